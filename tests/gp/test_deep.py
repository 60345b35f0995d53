"""Deep GP with doubly-stochastic variational inference: one layer equals the core SVGP (same parameters,
same ELBO and predictive density); the multi-layer ELBO equals an independent NumPy Monte-Carlo
estimate; training improves the ELBO under an XLA-compiled step; prediction is the S-sample mixture."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from helpers.gp import random_q
from gpseq.errors import ConfigError
from gpseq.gp.deep import DeepGP, GPLayer, build_deep_gp
from gpseq.gp.kernels import RBF
from gpseq.gp.likelihoods import Bernoulli, Gaussian, Softmax
from gpseq.gp.models import SVGP
from gpseq.training.trainer import Trainer


def _data(seed=0, N=30, kind="regression"):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(N, 2))
    f = np.sin(1.3 * X[:, :1]) + 0.3 * X[:, 1:]
    if kind == "binary":
        return X, (f > 0).astype(np.float64)
    if kind == "multiclass":
        return X, np.digitize(f[:, 0], [-0.5, 0.5]).astype(np.float64)[:, None]
    return X, f + 0.1 * rng.normal(size=f.shape)


def _pair(lik, P, whiten=True, full_cov=True, num_samples=4):
    X, _ = _data()
    k = RBF(1.3, [0.7, 1.4], ard=True)
    Z = X[:6].copy()
    svgp = SVGP(k, lik, Z, P, num_data=90, whiten=whiten, full_cov=full_cov)
    random_q(svgp.q, np.random.default_rng(4))
    layer = GPLayer(k, Z, P, whiten=whiten, full_cov=full_cov)
    layer.q.q_mu.assign(svgp.q.q_mu)
    layer.q.q_sqrt.assign(tf.convert_to_tensor(svgp.q.q_sqrt))
    return svgp, DeepGP([layer], lik, num_data=90, num_samples=num_samples)


@pytest.mark.parametrize("whiten,full_cov", [(True, True), (False, True), (True, False)])
@pytest.mark.parametrize("kind", ["regression", "binary"])
def test_one_layer_equals_svgp(whiten, full_cov, kind):
    X, Y = _data(kind=kind)
    lik = Gaussian(0.3) if kind == "regression" else Bernoulli("probit")
    svgp, deep = _pair(lik, 1, whiten, full_cov)
    np.testing.assert_allclose(deep.elbo((X, Y)).numpy(), svgp.elbo((X, Y)).numpy(), rtol=1e-10)
    np.testing.assert_allclose(deep.predict_log_density((X, Y), num_samples=3).numpy(),
                               svgp.predict_log_density((X, Y)).numpy(), rtol=1e-10)
    mean, var = deep.predict_f(X, num_samples=2)
    ref_mean, ref_var = svgp.predict_f(X)
    np.testing.assert_allclose(mean.numpy()[1], ref_mean.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(var.numpy()[0], ref_var.numpy(), rtol=1e-10)


def test_one_layer_softmax_equals_svgp():
    X, Y = _data(kind="multiclass")
    svgp, deep = _pair(Softmax(3, num_samples=50), 3, num_samples=1)  # same MC draws with S = 1
    np.testing.assert_allclose(deep.elbo((X, Y)).numpy(), svgp.elbo((X, Y)).numpy(), rtol=1e-10)
    p, _ = deep.predict_y(X, num_samples=1)
    np.testing.assert_allclose(p.numpy()[0].sum(-1), 1.0)


def _np_rbf(A, B, variance, ls):
    d = ((A[:, None, :] - B[None, :, :]) / ls) ** 2
    return variance * np.exp(-0.5 * d.sum(-1))


def test_two_layer_elbo_equals_numpy_monte_carlo():
    """Two layers (hidden width 2, linear mean, noisy hidden layer, non-whitened last layer) against an
    independent NumPy implementation of the same model: sample h_1 from its marginals, then the
    closed-form Gaussian expectation of the output layer, averaged over many samples."""
    X, Y = _data(N=12)
    rng = np.random.default_rng(6)
    W = rng.normal(size=(2, 2))
    k1, k2 = RBF(1.1, [0.9, 1.3], ard=True), RBF(0.7, [1.2, 0.8], ard=True)
    Z1, Z2 = rng.normal(size=(5, 2)), rng.normal(size=(4, 2))
    l1 = GPLayer(k1, Z1, 2, mean_weights=W, noise_variance=0.05, whiten=True)
    l2 = GPLayer(k2, Z2, 1, whiten=False)
    random_q(l1.q, rng)
    random_q(l2.q, rng)
    noise = 0.2
    model = DeepGP([l1, l2], Gaussian(noise), num_data=30)
    S = 20_000
    ours = model.elbo((X, Y), num_samples=S, seed=(3, 4)).numpy()

    def conditional(Hs, Z, k, q_mu, q_sqrt, whiten):  # NumPy marginals of q(f) at rows Hs
        Kzz = _np_rbf(Z, Z, float(k.variance.numpy()), k.lengthscales.numpy()) + 1e-6 * np.eye(len(Z))
        Kxz = _np_rbf(Hs, Z, float(k.variance.numpy()), k.lengthscales.numpy())
        L = np.linalg.cholesky(Kzz)
        A = np.linalg.solve(L, Kxz.T).T  # K_xz L⁻ᵀ
        proj = A if whiten else np.linalg.solve(Kzz, Kxz.T).T
        Sq = np.einsum("pmk,plk->pml", q_sqrt, q_sqrt)
        mean = proj @ q_mu
        var = float(k.variance.numpy()) - (A**2).sum(-1)[:, None] + np.einsum("nm,pmk,nk->np", proj, Sq, proj)
        return mean, var

    q1 = (l1.q.q_mu.numpy()[0], tf.convert_to_tensor(l1.q.q_sqrt).numpy()[0])
    q2 = (l2.q.q_mu.numpy()[0], tf.convert_to_tensor(l2.q.q_sqrt).numpy()[0])
    m1, v1 = conditional(X, Z1, k1, *q1, True)
    m1 = m1 + X @ W
    v1 = v1 + 0.05
    h = m1[None] + np.sqrt(v1)[None] * np.random.default_rng(0).standard_normal((S, 12, 2))
    m2, v2 = conditional(h.reshape(-1, 2), Z2, k2, *q2, False)
    ell = (-0.5 * np.log(2 * np.pi * noise) - 0.5 * ((np.tile(Y, (S, 1)) - m2) ** 2 + v2) / noise).reshape(S, 12)
    per_sample = ell.sum(1)
    kl = model.kl().numpy()
    ref = 30 / 12 * per_sample.mean() - kl
    se = 30 / 12 * per_sample.std() / np.sqrt(S)
    assert abs(ours - ref) < 5 * se * np.sqrt(2)


def test_training_improves_elbo_under_xla_and_mixture_prediction():
    X, Y = _data(N=40)
    model = build_deep_gp(X, 1, Gaussian(0.1), num_layers=2, num_inducing=8, num_samples=2, seed=1)
    assert [layer.output_dims for layer in model.layers] == [2, 1]
    before = np.mean([model.elbo((X, Y), num_samples=32, seed=(0, i)).numpy() for i in range(3)])
    losses = []
    trainer = Trainer(model, learning_rate=0.02, jit_compile=True,
                      callbacks=[lambda p: losses.append(p.loss) if p.event == "step" else None])
    trainer.fit([(tf.constant(X), tf.constant(Y))], 100)
    assert len(losses) == 100
    assert np.all(np.isfinite(losses))
    after = np.mean([model.elbo((X, Y), num_samples=32, seed=(0, i)).numpy() for i in range(3)])
    assert after > before + 10.0
    mean, var = model.predict_y(X, num_samples=5)
    assert mean.shape == (5, 40, 1) and np.all(var.numpy() > 0)
    # predictive density of the mixture: log (1/S) Σ_s N(y; m_s, v_s)
    logp = model.predict_log_density((X, Y), num_samples=5).numpy()
    m, v = mean.numpy(), var.numpy()
    dens = np.exp(-0.5 * (Y[None] - m) ** 2 / v) / np.sqrt(2 * np.pi * v)
    np.testing.assert_allclose(logp, np.log(dens.mean(0))[:, 0], rtol=1e-9)


def test_build_rejects_bad_configuration():
    X, _ = _data()
    with pytest.raises(ConfigError):
        build_deep_gp(X, 1, Gaussian(), num_layers=0)
    with pytest.raises(ConfigError):
        build_deep_gp(X, 1, Gaussian(), inference="ep")
    with pytest.raises(ConfigError):
        DeepGP([GPLayer(RBF(), np.zeros((3, 2)), 3), GPLayer(RBF(), np.zeros((3, 2)), 1)], Gaussian())


def test_natural_gradients_are_refused_with_a_config_error():
    X, _ = _data()
    model = build_deep_gp(X, 1, Gaussian(), num_layers=2, num_inducing=4)
    with pytest.raises(ConfigError):
        Trainer(model, natgrad_gamma=0.1)
