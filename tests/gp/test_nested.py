"""Nested variational compression bound (seed eq. 19): psi statistics vs Monte Carlo, one layer equals
SVGP (eq. 10) and, at the optimal q(u), SGPR (eq. 9); the bound stays below the exact GP log marginal
likelihood; the propagated messages equal Monte-Carlo moments of the DSVI conditionals."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from helpers.gp import random_q
from gpseq.errors import ConfigError
from gpseq.gp.deep import DeepGP, GPLayer
from gpseq.gp.kernels import RBF, Linear, Matern32
from gpseq.gp.likelihoods import Bernoulli, Gaussian
from gpseq.gp.models import SGPR, SVGP
from gpseq.gp.nested import layer_terms, nested_predict_f
from gpseq.gp.psi import psi_statistics


def _data(seed=0, N=25):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(N, 2))
    return X, np.sin(1.3 * X[:, :1]) + 0.3 * X[:, 1:] + 0.1 * rng.normal(size=(N, 1))


def _mc_psi(kernel, mu, var, Z, S, seed=0):
    """Monte-Carlo means and standard errors of (ψ0, Ψ, Φ, Ξ) using the kernel's own K / K_diag."""
    rng = np.random.default_rng(seed)
    N, D = mu.shape
    x = mu[None] + np.sqrt(var)[None] * rng.standard_normal((S, N, D))  # [S, N, D]
    kxz = kernel.K(tf.constant(x.reshape(-1, D)), tf.constant(Z)).numpy().reshape(S, N, -1)  # [S, N, M]
    kxx = kernel.K_diag(tf.constant(x.reshape(-1, D))).numpy().reshape(S, N)
    draws = [kxx, kxz, kxz[..., :, None] * kxz[..., None, :], kxz[..., :, None] * x[:, :, None, :]]
    return [(d.mean(0), d.std(0) / np.sqrt(S)) for d in draws]


@pytest.mark.parametrize("kernel", [
    RBF(1.3, [0.7, 1.4], ard=True), RBF(0.8, 1.1), Linear(0.7),
], ids=["rbf-ard", "rbf", "linear"])
def test_psi_statistics_equal_monte_carlo(kernel):
    rng = np.random.default_rng(1)
    mu, var, Z = rng.normal(size=(3, 2)), rng.uniform(0.05, 0.6, size=(3, 2)), rng.normal(size=(4, 2))
    closed = [t.numpy() for t in psi_statistics(kernel, mu, var, Z)]
    for name, value, (mc, se) in zip(["psi0", "Psi", "Phi", "Xi"], closed, _mc_psi(kernel, mu, var, Z, 200_000)):
        assert value.shape == mc.shape, name
        np.testing.assert_array_less(np.abs(value - mc), 5.0 * se + 1e-9, err_msg=name)


def test_psi_statistics_at_zero_variance_are_kernel_evaluations():
    rng = np.random.default_rng(2)
    mu, Z = rng.normal(size=(5, 2)), rng.normal(size=(3, 2))
    k = RBF(1.3, [0.7, 1.4], ard=True)
    psi0, psi1, phi, xi = [t.numpy() for t in psi_statistics(k, mu, np.zeros_like(mu), Z)]
    K = k.K(mu, Z).numpy()
    np.testing.assert_allclose(psi1, K, rtol=1e-12)
    np.testing.assert_allclose(phi, K[:, :, None] * K[:, None, :], rtol=1e-12)
    np.testing.assert_allclose(xi, K[..., None] * mu[:, None, :], rtol=1e-12)
    np.testing.assert_allclose(psi0, k.K_diag(mu).numpy())


@pytest.mark.parametrize("whiten,full_cov", [(True, True), (False, True), (True, False), (False, False)])
@pytest.mark.parametrize("kernel_cls", [RBF, Linear])
def test_one_layer_nested_equals_svgp(whiten, full_cov, kernel_cls):
    X, Y = _data()
    rng = np.random.default_rng(3)
    kernel = RBF(1.3, [0.7, 1.4], ard=True) if kernel_cls is RBF else Linear(0.6)
    lik = Gaussian(0.3)
    Z = X[:6].copy() if kernel_cls is RBF else X[:2].copy()  # linear K_zz has rank D = 2
    svgp = SVGP(kernel, lik, Z, 1, num_data=80, whiten=whiten, full_cov=full_cov)
    random_q(svgp.q, rng)
    layer = GPLayer(kernel, Z, 1, whiten=whiten, full_cov=full_cov)
    layer.q.q_mu.assign(svgp.q.q_mu)
    layer.q.q_sqrt.assign(tf.convert_to_tensor(svgp.q.q_sqrt))
    nested = DeepGP([layer], lik, num_data=80, inference="nested")
    np.testing.assert_allclose(nested.elbo((X, Y)).numpy(), svgp.elbo((X, Y)).numpy(), rtol=1e-9)


def test_one_layer_nested_at_optimal_q_equals_sgpr():
    X, Y = _data()
    k = RBF(1.3, [0.7, 1.4], ard=True)
    noise = 0.3
    Z = X[:7].copy()
    layer = GPLayer(k, Z, 1, whiten=False)
    Kuu = k.K(Z).numpy() + 1e-6 * np.eye(7)
    Kuf = k.K(Z, X).numpy()
    Sigma = np.linalg.inv(Kuu + Kuf @ Kuf.T / noise)
    S, m = Kuu @ Sigma @ Kuu, Kuu @ Sigma @ Kuf @ Y / noise  # Titsias' optimal q(u)
    layer.q.q_mu.assign(m[None])
    layer.q.q_sqrt.assign(tf.constant(np.linalg.cholesky(S)[None, None]))
    nested = DeepGP([layer], Gaussian(noise), inference="nested")
    sgpr = SGPR(k, (X, Y), Z, noise)
    np.testing.assert_allclose(nested.elbo((X, Y)).numpy(), sgpr.elbo().numpy(), rtol=1e-9)


def _exact_log_marginal(k, X, Y, noise):
    K = k.K(X).numpy() + noise * np.eye(len(X))
    L = np.linalg.cholesky(K)
    a = np.linalg.solve(L, Y[:, 0])
    return -0.5 * a @ a - np.log(np.diag(L)).sum() - 0.5 * len(X) * np.log(2 * np.pi)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nested_bound_below_exact_gp(seed):
    X, Y = _data(seed)
    rng = np.random.default_rng(seed)
    k = RBF(rng.uniform(0.5, 2.0), rng.uniform(0.5, 2.0, 2), ard=True)
    noise = rng.uniform(0.05, 0.5)
    exact = _exact_log_marginal(k, X, Y, noise)
    # one layer, random q(u)
    layer = GPLayer(k, X[:8].copy(), 1)
    random_q(layer.q, rng)
    one = DeepGP([layer], Gaussian(noise), inference="nested").elbo((X, Y)).numpy()
    assert one <= exact
    # two layers whose hidden layer is (almost) the identity: h_1 = x + N(0, 1e-6), tiny GP part.
    hidden = GPLayer(RBF(1e-10, [1.0, 1.0], ard=True), X[:5].copy(), 2, mean_weights=np.eye(2),
                     noise_variance=1e-6, initial_scale=1e-3)
    out = GPLayer(k, X[:8].copy(), 1)
    out.q.q_mu.assign(layer.q.q_mu)
    out.q.q_sqrt.assign(tf.convert_to_tensor(layer.q.q_sqrt))
    two = DeepGP([hidden, out], Gaussian(noise), inference="nested").elbo((X, Y)).numpy()
    # deep-GP marginal likelihood ≈ the GP's (inputs perturbed by 1e-6 noise): bound below it
    assert two <= exact + 1e-3
    assert two <= one + 1e-3  # extra KL and penalties only


@pytest.mark.parametrize("kernel", [RBF(1.2, [0.8, 1.5], ard=True), Linear(0.5)], ids=["rbf", "linear"])
@pytest.mark.parametrize("whiten", [True, False])
def test_messages_equal_monte_carlo_moments(kernel, whiten):
    """The nested mean and total variance (message + propagation + compression) of a layer with a linear
    mean function equal the Monte-Carlo moments of the DSVI conditionals under x ~ N(μ, diag s)."""
    rng = np.random.default_rng(5)
    Z = rng.normal(size=(5, 2))
    layer = GPLayer(kernel, Z, 3, mean_weights=rng.normal(size=(2, 3)), whiten=whiten)
    random_q(layer.q, rng)
    mu, var = rng.normal(size=(4, 2)), rng.uniform(0.05, 0.4, size=(4, 2))
    mean, bSb, prop, comp = [t.numpy() for t in layer_terms(layer, mu, var)]
    S = 100_000
    x = mu[None] + np.sqrt(var)[None] * rng.standard_normal((S, 4, 2))
    m_s, v_s = [t.numpy() for t in layer.marginals(x)]  # [S, N, P]
    mc_mean, mc_var = m_s.mean(0), v_s.mean(0) + m_s.var(0)
    se = m_s.std(0) / np.sqrt(S)
    np.testing.assert_array_less(np.abs(mean - mc_mean), 5 * se + 1e-9)
    np.testing.assert_allclose(bSb + prop + comp, mc_var, rtol=0.03)


def test_nested_predict_f_matches_svgp_for_one_layer():
    X, Y = _data()
    rng = np.random.default_rng(7)
    k = RBF(1.3, [0.7, 1.4], ard=True)
    svgp = SVGP(k, Gaussian(0.2), X[:6].copy(), 1)
    random_q(svgp.q, rng)
    layer = GPLayer(k, X[:6].copy(), 1)
    layer.q.q_mu.assign(svgp.q.q_mu)
    layer.q.q_sqrt.assign(tf.convert_to_tensor(svgp.q.q_sqrt))
    model = DeepGP([layer], Gaussian(0.2), inference="nested")
    for ours, ref in zip(nested_predict_f(model, X), svgp.predict_f(X)):
        np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=1e-9, atol=1e-12)


def test_nested_rejects_unsupported_configurations():
    Z = np.zeros((3, 1))
    with pytest.raises(ConfigError):
        DeepGP([GPLayer(RBF(), Z, 1)], Bernoulli(), inference="nested")
    with pytest.raises(ConfigError):
        DeepGP([GPLayer(Matern32(), Z, 1)], Gaussian(), inference="nested")
    with pytest.raises(ConfigError):  # hidden layer without noise
        DeepGP([GPLayer(RBF(), Z, 1), GPLayer(RBF(), Z, 1)], Gaussian(), inference="nested")


@pytest.mark.parametrize("whiten,full_cov", [(True, True), (False, False)])
def test_deterministic_first_layer_equals_general_terms_at_zero_variance(whiten, full_cov):
    rng = np.random.default_rng(8)
    layer = GPLayer(RBF(1.2, [0.8, 1.5], ard=True), rng.normal(size=(5, 2)), 3, mean_weights=rng.normal(size=(2, 3)),
                    whiten=whiten, full_cov=full_cov)
    random_q(layer.q, rng)
    X = rng.normal(size=(6, 2))
    fast = layer_terms(layer, X)
    general = layer_terms(layer, X, np.zeros_like(X))
    for a, b in zip(fast, general):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-9, atol=1e-10)
