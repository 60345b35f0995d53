"""Forward–backward in scaled probability space (CRFsuite's formulation): the fast path for
point potentials (the MAP fit, its gradient and Fisher, and prediction).

Messages are kept as probability vectors renormalised at every step (α̂_t = α_t / Π_{s≤t} z_s),
so a step is one `[B, V] @ [V, V]` product and an elementwise product with exp(u_t − max u_t),
with no log/exp of messages. Exact up to float rounding as long as no step's mass underflows:
a potential gap of ≳ 80 nats (float32) between the best continuation and every other one. The
log-space `gpseq.structured.chain` stays the general, always-exact implementation.

Shapes: unary `[B, T, V]`, pairwise `[V, V]` (shared), lengths `[B]` int32 (0 < L ≤ T).
"""

from __future__ import annotations

import tensorflow as tf


def forward_backward(unary, pairwise, lengths):
    """Token marginals `[B, T, V]` (0 at padding), summed pair marginals Σ_{b,t} ξ_t(i, j) `[V, V]`
    and log Z `[B]` of the linear chain (seed eq. 1)."""
    dtype = unary.dtype
    T = tf.shape(unary)[1]
    mask = tf.sequence_mask(lengths, T)  # [B, T]
    shift = tf.reduce_max(unary, -1, keepdims=True)  # [B, T, 1]
    emit = tf.exp(unary - shift)  # [B, T, V]
    p_max = tf.reduce_max(pairwise)
    trans = tf.exp(pairwise - p_max)  # [V, V]
    emit_tm = tf.transpose(emit, [1, 0, 2])  # [T, B, V]
    mask_tm = tf.transpose(mask)[..., None]  # [T, B, 1]

    first = emit_tm[0]
    z0 = tf.reduce_sum(first, -1, keepdims=True)
    alpha0 = first / z0

    def forward(carry, inputs):
        alpha, _ = carry
        e_t, m_t = inputs
        new = tf.linalg.matmul(alpha, trans) * e_t
        z = tf.reduce_sum(new, -1, keepdims=True)
        new = new / z
        return tf.where(m_t, new, alpha), tf.where(m_t, z, tf.ones_like(z))

    alphas, zs = tf.scan(forward, (emit_tm[1:], mask_tm[1:]), initializer=(alpha0, z0))
    alphas = tf.concat([alpha0[None], alphas], 0)  # [T, B, V]
    zs = tf.concat([z0[None], zs], 0)  # [T, B, 1]
    n_steps = tf.cast(lengths - 1, dtype)
    log_z = (tf.reduce_sum(tf.math.log(zs[..., 0]) * tf.cast(tf.transpose(mask), dtype), 0)
             + tf.reduce_sum(shift[..., 0] * tf.cast(mask, dtype), 1) + n_steps * p_max)

    # backward: β̂_{L-1} = 1, β̂_t = M (e_{t+1} β̂_{t+1}) / z_{t+1}; beyond a sequence's end β̂ = 1
    ones = tf.ones_like(alpha0)

    def backward(beta, inputs):
        e_next, z_next, m_next = inputs
        new = tf.linalg.matmul(e_next * beta / z_next, trans, transpose_b=True)
        return tf.where(m_next, new, ones)

    betas = tf.scan(backward, (emit_tm[1:], zs[1:], mask_tm[1:]), initializer=ones, reverse=True)
    betas = tf.concat([betas, ones[None]], 0)  # [T, B, V]
    marg_tm = alphas * betas * tf.cast(mask_tm, dtype)
    # ξ_t(i, j) = α̂_t(i) M(i, j) e_{t+1}(j) β̂_{t+1}(j) / z_{t+1}, summed over valid t
    right = emit_tm[1:] * betas[1:] / zs[1:] * tf.cast(mask_tm[1:], dtype)  # [T-1, B, V]
    pair_sum = trans * tf.einsum("tbi,tbj->ij", alphas[:-1], right)
    return tf.transpose(marg_tm, [1, 0, 2]), pair_sum, log_z
