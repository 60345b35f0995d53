"""The potentials of the structured GP: unary GPs over sparse token features and Gaussian pairwise
potentials (the paper, design notes `graybox-structured-gp.md` §3–4; equation numbers are its own).

Unary potentials, one latent function per label j:
    f_j(x) = b_j + w_jᵀx + g_j(x)  (+ a deep GP, `gpseq.structured.deep_unaries`; g_j as random features,
    `gpseq.structured.gpnet_unaries`)
with the linear part in weight space (`gpseq.gp.WeightSpaceLinear`: the linear-kernel GP without an
inducing approximation; DESIGN "The expressiveness trap") and g_j a sparse GP (`SparseGPUnaries`)
with K-means inducing inputs Z and q(u) a mixture of K Gaussians (eq. 13). Each sequence's
unaries are Gaussian with T_n-dimensional blocks per label (Theorem 3, eqs. 15–18): mean
X_n μ_j + A_n m_kj, covariance X_n diag(s_j) X_nᵀ + K̃_n + A_n S_kj A_nᵀ, where K̃_n is the joint
T_n × T_n conditional covariance of eq. 18 with `conditional="full"` and only its diagonal
with `"diag"` (the default: the FITC-style conditional p(g_n | u) = Π_t N(g_t; a_tᵀu, K̃_tt), a
different model from Theorem 3's; see `SparseGPUnaries`).

Batches are the tagger's padded batches: `indices [B, T, F]` (batch-local ids into
`feature_ids [U]`), `values [B, T, F]`, `lengths [B]`. Samples carry the mixture component and the
sample axes in front: `[K, S, B, T, V]`.

Draws with one seed are one draw of the model's global quantities — the weights w (keyed by feature
id, `gpseq.gp.hashed`), q(u), the pairwise potentials — whatever the batch: a Monte Carlo prediction
of a sentence does not depend on the sentences batched with it. Only the per-token conditional noise
of the sparse and deep GP parts is local, drawn from the seed folded with the batch (`local_seed`).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from gpseq._tfp import tfp

from gpseq.errors import ConfigError
from gpseq.features.padded import PaddedRows
from gpseq.gp.kernels import sparse_weighted_gram_blocks
from gpseq.gp.conditionals import conditional_noise, projections
from gpseq.gp.hashed import hashed_normal, mix32
from gpseq.gp.linalg import safe_cholesky
from gpseq.gp.variational import VariationalGaussian

tfd = tfp.distributions


def local_seed(seed, batch):
    """A stateless seed `[2]` for noise local to `batch`'s tokens: `seed` folded with a hash of the
    batch's features and lengths, so batches of other sentences get independent noise under one seed
    (the global draws stay keyed by `seed` alone)."""
    def digest(values):  # order-dependent hash of an integer vector → uint32
        words = mix32(tf.cast(values, tf.uint32) + tf.cast(tf.range(tf.size(values)), tf.uint32)
                      * tf.constant(0x9E3779B9, tf.uint32))
        return mix32(tf.reduce_sum(words))
    key = mix32(digest(batch["feature_ids"]) + digest(batch["lengths"]) * tf.constant(0x85EBCA6B, tf.uint32))
    return tf.random.experimental.stateless_fold_in(tf.cast(seed, tf.int32), tf.bitcast(key, tf.int32))


def global_rows(batch) -> PaddedRows:
    """The batch's tokens as padded rows over the whole feature space `[B, T, F]` (kernels gather Z by them)."""
    return PaddedRows(tf.gather(batch["feature_ids"], batch["indices"]), batch["values"])


class SparseGPUnaries(tf.Module):
    """g_j(x), j = 1…V: a sparse GP per label with `kernel`, shared inducing inputs `Z [M, D]` and
    q(u) = Σ_k π_k Π_j N(u_j; m_kj, S_kj) (`VariationalGaussian`, whitened by default).

    `conditional`: the prior conditional p(g_n | u) of a sequence. "full": N(A u, K̃_n) with the joint
    T × T block K̃_n = K_nn − A K_zn of the paper's eq. 18 (Theorem 3's model). "diag": N(A u, diag K̃_n),
    each token's residual independent given u (the fully independent / FITC conditional of
    Quiñonero-Candela & Rasmussen 2005): the same per-token marginals, but within a sentence the
    unaries are correlated only through q(u) (A S Aᵀ) and the weight-space part; the ELBO is that
    model's evidence lower bound, not a bound on Theorem 3's model's evidence. "full" costs one
    T × T Cholesky per sequence more.
    """

    def __init__(self, kernel, inducing_inputs, num_labels: int, *, full_cov: bool = True, whiten: bool = True,
                 num_components: int = 1, conditional: str = "diag", jitter: float = 1e-6, dtype=tf.float32):
        super().__init__(name="sparse_gp_unaries")
        inducing_inputs = np.asarray(inducing_inputs)
        self.kernel, self.whiten, self.conditional, self.jitter = kernel, whiten, conditional, jitter
        self.inducing_inputs_t = tf.constant(inducing_inputs.T, dtype)  # [D, M]
        self.q = VariationalGaussian(inducing_inputs.shape[0], num_labels, full_cov=full_cov, whiten=whiten,
                                     num_components=num_components, dtype=dtype)

    def kzz_cholesky(self):
        """chol(K_zz + jitter I) `[M, M]`."""
        return safe_cholesky(self.kernel.K(tf.transpose(self.inducing_inputs_t)), jitter=self.jitter)

    def projection(self, batch):
        """At the batch's tokens: A_w = K_xz L⁻ᵀ `[B, T, M]` (for K̃), the projection of q(u) `[B, T, M]`
        (A_w whitened, A = K_xz K_zz⁻¹ otherwise; the paper's eq. 17) and diag K_xx `[B, T]`."""
        rows = global_rows(batch)
        kxz = self.kernel.K(rows, tf.transpose(self.inducing_inputs_t))
        a_w, proj = projections(kxz, self.kzz_cholesky(), self.whiten)
        return a_w, proj, self.kernel.K_diag(rows)

    def mean(self, batch):
        """E_q[g] `[B, T, V]` (the mixture's mean)."""
        _, proj, _ = self.projection(batch)
        return tf.einsum("btm,kmv,k->btv", proj, tf.convert_to_tensor(self.q.q_mu), self.q.mixture_weights())

    def moments(self, batch):
        """Mean and marginal variance of g `[B, T, V]` each: diag K̃ + diag(A S Aᵀ), a mixture's
        variance taken as its components' mean variance."""
        a_w, proj, kxx = self.projection(batch)
        weights = self.q.mixture_weights()
        mean = tf.einsum("btm,kmv,k->btv", proj, tf.convert_to_tensor(self.q.q_mu), weights)
        variance = tf.nn.relu(kxx - tf.reduce_sum(a_w**2, -1))[..., None]
        scale = tf.convert_to_tensor(self.q.q_sqrt)
        if self.q.full_cov:  # [K, V, M, M]
            projected = tf.einsum("btm,kvmn->kbtvn", proj, scale)
            variance += tf.einsum("k,kbtv->btv", weights, tf.reduce_sum(projected**2, -1))
        else:  # [K, M, V]
            variance += tf.einsum("k,btm,kmv->btv", weights, proj**2, scale**2)
        return mean, variance

    def sample(self, batch, num_samples: int, seed):
        """Joint samples of g per sequence `[K, S, B, T, V]` (the paper's eqs. 15–16, 18): u ~ q_k(u)
        (v when whitened) shared by the batch, g = A u + a draw of the conditional N(0, K̃_n)."""
        seeds = tfp.random.split_seed(seed, 2)
        a_w, proj, kxx = self.projection(batch)
        draws = self.q.sample_u(num_samples, seeds[0])  # [K, S, M, V]
        g = tf.einsum("btm,ksmv->ksbtv", proj, draws)
        shape = tf.concat([tf.shape(draws)[:2], tf.shape(a_w)[:2], [self.q.num_latent]], 0)
        eps = tf.random.stateless_normal(shape, local_seed(seeds[1], batch), dtype=a_w.dtype)
        mask = tf.sequence_mask(batch["lengths"], tf.shape(a_w)[1], dtype=a_w.dtype)  # [B, T]
        if self.conditional == "full":
            return g + conditional_noise(eps, a_w, mask, self.jitter,
                                         k_block=self.kernel.K_sparse_block(global_rows(batch)))
        return g + conditional_noise(eps, a_w, mask, self.jitter, k_diag=kxx)

    def gaussian_blocks(self, batch):
        """q_k(g_n) per component and sequence: mean A m_k `[K, B, T, V]` and covariance
        K̃_n + A S_kj Aᵀ `[K, B, V, T, T]` (the paper's eqs. 15–16, 18; K̃_n its diagonal when
        `conditional = "diag"`, plus the sampler's jitter on the diagonal)."""
        a_w, proj, kxx = self.projection(batch)
        T = tf.shape(a_w)[1]
        if self.conditional == "full":
            k_tilde = self.kernel.K_sparse_block(global_rows(batch)) - tf.linalg.matmul(a_w, a_w, transpose_b=True)
        else:
            k_tilde = tf.linalg.diag(tf.nn.relu(kxx - tf.reduce_sum(a_w**2, -1)))
        k_tilde += self.jitter * tf.eye(T, dtype=a_w.dtype)  # [B, T, T]
        mean = tf.einsum("btm,kmv->kbtv", proj, tf.convert_to_tensor(self.q.q_mu))
        scale = tf.convert_to_tensor(self.q.q_sqrt)
        if self.q.full_cov:  # [K, V, M, M]
            projected = tf.einsum("btm,kvmn->kbvtn", proj, scale)
            cov = tf.linalg.matmul(projected, projected, transpose_b=True)
        else:  # [K, M, V]
            cov = tf.einsum("btm,kmv,bsm->kbvts", proj, scale**2, proj)
        return mean, cov + k_tilde[None, :, None]


class Unaries(tf.Module):
    """f_j(x) = b_j + w_jᵀx + g_j(x) (+ deep GP): the label bias `[V]` and any of a weight-space
    `linear` part, a `sparse` inducing-point GP, `deep` unaries and `gpnet` random-feature unaries
    (`GPNetUnaries`), whose posteriors are independent."""

    def __init__(self, num_features: int, num_labels: int, *, linear=None, sparse=None, deep=None, gpnet=None,
                 dtype=tf.float32):
        super().__init__(name="unaries")
        self.num_features, self.num_labels, self.dtype = num_features, num_labels, dtype
        self.label_bias = tf.Variable(tf.zeros([num_labels], dtype), name="label_bias")
        self.linear, self.sparse, self.deep, self.gpnet = linear, sparse, deep, gpnet

    @property
    def num_components(self) -> int:
        """K, the mixture components of q(u) (1 without a sparse GP)."""
        return self.sparse.q.num_components if self.sparse is not None else 1

    def mixture_weights(self):
        """π `[K]`."""
        if self.sparse is None:
            return tf.ones([1], self.dtype)
        return self.sparse.q.mixture_weights()

    def inducing_inputs(self) -> np.ndarray | None:
        """The K-means inducing inputs Z `[M, D]` of the sparse or deep GP (None without)."""
        part = self.sparse if self.sparse is not None else self.deep
        return None if part is None else part.inducing_inputs_t.numpy().T

    def variational_parameters(self):
        """[(q_mu, q_sqrt)] of the sparse GP's q(u), for natural-gradient steps ([] without one)."""
        return [] if self.sparse is None else [(self.sparse.q.q_mu, self.sparse.q.q_sqrt)]

    def kl(self):
        """KL(q(w)‖p(w)) + KL(q(u)‖p(u)) (Jensen bound when K > 1) + the deep GP's KLs → scalar."""
        kl = tf.zeros([], self.dtype)
        if self.linear is not None:
            kl += self.linear.kl()
        if self.sparse is not None:
            kl += self.sparse.q.kl(None if self.sparse.whiten else self.sparse.kzz_cholesky())
        if self.deep is not None:
            kl += self.deep.kl()
        if self.gpnet is not None:
            kl += self.gpnet.kl()
        return kl

    def _local_rows(self, batch) -> PaddedRows:
        return PaddedRows(batch["indices"], batch["values"])

    def mean(self, batch):
        """E_q[f] `[B, T, V]` (the deep part at its mean hidden representation)."""
        mean = self.label_bias + tf.zeros_like(batch["values"][..., :1])
        if self.linear is not None:
            mean += self.linear.mean_f(self._local_rows(batch), batch["feature_ids"])
        if self.sparse is not None:
            mean += self.sparse.mean(batch)
        if self.deep is not None:
            mean += self.deep.mean(batch)
        if self.gpnet is not None:
            mean += self.gpnet.mean(batch)
        return mean

    def moments(self, batch):
        """Mean and marginal variance of each unary potential, `[B, T, V]` each (linear part
        Σ_f x_f² s_f; sparse part diag K̃ + diag A S Aᵀ; gpnet part φᵀ V_j φ; deep unaries contribute
        their mean only)."""
        mean = self.label_bias + tf.zeros_like(batch["values"][..., :1])
        variance = tf.zeros_like(mean)
        if self.linear is not None:
            linear_mean, linear_variance = self.linear.marginals(self._local_rows(batch), batch["feature_ids"])
            mean, variance = mean + linear_mean, variance + linear_variance
        if self.sparse is not None:
            sparse_mean, sparse_variance = self.sparse.moments(batch)
            mean, variance = mean + sparse_mean, variance + sparse_variance
        if self.deep is not None:
            mean += self.deep.mean(batch)
        if self.gpnet is not None:
            gpnet_mean, gpnet_variance = self.gpnet.moments(batch)
            mean, variance = mean + gpnet_mean, variance + gpnet_variance
        return mean, variance

    def sample(self, batch, num_samples: int, seed):
        """Joint samples of the unaries per sequence `[K, S, B, T, V]` (the paper's eqs. 15–16, 19).

        Linear part: the U weights the batch touches drawn from q(w) (an exact joint sample over
        the batch at O(U · V) per draw). Sparse part: u ~ q_k(u) per mixture component (`sample`).
        GPNet part: the random-feature weights w ~ q(w), shared by the batch (`GPNetUnaries.sample`).
        """
        seeds = tfp.random.split_seed(seed, 3)
        K, S = self.num_components, num_samples
        B, T = tf.shape(batch["values"])[0], tf.shape(batch["values"])[1]
        V = self.num_labels
        f = self.label_bias + tf.zeros([K, S, B, T, V], self.dtype)
        if self.linear is not None:
            mu = tf.gather(self.linear.q_mu, batch["feature_ids"])  # [U, V]
            sd = tf.sqrt(tf.gather(tf.convert_to_tensor(self.linear.q_variance), batch["feature_ids"]))  # [U, V]
            U = tf.shape(mu)[0]
            # keyed by the feature's id (`hashed_normal`): w_d's draw is the same in every batch
            # that touches d; drawn in [U, S, V] so the table the tokens gather from needs no transpose
            eps = tf.reshape(hashed_normal(batch["feature_ids"], S * V, seeds[0], self.dtype), [U, S, V])
            w = mu[:, None] + sd[:, None] * eps  # [U, S, V]
            gathered = tf.gather(tf.reshape(w, [U, S * V]), batch["indices"])  # [B, T, F, S·V]
            lin = tf.einsum("btf,btfc->btc", batch["values"], gathered)  # [B, T, S·V]
            f += tf.transpose(tf.reshape(lin, [B, T, S, V]), [2, 0, 1, 3])  # [S, B, T, V]
        if self.sparse is not None:
            f += self.sparse.sample(batch, S, seeds[1])
        if self.deep is not None:
            f += self.deep.sample(batch, S, seeds[2])[None]  # [1, S, B, T, V]
        if self.gpnet is not None:
            f += self.gpnet.sample(batch, S, seeds[1])  # [1, S, B, T, V] (it replaces the sparse GP)
        return f

    def gaussian_blocks(self, batch):
        """Each sequence's unaries as Gaussians q_k(f_n) = N(b_kn, Σ_kn), one per mixture component:
        b `[K, B, T, V]` and per-label T × T covariances Σ `[K, B, V, T, T]` (the paper's
        Theorem 3, eqs. 15–16, 18), the exact marginals of `sample`'s joint draws. Linear part: mean
        X_n μ_j, covariance X_n diag(s_j) X_nᵀ (tokens sharing a feature are correlated); padded
        tokens get mean 0 and an identity block. GPNet part: mean Φ_n m_j, covariance Φ_n V_j Φ_nᵀ.
        Deep unaries have no Gaussian marginal (ConfigError)."""
        if self.deep is not None:
            raise ConfigError("deep unaries have no Gaussian marginal q(f_n): they need the pathwise estimator")
        B, T = tf.shape(batch["values"])[0], tf.shape(batch["values"])[1]
        mean = self.label_bias + tf.zeros([1, B, T, self.num_labels], self.dtype)
        cov = tf.zeros([1, B, self.num_labels, T, T], self.dtype)
        if self.linear is not None:
            if self.linear.q_factor is not None:
                raise ConfigError("gaussian_blocks supports a diagonal q(w) only")
            rows = self._local_rows(batch)
            variance = tf.gather(tf.convert_to_tensor(self.linear.q_variance), batch["feature_ids"])  # [U, V]
            mean += self.linear.mean_f(rows, batch["feature_ids"])
            cov += sparse_weighted_gram_blocks(rows, tf.gather(variance, rows.indices))
        if self.sparse is not None:
            sparse_mean, sparse_cov = self.sparse.gaussian_blocks(batch)
            mean, cov = mean + sparse_mean, cov + sparse_cov
        if self.gpnet is not None:
            gpnet_mean, gpnet_cov = self.gpnet.gaussian_blocks(batch)
            mean, cov = mean + gpnet_mean, cov + gpnet_cov
        mask = tf.sequence_mask(batch["lengths"], T, dtype=self.dtype)  # [B, T]
        outer = mask[:, None, :, None] * mask[:, None, None, :]  # [B, 1, T, T]
        return mean * mask[..., None], cov * outer + tf.linalg.diag(1.0 - mask)[:, None]


class GaussianPairwise(tf.Module):
    """q(f_bin) = N(m, diag s) over the V × V transition potentials, prior N(0, σ²_bin I) (the paper's
    eq. 12)."""

    def __init__(self, num_labels: int, *, prior_variance: float = 1.0, initial_variance: float = 1e-4,
                 dtype=tf.float32):
        super().__init__(name="pairwise")
        self.prior_variance, self.dtype = prior_variance, dtype
        self.mean = tf.Variable(tf.zeros([num_labels, num_labels], dtype), name="pairwise_mean")
        self.variance = tfp.util.TransformedVariable(
            tf.fill([num_labels, num_labels], tf.cast(initial_variance, dtype)), tfp.bijectors.Softplus(),
            name="pairwise_variance")

    def distribution(self):
        """q(f_bin) elementwise: `tfd.Normal` with batch shape `[V, V]`."""
        return tfd.Normal(self.mean, tf.sqrt(tf.convert_to_tensor(self.variance)))

    def kl(self):
        """KL(q(f_bin) ‖ p(f_bin)) → scalar."""
        prior = tfd.Normal(tf.zeros([], self.dtype), tf.sqrt(tf.cast(self.prior_variance, self.dtype)))
        return tf.reduce_sum(tfd.kl_divergence(self.distribution(), prior))

    def sample(self, num_samples: int, seed):
        """Draws of f_bin `[S, V, V]`."""
        return self.distribution().sample(num_samples, seed=seed)
