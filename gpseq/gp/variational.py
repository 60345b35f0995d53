"""q(u): a mixture of K Gaussians over P independent latent functions' M inducing values (design
notes, graybox-structured-gp eq. 13).

q(u) = Σ_k π_k Π_p N(u_p; m_kp, S_kp), with `q_mu [K, M, P]`, `q_sqrt [K, P, M, M]` lower
triangular (FillScaleTriL bijector: Softplus diagonal) or `[K, M, P]` diagonal standard
deviations, and π = softmax(`mixture_logits [K]`). Whitened: u = L v, p(v) = N(0, I), and the
parameters describe q(v). K = 1 is the plain Gaussian (GPflow's SVGP parameterisation).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from gpseq._tfp import tfp

from gpseq.errors import ConfigError

tfd = tfp.distributions
tfb = tfp.bijectors


def _fill_scale_tril(num_inducing: int):
    """`raw [..., M(M+1)/2] → [..., M, M]`: TFP's `FillScaleTriL(Softplus)` forward (same values from
    the same stored vector, so q_sqrt's variable and checkpoints are unchanged), with its gradient as
    one gather (∂/∂raw = ∂/∂L at the entry's position, × sigmoid(raw) on the diagonal) instead of the
    gradients of the bijector chain's slice, reverse, concat, band part and diagonal ops."""
    M = num_inducing
    n = M * (M + 1) // 2
    # fill_triangular's layout: the lower triangle of concat(x[M:], reverse(x)) reshaped to [M, M]
    layout = np.concatenate([np.arange(M, n), np.arange(n)[::-1]]).reshape(M, M)
    lower = np.tril(np.ones((M, M), bool))
    diagonal = np.diag(layout).copy()  # [M]: the raw entries on L's diagonal
    # [n]: each raw entry's source in concat(∂L flattened [M·M], ∂L's diagonal × sigmoid [M])
    source = np.empty(n, np.int64)
    source[layout[lower]] = np.flatnonzero(lower)
    source[diagonal] = M * M + np.arange(M)

    @tf.custom_gradient
    def fill(raw):
        raw_diagonal = tf.gather(raw, diagonal, axis=-1)
        scale = tf.linalg.set_diag(tfp.math.fill_triangular(raw), tf.math.softplus(raw_diagonal))

        def grad(upstream):
            flat = tf.reshape(upstream, tf.concat([tf.shape(raw)[:-1], [M * M]], 0))
            on_diagonal = tf.linalg.diag_part(upstream) * tf.math.sigmoid(raw_diagonal)
            return tf.gather(tf.concat([flat, on_diagonal], -1), source, axis=-1)

        return scale, grad

    return fill


class VariationalGaussian(tf.Module):
    """Mixture-of-Gaussians q(u) with its KL to the GP prior (exact for K = 1, Jensen bound for K > 1)."""

    def __init__(
        self,
        num_inducing: int,
        num_latent: int,
        *,
        full_cov: bool = True,
        whiten: bool = True,
        num_components: int = 1,
        initial_scale: float = 1.0,
        dtype=tf.float64,
        seed: int = 0,
        name: str = "variational_gaussian",
    ):
        super().__init__(name=name)
        if num_components < 1:
            raise ConfigError(f"num_components must be >= 1, got {num_components}")
        K, M, P = num_components, num_inducing, num_latent
        self.num_inducing, self.num_latent, self.num_components = M, P, K
        self.full_cov, self.whiten, self.dtype = full_cov, whiten, dtype
        mu = np.zeros((K, M, P))
        if K > 1:  # distinct starting means break the symmetry between components
            mu = 0.5 * np.random.default_rng(seed).standard_normal((K, M, P))
        self.q_mu = tf.Variable(tf.constant(mu, dtype), name="q_mu")
        if full_cov:
            init = initial_scale * np.broadcast_to(np.eye(M), (K, P, M, M))
            bijector = tfb.FillScaleTriL(diag_bijector=tfb.Softplus(), diag_shift=None)
            self.q_sqrt = tfp.util.TransformedVariable(tf.constant(init, dtype), bijector, name="q_sqrt")
            self._fill_scale = _fill_scale_tril(M)
        else:
            self.q_sqrt = tfp.util.TransformedVariable(
                tf.fill([K, M, P], tf.constant(initial_scale, dtype)), tfb.Softplus(), name="q_sqrt"
            )
        self.mixture_logits = tf.Variable(tf.zeros([K], dtype), name="mixture_logits", trainable=K > 1)

    def mixture_weights(self):
        """π `[K]`."""
        return tf.nn.softmax(self.mixture_logits)

    def components(self):
        """Per-component Gaussians as a TFP distribution with batch `[K, P]`, event `[M]`."""
        q_mu, q_sqrt = tf.convert_to_tensor(self.q_mu), tf.convert_to_tensor(self.q_sqrt)
        loc = tf.linalg.matrix_transpose(q_mu)  # [K, P, M]
        if self.full_cov:
            return tfd.MultivariateNormalTriL(loc=loc, scale_tril=q_sqrt)
        return tfd.MultivariateNormalDiag(loc=loc, scale_diag=tf.linalg.matrix_transpose(q_sqrt))

    def _prior(self, Kzz_cholesky):
        M = self.num_inducing
        if self.whiten:
            return tfd.MultivariateNormalDiag(loc=tf.zeros([M], self.dtype), scale_diag=tf.ones([M], self.dtype))
        if Kzz_cholesky is None:
            raise ConfigError("the KL of a non-whitened q(u) needs the Cholesky factor of K_zz")
        return tfd.MultivariateNormalTriL(loc=tf.zeros([M], self.dtype), scale_tril=Kzz_cholesky)

    def parameters(self):
        """(q_mu `[K, M, P]`, q_sqrt `[K, P, M, M]` or `[K, M, P]`) as tensors (the bijector run once;
        full: by `_fill_scale_tril`, the bijector's values with a cheaper gradient)."""
        if self.full_cov:
            # the variable read outside the custom gradient: a function that reads a variable needs a
            # `variables` gradient (eager, e.g. under a MirroredStrategy); a tensor's flows back the same
            return tf.convert_to_tensor(self.q_mu), self._fill_scale(
                tf.convert_to_tensor(self.q_sqrt.pretransformed_input))
        return tf.convert_to_tensor(self.q_mu), tf.convert_to_tensor(self.q_sqrt)

    def kl(self, Kzz_cholesky=None, parameters=None):
        """KL(q(u) ‖ p(u)) summed over latents → scalar; `Kzz_cholesky [M, M]` unless whitened;
        `parameters` = `self.parameters()` when the caller already has them.

        K = 1: exact, in closed form per latent (L = Kzz_cholesky, I when whitened):
            ½ (‖L⁻¹ L_S‖²_F + ‖L⁻¹ m‖² − M) + Σ log diag L − Σ log diag L_S.
        K > 1: the Jensen upper bound of the paper's supplement,
            KL ≤ Σ_k π_k CE(q_k, p) + Σ_k π_k log Σ_l π_l N(m_k; m_l, S_k + S_l),
        (exact cross-entropy, entropy bounded below by Jensen), which keeps the ELBO a lower bound.
        """
        if self.num_components == 1:
            q_mu, q_sqrt = self.parameters() if parameters is None else parameters
            return self._gaussian_kl(tf.squeeze(q_mu, 0), tf.squeeze(q_sqrt, 0), Kzz_cholesky)
        q = self.components()
        prior = self._prior(Kzz_cholesky)
        pi = self.mixture_weights()
        cross_entropy = tf.reduce_sum(q.cross_entropy(prior), -1)  # [K]
        return tf.reduce_sum(pi * cross_entropy) - self.entropy_lower_bound()

    def _gaussian_kl(self, q_mu, q_sqrt, Kzz_cholesky):
        """Σ_p KL(N(m_p, L_Sp L_Spᵀ) ‖ N(0, K_zz or I)) for `q_mu [M, P]`, `q_sqrt [P, M, M]` or `[M, P]`."""
        M, P = self.num_inducing, self.num_latent
        scale_diag = tf.linalg.diag_part(q_sqrt) if self.full_cov else q_sqrt  # [P, M] or [M, P]
        if self.whiten:
            trace, mahalanobis, prior_log_det = tf.reduce_sum(q_sqrt**2), tf.reduce_sum(q_mu**2), 0.0
        elif Kzz_cholesky is None:
            raise ConfigError("the KL of a non-whitened q(u) needs the Cholesky factor of K_zz")
        else:
            L = tf.convert_to_tensor(Kzz_cholesky, self.dtype)
            scale = q_sqrt if self.full_cov else tf.linalg.diag(tf.transpose(q_sqrt))  # [P, M, M]
            scaled = tf.linalg.triangular_solve(tf.broadcast_to(L, [P, M, M]), scale, lower=True)  # L⁻¹ L_S
            trace = tf.reduce_sum(scaled**2)
            mahalanobis = tf.reduce_sum(tf.linalg.triangular_solve(L, q_mu, lower=True) ** 2)
            prior_log_det = P * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(L)))
        log_det = tf.reduce_sum(tf.math.log(scale_diag))  # both bijectors give a positive diagonal
        return 0.5 * (trace + mahalanobis - M * P) + prior_log_det - log_det

    def entropy_lower_bound(self):
        """Jensen lower bound on H[q]: −Σ_k π_k log Σ_l π_l N(m_k; m_l, S_k + S_l) → scalar."""
        q_mu, q_sqrt = tf.convert_to_tensor(self.q_mu), tf.convert_to_tensor(self.q_sqrt)
        loc = tf.linalg.matrix_transpose(q_mu)  # [K, P, M]
        if self.full_cov:
            cov = tf.linalg.matmul(q_sqrt, q_sqrt, transpose_b=True)  # [K, P, M, M]
            pair = tfd.MultivariateNormalTriL(
                loc=loc[None], scale_tril=tf.linalg.cholesky(cov[:, None] + cov[None])
            )  # batch [K(k), K(l), P]
        else:
            var = tf.linalg.matrix_transpose(q_sqrt) ** 2  # [K, P, M]
            pair = tfd.MultivariateNormalDiag(loc=loc[None], scale_diag=tf.sqrt(var[:, None] + var[None]))
        log_overlap = tf.reduce_sum(pair.log_prob(loc[:, None]), -1)  # [K, K]: Σ_p log N(m_kp; m_lp, ·)
        pi = self.mixture_weights()
        return -tf.reduce_sum(pi * tf.reduce_logsumexp(tf.math.log(pi)[None, :] + log_overlap, axis=1))

    def sample_u(self, num_samples: int, seed):
        """Draws from every component `[K, S, M, P]` (whitened: draws of v)."""
        draws = self.components().sample(num_samples, seed=seed)  # [S, K, P, M]
        return tf.transpose(draws, [1, 0, 3, 2])
