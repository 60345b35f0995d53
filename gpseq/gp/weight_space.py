"""The linear-kernel GP in weight space, for sparse high-dimensional inputs (no inducing points).

P outputs f_p(x) = w_pᵀx with prior w_p ~ N(0, σ² I_D) — the GP with kernel σ² x·x' — and
posterior q(w_p) = N(μ_p, diag s_p + U_p U_pᵀ) (U_p [D, R], R = `low_rank`, 0 by default). Each
f is Gaussian at any batch of rows, with mean x·μ and variance Σ_k v_k² s[i_k] + ‖Σ_k v_k U[i_k]‖²,
at O(nnz · P) per row (DESIGN "The expressiveness trap").

Summing with an inducing-point GP of another kernel (κ_linear + κ_rbf): the two posteriors are
independent, so the sum's mean and (co)variance are the sums of the parts' and its KL is the
sum of both KLs; a joint sample is the sum of independent samples. The tagger adds them.

Rows must not list the same index twice (canonical CSR, as `padded_from_csr` produces); padding
slots (index 0, value 0) contribute nothing. Column 0 is never a real feature.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from gpseq._tfp import tfp

from gpseq.features.padded import PaddedRows
from gpseq.gp.hashed import hashed_normal

tfd = tfp.distributions


def gather_sum(table, indices, values):
    """Embedding bag: Σ_k values[..., k] · table[indices[..., k]] for `table [U, ...]` → `[..., ...]`."""
    gathered = tf.gather(table, indices)  # [..., F, *table.shape[1:]]
    extra = len(table.shape) - 1
    weights = tf.reshape(values, tf.concat([tf.shape(values), tf.ones([extra], tf.int32)], 0))
    return tf.reduce_sum(weights * gathered, axis=values.shape.rank - 1)


class WeightSpaceLinear(tf.Module):
    """q(w) over D × P weights: `q_mu [D, P]`, `q_variance [D, P]` (Softplus), `q_factor [D, P, R]`."""

    def __init__(
        self,
        n_features: int,
        n_outputs: int,
        prior_variance: float = 1.0,
        low_rank: int = 0,
        learn_prior_variance: bool = False,
        initial_variance: float | None = None,
        dtype=tf.float64,
        seed: int = 0,
        name: str = "weight_space_linear",
    ):
        super().__init__(name=name)
        self.n_features, self.n_outputs, self.low_rank = n_features, n_outputs, low_rank
        self.dtype = dtype
        if initial_variance is None:
            initial_variance = prior_variance
        self.prior_variance = tfp.util.TransformedVariable(
            tf.constant(prior_variance, dtype), tfp.bijectors.Softplus(), name="prior_variance",
            trainable=learn_prior_variance,
        )
        self.q_mu = tf.Variable(tf.zeros([n_features, n_outputs], dtype), name="q_mu")
        self.q_variance = tfp.util.TransformedVariable(
            tf.fill([n_features, n_outputs], tf.constant(initial_variance, dtype)), tfp.bijectors.Softplus(),
            name="q_variance",
        )
        self.q_factor = None
        if low_rank > 0:
            # small random start: at U = 0 every gradient wrt U vanishes.
            init = 1e-3 * np.random.default_rng(seed).standard_normal((n_features, n_outputs, low_rank))
            self.q_factor = tf.Variable(tf.constant(init, dtype), name="q_factor")

    # ---- KL -------------------------------------------------------------------------------------
    def kl(self):
        """KL(q(w) ‖ p(w)) summed over the P outputs (exact, closed form) → scalar."""
        prior_var = tf.convert_to_tensor(self.prior_variance)
        var = tf.convert_to_tensor(self.q_variance)
        if self.q_factor is None:
            q = tfd.Normal(self.q_mu, tf.sqrt(var))
            p = tfd.Normal(tf.zeros([], self.dtype), tf.sqrt(prior_var))
            return tf.reduce_sum(tfd.kl_divergence(q, p))
        # Σ_p = diag s_p + U_p U_pᵀ; log|Σ_p| by the matrix determinant lemma (R × R).
        D = tf.cast(self.n_features, self.dtype)
        U = tf.transpose(self.q_factor, [1, 0, 2])  # [P, D, R]
        s = tf.transpose(var)  # [P, D]
        inner = tf.eye(self.low_rank, dtype=self.dtype) + tf.linalg.matmul(U / s[..., None], U, transpose_a=True)
        logdet = tf.reduce_sum(tf.math.log(s), -1) + tf.linalg.logdet(inner)  # [P]
        trace = tf.reduce_sum(s, -1) + tf.reduce_sum(U**2, [-2, -1])  # [P]
        mahal = tf.reduce_sum(self.q_mu**2, 0)  # [P]
        return 0.5 * tf.reduce_sum((trace + mahal) / prior_var - D + D * tf.math.log(prior_var) - logdet)

    # ---- moments at a batch ----------------------------------------------------------------------
    def _local(self, feature_ids):
        """q(w) restricted to `feature_ids [U]` (all D when None): μ [U, P], s [U, P], U [U, P, R]."""
        mu, var, factor = self.q_mu, tf.convert_to_tensor(self.q_variance), self.q_factor
        if feature_ids is None:
            return tf.convert_to_tensor(mu), var, factor
        gather = lambda t: None if t is None else tf.gather(t, feature_ids)  # noqa: E731
        return gather(mu), gather(var), gather(factor)

    def mean_f(self, rows: PaddedRows, feature_ids=None):
        """E_q[f] at padded rows `[..., F]` → `[..., P]`; indices index `feature_ids [U]` when given."""
        mu, _, _ = self._local(feature_ids)
        return gather_sum(mu, rows.indices, tf.convert_to_tensor(rows.values, self.dtype))

    def marginals(self, rows: PaddedRows, feature_ids=None):
        """Marginal mean and variance of f at padded rows `[..., F]` → (`[..., P]`, `[..., P]`)."""
        mu, var, factor = self._local(feature_ids)
        values = tf.convert_to_tensor(rows.values, self.dtype)
        mean = gather_sum(mu, rows.indices, values)
        variance = gather_sum(var, rows.indices, values**2)
        if factor is not None:
            variance += tf.reduce_sum(gather_sum(factor, rows.indices, values) ** 2, -1)
        return mean, variance

    def covariance_blocks(self, rows: PaddedRows, feature_ids=None):
        """Per-block covariance of f over padded rows `[B, T, F]` → `[B, P, T, T]` (diag part only
        uses index matching between tokens, O(B T² F² P); low-rank part O(B T F P R))."""
        _, var, factor = self._local(feature_ids)
        values = tf.convert_to_tensor(rows.values, self.dtype)
        idx = rows.indices
        match = tf.cast(tf.equal(idx[:, :, None, :, None], idx[:, None, :, None, :]), self.dtype)  # [B,T,T,F,F]
        s = tf.gather(var, idx)  # [B, T, F, P]
        cov = tf.einsum("btk,bsl,btskl,btkp->bpts", values, values, match, s)
        if factor is not None:
            proj = gather_sum(factor, idx, values)  # [B, T, P, R]
            cov += tf.einsum("btpr,bspr->bpts", proj, proj)
        return cov

    # ---- samples -------------------------------------------------------------------------------
    def _draw(self, mu, var, factor, num_samples, seed, ids):
        """Weights `[S, U, P]` from q restricted to the rows `ids [U]` (exact joint draw; each row's
        noise keyed by its id, `hashed_normal`: the same draw of w_d whichever rows are drawn with it)."""
        seeds = tfp.random.split_seed(seed, 2)
        eps = tf.reshape(hashed_normal(ids, num_samples * self.n_outputs, seeds[0], self.dtype),
                         [-1, num_samples, self.n_outputs])  # [U, S, P]
        w = mu + tf.sqrt(var) * tf.transpose(eps, [1, 0, 2])
        if factor is not None:
            eta = tf.random.stateless_normal([num_samples, self.n_outputs, self.low_rank], seeds[1], dtype=self.dtype)
            w += tf.einsum("upr,spr->sup", factor, eta)  # the R shared factors are drawn once per sample
        return w

    def sample_weights(self, num_samples: int, seed):
        """Joint draws of all weights from q(w) → `[S, D, P]` (O(S·D·P); prefer `sample_f`)."""
        mu, var, factor = self._local(None)
        return self._draw(mu, var, factor, num_samples, seed, tf.range(tf.shape(mu)[0]))

    def sample_f(self, rows: PaddedRows, num_samples: int, seed, feature_ids=None):
        """Joint samples of f over a whole batch of padded rows `[..., F]` → `[S, ..., P]`.

        Only the weights the batch touches are drawn (exact: f depends on w only through them),
        O(S · U · P) for U distinct indices instead of O(S · D · P). With `feature_ids [U]` the
        rows' indices are batch-local ids into it (XLA-compilable); without, the distinct indices
        are found by `tf.unique` (dynamic shape: not XLA-compilable).
        """
        values = tf.convert_to_tensor(rows.values, self.dtype)
        indices = tf.convert_to_tensor(rows.indices, tf.int32)
        if feature_ids is None:
            feature_ids, local = tf.unique(tf.reshape(indices, [-1]))
            indices = tf.reshape(local, tf.shape(indices))
        mu, var, factor = self._local(feature_ids)
        w = self._draw(mu, var, factor, num_samples, seed, feature_ids)  # [S, U, P]
        gathered = tf.gather(w, indices, axis=1)  # [S, ..., F, P]
        return tf.reduce_sum(values[None, ..., None] * gathered, axis=-2)
