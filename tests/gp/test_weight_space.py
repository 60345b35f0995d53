"""Weight-space linear GP layer: KL vs TFP, moments vs dense numpy, equivalence with GPflow's SVGP."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.stats
import tensorflow as tf
import tensorflow_probability as tfp

from gpseq.features.padded import PaddedRows, padded_from_csr
from gpseq.gp.weight_space import WeightSpaceLinear

tfd = tfp.distributions


def _layer(D, P, R, seed=0, prior_variance=0.7):
    rng = np.random.default_rng(seed)
    layer = WeightSpaceLinear(D, P, prior_variance=prior_variance, low_rank=R, seed=seed)
    layer.q_mu.assign(rng.normal(size=(D, P)))
    layer.q_variance.assign(tf.constant(rng.uniform(0.1, 0.9, size=(D, P))))
    if R:
        layer.q_factor.assign(0.3 * rng.normal(size=(D, P, R)))
    return layer


def _dense_cov(layer):
    """Σ_p [P, D, D] of q(w_p) as dense numpy."""
    s = np.asarray(layer.q_variance).T
    cov = np.stack([np.diag(sp_) for sp_ in s])
    if layer.q_factor is not None:
        U = np.transpose(layer.q_factor.numpy(), [1, 0, 2])
        cov = cov + U @ np.transpose(U, [0, 2, 1])
    return cov


@pytest.mark.parametrize("rank", [0, 2])
def test_kl_equals_tfp(rank):
    layer = _layer(7, 3, rank)
    cov = _dense_cov(layer)
    q = tfd.MultivariateNormalTriL(loc=layer.q_mu.numpy().T, scale_tril=np.linalg.cholesky(cov))
    p = tfd.MultivariateNormalDiag(loc=np.zeros(7), scale_diag=np.full(7, np.sqrt(0.7)))
    np.testing.assert_allclose(layer.kl(), tf.reduce_sum(tfd.kl_divergence(q, p)), rtol=1e-10)


@pytest.mark.parametrize("rank", [0, 2])
def test_marginals_blocks_and_joint_samples_match_dense(rank):
    rng = np.random.default_rng(5)
    D, P = 9, 2
    layer = _layer(D, P, rank, seed=1)
    X = sp.random(6, D, density=0.4, random_state=rng, format="lil")
    X[:, 0] = 0
    X[1] = X[0] * 2.0  # rows sharing features: correlated f
    X = sp.csr_matrix(X)
    rows = padded_from_csr(X, width=5)
    dense = X.toarray()
    cov = _dense_cov(layer)  # [P, D, D]
    mean, var = layer.marginals(rows)
    np.testing.assert_allclose(mean, dense @ layer.q_mu.numpy(), rtol=1e-10)
    full = np.einsum("nd,pde,me->pnm", dense, cov, dense)  # [P, N, N]
    np.testing.assert_allclose(var, np.einsum("pnn->np", full), rtol=1e-10)
    blocks = PaddedRows(rows.indices.reshape(2, 3, -1), rows.values.reshape(2, 3, -1))
    expected = np.stack([full[:, :3, :3], full[:, 3:, 3:]])
    np.testing.assert_allclose(layer.covariance_blocks(blocks), expected, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(layer.mean_f(blocks), mean.numpy().reshape(2, 3, P), rtol=1e-10)
    # joint samples over the batch: empirical mean and full covariance (incl. cross-row terms)
    S = 40000
    draws = layer.sample_f(rows, S, seed=(1, 2)).numpy()  # [S, N, P]
    assert draws.shape == (S, 6, P)
    for p in range(P):
        emp = np.cov(draws[:, :, p].T)
        np.testing.assert_allclose(emp, full[p], atol=0.04 * np.abs(full[p]).max())
    np.testing.assert_allclose(draws.mean(0), mean, atol=0.03 * np.sqrt(np.max(var)))
    # batch-local ids (the XLA path) give the same distribution; compiled
    ids, local = np.unique(rows.indices, return_inverse=True)
    local_rows = PaddedRows(local.reshape(rows.indices.shape).astype(np.int32), rows.values)
    fn = tf.function(lambda r_i, r_v, f: layer.sample_f(PaddedRows(r_i, r_v), S, (3, 4), feature_ids=f),
                     jit_compile=True)
    local_draws = fn(local_rows.indices, local_rows.values, ids.astype(np.int32)).numpy()
    np.testing.assert_allclose(np.cov(local_draws[:, :, 0].T), full[0], atol=0.04 * np.abs(full[0]).max())
    # full weight draws have the right moments too
    w = layer.sample_weights(20000, (5, 6)).numpy()  # [S, D, P]
    np.testing.assert_allclose(np.cov(w[:, :, 1].T), cov[1], atol=0.05)


@pytest.mark.parametrize("rank", [0, 1])
def test_equals_inducing_gp_with_linear_kernel_at_all_training_rows(gpflow, rank):
    """u = X w with X square and invertible: the inducing-point GP with Z = X and q(u) = the image
    of q(w) is the same posterior, so GPflow's SVGP gives the same predictions and ELBO."""
    rng = np.random.default_rng(11)
    N, P, sigma2, noise = 5, 2, 0.8, 0.3
    X = rng.normal(size=(N, N))  # real features are columns 1..N (column 0 is padding)
    Y = rng.normal(size=(N, P))
    layer = _layer(N + 1, P, rank, seed=2, prior_variance=sigma2)
    mu = layer.q_mu.numpy()
    mu[0] = 0.0
    layer.q_mu.assign(mu)
    s = np.asarray(layer.q_variance)
    s[0] = sigma2  # q(w_0) = prior: no KL from the unused padding column
    layer.q_variance.assign(tf.constant(s))
    if rank:
        U = layer.q_factor.numpy()
        U[0] = 0.0
        layer.q_factor.assign(U)
    rows = padded_from_csr(sp.csr_matrix(np.hstack([np.zeros((N, 1)), X])))
    cov = _dense_cov(layer)[:, 1:, 1:]  # [P, N, N] over the real columns
    S_u = np.einsum("nd,pde,me->pnm", X, cov, X)
    model = gpflow.models.SVGP(
        gpflow.kernels.Linear(variance=sigma2), gpflow.likelihoods.Gaussian(variance=noise), X.copy(),
        num_latent_gps=P, q_mu=X @ mu[1:], q_sqrt=np.linalg.cholesky(S_u), whiten=False,
    )
    old = gpflow.config.default_jitter()
    gpflow.config.set_default_jitter(1e-13)
    try:
        gp_elbo = model.elbo((X, Y)).numpy()
        X_test = rng.normal(size=(4, N))
        gp_mean, gp_var = model.predict_f(X_test)
    finally:
        gpflow.config.set_default_jitter(old)
    mean, var = layer.marginals(rows)
    var_exp = -0.5 * np.log(2 * np.pi * noise) - 0.5 * ((Y - mean.numpy()) ** 2 + var.numpy()) / noise
    ours = var_exp.sum() - layer.kl().numpy()
    np.testing.assert_allclose(ours, gp_elbo, rtol=1e-7)
    test_rows = padded_from_csr(sp.csr_matrix(np.hstack([np.zeros((4, 1)), X_test])))
    t_mean, t_var = layer.marginals(test_rows)
    np.testing.assert_allclose(t_mean, gp_mean, rtol=1e-6)
    np.testing.assert_allclose(t_var, gp_var, rtol=1e-6)


def test_prior_variance_learnable_and_gradients_flow():
    layer = WeightSpaceLinear(5, 2, prior_variance=0.5, learn_prior_variance=True, initial_variance=1e-3)
    assert len(layer.trainable_variables) == 3
    rows = PaddedRows(np.array([[1, 3]], np.int32), np.array([[1.0, 2.0]]))
    with tf.GradientTape() as tape:
        mean, var = layer.marginals(rows)
        loss = layer.kl() + tf.reduce_sum(mean**2 + var)
    grads = tape.gradient(loss, layer.trainable_variables)
    assert all(g is not None for g in grads)


def test_a_weights_draw_is_keyed_by_its_feature_id():
    """Under one seed, the draw of w_d is the same whichever other rows are drawn with it (noise keyed
    by the feature id, `gpseq.gp.hashed`), and equals the row of a draw of all the weights; the draws
    of distinct rows, and of one row under distinct seeds, are independent standard normals."""
    from gpseq.gp.hashed import hashed_normal

    D, P, S = 12, 3, 5
    layer = WeightSpaceLinear(D, P, dtype=tf.float64)
    layer.q_mu.assign(np.random.default_rng(0).normal(size=(D, P)))
    rows = lambda ids: PaddedRows(np.array([[i] for i in ids], np.int32), np.ones((len(ids), 1)))  # noqa: E731
    first = layer.sample_f(rows([3, 7]), S, seed=(1, 2)).numpy()  # [S, 2, P]
    second = layer.sample_f(rows([7, 9, 11]), S, seed=(1, 2)).numpy()
    np.testing.assert_array_equal(first[:, 1], second[:, 0])  # row 7 in both
    whole = layer.sample_weights(S, (1, 2)).numpy()  # [S, D, P]
    np.testing.assert_allclose(whole[:, [3, 7, 9, 11]], np.concatenate([first, second[:, 1:]], 1), rtol=1e-12)
    other = layer.sample_f(rows([3, 7]), S, seed=(1, 3)).numpy()
    assert not np.allclose(other, first)
    # tensor seeds: standard normal entries, independent across seeds and ids
    z = {seed: hashed_normal(np.arange(20_000), 25, tf.constant(seed, tf.int32), tf.float64).numpy()
         for seed in [(1, 2), (1, 3), (2, 2)]}
    for draws in z.values():
        assert scipy.stats.kstest(draws.ravel()[::3], "norm").pvalue > 1e-3
        assert abs(draws.mean()) < 5e-3 and abs(draws.var() - 1.0) < 5e-3
        assert abs(np.corrcoef(draws[:-1, 0], draws[1:, 0])[0, 1]) < 0.03
    for a, b in [((1, 2), (1, 3)), ((1, 2), (2, 2)), ((1, 3), (2, 2))]:
        assert abs(np.corrcoef(z[a].ravel(), z[b].ravel())[0, 1]) < 5e-3
