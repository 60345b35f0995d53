"""Deep-GP unaries for the tagger (`ModelConfig.unary = "deep"`): a two-layer deep GP per token.

Layer 1 maps each token's sparse features x (padded rows) to a Q-dimensional hidden representation
    h(x) = x W + g(x),   g_q ~ GP(0, κ_rbf) sparse with the model's K-means inducing inputs Z_1 [M, D]
(linear mean function W [D, Q] learned by gather-and-sum, whitened q(v_1) over Q GPs); layer 2 puts
the |V| label GPs on h:
    f_j(x) = b_j (+ w_jᵀx, the weight-space linear part when the kernel has one) + g_j(h(x)),
    g_j ~ GP(0, κ_ard-rbf) on R^Q, inducing inputs Z_2 [M, Q] (learned), whitened q(v_2).
Built from the GP core (`gpseq.gp`: RBF kernels on sparse and dense inputs, `VariationalGaussian`,
`safe_cholesky`). Sampling is doubly stochastic (Salimbeni & Deisenroth 2017) and joint over a batch:
v_1, v_2 are drawn once per sample and shared by every token, so the unaries of a sequence are
correlated through q(u) exactly as in the single-layer model; the conditional part f − A u is drawn per
token with variance diag K̃ (`rbf_conditional = "diag"`) or per sequence with the T × T block
(`"full"`, the paper's eq. 18), at each layer. The KL is KL(q(v_1)) + KL(q(v_2)); the ELBO, estimators and
prediction paths of `StructuredGP` are unchanged (single-component q(u), pathwise estimator: the
builder, `gpseq.structured.model.build_structured_gp`, refuses other combinations).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from gpseq._tfp import tfp

from gpseq.errors import ConfigError
from gpseq.gp.conditionals import conditional_noise, whitened_projection
from gpseq.gp.kernels import RBF
from gpseq.gp.linalg import safe_cholesky
from gpseq.gp.variational import VariationalGaussian
from gpseq.gp.weight_space import gather_sum
from gpseq.structured.unaries import global_rows, local_seed


class DeepUnaries(tf.Module):
    """Two-layer deep-GP unary potentials over padded sparse token features → `[S, B, T, V]`."""

    def __init__(self, inducing_inputs, num_features: int, num_labels: int, *, hidden_dims: int = 8,
                 rbf_variance: float = 1.0, rbf_lengthscale: float = 4.0, full_cov: bool = True,
                 conditional: str = "diag", jitter: float = 1e-6, dtype=tf.float32, seed: int = 0):
        super().__init__(name="deep_unaries")
        if hidden_dims < 1:
            raise ConfigError(f"hidden_dims must be >= 1, got {hidden_dims}")
        Q, V = int(hidden_dims), num_labels
        self.dtype, self.hidden_dims, self.num_labels = dtype, Q, V
        self.conditional, self.jitter = conditional, jitter
        Z1 = np.asarray(inducing_inputs, dtype=np.float64)  # [M, D], the model's K-means centroids
        self.inducing_inputs_t = tf.constant(Z1.T, dtype)  # [D, M]
        M = Z1.shape[0]
        rng = np.random.default_rng(seed)
        nnz = max(1.0, float(np.mean(np.count_nonzero(Z1, axis=1))))
        W = rng.normal(scale=1.0 / np.sqrt(nnz), size=(num_features, Q))  # h ~ O(1) at start
        self.mean_weights = tf.Variable(tf.constant(W, dtype), name="mean_weights")
        self.kernel1 = RBF(variance=0.1 * rbf_variance, lengthscales=rbf_lengthscale, dtype=dtype,
                           name="hidden_rbf")
        self.q1 = VariationalGaussian(M, Q, full_cov=full_cov, whiten=True, initial_scale=1e-3,
                                      dtype=dtype, name="hidden_q")
        self.kernel2 = RBF(variance=rbf_variance, lengthscales=np.ones(Q), ard=True, dtype=dtype,
                           name="label_rbf")
        Z2 = Z1 @ W + 0.01 * rng.normal(size=(M, Q))  # Z_2 = Z_1 W (through the mean function)
        self.inducing_inputs2 = tf.Variable(tf.constant(Z2, dtype), name="inducing_inputs2")
        self.q2 = VariationalGaussian(M, V, full_cov=full_cov, whiten=True, dtype=dtype, name="label_q")

    # ---- pieces ----------------------------------------------------------------------------------
    def kl(self):
        """KL(q(v_1) ‖ N(0, I)) + KL(q(v_2) ‖ N(0, I)) → scalar."""
        return self.q1.kl() + self.q2.kl()

    def hidden_projection(self, batch):
        """Layer 1 at the batch tokens: mean function x W `[B, T, Q]`, A_w `[B, T, M]`, diag K_xx `[B, T]`
        and the tokens' padded rows."""
        rows = global_rows(batch)
        Z1 = tf.transpose(self.inducing_inputs_t)
        chol = safe_cholesky(self.kernel1.K(Z1), jitter=self.jitter)
        a_w = whitened_projection(self.kernel1.K(rows, Z1), chol)  # [B, T, M]
        W = tf.gather(self.mean_weights, batch["feature_ids"])  # [U, Q]
        return gather_sum(W, batch["indices"], batch["values"]), a_w, self.kernel1.K_diag(rows), rows

    def label_projection(self, H):
        """Layer 2 at hidden inputs `H [..., T, Q]`: A_w `[..., T, M]`, diag K_xx `[..., T]`, chol(K_zz)."""
        Z2 = tf.convert_to_tensor(self.inducing_inputs2)
        shape = tf.shape(H)
        flat = tf.reshape(H, [-1, self.hidden_dims])
        chol = safe_cholesky(self.kernel2.K(Z2), jitter=self.jitter)
        a_w = whitened_projection(self.kernel2.K(flat, Z2), chol)  # [N', M]
        a_w = tf.reshape(a_w, tf.concat([shape[:-1], [-1]], 0))
        return a_w, tf.reshape(self.kernel2.K_diag(flat), shape[:-1]), chol

    # ---- sampling and means --------------------------------------------------------------------------
    def sample(self, batch, num_samples: int, seed, return_hidden: bool = False):
        """Joint samples of the deep-GP part of the unaries `[S, B, T, V]` (and the hidden `[S, B, T, Q]`)."""
        seeds = tfp.random.split_seed(seed, 2)  # the inducing values: one draw per seed, whatever the batch
        local = tfp.random.split_seed(local_seed(seed, batch), 2)  # the tokens' conditional noise
        seeds = [seeds[0], local[0], seeds[1], local[1]]
        S = num_samples
        B, T = tf.shape(batch["values"])[0], tf.shape(batch["values"])[1]
        mask = tf.sequence_mask(batch["lengths"], T, dtype=self.dtype)  # [B, T]
        mean_fn, a1, kxx1, rows = self.hidden_projection(batch)
        v1 = self.q1.sample_u(S, seeds[0])[0]  # [S, M, Q]
        eps1 = tf.random.stateless_normal([S, B, T, self.hidden_dims], seeds[1], dtype=self.dtype)
        H = mean_fn + tf.einsum("btm,smq->sbtq", a1, v1)
        H += self._conditional(eps1, a1, kxx1, lambda: self.kernel1.K_sparse_block(rows), mask)
        a2, kxx2, _ = self.label_projection(H)  # [S, B, T, M], [S, B, T]
        v2 = self.q2.sample_u(S, seeds[2])[0]  # [S, M, V]
        eps2 = tf.random.stateless_normal([S, B, T, self.num_labels], seeds[3], dtype=self.dtype)
        f = tf.einsum("sbtm,smv->sbtv", a2, v2)
        f += self._conditional(eps2, a2, kxx2, lambda: self.kernel2.K(H), mask)
        return (f, H) if return_hidden else f

    def _conditional(self, eps, a_w, k_diag, block_fn, mask):
        """f − A u given u at one layer (`gpseq.gp.conditionals.conditional_noise`): diagonal or T × T blocks."""
        if self.conditional == "full":
            return conditional_noise(eps, a_w, mask, self.jitter, k_block=block_fn())
        return conditional_noise(eps, a_w, mask, self.jitter, k_diag=k_diag)

    def mean(self, batch):
        """Unaries at the mean hidden representation `[B, T, V]`: A_w(h̄) m_2 with h̄ = x W + A_w m_1
        (the fast "mean potentials" prediction mode; not the exact posterior mean of f)."""
        mean_fn, a1, _, _ = self.hidden_projection(batch)
        H = mean_fn + tf.einsum("btm,mq->btq", a1, self.q1.q_mu[0])
        a2, _, _ = self.label_projection(H)
        return tf.einsum("btm,mv->btv", a2, self.q2.q_mu[0])

