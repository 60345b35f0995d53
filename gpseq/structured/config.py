"""The structured GP model's settings (saved with a tagger). No TensorFlow: a tagger's
configuration is read and checked without it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from gpseq.errors import ConfigError
from gpseq.structured.likelihoods import LIKELIHOODS  # noqa: F401  (re-exported: the built-in names)
from gpseq.structured.likelihoods import check_estimator, check_likelihood_name
from gpseq.errors import check_number

KERNELS = ("linear+rbf", "linear", "paper-linear", "paper-rbf")
DEFAULT_KERNEL = "linear"  # the weight-space linear chain (the default training)
INDUCING_KERNEL = "linear+rbf"  # the default kernel with the sparse RBF GP: what asking for inducing points gives
DEFAULT_INDUCING = 64  # M of a kernel with inducing points when num_inducing is not given
ESTIMATORS = ("pathwise", "score")
UNARIES = ("shallow", "deep", "gpnet")
# The sizes a model may have: q(u) holds K × V Cholesky factors of M(M+1)/2 numbers, the deep
# unaries [D, Q] weights, the gpnet unaries V × F (or V × F(F+1)/2) numbers
MAX_INDUCING = 10_000
MAX_COMPONENTS = 64
MAX_HIDDEN_DIMS = 4096
MAX_RANDOM_FEATURES = 65_536


@dataclass
class ModelConfig:
    """The structured GP model (saved with the tagger)."""

    kernel: str | None = None  # see KERNELS; "paper-*" = the paper's pure inducing-point model. Not given:
    # DEFAULT_KERNEL, or INDUCING_KERNEL when num_inducing is given (`ModelConfig(num_inducing=128)` is
    # the linear part plus the sparse RBF GP on 128 inducing inputs, trained by SVI)
    likelihood: str = "exact"  # "exact" linear chain | "pseudo" piecewise pseudo-likelihood | a plug-in:
    # "package.module:function" or a name registered under the entry-point group gpseq_likelihoods
    # (`gpseq.structured.likelihoods`: the user's own code, imported to train; a saved model's plug-in
    # must be registered or allowed by the user who loads it)
    estimator: str = "pathwise"  # "pathwise" (reparameterised) | "score" (score function + control variates)
    num_inducing: int | None = None  # M, K-means centroids over training rows (shared by all labels);
    # not given: DEFAULT_INDUCING (used only by a kernel with inducing points)
    num_components: int = 1  # K, mixture components of q(u) (the paper's eq. 13)
    full_covariance: bool = True  # q(u) covariance: full (Cholesky) or diagonal
    whiten: bool = True
    prior_variance: float = 1.0  # σ² of the weight-space linear part, w ~ N(0, σ² I)
    learn_prior_variance: bool = False
    rbf_variance: float = 1.0
    rbf_lengthscale: float = 4.0
    linear_variance: float = 1.0  # of the "paper-linear" inducing-point kernel
    pairwise_prior_variance: float = 1.0
    rbf_conditional: str = "diag"  # p(g_n | u) of the inducing-point GP: "full" = N(A u, K̃_n), the
    # paper's Theorem 3 joint T × T conditional (eq. 18); "diag" = N(A u, diag K̃_n), a different
    # model (the fully independent, FITC-style conditional): each token's residual given u is
    # independent, so a sentence's unaries are correlated only through q(u) and q(w); per-token
    # marginals are the same
    initial_weight_variance: float = 1e-4  # initial s of q(w) (small: start near the MAP)
    jitter: float = 1e-6
    unary: str = "shallow"  # "deep": features → Q-dim GP layer → label GPs (gpseq/structured/deep_unaries.py);
    # "gpnet": the RBF part as random Fourier features with a Gaussian weight posterior per label, no
    # inducing points (gpseq/structured/gpnet_unaries.py)
    hidden_dims: int = 8  # Q, hidden width of the deep unaries
    num_random_features: int = 2000  # F (even) of the gpnet unaries
    gpnet_full_covariance: bool = False  # q(w) of the gpnet unaries: full [V, F, F] or diagonal (measured
    # better: Adam on the F(F+1)/2 free entries per label fits worse, benchmarks/RESULTS.md)

    def __post_init__(self):
        # the one rule that ties the two: inducing points asked for without a kernel bring the RBF GP
        # (after this both are set, so a saved configuration reads back as it was)
        if self.kernel is None:
            self.kernel = INDUCING_KERNEL if self.num_inducing is not None else DEFAULT_KERNEL
        if self.num_inducing is None:
            self.num_inducing = DEFAULT_INDUCING

    def with_inducing(self, num_inducing: int) -> "ModelConfig":
        """This model with `num_inducing` inducing inputs: the default kernel (`linear`) becomes
        `linear+rbf`, the linear part plus the sparse RBF GP on them (what `gpseq train --inducing M`
        asks for); a kernel that has inducing points already keeps it."""
        kernel = INDUCING_KERNEL if self.kernel == DEFAULT_KERNEL else self.kernel
        return replace(self, kernel=kernel, num_inducing=num_inducing)

    def validate(self) -> None:
        """ConfigError naming the first field of a wrong type, out of range or not allowed."""
        for name, value, allowed in (
            ("unary", self.unary, UNARIES),
            ("kernel", self.kernel, KERNELS),
            ("estimator", self.estimator, ESTIMATORS),
            ("rbf_conditional", self.rbf_conditional, ("full", "diag")),
        ):
            if value not in allowed:
                raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
        check_likelihood_name(self.likelihood)  # the name's form only: validating imports nothing
        check_estimator(self.likelihood, self.estimator)
        for name in ("full_covariance", "whiten", "learn_prior_variance", "gpnet_full_covariance"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"model.{name} must be true or false, got {getattr(self, name)!r}")
        for name, high in (("num_inducing", MAX_INDUCING), ("num_components", MAX_COMPONENTS),
                           ("hidden_dims", MAX_HIDDEN_DIMS), ("num_random_features", MAX_RANDOM_FEATURES)):
            check_number(f"model.{name}", getattr(self, name), low=1, high=high, integer=True)
        for name in ("prior_variance", "rbf_variance", "rbf_lengthscale", "linear_variance",
                     "pairwise_prior_variance", "initial_weight_variance"):
            check_number(f"model.{name}", getattr(self, name), above=0)
        check_number("model.jitter", self.jitter, low=0)
        if self.unary == "gpnet":  # replaces the RBF GP: needs a kernel with one, and has no mixture q(u)
            if self.kernel not in ("linear+rbf", "paper-rbf"):
                raise ConfigError(f"gpnet unaries replace the RBF GP: choose kernel 'linear+rbf' or 'paper-rbf', "
                                  f"not {self.kernel!r}")
            if self.num_components != 1:
                raise ConfigError("gpnet unaries have a single Gaussian weight posterior (num_components = 1)")
            if self.num_random_features < 2 or self.num_random_features % 2:
                raise ConfigError(f"num_random_features must be even and >= 2 (cos/sin pairs), "
                                  f"got {self.num_random_features}")

    @property
    def has_weight_space(self) -> bool:
        return self.kernel in ("linear+rbf", "linear")

    @property
    def has_inducing(self) -> bool:
        return self.kernel != "linear" and self.unary != "gpnet"  # gpnet: random features instead

    def to_dict(self) -> dict:
        return asdict(self)
