"""The log-semiring matrix product and the sequential forward pass of the linear chain, exact for
any finite potentials and fast when nothing underflows (`chain.py` builds on these).

log(exp(a) @ exp(b)) runs as one max-shifted matrix product (a GEMM); a product entry below
`underflow_bound` means a sum lost terms, and the computation is then redone by a broadcast
log-sum-exp. Gradients are written out so that the fallback's `[..., M, K, N]` intermediates are
never kept, and no control flow is differentiated (XLA cannot differentiate a conditional around
a loop).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def _shifted_product(a, b):
    """exp(a − a_max) @ exp(b − b_max) and the shifts, for `a [..., M, K]`, `b [..., K, N]`."""
    a_max = tf.stop_gradient(tf.reduce_max(a, axis=-1, keepdims=True))  # [..., M, 1]
    b_max = tf.stop_gradient(tf.reduce_max(b, axis=-2, keepdims=True))  # [..., 1, N]
    return tf.linalg.matmul(tf.exp(a - a_max), tf.exp(b - b_max)), a_max, b_max


def fast_log_matmul_exp(a, b):
    """log(exp(a) @ exp(b)) `[..., M, N]` by one max-shifted matmul, and its smallest shifted entry.

    Exact to rounding while that entry is above `underflow_bound`; otherwise the caller must
    redo the computation with `log_matmul_exp`. Clamping keeps values and gradients finite even
    then, so a discarded fast result never sends NaN into a gradient.
    """
    product, a_max, b_max = _shifted_product(a, b)
    product = tf.maximum(product, np.finfo(a.dtype.as_numpy_dtype).tiny)
    return tf.math.log(product) + a_max + b_max, tf.stop_gradient(tf.reduce_min(product))


def underflow_bound(dtype, num_terms: int):
    """Smallest shifted-product entry that is exact to rounding: every dropped (underflowed)
    term is below `tiny`, so `num_terms · tiny / eps` bounds the relative loss by eps.
    """
    info = np.finfo(dtype.as_numpy_dtype)
    return tf.constant(num_terms * info.tiny / info.eps, dtype)


@tf.custom_gradient
def log_matmul_exp(a, b):
    """log(exp(a) @ exp(b)) for `a [..., M, K]`, `b [..., K, N]` with equal batch dims → `[..., M, N]`,
    exact for any finite inputs.

    The max-shifted matmul when it is exact, else a broadcast log-sum-exp. The gradient is
    written out (softmax weights times the upstream gradient) so the fallback's `[..., M, K, N]`
    intermediates are never kept for the backward pass.
    """
    product, a_max, b_max = _shifted_product(a, b)
    exact = tf.reduce_all(product >= underflow_bound(a.dtype, a.shape[-1] or 1))

    out = tf.cond(
        exact,
        lambda: tf.math.log(product) + a_max + b_max,
        lambda: tf.reduce_logsumexp(a[..., :, :, None] + b[..., None, :, :], axis=-2),
    )

    def grad(upstream):
        def fast_grad():
            a_shift = tf.reduce_max(a, axis=-1, keepdims=True)
            b_shift = tf.reduce_max(b, axis=-2, keepdims=True)
            exp_a, exp_b = tf.exp(a - a_shift), tf.exp(b - b_shift)
            weighted = upstream * tf.exp(a_shift + b_shift - out)  # upstream / product
            grad_a = exp_a * tf.linalg.matmul(weighted, exp_b, transpose_b=True)
            grad_b = exp_b * tf.linalg.matmul(exp_a, weighted, transpose_a=True)
            return grad_a, grad_b

        def slow_grad():
            weights = tf.exp(a[..., :, :, None] + b[..., None, :, :] - out[..., :, None, :])
            weights = weights * upstream[..., :, None, :]  # [..., M, K, N]
            return tf.reduce_sum(weights, axis=-1), tf.reduce_sum(weights, axis=-3)

        return tf.cond(exact, fast_grad, slow_grad)

    return out, grad


def broadcast_log_matmul_exp(a, b):
    """log(exp(a) @ exp(b)) by a broadcast log-sum-exp: `[..., M, K]`, `[..., K, N]` → `[..., M, N]`."""
    return tf.reduce_logsumexp(a[..., :, :, None] + b[..., None, :, :], axis=-2)


@tf.custom_gradient
def forward_scan(unary_tm, pairwise):
    """Sequential forward messages α `[T, G, M, V]` of unary `[T, G, M, V]`, pairwise `[G, V, V]`.

    Runs the pass with max-shifted matmuls; if any product underflowed it reruns it with broadcast
    log-sum-exps (exact for any finite input). The backward pass is written out as the reverse
    recursion with the same fast/exact choice, so no control flow is differentiated (XLA cannot
    differentiate a conditional around a loop) and only α is kept for it.
    """
    bound = underflow_bound(unary_tm.dtype, unary_tm.shape[-1] or 1)
    big = tf.constant(np.finfo(unary_tm.dtype.as_numpy_dtype).max, unary_tm.dtype)

    def fast_step(carry, unary_t):
        alpha, smallest = carry
        message, least = fast_log_matmul_exp(alpha, pairwise)
        return message + unary_t, tf.minimum(smallest, least)

    fast, smallest = tf.scan(fast_step, unary_tm[1:], initializer=(unary_tm[0], big))
    is_fast = tf.reduce_min(tf.concat([smallest, big[None]], 0)) >= bound
    rest = tf.cond(
        is_fast,
        lambda: fast,
        lambda: tf.scan(lambda alpha, unary_t: broadcast_log_matmul_exp(alpha, pairwise) + unary_t,
                        unary_tm[1:], initializer=unary_tm[0]),
    )
    alphas = tf.concat([unary_tm[:1], rest], axis=0)

    def grad(upstream):
        # m_t = α_t − u_t = log Σ_i exp(α_{t−1}(i) + W(i, ·)); ∂m_t(j)/∂α_{t−1}(i) = ∂m_t(j)/∂W(i, j)
        # = exp(α_{t−1}(i) + W(i, j) − m_t(j)), the softmax weights of step t.
        messages = rest - unary_tm[1:]

        def fast_weights(alpha_prev, message, g):
            alpha_shift = tf.reduce_max(alpha_prev, axis=-1, keepdims=True)
            pair_shift = tf.reduce_max(pairwise, axis=-2, keepdims=True)
            exp_alpha, exp_pair = tf.exp(alpha_prev - alpha_shift), tf.exp(pairwise - pair_shift)
            weighted = g * tf.exp(alpha_shift + pair_shift - message)  # bounded by 1 / bound
            d_prev = exp_alpha * tf.linalg.matmul(weighted, exp_pair, transpose_b=True)
            d_pair = exp_pair * tf.linalg.matmul(exp_alpha, weighted, transpose_a=True)
            return d_prev, d_pair

        def exact_weights(alpha_prev, message, g):
            weights = tf.exp(alpha_prev[..., :, None] + pairwise[:, None] - message[..., None, :])
            weights = weights * g[..., None, :]  # [G, M, V, V]
            return tf.reduce_sum(weights, axis=-1), tf.reduce_sum(weights, axis=1)

        def backward(weights_fn):
            def step(carry, inputs):
                to_alpha, d_pair, _ = carry
                upstream_t, alpha_prev, message = inputs
                g = upstream_t + to_alpha  # total gradient reaching α_t
                d_prev, d_pair_t = weights_fn(alpha_prev, message, g)
                return d_prev, d_pair + d_pair_t, g

            zeros = tf.zeros_like(unary_tm[0])
            to_prev, d_pairs, gs = tf.scan(
                step, (upstream[1:], alphas[:-1], messages),
                initializer=(zeros, tf.zeros_like(pairwise), zeros), reverse=True,
            )
            # reverse=True stacks in forward order: index 0 is step t = 1
            first = upstream[0] + tf.concat([to_prev[:1], zeros[None]], 0)[0]
            d_pair = tf.concat([d_pairs[:1], tf.zeros_like(pairwise)[None]], 0)[0]
            return tf.concat([first[None], gs], 0), d_pair

        return tf.cond(is_fast, lambda: backward(fast_weights), lambda: backward(exact_weights))

    return alphas, grad
