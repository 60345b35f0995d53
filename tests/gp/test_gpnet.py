"""GPNet (`gpseq.gp.gpnet`) and random features against independent references: the RBF kernel
(Bochner / Monte Carlo error scaling), exact GP regression and the Gaussian product in precision
form computed directly in NumPy, the Bayesian-linear-regression posterior, and a save/load round trip."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from helpers.gp import rbf, regression

from gpseq.errors import ConfigError
from gpseq.gp import GPNet, RandomFeatures
from gpseq.gp.gpnet import beta_schedule
from gpseq.gp.kernels import RBF, Linear
from gpseq.gp.likelihoods import Bernoulli, Gaussian, Softmax
from gpseq.training.trainer import Trainer


def _exact_gp(X, Y, Xs, variance, lengthscale, noise):
    """Exact GP-regression posterior of f at Xs: mean [M, 1], covariance [M, M]."""
    K = rbf(X, X, variance, lengthscale) + noise * np.eye(len(X))
    Ks = rbf(Xs, X, variance, lengthscale)
    mean = Ks @ np.linalg.solve(K, Y)
    cov = rbf(Xs, Xs, variance, lengthscale) - Ks @ np.linalg.solve(K, Ks.T)
    return mean, cov


def _randomise_network(net, seed):
    rng = np.random.default_rng(seed)
    F, P = net.q_mu.shape
    net.q_mu.assign(rng.normal(size=(F, P)))
    net.q_sqrt_raw.assign(0.3 * rng.normal(size=net.q_sqrt_raw.shape))


def _network_moments(net, X):
    """q_γ(f_X) computed directly: Φ from the map's definition, V = L Lᵀ from the stored factor (as
    stored when dense; lower triangle with a Softplus diagonal otherwise)."""
    feats = net.features
    ls = tf.convert_to_tensor(feats.lengthscales).numpy()
    var = tf.convert_to_tensor(feats.variance).numpy()
    proj = (X / ls) @ feats.frequencies.numpy()
    phi = np.sqrt(var * 2.0 / feats.num_features) * np.concatenate([np.cos(proj), np.sin(proj)], -1)
    raw = net.q_sqrt_raw.numpy()[0]
    L = raw if net.weight_factor == "dense" else np.tril(raw, -1) + np.diag(np.log1p(np.exp(np.diag(raw))))
    return phi @ net.q_mu.numpy(), phi @ L @ L.T @ phi.T


# ---- random features ------------------------------------------------------------------------------
def test_random_fourier_features_error_falls_as_one_over_sqrt_features():
    """RMS error of φ(x)ᵀφ(x') against the RBF kernel, averaged over 12 draws of the frequencies:
    ×4 features must halve it (Monte Carlo rate F^{-1/2}); 12 draws put the mean ratio within ±0.1 of 1/2."""
    X = np.random.default_rng(0).normal(size=(25, 3))
    K = rbf(X, X, 1.7, np.array([0.9, 1.4, 2.0]))

    def rms_error(F, seed):
        feats = RandomFeatures(3, F, variance=1.7, lengthscales=[0.9, 1.4, 2.0], ard=True, seed=seed)
        return np.sqrt(np.mean((feats.K(X).numpy() - K) ** 2))

    for F in (100, 400):
        small = np.mean([rms_error(F, s) for s in range(12)])
        large = np.mean([rms_error(4 * F, s) for s in range(12)])
        assert large / small == pytest.approx(0.5, abs=0.1), (F, small, large)
    # and the level: the per-entry variance of the estimate is σ⁴(1 + k̃(2r) − 2k̃(r)²)/F ≤ 2σ⁴/F
    assert rms_error(400, 0) < 1.7 * np.sqrt(2.0 / 400)


def test_linear_features_are_the_linear_kernel_exactly():
    X = np.random.default_rng(1).normal(size=(6, 4))
    kernel = Linear(0.7)
    feats = RandomFeatures.from_kernel(kernel, 4)
    np.testing.assert_allclose(feats.K(X).numpy(), 0.7 * X @ X.T, rtol=1e-12)
    assert feats.num_features == 4


# ---- the functional mirror-descent target -----------------------------------------------------------
def test_target_with_beta_one_is_the_exact_gp_regression_update():
    """β = 1 and the whole data set as the batch: q̂(f_M) is the exact GP posterior at X_M,
    whatever the network q_{γ_t} is (randomised here)."""
    X, Y = regression(N=20)
    X_M = np.linspace(-3.5, 3.5, 9)[:, None]
    net = GPNet(RBF(1.3, 0.7), Gaussian(0.05), X, num_data=20, num_features=60, jitter=1e-10)
    _randomise_network(net, 0)
    mean, cov = net.gaussian_target(X, Y, X_M, beta=1.0)
    exact_mean, exact_cov = _exact_gp(X, Y, X_M, 1.3, 0.7, 0.05)
    np.testing.assert_allclose(mean.numpy(), exact_mean, atol=1e-8)
    np.testing.assert_allclose(cov.numpy()[0], exact_cov, atol=1e-8)


@pytest.mark.parametrize("beta", [0.3, 0.8])
def test_target_equals_the_gaussian_product_in_precision_form(beta):
    """β < 1, a minibatch of B of N points: q̂ ∝ N(y_b | f_b, σ² B/(Nβ)) N(0, K)^β q_t^{1−β}, its
    precision and shift summed directly (natural parameters) and marginalised to X_M."""
    rng = np.random.default_rng(2)
    X_b = rng.uniform(-5, 5, (5, 1))
    Y_b = rng.normal(size=(5, 1))
    X_M = rng.uniform(-5, 5, (4, 1))
    N, noise = 50, 0.2
    net = GPNet(RBF(1.1, 0.6), Gaussian(noise), X_b, num_data=N, num_features=80, jitter=1e-12)
    _randomise_network(net, 1)
    mean, cov = net.gaussian_target(X_b, Y_b, X_M, beta=beta)

    Z = np.concatenate([X_b, X_M])
    mu_t, sigma_t = _network_moments(net, Z)
    K = rbf(Z, Z, 1.1, 0.6)
    lik_precision = np.zeros((9, 9))
    lik_precision[:5, :5] = np.eye(5) * N * beta / (5 * noise)
    precision = beta * np.linalg.inv(K) + (1 - beta) * np.linalg.inv(sigma_t) + lik_precision
    shift = (1 - beta) * np.linalg.solve(sigma_t, mu_t)
    shift[:5] += N * beta / (5 * noise) * Y_b
    joint_cov = np.linalg.inv(precision)
    joint_mean = joint_cov @ shift
    np.testing.assert_allclose(mean.numpy(), joint_mean[5:], rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(cov.numpy()[0], joint_cov[5:, 5:], rtol=1e-6, atol=1e-8)


def test_beta_schedule():
    np.testing.assert_allclose(beta_schedule(np.arange(4), 0.5, 2.0).numpy(), 0.5 / (1 + 2 * np.sqrt(np.arange(4))))


# ---- training ---------------------------------------------------------------------------------------
def test_gpnet_approaches_the_exact_gp_posterior():
    """RBF prior with fixed hyperparameters, 100 random frequencies (F = 200), full weight covariance,
    full batch, β = 1, trained by the shared Trainer. Tolerances: mean within 0.03 (0.3 noise sd;
    the feature family's own weight-space posterior is off by ~0.15 here, asserted below, so this
    is not met by the features alone) and variance within 0.01 (6 % of the largest posterior
    variance); what remains is Adam's noise from the resampled measurement points. Adam here steps
    the lower-triangular factor (`weight_factor="lower"`, Algorithm 1's parametrisation; with the
    dense factor, the closed-form step's, the same 1,500 steps left the mean 0.034 off)."""
    X, Y = regression(0, N=30)
    Xs = np.linspace(-3.5, 3.5, 30)[:, None]
    noise = 0.01
    exact_mean, exact_cov = _exact_gp(X, Y, Xs, 1.0, 0.8, noise)
    exact_var = np.diag(exact_cov)
    feats = RandomFeatures(1, 200, variance=1.0, lengthscales=0.8, seed=3)
    phi, phi_s = feats(X).numpy(), feats(Xs).numpy()
    weight_cov = np.linalg.inv(np.eye(200) + phi.T @ phi / noise)
    blr_mean = phi_s @ weight_cov @ phi.T @ Y / noise
    assert np.abs(blr_mean - exact_mean).max() > 0.1  # the features alone are not the exact GP

    net = GPNet(RBF(1.0, 0.8), Gaussian(noise), X, num_data=30, features=feats, num_measurement=30,
                learn_hyperparameters=False, beta0=1.0, beta_decay=0.0, seed=1, weight_factor="lower")
    Trainer(net, learning_rate=0.03).fit([(tf.constant(X), tf.constant(Y))], max_steps=1500)
    mean, var = net.predict_f(Xs)
    assert np.abs(mean.numpy() - exact_mean).max() < 0.03
    assert np.abs(var.numpy()[:, 0] - exact_var).max() < 0.01


def test_gpnet_fixed_point_is_the_weight_space_posterior_when_the_prior_is_the_features():
    """Prior kernel = the feature map's own kernel, so the family holds the exact posterior
    (Bayesian linear regression, w ~ N(0, I)); minibatches of 10 of 30 and a decaying β. Each
    target sees a third of the data, so q keeps a minibatch noise that shrinks with β_t (0.09 at
    the last step): tolerances 0.05 on the mean (0.5 noise sd) and 0.02 on the variance (10 % of the
    largest posterior variance, 0.2 at the edges; measured 0.011)."""
    X, Y = regression(1, N=30)
    Xs = np.linspace(-3.5, 3.5, 25)[:, None]
    noise = 0.01
    prior = RandomFeatures(1, 40, lengthscales=0.8, seed=3, trainable=False)
    feats = RandomFeatures(1, 40, lengthscales=0.8, seed=3, trainable=False)
    phi, phi_s = prior(X).numpy(), prior(Xs).numpy()
    weight_cov = np.linalg.inv(np.eye(40) + phi.T @ phi / noise)
    exact_mean = phi_s @ weight_cov @ phi.T @ Y / noise
    exact_var = np.sum((phi_s @ weight_cov) * phi_s, 1)
    net = GPNet(prior, Gaussian(noise), X, num_data=30, features=feats, num_measurement=30,
                learn_hyperparameters=False, beta0=1.0, beta_decay=0.2, seed=1)
    batches = [(tf.constant(X[i:i + 10]), tf.constant(Y[i:i + 10])) for i in (0, 10, 20)]
    Trainer(net, learning_rate=0.03).fit(batches, max_steps=1500)
    mean, var = net.predict_f(Xs)
    assert np.abs(mean.numpy() - exact_mean).max() < 0.05
    assert np.abs(var.numpy()[:, 0] - exact_var).max() < 0.02


def test_gpnet_classification_and_hyperparameters_train():
    """Bernoulli (surrogate L_t) learns a separable 1-D problem; the Gaussian model's learned noise
    variance moves from 1.0 towards the data's 0.01 (minibatch marginal-likelihood bound)."""
    rng = np.random.default_rng(3)
    X = rng.uniform(-3, 3, (60, 1))
    Y = (np.sin(1.5 * X) > 0).astype(np.float64)
    net = GPNet(RBF(1.0, 1.0), Bernoulli("probit"), X, num_data=60, num_features=60, num_measurement=20,
                beta0=0.5, beta_decay=0.1, residual_hidden=8)
    Trainer(net, learning_rate=0.03).fit([(tf.constant(X), tf.constant(Y))], max_steps=400)
    p, _ = net.predict_y(X)
    assert np.mean((p.numpy() > 0.5) == (Y > 0.5)) > 0.9

    X, Y = regression(4, N=40)
    gauss = GPNet(RBF(1.0, 1.0), Gaussian(1.0), X, num_data=40, num_features=60, num_measurement=20)
    Trainer(gauss, learning_rate=0.03).fit([(tf.constant(X), tf.constant(Y))], max_steps=300)
    assert float(tf.convert_to_tensor(gauss.likelihood.variance)) < 0.3


def test_softmax_loss_is_finite_and_differentiable():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(12, 2))
    Y = rng.integers(0, 3, size=(12,))
    net = GPNet(RBF(1.0, 1.0), Softmax(3, num_samples=8), X, num_data=12, num_latent=3, num_features=40,
                num_measurement=6, full_cov=False)
    with tf.GradientTape() as tape:
        loss = net.loss((tf.constant(X), tf.constant(Y)), tf.constant([0, 3]))
    grads = tape.gradient(loss, net.trainable_variables)
    assert np.isfinite(float(loss)) and all(g is not None and np.all(np.isfinite(g)) for g in grads)
    with pytest.raises(ConfigError):
        GPNet(RBF(), Softmax(3), X, num_data=12, num_latent=2)


def test_save_load_round_trip_as_plain_arrays(tmp_path):
    X, Y = regression(6, N=15)
    net = GPNet(RBF(0.9, [0.5], ard=True), Gaussian(0.2), X, num_data=15, num_features=20, residual_hidden=4,
                full_cov=False)
    _randomise_network(net, 7)
    net.residual[2].assign(np.random.default_rng(8).normal(size=(4, 1)))
    path = tmp_path / "gpnet.npz"
    net.save(path)
    with np.load(path, allow_pickle=False) as data:  # plain arrays: readable without pickle
        assert "config" in data.files
    loaded = GPNet.load(path)
    Xs = np.linspace(-3, 3, 7)[:, None]
    for a, b in zip(net.predict_y(Xs), loaded.predict_y(Xs)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12)
    np.testing.assert_allclose(net.loss((X, Y), tf.constant([0, 2])).numpy(),
                               GPNet.load(path, inputs=X).loss((X, Y), tf.constant([0, 2])).numpy(), rtol=1e-10)
