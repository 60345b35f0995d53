"""The sparse structured GP model of the tagger (seed `graybox-structured-gp.md` §3–5).

Unary potentials: one latent function per label j over sparse token features,
    f_j(x) = b_j + w_jᵀx + g_j(x)
with the linear part in weight space (the linear-kernel GP without an inducing approximation;
DESIGN "The expressiveness trap") and g_j a sparse GP with an RBF kernel and K-means inducing
inputs Z, whitened q(v) (mixture of K Gaussians, seed eq. 13). Pairwise potentials f_bin [V, V]
with prior N(0, σ_bin² I) and q = N(m, diag s). The likelihood is the linear-chain structured
softmax (seed eq. 1) or the piecewise pseudo-likelihood. ELBO (seed eq. 14):

    L = N_seq / B · Σ_{n ∈ batch} Σ_k π_k E_{q_k}[log p(y_n | f_n)] − KL(q(w)) − KL(q(u)) − KL(q(f_bin))

Each sequence's unaries are Gaussian with T_n-dimensional blocks per label (seed Theorem 3,
eqs. 15–18): mean X_n μ_j + A_n m_kj, covariance X_n diag(s_j) X_nᵀ + K̃_n + A_n S_kj A_nᵀ.
The "paper" kernels drop the weight-space part and keep only the inducing-point GP.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import scipy.sparse as sp
import tensorflow as tf
from gpseq._tfp import tfp

from gpseq.errors import ConfigError
from gpseq.features.padded import PaddedRows
from gpseq.gp.kernels import RBF, Linear
from gpseq.gp.linalg import safe_cholesky
from gpseq.gp.weight_space import WeightSpaceLinear, gather_sum
from gpseq.structured import chain

KERNELS = ("linear+rbf", "linear", "paper-linear", "paper-rbf")
LIKELIHOODS = ("exact", "pseudo")
ESTIMATORS = ("pathwise", "score")


@dataclass
class ModelConfig:
    """The structured GP model (saved with the tagger)."""

    kernel: str = "linear"  # see KERNELS; "paper-*" = the seed's pure inducing-point model
    likelihood: str = "exact"  # "exact" linear chain | "pseudo" piecewise pseudo-likelihood
    estimator: str = "pathwise"  # "pathwise" (reparameterised) | "score" (score function + control variates)
    num_inducing: int = 64  # M, K-means centroids over training rows (shared by all labels)
    num_components: int = 1  # K, mixture components of q(u) (seed eq. 13)
    full_covariance: bool = True  # q(u) covariance: full (Cholesky) or diagonal
    whiten: bool = True
    prior_variance: float = 1.0  # σ² of the weight-space linear part, w ~ N(0, σ² I)
    learn_prior_variance: bool = False
    rbf_variance: float = 1.0
    rbf_lengthscale: float = 4.0
    linear_variance: float = 1.0  # of the "paper-linear" inducing-point kernel
    pairwise_prior_variance: float = 1.0
    rbf_conditional: str = "diag"  # K̃_n blocks: "full" T×T (seed eq. 18) or "diag" (its diagonal)
    initial_weight_variance: float = 1e-4  # initial s of q(w) (small: start near the MAP)
    jitter: float = 1e-6
    unary: str = "shallow"  # "deep": features → Q-dim GP layer → label GPs (gpseq/structured/deep_unaries.py)
    hidden_dims: int = 8  # Q, hidden width of the deep unaries

    def validate(self) -> None:
        for name, value, allowed in (
            ("unary", self.unary, ("shallow", "deep")),
            ("kernel", self.kernel, KERNELS),
            ("likelihood", self.likelihood, LIKELIHOODS),
            ("estimator", self.estimator, ESTIMATORS),
            ("rbf_conditional", self.rbf_conditional, ("full", "diag")),
        ):
            if value not in allowed:
                raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
        if self.num_components < 1:
            raise ConfigError(f"num_components must be >= 1, got {self.num_components}")

    @property
    def has_weight_space(self) -> bool:
        return self.kernel in ("linear+rbf", "linear")

    @property
    def has_inducing(self) -> bool:
        return self.kernel != "linear"

    def to_dict(self) -> dict:
        return asdict(self)


def _normal_log_density(x, mean, var):
    """Elementwise log N(x; mean, var)."""
    return -0.5 * (tf.math.log(2.0 * np.pi * var) + (x - mean) ** 2 / var)


class StructuredGP(tf.Module):
    """|V| unary GPs over sparse token features + Gaussian pairwise potentials (seed eq. 2, 12)."""

    def __init__(
        self,
        config: ModelConfig,
        num_features: int,
        num_labels: int,
        inducing_inputs: np.ndarray | None = None,  # [M, D] dense K-means centroids
        dtype=tf.float32,
    ):
        super().__init__(name="structured_gp")
        config.validate()
        self.config = config
        self.num_features = num_features
        self.num_labels = num_labels
        self.dtype = dtype
        # Optional log p(y | f) as a NumPy function (labels, unary, pairwise, lengths) → [..., B];
        # only the score-function estimator can train with it (seed §5.2).
        self.black_box_log_likelihood = None
        # (q_mu, q_sqrt) while an ELBO is evaluated at other q(u) parameters; untracked by tf.Module
        object.__setattr__(self, "_q_override", None)
        V = num_labels
        # Prediction-time calibration fitted on held-out data (never trained by the ELBO):
        # potentials N(m, α v) → m / √(1 + π α v / 8) / T (see `predictive_potentials`).
        self.variance_scale = tf.Variable(tf.ones([], dtype), trainable=False, name="variance_scale")
        self.temperature = tf.Variable(tf.ones([], dtype), trainable=False, name="temperature")
        self.label_bias = tf.Variable(tf.zeros([V], dtype), name="label_bias")
        self.pairwise_mean = tf.Variable(tf.zeros([V, V], dtype), name="pairwise_mean")
        self.pairwise_variance = tfp.util.TransformedVariable(
            tf.fill([V, V], tf.cast(config.initial_weight_variance, dtype)),
            tfp.bijectors.Softplus(),
            name="pairwise_variance",
        )
        self.linear = None
        if config.has_weight_space:
            self.linear = WeightSpaceLinear(
                num_features,
                V,
                prior_variance=config.prior_variance,
                learn_prior_variance=config.learn_prior_variance,
                initial_variance=config.initial_weight_variance,
                dtype=dtype,
            )
        self.inducing = None
        if config.has_inducing:
            if inducing_inputs is None:
                raise ConfigError(f"kernel {config.kernel!r} needs inducing inputs")
            self.inducing_inputs_t = tf.constant(np.asarray(inducing_inputs).T, dtype)  # [D, M]
            if config.kernel == "paper-linear":
                self.kernel = Linear(variance=config.linear_variance, dtype=dtype)
            else:
                self.kernel = RBF(variance=config.rbf_variance, lengthscales=config.rbf_lengthscale, dtype=dtype)
            from gpseq.gp.variational import VariationalGaussian

            M = inducing_inputs.shape[0]
            self.inducing = VariationalGaussian(
                M,
                V,
                full_cov=config.full_covariance,
                whiten=config.whiten,
                num_components=config.num_components,
                dtype=dtype,
            )
        self.deep = None
        if config.unary == "deep":  # the deep unaries replace the single-layer inducing-point GP
            if not config.has_inducing:
                raise ConfigError(f"deep unaries need a kernel with inducing points, not {config.kernel!r}")
            from gpseq.structured.deep_unaries import DeepUnaries

            self.kernel = self.inducing = None
            self.deep = DeepUnaries(config, self.inducing_inputs_t, num_features, V, dtype)

    # ---- KL terms (closed forms) --------------------------------------------------------------
    def prior_kl(self):
        """KL(q(w)‖p(w)) + KL(q(u)‖p(u)) (Jensen bound when K > 1) + KL(q(f_bin)‖p(f_bin))."""
        kl = self._pairwise_kl()
        if self.linear is not None:
            kl += self.linear.kl()
        if self.inducing is not None:
            q_mu, q_sqrt = self._q_override or (None, None)
            kl += self.inducing.kl(None if self.config.whiten else self._kzz_cholesky(), q_mu=q_mu, q_sqrt=q_sqrt)
        if self.deep is not None:
            kl += self.deep.kl()
        return kl

    def _pairwise_kl(self):
        prior_var = tf.cast(self.config.pairwise_prior_variance, self.dtype)
        var = tf.convert_to_tensor(self.pairwise_variance)
        return 0.5 * tf.reduce_sum(var / prior_var + self.pairwise_mean**2 / prior_var - 1.0 - tf.math.log(var / prior_var))

    # ---- unary potentials ---------------------------------------------------------------------
    def _kzz_cholesky(self):
        Z = tf.transpose(self.inducing_inputs_t)
        return safe_cholesky(self.kernel.K(Z), jitter=self.config.jitter)

    def _inducing_projection(self, batch):
        """Whitened projection `A_w = K_xz L⁻ᵀ [B, T, M]` and `K_xx` diag `[B, T]` at the batch tokens."""
        global_ids = tf.gather(batch["feature_ids"], batch["indices"])  # [B, T, F]
        rows = PaddedRows(global_ids, batch["values"])
        Z = tf.transpose(self.inducing_inputs_t)
        kxz = self.kernel.K(rows, Z)  # [B, T, M]
        kxx = self.kernel.K_diag(rows)  # [B, T]
        chol = self._kzz_cholesky()
        shape = tf.shape(kxz)
        flat = tf.reshape(kxz, [-1, shape[-1]])
        a_w = tf.transpose(tf.linalg.triangular_solve(chol, tf.transpose(flat), lower=True))
        return tf.reshape(a_w, shape), kxx, chol

    def unary_mean(self, batch):
        """Posterior mean of the unaries E_q[f] `[B, T, V]` (mixture mean over components)."""
        mean = self.label_bias + tf.zeros_like(batch["values"][..., :1])
        if self.linear is not None:
            mu = tf.gather(self.linear.q_mu, batch["feature_ids"])  # [U, V]
            mean += gather_sum(mu, batch["indices"], batch["values"])
        if self.inducing is not None:
            a_w, _, chol = self._inducing_projection(batch)
            m = self._component_means(chol)  # [K, M, V]
            weights = self.inducing.mixture_weights()  # [K]
            mean += tf.einsum("btm,kmv,k->btv", a_w, m, weights)
        if self.deep is not None:
            mean += self.deep.mean(batch)
        return mean

    def _component_means(self, chol):
        m = self._q_mean()  # [K, M, V] (whitened: v; else u)
        if not self.config.whiten:
            # A = K_xz K_zz⁻¹ = A_w L⁻¹, so A m = A_w (L⁻¹ m)
            m = tf.linalg.triangular_solve(tf.broadcast_to(chol, [tf.shape(m)[0], *chol.shape]), m, lower=True)
        return m

    def sample_unary(self, batch, num_samples: int, seed, return_draws: bool = False):
        """Joint samples of the unaries per sequence `[K, S, B, T, V]` (seed eqs. 15–16, 19).

        Linear part: the U weights the batch touches drawn from q(w) (an exact joint sample over
        the batch at O(U · V) per draw). Inducing part: v ~ q_k(v) per mixture component,
        f = A_w v (whitened; A u otherwise), plus a draw of the conditional N(0, K̃_n).
        With `return_draws` also returns the Gaussian draws {"w": [S, U, V], "v": [K, S, M, V]}.
        """
        seeds = tfp.random.split_seed(seed, 4)
        K = self.config.num_components
        S = num_samples
        B, T = tf.shape(batch["values"])[0], tf.shape(batch["values"])[1]
        V = self.num_labels
        draws = {}
        f = self.label_bias + tf.zeros([K, S, B, T, V], self.dtype)
        if self.linear is not None:
            mu = tf.gather(self.linear.q_mu, batch["feature_ids"])  # [U, V]
            sd = tf.sqrt(tf.gather(self.linear.q_variance, batch["feature_ids"]))  # [U, V]
            U = tf.shape(mu)[0]
            # drawn directly in [U, S, V] so the table the tokens gather from needs no transpose
            eps = tf.random.stateless_normal(tf.stack([U, S, V]), seeds[0], dtype=self.dtype)
            w = mu[:, None] + sd[:, None] * eps  # [U, S, V]
            if return_draws:
                draws["w"] = tf.transpose(w, [1, 0, 2])  # [S, U, V]
            gathered = tf.gather(tf.reshape(w, [U, S * V]), batch["indices"])  # [B, T, F, S·V]
            lin = tf.einsum("btf,btfc->btc", batch["values"], gathered)  # [B, T, S·V]
            f += tf.transpose(tf.reshape(lin, [B, T, S, V]), [2, 0, 1, 3])  # [S, B, T, V]
        if self.inducing is not None:
            a_w, kxx, chol = self._inducing_projection(batch)
            draw = self._draw_inducing(S, seeds[1])  # [K, S, M, V]
            draws["v"] = draw
            if not self.config.whiten:  # u = L v_w: A u = A_w L⁻¹ u
                draw = tf.linalg.triangular_solve(tf.broadcast_to(chol, [K, S, *chol.shape]), draw, lower=True)
            f += tf.einsum("btm,ksmv->ksbtv", a_w, draw)
            f += self._conditional_noise(a_w, kxx, batch, [K, S], seeds[2])
        if self.deep is not None:
            f += self.deep.sample(batch, S, seeds[3])[None]  # [1, S, B, T, V]
        return (f, draws) if return_draws else f

    def _inducing_scale(self):
        """q(u) scale per component and label: `[K, V, M, M]` lower-triangular (diag: `[K, V, M]`)."""
        if self._q_override is not None:
            return tf.convert_to_tensor(self._q_override[1])
        return tf.convert_to_tensor(self.inducing.q_sqrt)

    def _q_mean(self):
        """q(u) means `[K, M, V]` (or the override of a natural-gradient step)."""
        if self._q_override is not None:
            return tf.convert_to_tensor(self._q_override[0])
        return tf.convert_to_tensor(self.inducing.q_mu)

    def _draw_inducing(self, num_samples: int, seed):
        """Draws of the inducing values from each mixture component `[K, S, M, V]`."""
        q_mu = self._q_mean()  # [K, M, V]
        K, M, V = tf.shape(q_mu)[0], tf.shape(q_mu)[1], tf.shape(q_mu)[2]
        eps = tf.random.stateless_normal([K, num_samples, V, M], seed, dtype=self.dtype)
        scale = self._inducing_scale()
        if self.config.full_covariance:
            noise = tf.einsum("kvmn,ksvn->ksmv", scale, eps)
        else:  # diagonal: q_sqrt [K, M, V]
            noise = tf.transpose(eps, [0, 1, 3, 2]) * scale[:, None]
        return q_mu[:, None] + noise

    def draw_log_densities(self, batch, draws, pairwise_draw):
        """Per-element log q of the weight and pairwise draws with their mean-scores, for the
        score-function estimator: yields (log_density [S, ...], score [S, ...])."""
        if "w" in draws:
            w = tf.stop_gradient(draws["w"])
            mu = tf.gather(self.linear.q_mu, batch["feature_ids"])
            var = tf.gather(self.linear.q_variance, batch["feature_ids"])
            yield _normal_log_density(w, mu, var), (w - mu) / var
        var = tf.convert_to_tensor(self.pairwise_variance)
        yield _normal_log_density(pairwise_draw, self.pairwise_mean, var), (pairwise_draw - self.pairwise_mean) / var

    def inducing_log_densities(self, v):
        """Per component k: log q_k(v_j) per label `[S, V]` and its mean-score `[S, M, V]`."""
        v = tf.stop_gradient(v)
        q_mu = self._q_mean()  # [K, M, V]
        scale = self._inducing_scale()
        out = []
        for k in range(self.config.num_components):
            diff = v[k] - q_mu[k]  # [S, M, V]
            if self.config.full_covariance:
                dist = tfp.distributions.MultivariateNormalTriL(
                    loc=tf.transpose(q_mu[k]), scale_tril=scale[k])  # batch [V], event [M]
                log_density = dist.log_prob(tf.transpose(v[k], [0, 2, 1]))  # [S, V]
                # score = Σ⁻¹ (v − m) with Σ = L Lᵀ, by two triangular solves (broadcast over S)
                chol = tf.broadcast_to(scale[k], tf.concat([tf.shape(diff)[:1], tf.shape(scale[k])], 0))
                rhs = tf.transpose(diff, [0, 2, 1])[..., None]  # [S, V, M, 1]
                half = tf.linalg.triangular_solve(chol, rhs, lower=True)
                score = tf.transpose(tf.linalg.triangular_solve(chol, half, lower=True, adjoint=True)[..., 0],
                                     [0, 2, 1])  # [S, M, V]
            else:
                var = scale[k] ** 2  # [M, V]
                log_density = tf.reduce_sum(_normal_log_density(v[k], q_mu[k], var), 1)
                score = diff / var
            out.append((log_density, score))
        return out

    def _conditional_noise(self, a_w, kxx, batch, lead, seed):
        """A draw of f − A u given u: N(0, K̃_n) per sequence and label (seed eq. 18) `[*lead, B, T, V]`."""
        B, T = tf.shape(a_w)[0], tf.shape(a_w)[1]
        V = self.num_labels
        eps = tf.random.stateless_normal(tf.concat([lead, [B, T, V]], 0), seed, dtype=self.dtype)
        mask = tf.sequence_mask(batch["lengths"], T, dtype=self.dtype)  # [B, T]
        if self.config.rbf_conditional == "diag":
            var = tf.nn.relu(kxx - tf.reduce_sum(a_w**2, -1)) * mask
            return eps * tf.sqrt(var + self.config.jitter)[..., None]
        rows = PaddedRows(tf.gather(batch["feature_ids"], batch["indices"]), batch["values"])
        kxx_block = self.kernel.K_sparse_block(rows)  # [B, T, T]
        cond = kxx_block - tf.linalg.matmul(a_w, a_w, transpose_b=True)
        # padded tokens get an identity block so the Cholesky exists; their rows are masked out.
        pad = (1.0 - mask)
        cond = cond * mask[:, :, None] * mask[:, None, :] + tf.linalg.diag(pad)
        chol = safe_cholesky(cond, jitter=self.config.jitter)  # [B, T, T]
        return tf.einsum("bts,...bsv->...btv", chol, eps) * mask[..., None]

    def sample_pairwise(self, num_samples: int, seed):
        """Samples of f_bin `[S, V, V]` from q(f_bin) = N(m, diag s)."""
        V = self.num_labels
        eps = tf.random.stateless_normal([num_samples, V, V], seed, dtype=self.dtype)
        return self.pairwise_mean + tf.sqrt(tf.convert_to_tensor(self.pairwise_variance)) * eps

    # ---- likelihood and ELBO ------------------------------------------------------------------
    def log_likelihood(self, labels, unary, pairwise, lengths):
        """log p(y | f) per sequence `[..., B]`: exact chain or piecewise pseudo-likelihood."""
        if self.black_box_log_likelihood is not None:
            # a plain Python/NumPy likelihood: evaluated only, never differentiated (score estimator)
            out = tf.numpy_function(self.black_box_log_likelihood, [labels, unary, pairwise, lengths],
                                    self.dtype, stateful=False)
            return tf.ensure_shape(out, unary.shape[:-2])
        if self.config.likelihood == "pseudo":
            return chain.pseudo_log_likelihood(labels, unary, pairwise, lengths)
        return chain.log_likelihood(labels, unary, pairwise, lengths)

    def expected_log_likelihood(self, batch, num_samples: int, seed):
        """Σ_n Σ_k π_k E_{q_k}[log p(y_n | f_n)] over the batch, by Monte Carlo (seed eqs. 8, 19)."""
        if self.config.estimator == "score":
            from gpseq.structured.estimators import score_function_ell

            return score_function_ell(self, batch, num_samples, seed)
        seeds = tfp.random.split_seed(seed, 2)
        unary = self.sample_unary(batch, num_samples, seeds[0])  # [K, S, B, T, V]
        pairwise = self.sample_pairwise(num_samples, seeds[1])[:, None]  # [S, 1, V, V]
        ll = self.log_likelihood(batch["labels"], unary, pairwise, batch["lengths"])  # [K, S, B]
        per_component = tf.reduce_mean(tf.reduce_sum(ll, -1), axis=1)  # [K]
        return tf.reduce_sum(self._mixture_weights() * per_component)

    def _mixture_weights(self):
        if self.inducing is None:
            return tf.ones([1], self.dtype)
        return self.inducing.mixture_weights()

    def elbo(self, batch, num_sequences, num_samples: int, seed, q_mu=None, q_sqrt=None):
        """Minibatch ELBO (seed eq. 14) with the likelihood rescaled by N_seq / B.

        `q_mu [K, M, V]`, `q_sqrt` (as `inducing.q_sqrt`) replace q(u)'s parameters for this
        evaluation (natural-gradient steps differentiate the ELBO through them)."""
        batch_size = tf.cast(tf.shape(batch["lengths"])[0], self.dtype)
        scale = tf.cast(num_sequences, self.dtype) / batch_size
        if q_mu is None:
            return scale * self.expected_log_likelihood(batch, num_samples, seed) - self.prior_kl()
        if self.inducing is None:
            raise ConfigError("q(u) overrides need a model with inducing points")
        object.__setattr__(self, "_q_override", (q_mu, q_sqrt))
        try:
            return scale * self.expected_log_likelihood(batch, num_samples, seed) - self.prior_kl()
        finally:
            object.__setattr__(self, "_q_override", None)

    # ---- prediction ---------------------------------------------------------------------------
    def mean_potentials(self, batch):
        """Posterior-mean unaries `[B, T, V]` and pairwise `[V, V]` (the fast prediction mode)."""
        return self.unary_mean(batch), tf.convert_to_tensor(self.pairwise_mean)

    def calibrate_samples(self, batch, unary, pairwise):
        """Samples of the calibrated predictive: spread around the mean scaled by √α, then / T."""
        root = tf.sqrt(self.variance_scale)
        mean, pair_mean = self.mean_potentials(batch)
        unary = (mean + root * (unary - mean)) / self.temperature
        pairwise = (pair_mean + root * (pairwise - pair_mean)) / self.temperature
        return unary, pairwise

    def unary_moments(self, batch):
        """Posterior mean and marginal variance of each unary potential, `[B, T, V]` each
        (linear part Σ_f x_f² s_f; inducing part diag(K̃) + diag(A S Aᵀ), mixtures by their mean
        component variance; deep unaries contribute their mean only)."""
        mean = self.unary_mean(batch)
        variance = tf.zeros_like(mean)
        if self.linear is not None:
            var = tf.gather(tf.convert_to_tensor(self.linear.q_variance), batch["feature_ids"])  # [U, V]
            variance += gather_sum(var, batch["indices"], batch["values"] ** 2)
        if self.inducing is not None:
            a_w, kxx, _ = self._inducing_projection(batch)  # [B, T, M], [B, T]
            variance += tf.nn.relu(kxx - tf.reduce_sum(a_w**2, -1))[..., None]
            scale = self._inducing_scale()
            weights = self.inducing.mixture_weights()
            if self.config.full_covariance:  # [K, V, M, M]
                proj = tf.einsum("btm,kvmn->kbtvn", a_w, scale)
                variance += tf.einsum("k,kbtv->btv", weights, tf.reduce_sum(proj**2, -1))
            else:  # [K, M, V]
                variance += tf.einsum("k,btm,kmv->btv", weights, a_w**2, scale**2)
        return mean, variance

    def predictive_potentials(self, batch, moments=None):
        """Deterministic approximation of the posterior-averaged chain: each Gaussian potential
        N(m, α v) replaced by m / √(1 + π α v / 8) (MacKay's probit approximation of E[softmax]),
        all divided by the temperature T; one forward–backward on these gives the calibrated
        marginals. Unary `[B, T, V]`, pairwise `[V, V]`; `moments` = `unary_moments(batch)` if known."""
        mean, variance = self.unary_moments(batch) if moments is None else moments
        alpha = self.variance_scale
        factor = np.pi / 8.0
        unary = mean / tf.sqrt(1.0 + factor * alpha * variance) / self.temperature
        pair_var = tf.convert_to_tensor(self.pairwise_variance)
        pairwise = self.pairwise_mean / tf.sqrt(1.0 + factor * alpha * pair_var) / self.temperature
        return unary, pairwise

    def predict_marginals(self, batch, num_samples: int, seed):
        """Per-token label marginals averaged over posterior samples of f `[B, T, V]`, with the
        samples (unary `[K, S, B, T, V]`, pairwise `[S, 1, V, V]`) and their log Z `[K, S, B]`."""
        seeds = tfp.random.split_seed(seed, 2)
        unary = self.sample_unary(batch, num_samples, seeds[0])  # [K, S, B, T, V]
        pairwise = self.sample_pairwise(num_samples, seeds[1])[:, None]  # [S, 1, V, V]
        unary, pairwise = self.calibrate_samples(batch, unary, pairwise)
        marg, log_z = chain.unary_marginals(unary, pairwise, batch["lengths"], return_log_partition=True)
        weights = self._mixture_weights()
        mean = tf.einsum("k,ksbtv->btv", weights, marg) / tf.cast(num_samples, marg.dtype)
        return mean, unary, pairwise, log_z

    # ---- persistence as plain arrays ----------------------------------------------------------
    def _variables_by_path(self) -> dict[str, tf.Variable]:
        found = self._flatten(predicate=lambda v: isinstance(v, tf.Variable), with_path=True)
        return {"var:" + "/".join(str(part) for part in path): variable for path, variable in found}

    def get_state(self) -> dict[str, np.ndarray]:
        """Every variable as a named numpy array, plus the inducing inputs stored as CSR parts."""
        state = {name: variable.numpy() for name, variable in self._variables_by_path().items()}
        if self.config.has_inducing:  # the single-layer GP's or the deep unaries' Z
            Z = sp.csr_matrix(self.inducing_inputs_t.numpy().T)
            state.update({"inducing_inputs/data": Z.data, "inducing_inputs/indices": Z.indices,
                          "inducing_inputs/indptr": Z.indptr,
                          "inducing_inputs/shape": np.asarray(Z.shape, np.int64)})
        return state

    @staticmethod
    def inducing_from_state(state: dict[str, np.ndarray]) -> np.ndarray | None:
        if "inducing_inputs/data" not in state:
            return None
        return sp.csr_matrix(
            (state["inducing_inputs/data"], state["inducing_inputs/indices"], state["inducing_inputs/indptr"]),
            shape=tuple(state["inducing_inputs/shape"]),
        ).toarray()

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Assign the arrays of `get_state`; a missing or mis-shaped array is a ModelFormatError."""
        from gpseq.errors import ModelFormatError

        for name, variable in self._variables_by_path().items():
            if name not in state and name in ("var:temperature", "var:variance_scale"):
                variable.assign(tf.ones([], self.dtype))  # models saved before calibration existed
                continue
            if name not in state:
                raise ModelFormatError(f"model arrays lack {name!r}")
            value = state[name]
            if tuple(value.shape) != tuple(variable.shape):
                raise ModelFormatError(f"model array {name!r} has shape {value.shape}, expected {tuple(variable.shape)}")
            variable.assign(value)
