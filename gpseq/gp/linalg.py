"""Cholesky with escalating jitter (float64 by default), shared by every GP computation, and the
whitened solve L⁻¹ K_zx differentiated as one op."""

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

    @tf.custom_gradient
    def run(a):
        chol = _escalating_cholesky(a, tf.cast(jitter, a.dtype), max_tries, growth)

        def grad(upstream):
            return _cholesky_backward(chol, tf.linalg.matmul(chol, upstream, adjoint_a=True))  # Lᵀ L̄

        return chol, grad

    chol = run(matrix)
    _raise_if_failed_eagerly(chol, jitter * growth ** (max_tries - 1))
    return chol


def whitened_solve(matrix, rhs, jitter: float = 1e-6, max_tries: int = 6, growth: float = 10.0):
    """A = L⁻¹ `rhs [..., M, N]` with L = `safe_cholesky(matrix [..., M, M], jitter, ...)` (the whitened
    projection L⁻¹ K_zx of graybox-structured-gp eq. 17), differentiated as one op when L itself is
    not needed:

        ∂/∂rhs = L⁻ᵀ Ā,    ∂/∂matrix = −sym(L⁻ᵀ Φ(Ā Aᵀ) L⁻¹),

    the chain rule through the solve and the factor (Φ(Lᵀ L̄) with L̄ = −tril(L⁻ᵀ Ā Aᵀ) is −Φ(Ā Aᵀ),
    since Lᵀ times a strictly upper triangle stays strictly upper), which skips the M³ product Lᵀ L̄.
    """
    matrix = tf.convert_to_tensor(matrix)
    rhs = tf.convert_to_tensor(rhs, matrix.dtype)
    chol_out = []

    @tf.custom_gradient
    def run(a, b):
        chol = _escalating_cholesky(a, tf.cast(jitter, a.dtype), max_tries, growth)
        chol_out.append(chol)
        out = tf.linalg.triangular_solve(chol, b, lower=True)

        def grad(upstream):
            rhs_grad = tf.linalg.triangular_solve(chol, upstream, lower=True, adjoint=True)
            return _cholesky_backward(chol, -tf.linalg.matmul(upstream, out, adjoint_b=True)), rhs_grad

        return out, grad

    out = run(matrix, rhs)
    _raise_if_failed_eagerly(chol_out[0], jitter * growth ** (max_tries - 1))
    return out


def _raise_if_failed_eagerly(chol, last_jitter):
    if tf.executing_eagerly() and not bool(tf.reduce_all(_factor_ok(chol))):
        raise NumericalError(
            f"Cholesky failed even with jitter {last_jitter:.1e}: "
            "the kernel matrix is not positive definite (check hyperparameters and inputs)"
        )


def _factor_ok(chol):  # [...] bool: factor finite (TF's factor of a failing matrix is NaN, diagonal included)
    return tf.reduce_all(tf.math.is_finite(tf.linalg.diag_part(chol)), axis=-1)


def _escalating_cholesky(a, jitter, max_tries, growth):
    """Forward only: bounded jitter escalation per matrix. The callers' gradients are the Cholesky
    derivative at the jitter that was used (a constant), so the while loop is never differentiated —
    this keeps the gradient one factorisation and XLA-compilable."""
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

    def escalate():
        return tf.while_loop(cond, body, (jit0, chol0), maximum_iterations=max_tries - 1)[1]

    # the loop only behind a cond: a graph's while loop costs its frame ops every step, even at 0 iterations
    return tf.cond(tf.reduce_all(_factor_ok(chol0)), lambda: chol0, escalate)


def _cholesky_backward(chol, middle):
    """Ā = sym(L⁻ᵀ Φ(middle) L⁻¹) for middle = Lᵀ L̄, Φ = lower triangle with the diagonal halved
    (Murray 2016), by two triangular solves (L⁻ᵀ (L⁻ᵀ Φ)ᵀ = (L⁻ᵀ Φ L⁻¹)ᵀ; symmetrised anyway)
    rather than forming L⁻¹."""
    phi = tf.linalg.band_part(middle, -1, 0) - 0.5 * tf.linalg.diag(tf.linalg.diag_part(middle))
    left = tf.linalg.triangular_solve(chol, phi, lower=True, adjoint=True)  # L⁻ᵀ Φ
    g = tf.linalg.triangular_solve(chol, tf.linalg.matrix_transpose(left), lower=True, adjoint=True)
    return 0.5 * (g + tf.linalg.matrix_transpose(g))
