"""GPNet unaries for the tagger (`ModelConfig.unary = "gpnet"`): the RBF part of the unaries as a
random-feature inference network (design notes `inference-networks-gp.md`, "Examples of inference
networks") instead of the sparse inducing-point GP:

    g_j(x) = φ(x)ᵀ w_j,   w_j ~ q(w_j) = N(m_j, L_j L_jᵀ),   p(w_j) = N(0, I),   j = 1…V,

φ the random Fourier features of the RBF kernel σ² exp(−‖x − x'‖² / (2ℓ²)) over the token's sparse
feature vector x (`gpseq.gp.random_features.fourier_features`), shared by the labels; each label
has its own Gaussian weight posterior. The KL of q(w) to N(0, I) is exactly the KL of the posterior
process to the random-feature GP prior, so no inducing or measurement points are needed.

**Frequencies.** Ω (D × F/2) is never stored: its entries are a fixed function of (seed, feature
id, column) (`hashed_normal`); a batch regenerates the rows of the U features it touches and sums
them weighted by the feature values (`gather_sum`), O(U · F) per batch.

**Weight posterior.** Diagonal by default (`ModelConfig.gpnet_full_covariance = False`), started
near the MAP like the weight-space linear part: Adam moves each of a full factor's F(F+1)/2 entries
per label by about the learning rate whatever its noisy gradient, which inflates the off-diagonal
variance (benchmarks/RESULTS.md, "GPNet unaries").

**Training: the reparameterised ELBO, not GPNet's functional mirror descent** (Algorithm 1 needs
measurement points because a general network's KL to the GP prior has no closed form; here it is
`VariationalGaussian.kl`, and with β_t = 1 its surrogate L_t is the ELBO itself). q(w), σ² and ℓ
train with the rest of the tagger (`StructuredGP.elbo`), pathwise through joint draws w ~ q(w)
shared by the batch, or by score functions (`gaussian_blocks`).
"""

from __future__ import annotations

import tensorflow as tf

from gpseq.errors import ConfigError
from gpseq.gp.hashed import hashed_normal
from gpseq.gp.kernels import RBF
from gpseq.gp.random_features import fourier_features
from gpseq.gp.variational import VariationalGaussian
from gpseq.gp.weight_space import gather_sum

class GPNetUnaries(tf.Module):
    """Random-feature RBF unaries g `[.., B, T, V]` over padded sparse token features (module docstring).

    `num_features` F (even): random Fourier features, F/2 frequencies per input feature; `variance`,
    `lengthscale`: the RBF kernel's starting σ², ℓ (learned); `full_cov`: q(w_j) full (Cholesky
    `[V, F, F]`) or diagonal `[F, V]`, starting at N(0, `initial_scale`² I); `seed`: the frequencies'
    seed (fixed: Ω is regenerated, not saved).
    """

    def __init__(self, num_labels: int, *, num_features: int = 200, variance: float = 1.0,
                 lengthscale: float = 4.0, full_cov: bool = True, initial_scale: float = 1.0, seed: int = 0,
                 dtype=tf.float32):
        super().__init__(name="gpnet_unaries")
        if num_features < 2 or num_features % 2:
            raise ConfigError(f"random Fourier features come in cos/sin pairs: num_features must be even "
                              f"and >= 2, got {num_features}")
        self.num_features, self.num_labels, self.seed, self.dtype = int(num_features), num_labels, int(seed), dtype
        self.kernel = RBF(variance=variance, lengthscales=lengthscale, dtype=dtype)  # σ², ℓ of φ
        self.q = VariationalGaussian(self.num_features, num_labels, full_cov=full_cov, whiten=True, dtype=dtype,
                                     initial_scale=initial_scale, name="weights")

    def frequencies(self, feature_ids):
        """Ω's rows of the features `feature_ids [U]` → `[U, F/2]` (`hashed_normal`)."""
        return hashed_normal(feature_ids, self.num_features // 2, self.seed, self.dtype)

    def features(self, batch):
        """φ(x) of the batch's tokens `[B, T, F]`: Ωᵀx / ℓ by gather-and-sum over each token's features."""
        omega = self.frequencies(batch["feature_ids"])  # [U, F/2]
        projection = gather_sum(omega, batch["indices"], batch["values"])  # [B, T, F/2]
        projection /= tf.convert_to_tensor(self.kernel.lengthscales)
        return fourier_features(projection, tf.sqrt(tf.convert_to_tensor(self.kernel.variance)))

    def kl(self):
        """KL(q(w) ‖ N(0, I)) → scalar (= the KL to the random-feature GP prior)."""
        return self.q.kl()

    def mean(self, batch):
        """E_q[g] = φ(x)ᵀ m_j `[B, T, V]`."""
        return tf.einsum("btf,fv->btv", self.features(batch), self.q.q_mu[0])

    def moments(self, batch):
        """Mean and marginal variance φᵀ L_j L_jᵀ φ of g `[B, T, V]` each."""
        phi = self.features(batch)
        mean = tf.einsum("btf,fv->btv", phi, self.q.q_mu[0])
        scale = tf.convert_to_tensor(self.q.q_sqrt)[0]
        if self.q.full_cov:  # [V, F, F]
            variance = tf.reduce_sum(tf.einsum("btf,vfg->btvg", phi, scale) ** 2, -1)
        else:  # [F, V]
            variance = tf.einsum("btf,fv->btv", phi**2, scale**2)
        return mean, variance

    def sample(self, batch, num_samples: int, seed):
        """Joint draws `[1, S, B, T, V]`: w ~ q(w) once per draw, shared by every token of the batch
        (exact: given w the random-feature GP has no residual)."""
        return tf.einsum("btf,ksfv->ksbtv", self.features(batch), self.q.sample_u(num_samples, seed))

    def gaussian_blocks(self, batch):
        """q(g_n) per sequence: mean `[1, B, T, V]` and covariance Φ_n L_j L_jᵀ Φ_nᵀ `[1, B, V, T, T]`."""
        phi = self.features(batch)
        mean = tf.einsum("btf,fv->btv", phi, self.q.q_mu[0])[None]
        scale = tf.convert_to_tensor(self.q.q_sqrt)[0]
        if self.q.full_cov:
            projected = tf.einsum("btf,vfg->bvtg", phi, scale)
            cov = tf.linalg.matmul(projected, projected, transpose_b=True)
        else:
            cov = tf.einsum("btf,fv,bsf->bvts", phi, scale**2, phi)
        return mean, cov[None]
