"""Natural-gradient steps on Gaussian variational parameters (design notes
`gps-for-big-data-svi.md` §4-2).

For q(u) = N(m, S) per latent, natural parameters θ₁ = S⁻¹m, θ₂ = −½S⁻¹ and expectation
parameters η₁ = m, η₂ = S + mmᵀ. The natural gradient in θ is the ordinary gradient in η, so a
step of size γ on a loss ℓ (the negative ELBO) is

    θ ← θ − γ ∂ℓ/∂η.

∂ℓ/∂η comes from the ordinary gradients of ℓ with respect to the variables that hold q(u) —
`q_mu` and the unconstrained variable behind `q_sqrt` (a `TransformedVariable`) — pulled back
through the map η ↦ (m, bijector⁻¹(chol(η₂ − η₁η₁ᵀ))) by one vector–Jacobian product (the chain
rule GPflow's `NaturalGradient` applies). The model is never asked to evaluate its loss at other
parameters: the same gradients that feed Adam feed this step. With a Gaussian likelihood and γ = 1
on the full data one step lands on the optimal q(u).
"""

from __future__ import annotations

import tensorflow as tf

from gpseq.errors import ConfigError
from gpseq.gp.linalg import safe_cholesky


def _sym(a):
    return 0.5 * (a + tf.linalg.matrix_transpose(a))


def natural_variables(q_mu, q_sqrt) -> list[tf.Variable]:
    """The variables that hold a Gaussian (q_mu, q_sqrt): `q_mu` and `q_sqrt`'s unconstrained variable."""
    return [q_mu, *q_sqrt.trainable_variables]


class NaturalGradient:
    """Natural-gradient steps of size `gamma` on pairs (q_mu `[1, M, P]`, q_sqrt) of single Gaussians:
    `q_sqrt` a `TransformedVariable`, `[1, P, M, M]` lower-triangular (full) or `[1, M, P]` (diagonal).

    `apply_gradients([(gradients, (q_mu, q_sqrt)), ...])` takes the loss's gradients with respect to
    `natural_variables(q_mu, q_sqrt)` and assigns the new parameters; it works in a `tf.function`,
    under XLA and in a `tf.distribute` cross-replica context. A step that would leave q(u) invalid
    (an indefinite precision, e.g. from a noisy Monte Carlo gradient) leaves it unchanged.
    """

    def __init__(self, gamma: float):
        if not 0.0 < gamma <= 1.0:
            raise ConfigError(f"the natural-gradient step size must be in (0, 1], got {gamma}")
        self.gamma = gamma

    @staticmethod
    def check(q_mu, q_sqrt) -> None:
        """Raises `ConfigError` unless (q_mu, q_sqrt) is one Gaussian with a transformed scale."""
        if q_mu.shape[0] != 1:
            raise ConfigError("natural gradients need a single-Gaussian q(u) (num_components=1)")
        if len(q_sqrt.trainable_variables) != 1:
            raise ConfigError("natural gradients need q_sqrt as a TransformedVariable over one variable")

    def minimize(self, loss_fn, var_list) -> tf.Tensor:
        """One step on each (q_mu, q_sqrt) of `var_list` along the gradient of `loss_fn()`; returns the loss."""
        variables = [v for q_mu, q_sqrt in var_list for v in natural_variables(q_mu, q_sqrt)]
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(variables)
            loss = loss_fn()
        grads = tape.gradient(loss, variables)
        self.apply_gradients([(grads[2 * i: 2 * i + 2], pair) for i, pair in enumerate(var_list)])
        return loss

    def apply_gradients(self, grads_and_params) -> None:
        for grads, (q_mu, q_sqrt) in grads_and_params:
            self._step(grads, q_mu, q_sqrt)

    def _step(self, grads, q_mu, q_sqrt) -> None:
        dtype = q_mu.dtype
        gamma = tf.cast(self.gamma, dtype)
        grad_mu, grad_raw = (tf.convert_to_tensor(g) for g in grads)
        bijector = q_sqrt.bijector
        m = tf.transpose(tf.convert_to_tensor(q_mu)[0])  # [P, M]
        sqrt = tf.convert_to_tensor(q_sqrt)[0]  # full [P, M, M] | diag [M, P]
        full = sqrt.shape.rank == 3
        if full:
            S = tf.linalg.matmul(sqrt, sqrt, transpose_b=True)  # [P, M, M]
            eta1, eta2 = m, S + m[..., :, None] * m[..., None, :]
        else:
            S = tf.transpose(sqrt**2)  # [P, M] variances
            eta1, eta2 = m, S + m**2
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch([eta1, eta2])
            if full:
                scale = tf.linalg.cholesky(eta2 - eta1[..., :, None] * eta1[..., None, :])
            else:
                scale = tf.transpose(tf.sqrt(eta2 - eta1**2))
            raw = bijector.inverse(scale[None])
            mean = tf.transpose(eta1)[None]
        g1, g2 = tape.gradient([mean, raw], [eta1, eta2], output_gradients=[grad_mu, grad_raw])
        if full:
            eye = tf.eye(tf.shape(S)[-1], dtype=dtype)
            precision = tf.linalg.cholesky_solve(sqrt, tf.broadcast_to(eye, tf.shape(S)))  # S⁻¹
            theta1 = tf.linalg.matvec(precision, m) - gamma * g1  # [P, M]
            theta2 = -0.5 * precision - gamma * _sym(g2)  # [P, M, M]
            new_precision_chol = safe_cholesky(_sym(-2.0 * theta2), jitter=1e-12)
            new_S = _sym(tf.linalg.cholesky_solve(new_precision_chol, tf.broadcast_to(eye, tf.shape(S))))
            new_m = tf.linalg.matvec(new_S, theta1)
            new_scale = safe_cholesky(new_S, jitter=1e-12)
            ok = tf.reduce_all(tf.math.is_finite(new_scale)) & tf.reduce_all(tf.math.is_finite(new_m))
        else:
            theta1 = m / S - gamma * g1
            theta2 = -0.5 / S - gamma * g2
            new_S = -0.5 / theta2
            new_m = new_S * theta1
            new_scale = tf.transpose(tf.sqrt(tf.abs(new_S)))
            ok = tf.reduce_all(new_S > 0.0) & tf.reduce_all(tf.math.is_finite(new_m))
        # a noisy (Monte Carlo) gradient can make the new precision indefinite: then skip the step
        q_mu.assign(tf.transpose(tf.where(ok, new_m, m))[None])
        q_sqrt.assign(tf.where(ok, new_scale, sqrt)[None])
