"""q(u): exact KL (K = 1) vs numpy closed form; mixture Jensen bound vs Monte Carlo KL; samples."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from scipy.special import logsumexp
from scipy.stats import multivariate_normal

from gpseq.gp.variational import VariationalGaussian


def _set_random(q, seed):
    rng = np.random.default_rng(seed)
    K, M, P = q.num_components, q.num_inducing, q.num_latent
    q.q_mu.assign(rng.normal(size=(K, M, P)))
    if q.full_cov:
        L = np.tril(0.3 * rng.normal(size=(K, P, M, M)), -1) + np.eye(M) * rng.uniform(0.3, 1.2, size=(K, P, M, 1))
        q.q_sqrt.assign(tf.constant(L))
    else:
        q.q_sqrt.assign(tf.constant(rng.uniform(0.3, 1.2, size=(K, M, P))))
    if K > 1:
        q.mixture_logits.assign(rng.normal(size=K))


def _covs(q):
    """[K, P, M, M] numpy covariances."""
    s = tf.convert_to_tensor(q.q_sqrt).numpy()
    if q.full_cov:
        return s @ np.swapaxes(s, -1, -2)
    return np.stack([[np.diag(s[k, :, p] ** 2) for p in range(s.shape[2])] for k in range(s.shape[0])])


def _kzz(M, seed=0):
    A = np.random.default_rng(seed).normal(size=(M, M))
    return A @ A.T + M * np.eye(M)


def _gauss_kl(m, S, K):
    """Closed-form KL(N(m, S) ‖ N(0, K))."""
    Kinv = np.linalg.inv(K)
    return 0.5 * (np.trace(Kinv @ S) + m @ Kinv @ m - len(m) + np.linalg.slogdet(K)[1] - np.linalg.slogdet(S)[1])


@pytest.mark.parametrize("full_cov", [True, False])
@pytest.mark.parametrize("whiten", [True, False])
def test_single_component_kl_is_exact(full_cov, whiten):
    M, P = 4, 3
    q = VariationalGaussian(M, P, full_cov=full_cov, whiten=whiten)
    _set_random(q, 1)
    Kzz = np.eye(M) if whiten else _kzz(M)
    chol = None if whiten else np.linalg.cholesky(Kzz)
    covs, mu = _covs(q), q.q_mu.numpy()
    expected = sum(_gauss_kl(mu[0, :, p], covs[0, p], Kzz) for p in range(P))
    np.testing.assert_allclose(q.kl(chol), expected, rtol=1e-10)


@pytest.mark.parametrize("full_cov", [True, False])
def test_mixture_bound_is_an_upper_bound_on_the_monte_carlo_kl(full_cov):
    M, P, K = 3, 2, 3
    q = VariationalGaussian(M, P, full_cov=full_cov, whiten=False, num_components=K)
    _set_random(q, 4)
    Kzz = _kzz(M, 2)
    chol = np.linalg.cholesky(Kzz)
    mu, covs, pi = q.q_mu.numpy(), _covs(q), q.mixture_weights().numpy()
    rng = np.random.default_rng(9)
    S = 60000
    comp = rng.choice(K, size=S, p=pi)
    u = np.empty((S, P, M))
    for k in range(K):
        idx = comp == k
        for p in range(P):
            u[idx, p] = rng.multivariate_normal(mu[k, :, p], covs[k, p], size=idx.sum())
    log_q = logsumexp(
        np.stack([np.log(pi[k]) + sum(multivariate_normal(mu[k, :, p], covs[k, p]).logpdf(u[:, p]) for p in range(P))
                  for k in range(K)]), axis=0)
    log_p = sum(multivariate_normal(np.zeros(M), Kzz).logpdf(u[:, p]) for p in range(P))
    terms = log_q - log_p
    mc_kl, stderr = terms.mean(), terms.std() / np.sqrt(S)
    bound = float(q.kl(chol))
    assert bound >= mc_kl - 4 * stderr
    # and not vacuous: the entropy bound is within M·P/2·log(e/2)·(a bit) of the truth here
    assert bound - mc_kl < 0.5 * M * P * np.log(np.e / 2) + 4 * stderr + 0.5


def test_mixture_bound_with_identical_components_equals_its_closed_form():
    """K identical components: q is one Gaussian; the bound is CE − (−log N(m; m, 2S)) exactly."""
    M, P = 3, 1
    q = VariationalGaussian(M, P, whiten=True, num_components=2)
    _set_random(q, 0)
    q.q_mu.assign(np.repeat(q.q_mu.numpy()[:1], 2, 0))
    q.q_sqrt.assign(tf.constant(np.repeat(tf.convert_to_tensor(q.q_sqrt).numpy()[:1], 2, 0)))
    m, S = q.q_mu.numpy()[0, :, 0], _covs(q)[0, 0]
    exact = _gauss_kl(m, S, np.eye(M))
    entropy = 0.5 * (M * np.log(2 * np.pi * np.e) + np.linalg.slogdet(S)[1])
    jensen_entropy = -multivariate_normal(m, 2 * S).logpdf(m)
    np.testing.assert_allclose(q.kl(), exact + entropy - jensen_entropy, rtol=1e-10)


def test_sample_u_moments():
    q = VariationalGaussian(3, 2, num_components=2)
    _set_random(q, 3)
    draws = q.sample_u(30000, seed=(1, 2)).numpy()  # [K, S, M, P]
    assert draws.shape == (2, 30000, 3, 2)
    covs = _covs(q)
    for k in range(2):
        np.testing.assert_allclose(draws[k].mean(0), q.q_mu.numpy()[k], atol=0.05)
        np.testing.assert_allclose(np.cov(draws[k, :, :, 1].T), covs[k, 1], atol=0.06)


def test_parameters_are_trainable_and_constrained():
    q = VariationalGaussian(3, 2, num_components=2)
    names = sorted(v.name.split(":")[0] for v in q.trainable_variables)
    assert len(names) == 3
    single = VariationalGaussian(3, 2)
    assert len(single.trainable_variables) == 2  # mixture logits frozen for K = 1
    with tf.GradientTape() as tape:
        kl = q.kl()
    assert all(g is not None for g in tape.gradient(kl, q.trainable_variables))


@pytest.mark.parametrize("M", [1, 2, 5, 9])
def test_full_scale_equals_the_tfp_bijector_with_its_gradient(M, tmp_path):
    """`parameters()`'s q_sqrt (one gather, own gradient) equals TFP's FillScaleTriL(Softplus) forward
    of the same stored variable, and its gradient equals autodiff through the bijector; a checkpoint of
    q(u) (the stored layout unchanged) restores into a new q(u) with the same parameters."""
    import tensorflow_probability as tfp

    q = VariationalGaussian(M, 3, num_components=2)
    raw = q.q_sqrt.pretransformed_input
    raw.assign(np.random.default_rng(M).normal(size=raw.shape))
    bijector = tfp.bijectors.FillScaleTriL(diag_bijector=tfp.bijectors.Softplus(), diag_shift=None)
    weights = tf.constant(np.random.default_rng(M + 1).normal(size=(2, 3, M, M)))
    with tf.GradientTape(persistent=True) as tape:
        ours, theirs = q.parameters()[1], bijector.forward(raw)
        ours_loss, their_loss = tf.reduce_sum(weights * ours**2), tf.reduce_sum(weights * theirs**2)
    np.testing.assert_allclose(ours, theirs, rtol=1e-15, atol=0)
    assert np.all(np.triu(ours.numpy(), 1) == 0.0)
    np.testing.assert_allclose(tape.gradient(ours_loss, raw), tape.gradient(their_loss, raw), rtol=1e-12, atol=1e-14)
    path = tf.train.Checkpoint(q=q).write(str(tmp_path / "q"))
    restored = VariationalGaussian(M, 3, num_components=2)
    tf.train.Checkpoint(q=restored).read(path).assert_consumed()
    for a, b in zip(restored.parameters(), q.parameters()):
        np.testing.assert_array_equal(a, b)
