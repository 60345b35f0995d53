"""The training settings (saved with a model) and what progress callbacks see. No TensorFlow:
the default training (`gpseq.training.laplace`) runs without it."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpseq.errors import ConfigError, check_number

STRATEGIES = ("default", "mirrored", "multiworker")  # tf.distribute strategies (`gpseq.training.distribute`)
SEED_LIMIT = 2**31  # seeds are TensorFlow int32 tensors (stateless random ops) and NumPy generator seeds


@dataclass
class TrainingConfig:
    """Optimisation settings (saved with the model)."""

    method: str = "auto"  # "laplace" (MAP by L-BFGS + diagonal Laplace + evidence-fitted prior
    # variances, for the weight-space linear model) | "svi" (the ELBO by Adam) | "auto" (laplace
    # where the model allows it)
    max_iterations: int = 100  # L-BFGS iterations of the first MAP fit (laplace)
    prior_variance_grid: list = field(default_factory=lambda: [16.0, 2.0])  # laplace: σ² of the
    # weights: the L1 path runs at the first; the others are tried in order at the chosen λ, each
    # kept only when its calibrated dev NLL is better by one standard error (`prior_path.choose_prior`).
    # Empty = model.prior_variance
    l1_grid: list = field(default_factory=lambda: [1.0, 0.1, 0.01, 0.0])  # laplace: strengths of the Laplace
    # prior (L1) on the weights, searched in this order within each σ² (a warm-started path from the
    # sparsest fit; the densest strength whose held-out NLL is not worse than the best by one standard
    # error is chosen, and the path ends at the first that is: `prior_path.PathChoice`; the fits run
    # on a budget, so the path's warm starts matter); the first pair (σ², l1) is the model without a
    # dev split
    pairwise_variance_grid: list = field(default_factory=lambda: [1.0, 16.0])  # laplace: the pairwise
    # potentials' prior variances σ²_P, tried in order at the chosen (σ², l1), each kept when its
    # held-out NLL is lower at all (no standard-error margin: V² weights, not a denser model): a large
    # σ²_P suits near-hard transitions (NER's) and hurts chunking. Empty = model.pairwise_prior_variance
    cross_fit_folds: int = 3  # laplace, small corpora: choose (σ², l1) and calibrate on out-of-fold
    cross_fit_tokens: int = 40000  # predictions of this many folds of train + dev when they hold at most
    # this many tokens (a dev split of a few sentences is too noisy to choose or calibrate on); 0 = never.
    # Beyond about 40k tokens a dev split does as well, for less training time (benchmarks/RESULTS.md,
    # "Where cross-fitting stops paying")
    evidence_rounds: int = 0  # prior-variance updates, each followed by a warm-started refit (laplace)
    calibrate: bool = True  # fit the predictive's variance scale and temperature on the dev split
    refit_with_dev: bool = True  # laplace: after calibrating, refit the weights on train + dev (warm start)
    batch_size: int = 32
    batch_tokens: int = 4096  # svi: at most this many padded tokens (B × T_max) a batch, as well as
    # batch_size sentences; a longer training sentence is cut into pieces of at most this many tokens
    epochs: int = 10
    max_steps: int | None = None
    learning_rate: float = 0.02
    num_samples: int | None = None  # Monte Carlo samples of f per sequence in the ELBO (None: the
    # estimator's default, 1 pathwise, 128 score-function; gpseq.structured.estimators.DEFAULT_SAMPLES)
    seed: int = 0
    dev_fraction: float = 0.1  # held-out slice of train when no dev set is given (0 = none), as runs of
    # consecutive sentences (`corpora.splits.train_dev_split`)
    dev_max_sentences: int | None = 2000  # at most this many sentences in that slice: it is held in memory
    # (a large corpus is not), and a few thousand sentences choose λ and calibrate as well as more
    early_stopping: str = "nll"  # "f1" | "nll" | "none"
    patience: int = 3  # evaluations without improvement before stopping
    eval_every: int | None = None  # steps between dev evaluations (default: once per epoch)
    checkpoint_every: int = 200
    max_bad_steps: int = 20  # consecutive non-finite steps before giving up
    jit_compile: bool = False
    strategy: str = "default"  # "default" (one device; the GPU if any) | "mirrored" | "multiworker"
    devices: int | None = None  # replicas on this host (mirrored: default all GPUs; CPU: logical devices)
    natgrad_gamma: float | None = None  # natural-gradient step size on q(u), taken with each Adam step on the
    # rest (≈0.01; with Monte Carlo chain gradients 0.1 overshoots: such steps would make q(u) invalid and are skipped)

    def validate(self) -> None:
        """ConfigError naming the first field of a wrong type or out of range."""
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"strategy must be one of {', '.join(STRATEGIES)}; got {self.strategy!r}")
        if self.method not in ("auto", "laplace", "svi"):
            raise ConfigError(f"method must be auto, laplace or svi, got {self.method!r}")
        if self.early_stopping not in ("f1", "nll", "none"):
            raise ConfigError(f"early_stopping must be f1, nll or none, got {self.early_stopping!r}")
        for name in ("calibrate", "refit_with_dev", "jit_compile"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"training.{name} must be true or false, got {getattr(self, name)!r}")
        for name, low, optional in (("max_iterations", 1, False), ("evidence_rounds", 0, False),
                                    ("cross_fit_tokens", 0, False), ("batch_size", 1, False),
                                    ("batch_tokens", 1, False), ("epochs", 0, False), ("max_steps", 0, True),
                                    ("num_samples", 1, True), ("dev_max_sentences", 1, True), ("patience", 0, False),
                                    ("eval_every", 1, True), ("checkpoint_every", 0, False),
                                    ("max_bad_steps", 1, False), ("devices", 1, True)):
            check_number(f"training.{name}", getattr(self, name), low=low, integer=True, optional=optional)
        check_number("training.cross_fit_folds", self.cross_fit_folds, low=0, integer=True)
        if self.cross_fit_folds == 1:
            raise ConfigError("training.cross_fit_folds must be 0 (none) or >= 2, got 1")
        check_number("training.seed", self.seed, low=0, high=SEED_LIMIT - 1, integer=True)
        check_number("training.learning_rate", self.learning_rate, low=0)
        check_number("training.natgrad_gamma", self.natgrad_gamma, above=0, high=1, optional=True)
        check_number("training.dev_fraction", self.dev_fraction, low=0, below=1)
        for name, low, above in (("prior_variance_grid", None, 0), ("pairwise_variance_grid", None, 0),
                                 ("l1_grid", 0, None)):
            grid = getattr(self, name)
            if grid is not None and not isinstance(grid, list):
                raise ConfigError(f"training.{name} must be a list of numbers, got {grid!r}")
            for value in grid or []:
                check_number(f"training.{name} values", value, low=low, above=above)


@dataclass
class Progress:
    """What a callback sees after each step (and after each dev evaluation)."""

    step: int
    total_steps: int
    epoch: int
    elbo_per_token: float
    dev_score: float | None = None
    dev_metric: str | None = None
    skipped_steps: int = 0
    elapsed_s: float = 0.0
    event: str = "step"  # "step" | "eval" | "checkpoint" | "done"
    loss: float = float("nan")  # the step's global-batch loss (elbo_per_token = −loss / training tokens)


@dataclass
class TrainState:
    """Bookkeeping saved next to each checkpoint (JSON)."""

    step: int = 0
    best_score: float | None = None
    best_step: int | None = None
    evals_without_improvement: int = 0
    skipped_steps: int = 0
    history: list = field(default_factory=list)
    stopped_early: bool = False
