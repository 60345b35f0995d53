"""The sparse structured GP model of the tagger (the paper, design notes `graybox-structured-gp.md`
§3–5), composed of unary potentials, pairwise potentials and a structured likelihood
(`gpseq.structured.unaries`, `gpseq.structured.likelihoods`). ELBO (its eq. 14):

    L = N_seq / B · Σ_{n ∈ batch} Σ_k π_k E_{q_k}[log p(y_n | f_n)] − KL(q(w)) − KL(q(u)) − KL(q(f_bin))

with the expectation by Monte Carlo over joint draws of each sequence's potentials, differentiated
pathwise (reparameterised) or by score functions with control variates (§5.2,
`gpseq.structured.estimators`). `build_structured_gp` maps a `ModelConfig` (the strings saved with
a tagger) to the parts; prediction lives in `gpseq.structured.predict`.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import tensorflow as tf
from gpseq._tfp import tfp

from gpseq.errors import ConfigError, ModelFormatError
from gpseq.gp.kernels import RBF, Linear
from gpseq.gp.weight_space import WeightSpaceLinear
from gpseq.structured.config import ESTIMATORS, KERNELS, ModelConfig  # noqa: F401  (re-exported)
from gpseq.structured.estimators import DEFAULT_SAMPLES, score_function_ell
from gpseq.structured.likelihoods import check_estimator, likelihood_by_name
from gpseq.structured.unaries import GaussianPairwise, SparseGPUnaries, Unaries

# arrays.npz names of the parts' variables (the model format, older than the model's composition):
# the first prefix that matches a variable's path in the model is replaced.
_SAVED_NAMES = (("unaries/sparse/q/", "inducing/"), ("unaries/sparse/kernel/", "kernel/"), ("unaries/", ""),
                ("pairwise/", "pairwise_"))


class StructuredGP(tf.Module):
    """Unary GPs + Gaussian pairwise potentials + a structured likelihood (the paper's eqs. 2, 12, 14).

    `unaries`: `Unaries`; `pairwise`: `GaussianPairwise`; `likelihood`: an object with
    `log_prob(labels, unary, pairwise, lengths)` (`gpseq.structured.likelihoods`). `num_data` N_seq
    rescales minibatch likelihood terms in `loss` (None: the batch is the data), with `num_samples`
    Monte Carlo draws per sequence (None: the estimator's default, `estimators.DEFAULT_SAMPLES`).
    `variance_scale` α and `temperature` T calibrate the predictive on held-out data (never trained
    by the ELBO; `gpseq.structured.predict`).
    """

    def __init__(self, unaries: Unaries, pairwise: GaussianPairwise, likelihood, *, estimator: str = "pathwise",
                 num_data: int | None = None, num_samples: int | None = None):
        super().__init__(name="structured_gp")
        if estimator not in ESTIMATORS:
            raise ConfigError(f"estimator must be one of {', '.join(ESTIMATORS)}; got {estimator!r}")
        check_estimator(likelihood, estimator)
        self.unaries, self.pairwise, self._likelihood = unaries, pairwise, likelihood
        self.estimator, self.num_data = estimator, num_data
        self.num_samples = DEFAULT_SAMPLES[estimator] if num_samples is None else int(num_samples)
        self.num_features, self.num_labels, self.dtype = unaries.num_features, unaries.num_labels, unaries.dtype
        self.variance_scale = tf.Variable(tf.ones([], self.dtype), trainable=False, name="variance_scale")
        self.temperature = tf.Variable(tf.ones([], self.dtype), trainable=False, name="temperature")

    @property
    def likelihood(self):
        """The structured likelihood, fixed when the model is built (its estimator was checked
        against it then: a likelihood cannot be swapped into a built model)."""
        return self._likelihood

    def prior_kl(self):
        """KL(q(w)‖p(w)) + KL(q(u)‖p(u)) (Jensen bound when K > 1) + KL(q(f_bin)‖p(f_bin)) → scalar."""
        return self.unaries.kl() + self.pairwise.kl()

    def mixture_weights(self):
        """π `[K]` of q(u)'s components (`[1.]` without an inducing-point GP)."""
        return self.unaries.mixture_weights()

    def variational_parameters(self):
        """[(q_mu, q_sqrt)] of q(u) for natural-gradient steps (`gpseq.training.trainer`), [] without one."""
        return self.unaries.variational_parameters()

    def sample_potentials(self, batch, num_samples: int, seed):
        """Joint draws of the potentials: unary `[K, S, B, T, V]` and pairwise `[S, 1, V, V]`."""
        seeds = tfp.random.split_seed(seed, 2)
        unary = self.unaries.sample(batch, num_samples, seeds[0])
        return unary, self.pairwise.sample(num_samples, seeds[1])[:, None]

    def expected_log_likelihood(self, batch, num_samples: int, seed):
        """Σ_n Σ_k π_k E_{q_k}[log p(y_n | f_n)] over the batch, by Monte Carlo (the paper's eqs. 8, 19)."""
        if self.estimator == "score":
            return score_function_ell(self, batch, num_samples, seed)
        unary, pairwise = self.sample_potentials(batch, num_samples, seed)
        ll = self.likelihood.log_prob(batch["labels"], unary, pairwise, batch["lengths"])  # [K, S, B]
        per_component = tf.reduce_mean(tf.reduce_sum(ll, -1), axis=1)  # [K]
        return tf.reduce_sum(self.mixture_weights() * per_component)

    def elbo(self, batch, num_sequences, num_samples: int, seed):
        """Minibatch ELBO (the paper's eq. 14) with the likelihood rescaled by N_seq / B."""
        batch_size = tf.cast(tf.shape(batch["lengths"])[0], self.dtype)
        scale = tf.cast(num_sequences, self.dtype) / batch_size
        return scale * self.expected_log_likelihood(batch, num_samples, seed) - self.prior_kl()

    def loss(self, batch, seed):
        """−ELBO of the batch with `num_data` and `num_samples` (what the trainer minimises)."""
        num_data = self.num_data if self.num_data is not None else tf.shape(batch["lengths"])[0]
        return -self.elbo(batch, num_data, self.num_samples, seed)

    # ---- persistence as plain arrays ----------------------------------------------------------
    def _variables_by_name(self) -> dict[str, tf.Variable]:
        """{saved name: variable}: "var:" + the variable's path, in the names of `_SAVED_NAMES`."""
        found = self._flatten(predicate=lambda v: isinstance(v, tf.Variable), with_path=True)
        out = {}
        for path, variable in found:
            name = "/".join(str(part) for part in path)
            for prefix, saved in _SAVED_NAMES:
                if name.startswith(prefix):
                    name = saved + name[len(prefix):]
                    break
            out["var:" + name] = variable
        return out

    def get_state(self) -> dict[str, np.ndarray]:
        """Every variable as a named numpy array, plus the inducing inputs stored as CSR parts."""
        state = {name: variable.numpy() for name, variable in self._variables_by_name().items()}
        inducing = self.unaries.inducing_inputs()
        if inducing is not None:  # the single-layer GP's or the deep unaries' Z
            Z = sp.csr_matrix(inducing)
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
        for name, variable in self._variables_by_name().items():
            if name not in state and name in ("var:temperature", "var:variance_scale"):
                variable.assign(tf.ones([], self.dtype))  # models saved before calibration existed
                continue
            if name not in state:
                raise ModelFormatError(f"model arrays lack {name!r}")
            value = state[name]
            if tuple(value.shape) != tuple(variable.shape):
                raise ModelFormatError(f"model array {name!r} has shape {value.shape}, expected {tuple(variable.shape)}")
            variable.assign(value)


def build_structured_gp(config: ModelConfig, num_features: int, num_labels: int, inducing_inputs=None,
                        dtype=tf.float32, *, num_data: int | None = None, num_samples: int | None = None,
                        likelihood=None) -> StructuredGP:
    """The `StructuredGP` a `ModelConfig` describes: its kernel, likelihood and unaries by name.

    `inducing_inputs [M, D]` (dense K-means centroids) are needed by every kernel but "linear";
    `likelihood` (an object) replaces the config's named one, e.g. a `BlackBoxLikelihood`.
    """
    config.validate()
    V = num_labels
    linear = sparse = deep = gpnet = None
    if config.has_weight_space:
        linear = WeightSpaceLinear(num_features, V, prior_variance=config.prior_variance,
                                   learn_prior_variance=config.learn_prior_variance,
                                   initial_variance=config.initial_weight_variance, dtype=dtype)
    if config.has_inducing and inducing_inputs is None:
        raise ConfigError(f"kernel {config.kernel!r} needs inducing inputs")
    if config.unary == "deep":  # the deep unaries replace the single-layer inducing-point GP
        if not config.has_inducing:
            raise ConfigError(f"deep unaries need a kernel with inducing points, not {config.kernel!r}")
        if config.num_components != 1:
            raise ConfigError("deep unaries need a single-component q(u) (num_components = 1)")
        if config.estimator != "pathwise":
            raise ConfigError("deep unaries need the pathwise estimator")
        if config.kernel == "paper-linear":
            raise ConfigError("deep unaries use RBF kernels: choose kernel 'linear+rbf' or 'paper-rbf'")
        from gpseq.structured.deep_unaries import DeepUnaries

        deep = DeepUnaries(inducing_inputs, num_features, V, hidden_dims=config.hidden_dims,
                           rbf_variance=config.rbf_variance, rbf_lengthscale=config.rbf_lengthscale,
                           full_cov=config.full_covariance, conditional=config.rbf_conditional,
                           jitter=config.jitter, dtype=dtype)
    elif config.unary == "gpnet":  # random-feature RBF part instead of the inducing-point GP (validated)
        from gpseq.structured.gpnet_unaries import GPNetUnaries

        gpnet = GPNetUnaries(V, num_features=config.num_random_features, variance=config.rbf_variance,
                             lengthscale=config.rbf_lengthscale, full_cov=config.gpnet_full_covariance,
                             initial_scale=float(np.sqrt(config.initial_weight_variance)), dtype=dtype)
    elif config.has_inducing:
        if config.kernel == "paper-linear":
            kernel = Linear(variance=config.linear_variance, dtype=dtype)
        else:
            kernel = RBF(variance=config.rbf_variance, lengthscales=config.rbf_lengthscale, dtype=dtype)
        sparse = SparseGPUnaries(kernel, inducing_inputs, V, full_cov=config.full_covariance, whiten=config.whiten,
                                 num_components=config.num_components, conditional=config.rbf_conditional,
                                 jitter=config.jitter, dtype=dtype)
    unaries = Unaries(num_features, V, linear=linear, sparse=sparse, deep=deep, gpnet=gpnet, dtype=dtype)
    pairwise = GaussianPairwise(V, prior_variance=config.pairwise_prior_variance,
                                initial_variance=config.initial_weight_variance, dtype=dtype)
    return StructuredGP(unaries, pairwise, likelihood or likelihood_by_name(config.likelihood),
                        estimator=config.estimator, num_data=num_data, num_samples=num_samples)
