"""Kernels: dense vs GPflow, sparse (padded) inputs vs the densified input, safe_cholesky."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

from gpseq.errors import NumericalError
from gpseq.features.padded import PaddedRows, padded_from_csr
from gpseq.gp.kernels import RBF, Linear, Matern32, Matern52, Product, Sum, sparse_gram_blocks
from gpseq.gp.linalg import safe_cholesky, whitened_solve

# The GPflow comparisons take conftest's `gpflow` fixture (they skip cleanly without GPflow).


def _random_csr(rng, n, d, density=0.3):
    m = sp.random(n, d, density=density, random_state=rng, format="csc").tolil()
    m[:, 0] = 0.0  # column 0 is the padding id
    return sp.csr_matrix(m)


def _kernel_pairs(gpflow):
    ls = np.array([0.7, 1.3, 2.0])
    return [
        (Linear(0.8), gpflow.kernels.Linear(variance=0.8)),
        (RBF(1.7, 0.9), gpflow.kernels.SquaredExponential(variance=1.7, lengthscales=0.9)),
        (RBF(1.7, ls, ard=True), gpflow.kernels.SquaredExponential(variance=1.7, lengthscales=ls)),
        (Matern32(0.6, ls, ard=True), gpflow.kernels.Matern32(variance=0.6, lengthscales=ls)),
        (Matern52(1.2, 1.1), gpflow.kernels.Matern52(variance=1.2, lengthscales=1.1)),
    ]


@pytest.mark.parametrize("index", range(5))
def test_dense_kernels_match_gpflow(gpflow, index):
    ours, theirs = _kernel_pairs(gpflow)[index]
    rng = np.random.default_rng(index)
    X, Z = rng.normal(size=(7, 3)), rng.normal(size=(4, 3))
    np.testing.assert_allclose(ours.K(X, Z), theirs.K(X, Z), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours.K(X), theirs.K(X), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours.K_diag(X), theirs.K_diag(X), rtol=1e-10, atol=1e-12)


def test_sum_and_product_match_gpflow(gpflow):
    rng = np.random.default_rng(1)
    X, Z = rng.normal(size=(6, 2)), rng.normal(size=(3, 2))
    ours = Sum([Linear(0.5), Product([RBF(1.5, 0.8), Matern32(0.7, 1.9)])])
    theirs = gpflow.kernels.Linear(variance=0.5) + gpflow.kernels.SquaredExponential(
        variance=1.5, lengthscales=0.8
    ) * gpflow.kernels.Matern32(variance=0.7, lengthscales=1.9)
    np.testing.assert_allclose(ours.K(X, Z), theirs.K(X, Z), rtol=1e-10)
    np.testing.assert_allclose(ours.K_diag(X), theirs.K_diag(X), rtol=1e-10)


@pytest.mark.parametrize("kernel", [Linear(0.7), RBF(1.3, 1.7), Matern52(0.9, 2.1),
                                    Sum([Linear(0.3), RBF(1.0, 1.5)])], ids=["lin", "rbf", "m52", "sum"])
def test_sparse_inputs_equal_dense_computation(kernel):
    rng = np.random.default_rng(3)
    X = _random_csr(rng, 9, 12)
    rows = padded_from_csr(X, width=X.getnnz(axis=1).max() + 2)  # extra padding slots
    Z = rng.normal(size=(5, 12))
    dense = X.toarray()
    np.testing.assert_allclose(kernel.K(rows, Z), kernel.K(dense, Z), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(kernel.K(rows), kernel.K(dense), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(kernel.K_diag(rows), kernel.K_diag(dense), rtol=1e-10, atol=1e-12)
    # blocks of sequences [B, T, F] vs per-block dense Gram
    blocks = PaddedRows(rows.indices[:8].reshape(2, 4, -1), rows.values[:8].reshape(2, 4, -1))
    expected = np.stack([kernel.K(dense[:4]), kernel.K(dense[4:8])])
    np.testing.assert_allclose(kernel.K_sparse_block(blocks), expected, rtol=1e-10, atol=1e-12)
    # leading batch dims beyond one are kept
    blocks4 = PaddedRows(rows.indices[:8].reshape(2, 1, 4, -1), rows.values[:8].reshape(2, 1, 4, -1))
    np.testing.assert_allclose(kernel.K_sparse_block(blocks4)[:, 0], expected, rtol=1e-10, atol=1e-12)


def test_gram_blocks_with_repeated_indices_and_xla():
    # a row listing the same index twice means x_d = v1 + v2; the sort-based Gram sums them.
    indices = np.array([[[3, 3, 0], [1, 3, 0], [2, 0, 0]]], np.int32)
    values = np.array([[[1.0, 2.0, 0.0], [0.5, -1.0, 0.0], [4.0, 0.0, 0.0]]])
    dense = np.zeros((3, 5))
    for t in range(3):
        for i, v in zip(indices[0, t], values[0, t]):
            dense[t, i] += v
    fn = tf.function(lambda i, v: sparse_gram_blocks(PaddedRows(i, v)), jit_compile=True)
    np.testing.assert_allclose(fn(indices, values)[0], dense @ dense.T, rtol=1e-12)
    rbf = RBF(1.0, 2.0)
    kern = tf.function(lambda i, v, z: rbf.K(PaddedRows(i, v), z), jit_compile=True)
    Z = np.random.default_rng(0).normal(size=(2, 5))
    np.testing.assert_allclose(kern(indices[0], values[0], Z), RBF(1.0, 2.0).K(dense, Z), rtol=1e-12)


def test_hyperparameters_are_learnable_and_positive():
    k = RBF(1.0, 1.0)
    X = np.random.default_rng(0).normal(size=(5, 2))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(k.K(X))
    grads = tape.gradient(loss, k.trainable_variables)
    assert len(grads) == 2 and all(g is not None for g in grads)
    k.variance.assign(tf.constant(1e-8, tf.float64))
    assert float(tf.convert_to_tensor(k.variance)) > 0


def test_ard_on_sparse_input_is_refused():
    from gpseq.errors import ConfigError

    with pytest.raises(ConfigError):
        RBF(1.0, [1.0, 2.0], ard=True).K(PaddedRows(np.array([[1]], np.int32), np.array([[1.0]])),
                                          np.ones((1, 2)))


def test_safe_cholesky_escalates_and_raises():
    a = np.array([[1.0, 1.0], [1.0, 1.0]])  # singular PSD: needs jitter
    neg = np.array([[1.0, 0.0], [0.0, -1e-4]])  # needs jitter > 1e-4
    good = np.eye(2) * 2.0
    batch = np.stack([good, neg, a])
    chol = safe_cholesky(batch, jitter=1e-8)
    assert np.all(np.isfinite(chol))
    # the good matrix kept the smallest jitter
    np.testing.assert_allclose(chol[0], np.linalg.cholesky(good + 1e-8 * np.eye(2)), rtol=1e-14)
    # the indefinite one escalated until it became positive definite: 1e-8·10^k > 1e-4 ⇒ k = 4 (1e-3)
    np.testing.assert_allclose(chol[1], np.linalg.cholesky(neg + 1e-3 * np.eye(2)), rtol=1e-8)
    with pytest.raises(NumericalError):
        safe_cholesky(-np.eye(3), jitter=1e-6, max_tries=3)
    compiled = tf.function(lambda m: safe_cholesky(m, jitter=1e-8), jit_compile=True)
    np.testing.assert_allclose(compiled(batch), chol, rtol=1e-12)


def test_safe_cholesky_gradient_under_xla_through_escalation():
    base = tf.constant([[1.0, 1.0], [1.0, 1.0 - 1e-4]], tf.float64)  # indefinite until jitter ≥ ~1e-4

    @tf.function(jit_compile=True)
    def fn(scale):
        with tf.GradientTape() as tape:
            tape.watch(scale)
            out = tf.reduce_sum(safe_cholesky(scale * base, jitter=1e-8))
        return out, tape.gradient(out, scale)

    value, grad = fn(tf.constant(1.0, tf.float64))
    eps = 1e-6
    # finite difference at the escalated jitter (1e-8·10⁴ = 1e-4: the smallest making it definite)
    f = lambda s: np.linalg.cholesky(s * base.numpy() + 1e-4 * np.eye(2)).sum()  # noqa: E731
    np.testing.assert_allclose(value, f(1.0), rtol=1e-8)
    np.testing.assert_allclose(grad, (f(1 + eps) - f(1 - eps)) / (2 * eps), rtol=1e-5)


def test_whitened_solve_value_and_gradients_equal_numpy():
    """L⁻¹ B and its fused gradients (w.r.t. the matrix and B) against NumPy values and central finite
    differences of a scalar function of L⁻¹ B, batched, eagerly and under XLA; a failing matrix raises."""
    rng = np.random.default_rng(0)
    G = rng.normal(size=(2, 4, 4))
    K = G @ np.swapaxes(G, -1, -2) + 0.5 * np.eye(4)  # [2, 4, 4]
    B = rng.normal(size=(2, 4, 3))
    W = rng.normal(size=(2, 4, 3))  # the scalar is Σ W ∘ (L⁻¹ B)²

    def numpy_value(K, B):
        L = np.linalg.cholesky(K + 1e-6 * np.eye(4))
        return np.sum(W * np.linalg.solve(L, B) ** 2)

    def fn(K, B):
        with tf.GradientTape() as tape:
            tape.watch([K, B])
            value = tf.reduce_sum(W * whitened_solve(K, B, jitter=1e-6) ** 2)
        return value, tape.gradient(value, [K, B])

    eps = 1e-6
    for run in (fn, tf.function(fn, jit_compile=True)):
        value, (grad_K, grad_B) = run(tf.constant(K), tf.constant(B))
        np.testing.assert_allclose(value, numpy_value(K, B), rtol=1e-12)
        for i, j in [(0, 0), (1, 2), (3, 1)]:  # a symmetric perturbation of entry (i, j) and (j, i)
            E = np.zeros((2, 4, 4))
            E[:, i, j] = E[:, j, i] = 1.0
            fd = (numpy_value(K + eps * E, B) - numpy_value(K - eps * E, B)) / (2 * eps)
            np.testing.assert_allclose(np.sum(grad_K.numpy() * E), fd, rtol=1e-6)
        E = np.zeros_like(B)
        E[1, 2, 0] = 1.0
        fd = (numpy_value(K, B + eps * E) - numpy_value(K, B - eps * E)) / (2 * eps)
        np.testing.assert_allclose(grad_B[1, 2, 0], fd, rtol=1e-6)
    with pytest.raises(NumericalError):
        whitened_solve(-np.eye(3), np.ones((3, 1)), jitter=1e-6, max_tries=3)
