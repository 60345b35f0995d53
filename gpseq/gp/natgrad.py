"""Natural-gradient steps on q(u) (seed `gps-for-big-data-svi.md` §4-2).

For the Gaussian q(u) = N(m, S) per latent, natural parameters θ₁ = S⁻¹m, θ₂ = −½S⁻¹ and
expectation parameters η₁ = m, η₂ = S + mmᵀ. The natural gradient in θ is the ordinary gradient
in η, so one step is
    θ ← θ + γ ∂L/∂η,
computed here by differentiating the ELBO through (η₁, η₂) ↦ (m, chol(η₂ − η₁η₁ᵀ)). With a
Gaussian likelihood and γ = 1 on the full data one step lands on the optimal q(u).
The model must expose `elbo(batch, q_mu=..., q_sqrt=...)` and `q` (a single-component
`VariationalGaussian`); other parameters are left to an ordinary optimiser (Adam).
"""

from __future__ import annotations

import tensorflow as tf

from gpseq.errors import ConfigError
from gpseq.gp.linalg import safe_cholesky


def _sym(a):
    return 0.5 * (a + tf.linalg.matrix_transpose(a))


def natgrad_step(model, batch, gamma):
    """One natural-gradient step of size `gamma` on `model.q` (assigns the new q_mu, q_sqrt); returns the
    ELBO evaluated before the step. Works inside `tf.function` (XLA-compilable). A step that would
    leave q(u) invalid (an indefinite precision, e.g. from a noisy Monte Carlo gradient) leaves it
    unchanged instead of writing NaNs."""
    q = model.q
    if q.num_components != 1:
        raise ConfigError("natural gradients need a single-Gaussian q(u) (num_components=1)")
    gamma = tf.cast(gamma, q.dtype)
    m = tf.convert_to_tensor(q.q_mu)[0]  # [M, P]
    sqrt = tf.convert_to_tensor(q.q_sqrt)[0]  # full [P, M, M] | diag [M, P]
    mT = tf.transpose(m)  # [P, M]
    if q.full_cov:
        S = tf.linalg.matmul(sqrt, sqrt, transpose_b=True)  # [P, M, M]
        eta1, eta2 = mT, S + mT[..., :, None] * mT[..., None, :]
        with tf.GradientTape() as tape:
            tape.watch([eta1, eta2])
            cov = eta2 - eta1[..., :, None] * eta1[..., None, :]
            elbo = model.elbo(batch, q_mu=tf.transpose(eta1)[None], q_sqrt=tf.linalg.cholesky(cov)[None])
        g1, g2 = tape.gradient(elbo, [eta1, eta2])
        g2 = _sym(g2)
        eye = tf.eye(tf.shape(S)[-1], dtype=q.dtype)
        prec = tf.linalg.cholesky_solve(sqrt, tf.broadcast_to(eye, tf.shape(S)))  # S⁻¹
        theta1 = tf.linalg.matvec(prec, mT) + gamma * g1  # [P, M]
        theta2 = -0.5 * prec + gamma * g2  # [P, M, M]
        new_prec = _sym(-2.0 * theta2)
        prec_chol = safe_cholesky(new_prec, jitter=1e-12)
        new_S = _sym(tf.linalg.cholesky_solve(prec_chol, tf.broadcast_to(eye, tf.shape(S))))
        new_mT = tf.linalg.matvec(new_S, theta1)
        new_sqrt = safe_cholesky(new_S, jitter=1e-12)
        # a noisy (Monte Carlo) gradient can make the new precision indefinite: then skip the step
        ok = tf.reduce_all(tf.math.is_finite(new_sqrt)) & tf.reduce_all(tf.math.is_finite(new_mT))
        new_mT = tf.where(ok, new_mT, mT)
        q.q_sqrt.assign(tf.where(ok, new_sqrt, sqrt)[None])
    else:
        var = tf.transpose(sqrt**2)  # [P, M]
        eta1, eta2 = mT, var + mT**2
        with tf.GradientTape() as tape:
            tape.watch([eta1, eta2])
            std = tf.sqrt(eta2 - eta1**2)
            elbo = model.elbo(batch, q_mu=tf.transpose(eta1)[None], q_sqrt=tf.transpose(std)[None])
        g1, g2 = tape.gradient(elbo, [eta1, eta2])
        theta1 = mT / var + gamma * g1
        theta2 = -0.5 / var + gamma * g2
        new_var = -0.5 / theta2
        new_mT = new_var * theta1
        ok = tf.reduce_all(new_var > 0.0) & tf.reduce_all(tf.math.is_finite(new_mT))  # else skip
        new_mT = tf.where(ok, new_mT, mT)
        q.q_sqrt.assign(tf.where(ok, tf.transpose(tf.sqrt(tf.abs(new_var))), sqrt)[None])
    q.q_mu.assign(tf.transpose(new_mT)[None])
    return elbo
