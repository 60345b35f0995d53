"""SVGP / SGPR / FITC vs GPflow (float64, identical hyperparameters, Z and q(u)); natural gradients;
likelihood expectations vs brute-force quadrature."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from scipy import integrate
from scipy.special import expit, log_ndtr

from gpseq.gp.kernels import RBF
from gpseq.gp.likelihoods import Bernoulli, Gaussian, Softmax, log_normal_cdf
from gpseq.gp.models import FITC, SGPR, SVGP
from gpseq.gp.natgrad import NaturalGradient

# The GPflow comparisons take conftest's `gpflow` fixture (they skip cleanly without GPflow; the
# other tests here run on every environment).


def _data(seed=0, N=40, classification=False):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(N, 2))
    f = np.sin(X[:, :1] * 1.5) + 0.5 * X[:, 1:]
    if classification:
        return X, (f + 0.3 * rng.normal(size=f.shape) > 0).astype(np.float64)
    return X, f + 0.2 * rng.normal(size=f.shape)


def _random_q(model, seed):
    rng = np.random.default_rng(seed)
    q = model.q
    K, M, P = q.num_components, q.num_inducing, q.num_latent
    q.q_mu.assign(rng.normal(size=(K, M, P)))
    if q.full_cov:
        L = np.tril(0.2 * rng.normal(size=(K, P, M, M)), -1) + np.eye(M) * rng.uniform(0.2, 0.9, (K, P, M, 1))
        q.q_sqrt.assign(tf.constant(L))
    else:
        q.q_sqrt.assign(tf.constant(rng.uniform(0.2, 0.9, size=(K, M, P))))


def _exact_probit(gpflow):
    class _ExactProbit(gpflow.likelihoods.Bernoulli):
        """GPflow's Bernoulli (its quadrature) with an unsquashed probit and a log Φ that does not underflow."""

        def _scalar_log_prob(self, X, F, Y):
            return tfp.distributions.Normal(tf.zeros([], F.dtype), 1.0).log_cdf((2.0 * Y - 1.0) * F)

    return _ExactProbit


def _gpflow_svgp(gpflow, model, ours_lik, num_data):
    q_sqrt = tf.convert_to_tensor(model.q.q_sqrt).numpy()[0]
    if ours_lik.__class__ is Gaussian:
        lik = gpflow.likelihoods.Gaussian(variance=float(tf.convert_to_tensor(ours_lik.variance)))
    elif ours_lik.link == "logit":
        lik = gpflow.likelihoods.Bernoulli(invlink=tf.sigmoid)
    else:  # exact probit (GPflow's default probit squashes Φ by 1e-3 for stability)
        lik = _exact_probit(gpflow)(invlink=lambda f: 0.5 * (1.0 + tf.math.erf(f / np.sqrt(2.0))))
    return gpflow.models.SVGP(
        gpflow.kernels.SquaredExponential(variance=1.4, lengthscales=[0.8, 1.7]), lik,
        model.inducing_inputs.numpy(), num_latent_gps=model.q.num_latent, q_diag=not model.q.full_cov,
        q_mu=model.q.q_mu.numpy()[0], q_sqrt=q_sqrt, whiten=model.whiten, num_data=num_data,
    )


@pytest.mark.parametrize("likelihood", ["gaussian", "logit", "probit"])
@pytest.mark.parametrize("whiten", [True, False])
@pytest.mark.parametrize("full_cov", [True, False])
def test_svgp_elbo_and_predictions_equal_gpflow(gpflow, likelihood, whiten, full_cov):
    X, Y = _data(1, classification=likelihood != "gaussian")
    Z = X[::5].copy()
    lik = Gaussian(0.3) if likelihood == "gaussian" else Bernoulli(likelihood)
    model = SVGP(RBF(1.4, [0.8, 1.7], ard=True), lik, Z, num_data=100, whiten=whiten, full_cov=full_cov)
    _random_q(model, 2)
    theirs = _gpflow_svgp(gpflow, model, lik, 100)
    batch = (X[:25], Y[:25])  # a minibatch: likelihood term scaled by 100 / 25
    np.testing.assert_allclose(model.elbo(batch), theirs.elbo(batch), rtol=1e-7)
    X_test = np.random.default_rng(3).uniform(-3, 3, size=(7, 2))
    for ours_pred, their_pred in ((model.predict_f(X_test), theirs.predict_f(X_test)),
                                  (model.predict_y(X_test), theirs.predict_y(X_test))):
        for a, b in zip(ours_pred, their_pred):
            np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-12)
    Y_test = Y[:7]
    # probit: ours is the closed form Φ(μ/√(1+v)), GPflow's 20-point Gauss–Hermite is good to ~1e-7
    np.testing.assert_allclose(model.predict_log_density((X_test, Y_test)),
                               theirs.predict_log_density((X_test, Y_test)),
                               rtol=1e-6 if likelihood == "probit" else 1e-7)


@pytest.mark.parametrize("likelihood", ["gaussian", "probit"])
@pytest.mark.parametrize("whiten", [True, False])
def test_svgp_elbo_gradients_equal_gpflow(gpflow, likelihood, whiten):
    """d ELBO / d (q_mu, q_sqrt, kernel variance, lengthscales) against GPflow's autodiff. Both put
    Softplus on the kernel's parameters and fill q_sqrt's lower triangle in the same order; gpseq's
    q_sqrt diagonal is Softplus(raw) too, so its raw gradient there is GPflow's times sigmoid(raw)."""
    X, Y = _data(1, classification=likelihood != "gaussian")
    lik = Gaussian(0.3) if likelihood == "gaussian" else Bernoulli("probit")
    model = SVGP(RBF(1.4, [0.8, 1.7], ard=True), lik, X[::5].copy(), num_data=100, whiten=whiten)
    _random_q(model, 2)
    theirs = _gpflow_svgp(gpflow, model, lik, 100)
    batch = (X[:25], Y[:25])
    ours_vars = [model.q.q_mu, model.q.q_sqrt.trainable_variables[0], model.kernel.variance.trainable_variables[0],
                 model.kernel.lengthscales.trainable_variables[0]]
    their_vars = [theirs.q_mu.unconstrained_variable, theirs.q_sqrt.unconstrained_variable,
                  theirs.kernel.variance.unconstrained_variable, theirs.kernel.lengthscales.unconstrained_variable]
    with tf.GradientTape() as tape:
        ours_elbo = model.elbo(batch)
    ours = tape.gradient(ours_elbo, ours_vars)
    with tf.GradientTape() as tape:
        their_elbo = theirs.elbo(batch)
    grads = tape.gradient(their_elbo, their_vars)
    raw = ours_vars[1].numpy()[0, 0]
    on_diag = tfp.bijectors.FillTriangular().inverse(np.eye(len(X[::5]))).numpy() == 1.0
    expected = [grads[0].numpy()[None], np.where(on_diag, grads[1].numpy()[0] * expit(raw), grads[1].numpy()[0]),
                grads[2].numpy(), grads[3].numpy()]
    for got, want in zip([g.numpy() for g in ours], expected):
        np.testing.assert_allclose(np.reshape(got, np.shape(want)), want, rtol=1e-7, atol=1e-10)


def test_sgpr_and_fitc_equal_gpflow(gpflow):
    X, Y = _data(4, N=50)
    Z = X[::6].copy()
    ours = SGPR(RBF(1.2, 0.9), (X, Y), Z, noise_variance=0.15)
    theirs = gpflow.models.SGPR((X, Y), gpflow.kernels.SquaredExponential(variance=1.2, lengthscales=0.9), Z,
                                noise_variance=0.15)
    np.testing.assert_allclose(ours.elbo(), theirs.elbo(), rtol=1e-7)
    X_test = np.linspace(-3, 3, 8).reshape(4, 2)
    for a, b in zip(ours.predict_f(X_test), theirs.predict_f(X_test)):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-12)
    fitc = FITC(RBF(1.2, 0.9), (X, Y), Z, noise_variance=0.15)
    g_fitc = gpflow.models.GPRFITC((X, Y), gpflow.kernels.SquaredExponential(variance=1.2, lengthscales=0.9), Z,
                                   noise_variance=0.15)
    np.testing.assert_allclose(fitc.elbo(), g_fitc.maximum_log_likelihood_objective(), rtol=1e-7)
    for a, b in zip(fitc.predict_f(X_test), g_fitc.predict_f(X_test)):
        np.testing.assert_allclose(a, b, rtol=1e-7, atol=1e-12)
    # Titsias' bound ≤ the FITC objective's exact-GP counterpart is not guaranteed, but both are ≤ 0 here
    # and the SGPR bound is below the exact log marginal likelihood:
    exact = gpflow.models.GPR((X, Y), gpflow.kernels.SquaredExponential(variance=1.2, lengthscales=0.9),
                              noise_variance=0.15).log_marginal_likelihood()
    assert float(ours.elbo()) <= float(exact)


@pytest.mark.parametrize("whiten", [True, False])
def test_one_natural_gradient_step_lands_on_the_collapsed_bound(whiten):
    X, Y = _data(5, N=30)
    Z = X[::3].copy()
    model = SVGP(RBF(1.4, [0.8, 1.7], ard=True), Gaussian(0.2), Z, num_data=30, whiten=whiten)
    _random_q(model, 7)
    sgpr = SGPR(RBF(1.4, [0.8, 1.7], ard=True), (X, Y), Z, noise_variance=0.2)
    before = float(model.elbo((X, Y)))
    NaturalGradient(1.0).minimize(lambda: model.loss((X, Y)), model.variational_parameters())
    after = float(model.elbo((X, Y)))
    assert after > before
    np.testing.assert_allclose(after, sgpr.elbo(), rtol=1e-7)
    # a second step stays put (fixed point), compiled
    step = tf.function(lambda x, y: NaturalGradient(1.0).minimize(lambda: model.loss((x, y)),
                                                                    model.variational_parameters()))
    step(X, Y)
    np.testing.assert_allclose(model.elbo((X, Y)), sgpr.elbo(), rtol=1e-7)


def test_diagonal_natural_gradient_increases_the_elbo():
    X, Y = _data(6, N=30)
    model = SVGP(RBF(1.0, 1.0), Gaussian(0.2), X[::3].copy(), full_cov=False)
    _random_q(model, 8)
    values = [float(model.elbo((X, Y)))]
    for _ in range(3):
        NaturalGradient(0.5).minimize(lambda: model.loss((X, Y)), model.variational_parameters())
        values.append(float(model.elbo((X, Y))))
    assert all(b > a for a, b in zip(values, values[1:]))


def test_bernoulli_expectations_equal_brute_force_quadrature():
    mean = np.array([[-2.0], [0.3], [1.5]])
    var = np.array([[0.5], [2.0], [0.1]])
    Y = np.array([[0.0], [1.0], [1.0]])
    for link, logp in (("probit", lambda f, y: log_ndtr((2 * y - 1) * f)),
                       ("logit", lambda f, y: np.log(expit((2 * y - 1) * f)))):
        ours = Bernoulli(link).variational_expectations(mean, var, Y).numpy()
        expected = [integrate.quad(lambda f: logp(f, y) * np.exp(-0.5 * (f - m) ** 2 / v) / np.sqrt(2 * np.pi * v),
                                   -30, 30)[0] for m, v, y in zip(mean[:, 0], var[:, 0], Y[:, 0])]
        np.testing.assert_allclose(ours, expected, rtol=1e-7)  # 20-point Gauss–Hermite
        precise = Bernoulli(link, num_gauss_hermite=60).variational_expectations(mean, var, Y).numpy()
        np.testing.assert_allclose(precise, expected, rtol=1e-10)


def test_probit_expectation_gradients_equal_brute_force_quadrature():
    """The probit expectations' closed-form gradient against SciPy quadrature of independent formulas:
    ∂/∂μ E[log Φ(s f)] = E[s r(s f)] and ∂/∂v = ½ E[∂²/∂f² log Φ(s f)] = −½ E[r (s f + r)], r = φ/Φ
    (Price's theorem), incl. a point in the lower tail's series (μ = −60, y = 1) and P = 2 columns."""
    from scipy.stats import norm

    mean = np.array([[-2.0, 0.4], [0.3, -1.0], [1.5, 3.0], [-60.0, 0.0]])
    var = np.array([[0.5, 0.2], [2.0, 1.0], [0.1, 4.0], [0.3, 1e-3]])
    Y = np.array([[0.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    F_mean, F_var = tf.constant(mean), tf.constant(var)
    upstream = tf.constant([1.0, -0.5, 2.0, 0.25], tf.float64)
    with tf.GradientTape() as tape:
        tape.watch([F_mean, F_var])
        value = Bernoulli("probit", num_gauss_hermite=60).variational_expectations(F_mean, F_var, Y)
        total = tf.reduce_sum(upstream * value)
    d_mean, d_var = (g.numpy() for g in tape.gradient(total, [F_mean, F_var]))

    def expect(g, m, v):
        width = 12.0 * np.sqrt(v)
        return integrate.quad(lambda f: g(f) * norm.pdf(f, m, np.sqrt(v)), m - width, m + width, epsabs=0, limit=200)[0]

    expected = np.zeros(len(mean))
    for n, p in np.ndindex(mean.shape):
        s, m, v = 2.0 * Y[n, p] - 1.0, mean[n, p], var[n, p]
        expected[n] += expect(lambda f: log_ndtr(s * f), m, v)
        ratio = lambda f: np.exp(norm.logpdf(s * f) - log_ndtr(s * f))  # noqa: E731
        np.testing.assert_allclose(d_mean[n, p], upstream[n] * expect(lambda f: s * ratio(f), m, v), rtol=1e-8)
        np.testing.assert_allclose(d_var[n, p], upstream[n] * expect(lambda f: -0.5 * ratio(f) * (s * f + ratio(f)), m, v),
                                   rtol=1e-7)
    np.testing.assert_allclose(value.numpy(), expected, rtol=1e-10)


def test_log_normal_cdf_matches_scipy_over_the_whole_line():
    """log Φ and its derivative φ/Φ against SciPy, from far in the lower tail (series) to where log Φ
    is −Φ(−x) ≈ −1e-268 (log1p); no infinities or NaNs anywhere."""
    from scipy.stats import norm

    x = np.concatenate([-np.logspace(-8, 4, 400), np.logspace(-8, np.log10(35.0), 400), np.linspace(-40, 35, 3001)])
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = log_normal_cdf(xt)
    grad = tape.gradient(y, xt).numpy()
    np.testing.assert_allclose(y.numpy(), log_ndtr(x), rtol=1e-10)  # the series' truncation at x = −20: 2e-11
    np.testing.assert_allclose(grad, np.exp(norm.logpdf(x) - log_ndtr(x)), rtol=1e-8)
    middle = x[(x > -20) & (x < 8)]  # no element in the series' range: that branch is skipped
    np.testing.assert_allclose(log_normal_cdf(tf.constant(middle)), log_ndtr(middle), rtol=1e-12)
    far = tf.constant([-1e150, -1e8, 1e8, 1e150], tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(far)
        y = log_normal_cdf(far)
    assert np.all(np.isfinite(y.numpy())) and np.all(np.isfinite(tape.gradient(y, far).numpy()))


def test_softmax_monte_carlo_matches_numpy_and_converges():
    rng = np.random.default_rng(0)
    mean, var = rng.normal(size=(4, 3)), rng.uniform(0.1, 1.0, size=(4, 3))
    labels = np.array([0, 2, 1, 2])
    lik = Softmax(3, num_samples=20000, seed=(1, 2))
    ours = lik.variational_expectations(mean, var, labels).numpy()
    eps = tf.random.stateless_normal([20000, 4, 3], (1, 2), dtype=tf.float64).numpy()
    f = mean + np.sqrt(var) * eps
    logp = f - np.log(np.exp(f).sum(-1, keepdims=True))
    np.testing.assert_allclose(ours, logp[:, np.arange(4), labels].mean(0), rtol=1e-10)
    # independent draws agree within Monte Carlo error (≈ 1/√S)
    other = Softmax(3, num_samples=20000, seed=(7, 9)).variational_expectations(mean, var, labels).numpy()
    np.testing.assert_allclose(ours, other, atol=0.03)
    p, _ = lik.predict_y(mean, var)
    np.testing.assert_allclose(p.numpy().sum(-1), 1.0, rtol=1e-12)


def test_mixture_svgp_elbo_uses_the_weighted_components():
    """ELBO of a K = 2 whitened SVGP against NumPy: Σ_k π_k Σ_n E_{q_k}[log N(y_n; f_n, σ²)] in closed
    form from each component's dense marginals, minus the seed supplement's Jensen bound on the KL,
    Σ_k π_k CE(q_k, N(0, I)) + Σ_k π_k log Σ_l π_l N(m_k; m_l, S_k + S_l)."""
    from scipy.stats import multivariate_normal

    X, Y = _data(2, N=20)
    Z = X[::4].copy()
    model = SVGP(RBF(1.0, 1.0), Gaussian(0.3), Z, num_components=2, whiten=True)
    _random_q(model, 1)
    model.q.mixture_logits.assign([0.3, -0.4])
    pi = np.exp([0.3, -0.4]) / np.exp([0.3, -0.4]).sum()
    q_mu = model.q.q_mu.numpy()[:, :, 0]  # [K, M]
    q_sqrt = tf.convert_to_tensor(model.q.q_sqrt).numpy()[:, 0]  # [K, M, M]
    covs = q_sqrt @ np.transpose(q_sqrt, (0, 2, 1))

    def rbf(a, b):
        return np.exp(-0.5 * ((a[:, None] - b[None]) ** 2).sum(-1))

    A = np.linalg.solve(np.linalg.cholesky(rbf(Z, Z) + 1e-6 * np.eye(len(Z))), rbf(Z, X)).T  # K_xz L⁻ᵀ
    y, noise, M = Y[:, 0], 0.3, len(Z)
    expected_ll = 0.0
    for k in range(2):
        mean = A @ q_mu[k]
        var = 1.0 - (A**2).sum(1) + np.einsum("nm,mk,nk->n", A, covs[k], A)
        expected_ll += pi[k] * np.sum(-0.5 * np.log(2 * np.pi * noise) - ((y - mean) ** 2 + var) / (2 * noise))
    cross_entropy = [0.5 * (M * np.log(2 * np.pi) + np.trace(covs[k]) + q_mu[k] @ q_mu[k]) for k in range(2)]
    overlap = [[multivariate_normal(q_mu[l], covs[k] + covs[l]).pdf(q_mu[k]) for l in range(2)] for k in range(2)]
    kl_bound = pi @ np.array(cross_entropy) + sum(pi[k] * np.log(pi @ np.array(overlap[k])) for k in range(2))
    np.testing.assert_allclose(model.elbo((X, Y)).numpy(), expected_ll - kl_bound, rtol=1e-9)
