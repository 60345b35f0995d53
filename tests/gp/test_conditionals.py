"""Conditionals: marginals vs GPflow's conditional; per-sequence blocks vs the brute-force N × N q(f)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

from gpseq.features.padded import PaddedRows, padded_from_csr
from gpseq.gp.conditionals import conditional_blocks, conditional_marginals, mixture_blocks
from gpseq.gp.kernels import RBF

# The GPflow comparison takes conftest's `gpflow` fixture (it skips cleanly without GPflow).


def _q(rng, M, P, full):
    q_mu = rng.normal(size=(M, P))
    if full:
        q_sqrt = np.tril(0.3 * rng.normal(size=(P, M, M)), -1) + np.eye(M) * rng.uniform(0.2, 1.0, (P, M, 1))
    else:
        q_sqrt = rng.uniform(0.2, 1.0, size=(M, P))
    return q_mu, q_sqrt


@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("whiten", [True, False])
def test_marginals_match_gpflow(gpflow, full, whiten):
    rng = np.random.default_rng(0)
    X, Z = rng.normal(size=(8, 2)), rng.normal(size=(5, 2))
    k_ours, k_gpf = RBF(1.3, 0.9), gpflow.kernels.SquaredExponential(variance=1.3, lengthscales=0.9)
    q_mu, q_sqrt = _q(rng, 5, 3, full)
    Kzz = k_ours.K(Z).numpy() + 1e-6 * np.eye(5)
    mean, var = conditional_marginals(k_ours.K(X, Z), np.linalg.cholesky(Kzz), k_ours.K_diag(X), q_mu, q_sqrt, whiten)
    g_mean, g_var = gpflow.conditionals.conditional(
        X, gpflow.inducing_variables.InducingPoints(Z), k_gpf, tf.constant(q_mu), q_sqrt=tf.constant(q_sqrt),
        white=whiten, full_cov=False,
    )
    np.testing.assert_allclose(mean, g_mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(var, g_var, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("whiten", [True, False])
def test_blocks_equal_the_diagonal_blocks_of_the_full_posterior(full, whiten):
    rng = np.random.default_rng(1)
    B, T, D, M, P = 3, 4, 10, 6, 2
    X = sp.random(B * T, D, density=0.35, random_state=rng, format="lil")
    X[:, 0] = 0
    X = sp.csr_matrix(X)
    rows = padded_from_csr(X, width=6)
    blocks = PaddedRows(rows.indices.reshape(B, T, -1), rows.values.reshape(B, T, -1))
    Z = rng.normal(size=(M, D))
    kernel = RBF(1.1, 1.6)
    q_mu, q_sqrt = _q(rng, M, P, full)
    # brute force in numpy on dense X: the full N × N covariance of q(f)
    dense = X.toarray()
    Kxx, Kxz, Kzz = (kernel.K(a, b).numpy() for a, b in ((dense, None), (dense, Z), (Z, None)))
    Kzz = Kzz + 1e-8 * np.eye(M)
    L = np.linalg.cholesky(Kzz)
    A = Kxz @ np.linalg.inv(Kzz)
    S = q_sqrt @ np.swapaxes(q_sqrt, -1, -2) if full else np.stack([np.diag(q_sqrt[:, p] ** 2) for p in range(P)])
    if whiten:  # q(u) = N(L m, L S Lᵀ)
        m_u, S_u = L @ q_mu, L @ S @ L.T
    else:
        m_u, S_u = q_mu, S
    full_mean = A @ m_u  # [N, P]
    full_cov = Kxx - A @ Kxz.T + A @ S_u @ A.T  # [P, N, N]
    kxz_b = kernel.K(blocks, Z)  # [B, T, M] from sparse rows
    mean, cov = conditional_blocks(kxz_b, L, kernel.K_sparse_block(blocks), q_mu, q_sqrt, whiten)
    np.testing.assert_allclose(mean, full_mean.reshape(B, T, P), rtol=1e-8, atol=1e-10)
    for b in range(B):
        sl = slice(b * T, (b + 1) * T)
        np.testing.assert_allclose(cov[b], full_cov[:, sl, sl], rtol=1e-8, atol=1e-10)
    # marginals agree with the blocks' diagonals
    m2, v2 = conditional_marginals(kernel.K(rows, Z), L, kernel.K_diag(rows), q_mu, q_sqrt, whiten)
    np.testing.assert_allclose(v2.numpy().reshape(B, T, P), np.einsum("bptt->btp", cov.numpy()), rtol=1e-10)
    # mixture helper: component k equals the single-component call; compiles under XLA
    fn = tf.function(lambda kxz, kxx, mu, sq: mixture_blocks(kxz, L, kxx, mu, sq, whiten), jit_compile=True)
    mk, ck = fn(kxz_b, kernel.K_sparse_block(blocks), np.stack([q_mu, 2 * q_mu]), np.stack([q_sqrt, q_sqrt]))
    np.testing.assert_allclose(mk[1], 2 * mean.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ck[0], cov, rtol=1e-10, atol=1e-12)
