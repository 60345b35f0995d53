"""GPNet's closed-form weight step (`gpnet_training.project`, `GPNetTrainer`) and exact-GP pre-training
(`GPNet.pretrain`) against independent references: Gaussian conditioning and the natural-parameter
(precision) form of the step computed directly in NumPy, SciPy's multivariate normal density, and
scikit-learn's GaussianProcessRegressor (its own L-BFGS fit of the same marginal likelihood)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from scipy.stats import multivariate_normal

from helpers.gp import rbf, regression  # the exact-GP references of the GPNet tests

from gpseq.errors import ConfigError
from gpseq.gp import GPNet, GPNetTrainer
from gpseq.gp.gpnet_training import log_marginal_likelihood, project
from gpseq.gp.kernels import RBF
from gpseq.gp.likelihoods import Bernoulli, Gaussian


def _phi(net, X):
    """The feature map computed from its definition (not the module's call)."""
    feats = net.features
    proj = (X / tf.convert_to_tensor(feats.lengthscales).numpy()) @ feats.frequencies.numpy()
    var = float(tf.convert_to_tensor(feats.variance))
    return np.sqrt(var * 2.0 / feats.num_features) * np.concatenate([np.cos(proj), np.sin(proj)], -1)


def _weights(net):
    raw = net.q_sqrt_raw.numpy()[0]
    L = raw if net.weight_factor == "dense" else np.tril(raw, -1) + np.diag(np.log1p(np.exp(np.diag(raw))))
    return net.q_mu.numpy()[:, 0], L @ L.T


def _small_net(ridge, seed=0, F=12, factor="lower", M=4):
    """A random network (a lower factor with a random stored diagonal, or a dense one) and a random
    target at M measurement points."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, (6, 1))
    net = GPNet(RBF(1.2, 0.9), Gaussian(0.1), X, num_data=6, num_features=F, projection_ridge=ridge,
                jitter=1e-12, seed=seed, weight_factor=factor)
    net.q_mu.assign(rng.normal(size=(F, 1)))
    raw = np.tril(0.3 * rng.normal(size=(F, F)), -1) + np.diag(rng.normal(size=F))
    if factor == "dense":
        raw = raw + 0.3 * np.triu(rng.normal(size=(F, F)), 1)
    net.q_sqrt_raw.assign(raw[None])
    X_M = np.array([[-1.7], [-0.4], [0.8], [1.9]]) if M == 4 else rng.uniform(-2, 2, (M, 1))
    target_mean = rng.normal(size=(M, 1))
    B = rng.normal(size=(M, M))
    target_cov = 0.2 * B @ B.T + 0.05 * np.eye(M)
    return net, X_M, target_mean, target_cov


@pytest.mark.parametrize("factor, ridge, F, M", [("lower", 0.0, 12, 4), ("lower", 0.05, 12, 4),
                                                 ("dense", 0.0, 12, 4), ("dense", 0.05, 12, 4),
                                                 ("dense", 0.01, 40, 9), ("dense", 0.05, 8, 11)])
def test_projection_is_conditioning_on_the_measurements_then_marginalising_the_target(factor, ridge, F, M):
    """q_{t+1}(w) = ∫ q_t(w | y_M) q̂(y_M) dy_M with y_M = f_M + ε, ε ~ N(0, δI) (δ = ridge × mean
    prior-network variance at X_M; ridge 0: exact), computed from the joint Gaussian of (w, y_M) —
    the dense closed form V' = V − GΦV + G(Σ̂ + δI)Gᵀ. A dense factor takes it as a low-rank update of
    the factor (thin QR, M × M Cholesky; also with more measurement points than features): equal
    to 1e-8 all the same."""
    net, X_M, mu_hat, sigma_hat = _small_net(ridge, F=F, factor=factor, M=M)
    m, V = _weights(net)
    phi = _phi(net, X_M)
    C = phi @ V @ phi.T
    delta = ridge * np.mean(np.diag(C))
    G = V @ phi.T @ np.linalg.inv(C + delta * np.eye(M))
    expected_mean = m + G @ (mu_hat[:, 0] - phi @ m)
    expected_cov = V - G @ phi @ V + G @ (sigma_hat + delta * np.eye(M)) @ G.T
    m_new, L_new, ok = project(net, X_M, mu_hat, sigma_hat[None])
    assert bool(ok)
    np.testing.assert_allclose(m_new.numpy()[:, 0], expected_mean, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose((L_new.numpy()[0] @ L_new.numpy()[0].T), expected_cov, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("factor", ["lower", "dense"])
def test_projection_is_the_unit_natural_gradient_step_and_matches_the_target(factor):
    """Ridge 0: the step is θ ← θ − ∂KL/∂η with the KL[q(f_M) ‖ q̂(f_M)] of the seed's step, i.e. in
    precision form Λ' = Λ − Φᵀ(ΦVΦᵀ)⁻¹Φ + ΦᵀΣ̂⁻¹Φ and Λ'm' = Λm − Φᵀ(ΦVΦᵀ)⁻¹Φm + ΦᵀΣ̂⁻¹μ̂;
    afterwards q(f_M) is the target (the KL is 0) and the network's conditional q(w | f_M) is unchanged."""
    net, X_M, mu_hat, sigma_hat = _small_net(0.0, seed=1, factor=factor)
    m, V = _weights(net)
    phi = _phi(net, X_M)
    Lam = np.linalg.inv(V)
    old_info = phi.T @ np.linalg.solve(phi @ V @ phi.T, phi)
    new_info = phi.T @ np.linalg.solve(sigma_hat, phi)
    Lam_new = Lam - old_info + new_info
    shift = Lam @ m - old_info @ m + phi.T @ np.linalg.solve(sigma_hat, mu_hat[:, 0])
    m_new, L_new, ok = project(net, X_M, mu_hat, sigma_hat[None])
    net.assign_weights(m_new, L_new)
    m2, V2 = _weights(net)
    np.testing.assert_allclose(np.linalg.inv(V2), Lam_new, rtol=1e-6, atol=1e-6 * np.abs(Lam_new).max())
    np.testing.assert_allclose(m2, np.linalg.solve(Lam_new, shift), rtol=1e-7, atol=1e-7)
    mean, cov = net.predict_f_full(X_M)
    np.testing.assert_allclose(mean.numpy(), mu_hat, atol=1e-8)
    np.testing.assert_allclose(cov.numpy()[0], sigma_hat, atol=1e-8)

    def conditional(m, V):  # q(w | f_M = 0): mean and covariance
        G = V @ phi.T @ np.linalg.inv(phi @ V @ phi.T)
        return m - G @ (phi @ m), V - G @ phi @ V
    for a, b in zip(conditional(m, V), conditional(m2, V2)):
        np.testing.assert_allclose(a, b, atol=1e-7)


def test_one_closed_form_step_with_beta_one_puts_the_exact_gp_posterior_at_the_measurement_points():
    """β = 1, the whole data as the batch: after one step, q(f_M) is the exact GP posterior at the
    step's measurement points (Adam off: hyperparameters fixed, feature map frozen)."""
    X, Y = regression(2, N=20)
    from gpseq.gp import RandomFeatures
    feats = RandomFeatures(1, 300, lengthscales=0.8, seed=4, trainable=False)
    net = GPNet(RBF(1.0, 0.8), Gaussian(0.05), X, num_data=20, features=feats, num_measurement=5,
                spread="none", learn_hyperparameters=False, projection_ridge=0.0, jitter=1e-12, seed=1)
    trainer = GPNetTrainer(net, learning_rate=0.0)
    assert trainer.closed_form and trainer.variables == []
    seed = tf.constant([0, 0], tf.int32)
    X_M = net.measurement_points(tf.unstack(tf.random.experimental.stateless_split(seed, 2))[0], X).numpy()
    trainer.step((X, Y))
    K = rbf(X, X, 1.0, 0.8) + 0.05 * np.eye(20)
    Ks = rbf(X_M, X, 1.0, 0.8)
    exact_mean = Ks @ np.linalg.solve(K, Y)
    exact_cov = rbf(X_M, X_M, 1.0, 0.8) - Ks @ np.linalg.solve(K, Ks.T)
    mean, cov = net.predict_f_full(X_M)
    np.testing.assert_allclose(mean.numpy(), exact_mean, atol=1e-6)
    np.testing.assert_allclose(cov.numpy()[0], exact_cov, atol=1e-6)


def test_closed_form_training_approaches_the_exact_gp_posterior():
    """The setting of tests/gp/test_gpnet.py's Adam test (F = 200 features whose own posterior is off by
    > 0.1), closed-form steps (default ridge) instead: 300 steps (the Adam run needs 1,500) reach
    the same tolerances, mean within 0.03 (0.3 noise sd) and variance within 0.01 (6 % of the
    largest posterior variance); measured 0.004 and 0.001."""
    from gpseq.gp import RandomFeatures
    X, Y = regression(0, N=30)
    Xs = np.linspace(-3.5, 3.5, 30)[:, None]
    noise = 0.01
    K = rbf(X, X, 1.0, 0.8) + noise * np.eye(30)
    Ks = rbf(Xs, X, 1.0, 0.8)
    exact_mean = Ks @ np.linalg.solve(K, Y)
    exact_var = 1.0 - np.sum(Ks * np.linalg.solve(K, Ks.T).T, 1)
    feats = RandomFeatures(1, 200, variance=1.0, lengthscales=0.8, seed=3)
    net = GPNet(RBF(1.0, 0.8), Gaussian(noise), X, num_data=30, features=feats, num_measurement=30,
                learn_hyperparameters=False, beta0=1.0, beta_decay=0.0, seed=1)
    GPNetTrainer(net, learning_rate=0.03).fit([(tf.constant(X), tf.constant(Y))], max_steps=300)
    mean, var = net.predict_f(Xs)
    assert np.abs(mean.numpy() - exact_mean).max() < 0.03
    assert np.abs(var.numpy()[:, 0] - exact_var).max() < 0.01


def test_log_marginal_likelihood_is_the_gaussian_density():
    X, Y = regression(3, N=15)
    net = GPNet(RBF(1.4, 0.7), Gaussian(0.2), X, num_data=15, num_features=10, jitter=1e-12)
    expected = multivariate_normal(np.zeros(15), rbf(X, X, 1.4, 0.7) + 0.2 * np.eye(15)).logpdf(Y[:, 0])
    np.testing.assert_allclose(float(log_marginal_likelihood(net, X, Y)), expected, rtol=1e-9)


def test_pretrain_finds_the_exact_gp_hyperparameters_of_scikit_learn():
    """Pre-training on all 80 points (num_points ≥ N) maximises the same evidence as scikit-learn's
    GPR (C · RBF + White, its own L-BFGS with restarts): hyperparameters within 2 % and evidence
    within 1e-4 nats per point; the feature map then carries the kernel's values."""
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF as SkRBF, ConstantKernel, WhiteKernel

    rng = np.random.default_rng(5)
    X = rng.uniform(-3, 3, (80, 2))
    Y = np.sin(1.5 * X[:, :1]) * np.cos(0.5 * X[:, 1:]) + 0.2 * rng.normal(size=(80, 1))
    sk = GaussianProcessRegressor(ConstantKernel(1.0, (1e-3, 1e3)) * SkRBF([1.0, 1.0], (1e-2, 1e2))
                                  + WhiteKernel(1.0, (1e-5, 1e1)), n_restarts_optimizer=3, random_state=0)
    sk.fit(X, Y[:, 0])
    params = sk.kernel_.get_params()
    sk_var, sk_ls, sk_noise = params["k1__k1__constant_value"], params["k1__k2__length_scale"], params["k2__noise_level"]

    net = GPNet(RBF(1.0, [1.0, 1.0], ard=True), Gaussian(1.0), X, num_data=80, num_features=20)
    per_point = net.pretrain(X, Y, num_points=1000)
    np.testing.assert_allclose(per_point * 80, sk.log_marginal_likelihood_value_, atol=80 * 1e-4)
    np.testing.assert_allclose(float(tf.convert_to_tensor(net.kernel.variance)), sk_var, rtol=0.02)
    np.testing.assert_allclose(tf.convert_to_tensor(net.kernel.lengthscales).numpy(), sk_ls, rtol=0.02)
    np.testing.assert_allclose(float(tf.convert_to_tensor(net.likelihood.variance)), sk_noise, rtol=0.02)
    np.testing.assert_allclose(tf.convert_to_tensor(net.features.lengthscales).numpy(), sk_ls, rtol=0.02)
    np.testing.assert_allclose(float(tf.convert_to_tensor(net.features.variance)), sk_var, rtol=0.02)


def test_fit_learns_a_regression_and_classification_keeps_the_gradient_step():
    X, Y = regression(6, N=200)
    net = GPNet(RBF(1.0, 1.0), Gaussian(1.0), X, num_data=200, num_features=100, num_measurement=50)
    trainer = net.fit(X, Y, max_steps=100, batch_size=50)
    assert trainer.closed_form and trainer.step_count == 100
    Xs = np.linspace(-2.5, 2.5, 20)[:, None]
    mean, _ = net.predict_y(Xs)
    assert np.abs(mean.numpy() - np.sin(2 * Xs)).max() < 0.15  # noise sd 0.1
    assert 0.005 < float(tf.convert_to_tensor(net.likelihood.variance)) < 0.02

    clf = GPNet(RBF(1.0, 1.0), Bernoulli(), X, num_data=200, num_features=20, num_measurement=10)
    assert not GPNetTrainer(clf).closed_form
    with pytest.raises(ConfigError):
        GPNetTrainer(clf, update="closed_form")
    diag = GPNet(RBF(1.0, 1.0), Gaussian(1.0), X, num_data=200, num_features=20, full_cov=False)
    assert not GPNetTrainer(diag).closed_form


def test_the_trainer_is_importable_from_its_old_place():
    import gpseq.gp.gpnet
    import gpseq.gp.gpnet_training

    assert gpseq.gp.gpnet.GPNetTrainer is GPNetTrainer is gpseq.gp.gpnet_training.GPNetTrainer


def test_closed_form_steps_with_beta_one_over_t_give_the_tempered_posterior_of_every_batch_seen():
    """β_t = 1/(1 + t) (`beta_power=1`) with exact steps (a linear prior whose features are exact, as
    many measurement points as weights, no ridge): after T batches q(w) ∝ N(w; 0, I) Π_t p(y_t | w)^{N/(BT)},
    each batch weighted equally — Bayesian linear regression on the T·B points seen, tempered to N,
    computed here in NumPy. Tolerance 1e-6 (the jitter of the rank-deficient prior covariances)."""
    from gpseq.gp.kernels import Linear

    rng = np.random.default_rng(7)
    N, B, D, noise = 24, 4, 3, 0.1
    X = rng.normal(size=(N, D))
    Y = X @ np.array([[0.5], [-1.0], [2.0]]) + np.sqrt(noise) * rng.normal(size=(N, 1))
    net = GPNet(Linear(), Gaussian(noise), X, num_data=N, num_measurement=D, learn_hyperparameters=False,
                beta0=1.0, beta_decay=1.0, beta_power=1.0, projection_ridge=0.0, jitter=1e-12, seed=2)
    trainer = GPNetTrainer(net, learning_rate=0.0)
    batches = [(X[i:i + B], Y[i:i + B]) for i in range(0, N, B)]
    for batch in batches:
        trainer.step(batch)
    T = len(batches)
    precision = np.eye(D) + (N / (B * T)) * X.T @ X / noise
    mean = np.linalg.solve(precision, (N / (B * T)) * X.T @ Y / noise)
    L = net.q_sqrt().numpy()[0]
    np.testing.assert_allclose(net.q_mu.numpy(), mean, atol=1e-6)
    np.testing.assert_allclose(L @ L.T, np.linalg.inv(precision), atol=1e-6)


def test_pretrained_trainer_holds_the_feature_map_it_set():
    """`GPNetTrainer.pretrained`: after exact-GP pre-training the feature map (set from the fitted
    kernel) takes no Adam step, the kernel and noise still do; without pre-training it is learned."""
    X, Y = regression(3, N=60)
    net = GPNet(RBF(1.0, 1.0), Gaussian(1.0), X, num_data=60, num_features=20)
    trainer = GPNetTrainer.pretrained(net, X, Y)
    held = {v.ref() for v in net.features.trainable_variables}
    assert held and not held & {v.ref() for v in trainer.variables}
    assert {v.ref() for v in net.kernel.trainable_variables} <= {v.ref() for v in trainer.variables}
    np.testing.assert_allclose(tf.convert_to_tensor(net.features.lengthscales).numpy(),
                               tf.convert_to_tensor(net.kernel.lengthscales).numpy())
    before = [v.numpy().copy() for v in net.features.trainable_variables]
    trainer.fit([(X, Y)], max_steps=3)
    for b, v in zip(before, net.features.trainable_variables):
        np.testing.assert_array_equal(b, v.numpy())
    unfitted = GPNet(RBF(1.0, 1.0), Bernoulli(), X, num_data=60, num_features=20)
    learned = {v.ref() for v in GPNetTrainer.pretrained(unfitted, X, (Y > 0).astype(float)).variables}
    assert {v.ref() for v in unfitted.features.trainable_variables} <= learned
