"""Cholesky with escalating jitter (float64 by default), shared by every GP computation."""

from __future__ import annotations

import tensorflow as tf

from gpseq.errors import NumericalError


def safe_cholesky(matrix, jitter: float = 1e-6, max_tries: int = 6, growth: float = 10.0):
    """Lower Cholesky factor of `matrix [..., M, M]` + jitter·I, escalating the jitter on failure.

    The first attempt always adds `jitter` (as GPflow does, so the two agree). TF's Cholesky
    returns NaNs for a matrix that is not positive definite (CPU, GPU and XLA alike), so each
    failing matrix of the batch is retried with its jitter multiplied by `growth`, up to
    `max_tries` attempts (jitter · growth^(max_tries-1) at most), inside a bounded `tf.while_loop`
    on a gradient-free copy (XLA-compilable; only the final factor is differentiated). When a
    matrix cannot be factorised: eagerly this raises `gpseq.errors.NumericalError`; inside a `tf.function` the NaN factor is returned and the
    caller's non-finite loss check (e.g. `gpseq.training.trainer.Trainer`) raises instead.
    """
    matrix = tf.convert_to_tensor(matrix)
    chol = _escalating_cholesky(matrix, tf.cast(jitter, matrix.dtype), max_tries, growth)
    if tf.executing_eagerly() and not bool(tf.reduce_all(tf.math.is_finite(chol))):
        raise NumericalError(
            f"Cholesky failed even with jitter {jitter * growth ** (max_tries - 1):.1e}: "
            "the kernel matrix is not positive definite (check hyperparameters and inputs)"
        )
    return chol


def _factor_ok(chol):  # [...] bool: factor finite (TF's factor of a failing matrix is NaN, diagonal included)
    return tf.reduce_all(tf.math.is_finite(tf.linalg.diag_part(chol)), axis=-1)


def _escalating_cholesky(matrix, jitter, max_tries, growth):
    """Forward: bounded jitter escalation per matrix. Backward: the Cholesky derivative at the
    jitter that was used (the jitter is a constant), so the while loop is never differentiated —
    this keeps the gradient one factorisation and XLA-compilable."""

    @tf.custom_gradient
    def run(a):
        eye = tf.eye(tf.shape(a)[-1], dtype=a.dtype)
        jit0 = tf.fill(tf.shape(a)[:-2], jitter)
        chol0 = tf.linalg.cholesky(a + jit0[..., None, None] * eye)

        def cond(jit, chol):
            return tf.logical_not(tf.reduce_all(_factor_ok(chol)))

        def body(jit, chol):
            good = _factor_ok(chol)
            jit = tf.where(good, jit, jit * tf.cast(growth, a.dtype))
            retry = tf.linalg.cholesky(a + jit[..., None, None] * eye)
            return jit, tf.where(good[..., None, None], chol, retry)

        _, chol = tf.while_loop(cond, body, (jit0, chol0), maximum_iterations=max_tries - 1)

        def grad(upstream):
            # Ā = sym(L⁻ᵀ Φ(Lᵀ L̄) L⁻¹), Φ = lower triangle with the diagonal halved (Murray 2016), by two
            # triangular solves (L⁻ᵀ (L⁻ᵀ Φ)ᵀ = (L⁻ᵀ Φ L⁻¹)ᵀ; symmetrised anyway) rather than forming L⁻¹
            middle = tf.linalg.matmul(chol, upstream, adjoint_a=True)
            middle = tf.linalg.band_part(middle, -1, 0) - 0.5 * tf.linalg.diag(tf.linalg.diag_part(middle))
            left = tf.linalg.triangular_solve(chol, middle, lower=True, adjoint=True)  # L⁻ᵀ Φ
            g = tf.linalg.triangular_solve(chol, tf.linalg.matrix_transpose(left), lower=True, adjoint=True)
            return 0.5 * (g + tf.linalg.matrix_transpose(g))

        return chol, grad

    return run(matrix)
