"""Cholesky with escalating jitter (float64 by default), shared by every GP computation."""

from __future__ import annotations

import tensorflow as tf

from gpseq.errors import NumericalError


def safe_cholesky(matrix, jitter: float = 1e-6, max_tries: int = 6, growth: float = 10.0):
    """Lower Cholesky factor of `matrix [..., M, M]` + jitter·I, escalating the jitter on failure.

    The first attempt always adds `jitter` (as GPflow does, so the two agree). TF's Cholesky
    returns NaNs for a matrix that is not positive definite (CPU, GPU and XLA alike), so each
    failing matrix of the batch is retried with its jitter multiplied by `growth`, up to
    `max_tries` attempts (jitter · growth^(max_tries-1) at most), inside a `tf.while_loop`
    (XLA-compilable). When a matrix cannot be factorised: eagerly this raises
    `gpseq.errors.NumericalError`; inside a `tf.function` the NaN factor is returned and the
    caller's non-finite loss check (e.g. `gpseq.gp.trainer.Trainer`) raises instead.
    """
    matrix = tf.convert_to_tensor(matrix)
    dtype = matrix.dtype
    size = tf.shape(matrix)[-1]
    eye = tf.eye(size, dtype=dtype)
    batch_shape = tf.shape(matrix)[:-2]
    base = tf.cast(jitter, dtype)

    def factor(jit):  # jit [...]: per-matrix jitter
        return tf.linalg.cholesky(matrix + jit[..., None, None] * eye)

    def ok(chol):  # [...] bool: factor finite
        return tf.reduce_all(tf.math.is_finite(chol), axis=[-2, -1])

    jit0 = tf.fill(batch_shape, base)
    chol0 = factor(jit0)

    def cond(i, jit, chol):
        return tf.logical_and(i < max_tries, tf.logical_not(tf.reduce_all(ok(chol))))

    def body(i, jit, chol):
        good = ok(chol)
        jit = tf.where(good, jit, jit * tf.cast(growth, dtype))
        retry = factor(jit)
        chol = tf.where(good[..., None, None], chol, retry)
        return i + 1, jit, chol

    _, _, chol = tf.while_loop(cond, body, (tf.constant(1), jit0, chol0))
    if tf.executing_eagerly() and not bool(tf.reduce_all(ok(chol))):
        raise NumericalError(
            f"Cholesky failed even with jitter {jitter * growth ** (max_tries - 1):.1e}: "
            "the kernel matrix is not positive definite (check hyperparameters and inputs)"
        )
    return chol
