"""The SVI loop for the structured GP tagger: bucketed minibatches, Adam, early stopping on a
dev set, atomic checkpoints with resume, NaN guarding, progress callbacks, `tf.distribute`.

The model supplies `loss(batch, seed) -> (loss, metrics)` (negative ELBO of the batch with the
likelihood rescaled to the corpus by N_seq / B) and its `trainable_variables`; the trainer owns
the optimiser, the batch order and the bookkeeping. Noise is drawn with stateless ops seeded by
(seed, step), and the batch order of epoch e by (seed, e): a resumed run repeats exactly what an
uninterrupted one would have done.

Under a strategy with R replicas every step's global batch is cut into R sub-batches
(`gpseq.training.distribute`); replica r's loss is weighted by B_r / B so the replicas' sum is
the global-batch loss with the KL counted once (`gpseq.gp.trainer.build_svi_step`). Variables
live under the strategy (the model must be built in `strategy.scope()`); checkpoints are
written by the chief only and hold one copy of each variable, so a run resumes on any number of
replicas.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import tensorflow as tf

from gpseq.errors import ConfigError, NumericalError
from gpseq.gp.natgrad import natgrad_step
from gpseq.gp.trainer import STRATEGIES, build_svi_step, is_chief
from gpseq.training.batching import SequenceData
from gpseq.training.distribute import batch_plan, distributed_batches, sequence_count

log = logging.getLogger("gpseq.training")


@dataclass
class TrainingConfig:
    """Optimisation settings (saved with the model)."""

    method: str = "auto"  # "laplace" (MAP by L-BFGS + diagonal Laplace + evidence-fitted prior
    # variances, for the weight-space linear model) | "svi" (the ELBO by Adam) | "auto" (laplace
    # where the model allows it)
    max_iterations: int = 100  # L-BFGS iterations of the first MAP fit (laplace)
    prior_variance_grid: list = field(default_factory=lambda: [1.0, 4.0, 16.0])  # laplace: σ² of the
    # weights chosen among these by calibrated dev NLL (warm-started fits); empty = model.prior_variance
    evidence_rounds: int = 0  # prior-variance updates, each followed by a warm-started refit (laplace)
    calibrate: bool = True  # fit the predictive's variance scale and temperature on the dev split
    refit_with_dev: bool = True  # laplace: after calibrating, refit the weights on train + dev (warm start)
    batch_size: int = 32
    epochs: int = 10
    max_steps: int | None = None
    learning_rate: float = 0.02
    num_samples: int = 1  # Monte Carlo samples of f per sequence in the ELBO
    seed: int = 0
    dev_fraction: float = 0.1  # held-out slice of train when no dev set is given (0 = none)
    early_stopping: str = "nll"  # "f1" | "nll" | "none"
    patience: int = 3  # evaluations without improvement before stopping
    eval_every: int | None = None  # steps between dev evaluations (default: once per epoch)
    checkpoint_every: int = 200
    max_bad_steps: int = 20  # consecutive non-finite steps before giving up
    jit_compile: bool = False
    strategy: str = "default"  # "default" (one device; the GPU if any) | "mirrored" | "multiworker"
    devices: int | None = None  # replicas on this host (mirrored: default all GPUs; CPU: logical devices)
    natgrad_gamma: float | None = None  # natural-gradient step size on q(u) before each Adam step (≈0.01;
    # with Monte Carlo chain gradients 0.1 overshoots: such steps would make q(u) invalid and are skipped)

    def validate(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"strategy must be one of {', '.join(STRATEGIES)}; got {self.strategy!r}")
        if self.devices is not None and self.devices < 1:
            raise ConfigError(f"devices must be >= 1, got {self.devices}")
        if self.natgrad_gamma is not None and not 0.0 < self.natgrad_gamma <= 1.0:
            raise ConfigError(f"natgrad_gamma must be in (0, 1], got {self.natgrad_gamma}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.method not in ("auto", "laplace", "svi"):
            raise ConfigError(f"method must be auto, laplace or svi, got {self.method!r}")
        if self.max_iterations < 1 or self.evidence_rounds < 0:
            raise ConfigError("max_iterations must be >= 1 and evidence_rounds >= 0")
        if self.early_stopping not in ("f1", "nll", "none"):
            raise ConfigError(f"early_stopping must be f1, nll or none, got {self.early_stopping!r}")
        if not 0.0 <= self.dev_fraction < 1.0:
            raise ConfigError(f"dev_fraction must be in [0, 1), got {self.dev_fraction}")


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


class Trainer:
    """Runs SVI on a model with `loss(batch, seed)` and `trainable_variables` under `strategy`
    (default: the current one, i.e. the strategy whose scope the model was built in)."""

    def __init__(
        self,
        model,
        config: TrainingConfig,
        *,
        evaluate: Callable[[], tuple[float, dict]] | None = None,
        callbacks: list[Callable[[Progress], None]] | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        strategy: tf.distribute.Strategy | None = None,
    ):
        config.validate()
        self.model = model
        self.config = config
        self.evaluate = evaluate  # returns (score where higher is better, metrics)
        self.callbacks = list(callbacks or [])
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.strategy = strategy or tf.distribute.get_strategy()
        self.is_chief = is_chief(self.strategy)
        with self.strategy.scope():
            self.optimizer = tf.keras.optimizers.Adam(learning_rate=config.learning_rate)
        self.step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.state = TrainState()
        self._step_fn = None
        self._best_values: list[np.ndarray] | None = None

    # ---- the compiled step -------------------------------------------------------------------
    def _build_step(self, element_spec):
        model = self.model
        self._ensure_slots()

        def loss(batch, seed):
            return model.loss(batch, seed)[0]

        variables, pre_step = self._natural_gradient_split()
        signature = [element_spec, tf.TensorSpec([2], tf.int32)]
        return build_svi_step(self.strategy, loss, variables, self.optimizer,
                              size_fn=sequence_count, jit_compile=self.config.jit_compile,
                              input_signature=signature, pre_step=pre_step)

    def _natural_gradient_split(self):
        """Adam's variables and the pre-step: with `natgrad_gamma`, q(u) is updated only by a
        natural-gradient step (seed `gps-for-big-data-svi.md` §4-2) on the same batch and seed.
        The model provides `natgrad_elbo(batch, seed, q_mu, q_sqrt)` and `inducing` (q(u))."""
        model, gamma = self.model, self.config.natgrad_gamma
        if gamma is None:
            return model.trainable_variables, None
        q = getattr(model, "inducing", None)
        if q is None or not hasattr(model, "natgrad_elbo"):
            raise ConfigError("natgrad_gamma needs a model with inducing points (q(u)); this one has none")
        if self.strategy.num_replicas_in_sync > 1:
            raise ConfigError("natural-gradient steps need a single replica")
        natural = {v.ref() for v in q.trainable_variables}
        variables = [v for v in model.trainable_variables if v.ref() not in natural]

        class _View:  # what natgrad_step expects: `.q` and `.elbo(batch, q_mu=, q_sqrt=)`
            def __init__(self, seed):
                self.q, self.seed = q, seed

            def elbo(self, batch, q_mu, q_sqrt):
                return model.natgrad_elbo(batch, self.seed, q_mu, q_sqrt)

        def pre_step(batch, seed):
            natgrad_step(_View(seed), batch, gamma)

        return variables, pre_step

    # ---- checkpoints -------------------------------------------------------------------------
    def _checkpoint(self) -> tf.train.Checkpoint:
        return tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, step=self.step_var)

    def save_checkpoint(self) -> None:
        """Write model + optimiser + state to `checkpoint_dir/checkpoint` atomically (dir rename).

        Only the chief writes there; other workers write their (identical) variables to a
        temporary directory and delete it, since saving mirrored variables is collective.
        `.checkpoint.tmp-PID` directories of writers that were killed are removed first;
        state.json records the shape of every variable, so that `--resume` with another
        configuration or corpus names what differs."""
        if self.checkpoint_dir is None:
            return
        if not self.is_chief:
            scratch = Path(tempfile.mkdtemp(prefix="gpseq-worker-ckpt-"))
            try:
                self._checkpoint().write(str(scratch / "ckpt"))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            return
        from gpseq.corpora._atomic import stale_temp_siblings

        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        for stale in stale_temp_siblings(self.checkpoint_dir, (".checkpoint.tmp-",)):
            shutil.rmtree(stale, ignore_errors=True)
        final = self.checkpoint_dir / "checkpoint"
        tmp = self.checkpoint_dir / f".checkpoint.tmp-{os.getpid()}"
        old = self.checkpoint_dir / ".checkpoint.old"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        self._checkpoint().write(str(tmp / "ckpt"))
        state = asdict(self.state)
        state["best_values"] = None
        state["variables"] = self._variable_shapes()
        with open(tmp / "state.json", "w") as handle:
            json.dump(state, handle)
        if self._best_values is not None:
            np.savez(tmp / "best.npz", *self._best_values)
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)

    def _variable_shapes(self) -> dict[str, list[int]]:
        """{path of the variable in the model: shape} (what a checkpoint must match to be restored)."""
        flatten = getattr(self.model, "_flatten", None)
        if flatten is not None:
            found = flatten(predicate=lambda v: isinstance(v, tf.Variable), with_path=True)
            named = (("/".join(str(part) for part in path), v) for path, v in found)
        else:
            named = ((f"{i}:{v.name}", v) for i, v in enumerate(self.model.trainable_variables))
        return {name: [int(d) for d in variable.shape] for name, variable in named}

    def restore_checkpoint(self) -> bool:
        """Load the last checkpoint if there is one; returns whether one was found.

        A checkpoint written for another model (other labels, features, kernel, inducing points…)
        is a ConfigError naming the checkpoint directory and the first variables that differ."""
        if self.checkpoint_dir is None:
            return False
        final = self.checkpoint_dir / "checkpoint"
        if not (final / "state.json").exists():
            return False
        advice = "use another --checkpoint-dir, delete it, or train without --resume"
        try:
            with open(final / "state.json") as handle:
                state = json.load(handle)
            if not isinstance(state, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as error:
            raise ConfigError(f"{final}: unreadable checkpoint state ({error}); {advice}") from None
        saved = state.pop("variables", None)
        if isinstance(saved, dict):
            current = self._variable_shapes()
            differences = [
                f"{name} {saved.get(name, 'absent')} in the checkpoint, {current.get(name, 'absent')} now"
                for name in sorted(set(saved) | set(current)) if saved.get(name) != current.get(name)
            ]
            if differences:
                more = f" (and {len(differences) - 2} more)" if len(differences) > 2 else ""
                raise ConfigError(
                    f"{self.checkpoint_dir}: the checkpoint was written for another model configuration or "
                    f"corpus: {'; '.join(differences[:2])}{more}; {advice}"
                )
        self._ensure_slots()
        try:
            self._checkpoint().read(str(final / "ckpt")).assert_consumed()
        except (ValueError, AssertionError, tf.errors.OpError) as error:
            detail = " ".join(str(error).split())[:300]
            raise ConfigError(
                f"{self.checkpoint_dir}: the checkpoint does not match this model configuration or corpus "
                f"({detail}); {advice}"
            ) from None
        state.pop("best_values", None)
        try:
            self.state = TrainState(**state)
        except TypeError as error:
            raise ConfigError(f"{final}: unreadable checkpoint state ({error}); {advice}") from None
        best = final / "best.npz"
        if best.exists():
            with np.load(best, allow_pickle=False) as arrays:
                self._best_values = [arrays[f"arr_{i}"] for i in range(len(arrays.files))]
        return True

    def _ensure_slots(self) -> None:
        # Adam creates its slot variables lazily; build them so a checkpoint can fill them.
        if not self.optimizer.built:
            with self.strategy.scope():
                self.optimizer.build(self.model.trainable_variables)

    # ---- the loop ----------------------------------------------------------------------------
    def fit(self, data: SequenceData, *, resume: bool = False) -> TrainState:
        cfg = self.config
        if resume and not self.restore_checkpoint():
            log.warning("resume requested but no checkpoint found in %s; starting fresh", self.checkpoint_dir)
        n_seq = len(data)
        batches_per_epoch = math.ceil(n_seq / cfg.batch_size)
        total = batches_per_epoch * cfg.epochs
        if cfg.max_steps is not None:
            total = min(total, cfg.max_steps)
        eval_every = cfg.eval_every or batches_per_epoch
        tokens = max(1, int(data.lengths.sum()))
        start = time.perf_counter()
        bad_in_a_row = 0
        step = self.state.step
        plan = batch_plan(data.lengths, cfg.batch_size, cfg.seed, step, total)
        batches = distributed_batches(self.strategy, data, plan, self.model.dtype)
        if self._step_fn is None:
            self._step_fn = self._build_step(batches.element_spec)
        for batch in batches:
            if step >= total or self.state.stopped_early:
                break
            epoch = step // batches_per_epoch
            seed = tf.constant([cfg.seed, step], dtype=tf.int32)
            loss, applied = self._step_fn(batch, seed)
            step += 1
            self.state.step = step
            self.step_var.assign(step)
            if not bool(applied):
                bad_in_a_row += 1
                self.state.skipped_steps += 1
                log.warning("step %d: non-finite loss or gradient; step skipped", step)
                if bad_in_a_row >= cfg.max_bad_steps:
                    raise NumericalError(
                        f"{bad_in_a_row} consecutive non-finite training steps at step {step}; "
                        "try a smaller learning_rate"
                    )
                continue
            bad_in_a_row = 0
            elbo = -float(loss) / tokens
            self._emit(Progress(step, total, epoch, elbo, skipped_steps=self.state.skipped_steps,
                                elapsed_s=time.perf_counter() - start))
            if self.evaluate is not None and (step % eval_every == 0 or step == total):
                self._run_eval(step, total, epoch, elbo, start)
                if self.state.stopped_early:
                    break
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                self.save_checkpoint()
                self._emit(Progress(step, total, epoch, elbo, event="checkpoint",
                                    elapsed_s=time.perf_counter() - start))
        if self._best_values is not None:
            for variable, value in zip(self.model.trainable_variables, self._best_values):
                variable.assign(value)
        self.save_checkpoint()
        self._emit(Progress(step, total, step // max(1, batches_per_epoch), float("nan"), event="done",
                            dev_score=self.state.best_score, elapsed_s=time.perf_counter() - start))
        return self.state

    def _run_eval(self, step: int, total: int, epoch: int, elbo: float, start: float) -> None:
        score, metrics = self.evaluate()
        self.state.history.append({"step": step, "elbo_per_token": elbo, **metrics})
        metric = self.config.early_stopping
        improved = self.state.best_score is None or score > self.state.best_score
        if improved:
            self.state.best_score = float(score)
            self.state.best_step = step
            self.state.evals_without_improvement = 0
            self._best_values = [v.numpy() for v in self.model.trainable_variables]
        else:
            self.state.evals_without_improvement += 1
            if metric != "none" and self.state.evals_without_improvement >= self.config.patience:
                self.state.stopped_early = True
        self._emit(Progress(step, total, epoch, elbo, dev_score=float(score), dev_metric=metric,
                            event="eval", elapsed_s=time.perf_counter() - start))

    def _emit(self, progress: Progress) -> None:
        for callback in self.callbacks:
            callback(progress)
