"""One SVI trainer for every model of gpseq: the structured GP tagger, SVGPs and deep GPs.

The model protocol:
- `loss(batch, seed) → scalar`: the minibatch loss, the negative ELBO with the likelihood rescaled
  to the data by N / B; `seed` (int32 `[2]`) drives its stateless noise (closed-form losses ignore it);
- `trainable_variables`;
- optionally `variational_parameters() → [(q_mu, q_sqrt), ...]`: Gaussian q(u)s that
  `natgrad_gamma` steps by natural gradients (`gpseq.gp.natgrad`) from the same gradients that
  feed Adam on everything else.

The trainer owns the optimisers, the batch order and the bookkeeping: early stopping on a dev
evaluation, atomic checkpoints with resume (`gpseq.training.checkpoint`), NaN guarding, progress
callbacks, `tf.distribute` (`gpseq.training.distribute`). Data is either the tagger's
`SequenceData` — length-bucketed batches, epoch e's order drawn from (seed, e), each global batch
cut into one sub-batch per replica — or any iterable (or `tf.data.Dataset`) of global batches,
re-iterated until the step budget is spent. Noise is drawn with stateless ops seeded by (seed,
step): a resumed tagger run repeats exactly what an uninterrupted one would have done.

Under a strategy with R replicas replica r's loss is weighted by B_r / B, so the replicas' sum is
the global-batch loss with the KL counted once. Variables live under the strategy (the model must
be built in `strategy.scope()`); checkpoints are written by the chief only and hold one copy of
each variable, so a run resumes on any number of replicas.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import asdict, replace
from typing import Callable, Iterable

import numpy as np
import tensorflow as tf

from gpseq.errors import ConfigError, NumericalError
from gpseq.gp.natgrad import NaturalGradient, natural_variables
from gpseq.training.batching import SequenceData, batch_count
from gpseq.training.checkpoint import Checkpoints
from gpseq.training.config import Progress, TrainingConfig, TrainState  # noqa: F401  (re-exported)
from gpseq.training.distribute import (
    batch_plan, batch_size_of, build_svi_step, distributed_batches, is_chief,
)

log = logging.getLogger("gpseq.training")


class Trainer:
    """Minimises `model.loss(batch, seed)` (module docstring) under `strategy` (default: the current
    one, i.e. the strategy whose scope the model was built in).

    `config` holds the optimisation settings; keyword `settings` override its fields
    (`Trainer(svgp, learning_rate=0.01, natgrad_gamma=0.5)`). `evaluate()` returns (score where
    higher is better, metrics) for early stopping; `callbacks` receive a `Progress` after every
    step, evaluation and checkpoint.
    """

    def __init__(
        self,
        model,
        config: TrainingConfig | None = None,
        *,
        evaluate: Callable[[], tuple[float, dict]] | None = None,
        callbacks: list[Callable[[Progress], None]] | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        strategy: tf.distribute.Strategy | None = None,
        **settings,
    ):
        config = replace(config or TrainingConfig(), **settings)
        config.validate()
        self.model, self.config = model, config
        self.evaluate = evaluate
        self.callbacks = list(callbacks or [])
        self.strategy = strategy or tf.distribute.get_strategy()
        self.is_chief = is_chief(self.strategy)
        self.natural = self._natural_gradient()
        pairs = self.natural[1] if self.natural is not None else []
        natural = {v.ref() for pair in pairs for v in natural_variables(*pair)}
        self.adam_variables = [v for v in model.trainable_variables if v.ref() not in natural]
        with self.strategy.scope():
            self.optimizer = tf.keras.optimizers.Adam(learning_rate=config.learning_rate)
            self.optimizer.build(self.adam_variables)  # slots exist before a checkpoint is read
        self.step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self._counted = 0  # step_var's value as far as this object knows (the compiled step counts it up)
        self.checkpoints = None
        if checkpoint_dir:
            self.checkpoints = Checkpoints(checkpoint_dir, model, self.optimizer, self.step_var, is_chief=self.is_chief)
        self.state = TrainState()
        self._steps: dict = {}  # compiled steps: with an input signature (True) or without
        self._concrete: dict = {}  # the signature-free step's concrete functions by batch type (`_run_step`)
        self._flat_calls = True  # whether `_run_step` may use TF's private flat call
        self._best_values: list[np.ndarray] | None = None

    def _natural_gradient(self):
        """(NaturalGradient, [(q_mu, q_sqrt), ...]) when `natgrad_gamma` is set, else None."""
        gamma = self.config.natgrad_gamma
        if gamma is None:
            return None
        pairs = list(getattr(self.model, "variational_parameters", lambda: [])())
        if not pairs:
            raise ConfigError(f"natgrad_gamma needs a Gaussian q(u) over inducing points (variational_parameters); "
                              f"this {type(self.model).__name__} has none")
        for pair in pairs:
            NaturalGradient.check(*pair)
        return NaturalGradient(gamma), pairs

    def _compiled_step(self, signature=None):
        """The compiled step for batches of `signature` (the tagger's; traced once) or, without one,
        for any batches (retraced as their shapes need)."""
        key = signature is not None
        if key not in self._steps:
            input_signature = None if signature is None else [signature]
            self._steps[key] = build_svi_step(
                self.strategy, self.model.loss, self.adam_variables, self.optimizer, natural=self.natural,
                size_fn=batch_size_of, jit_compile=self.config.jit_compile, input_signature=input_signature,
                loss_args=self._next_seed)
        return self._steps[key]

    def _run_step(self, batch):
        """The signature-free compiled step on `batch` → (loss, applied). A tuple or list of eager tensors
        (the usual batch of `step` and of `fit` on a dataset) goes straight to the concrete function
        traced for its dtypes and shapes, with its flat tensors: `tf.function`'s own dispatch (binding
        the arguments, looking up their trace types, casting them to the traced signature) is a
        sizeable share of a small SVGP step. Other batches (dicts,
        distributed values) go through the `tf.function`."""
        function = self._compiled_step()
        if type(batch) not in (tuple, list) or not all(isinstance(t, tf.Tensor) for t in batch) \
                or not tf.executing_eagerly():
            return function(batch)
        key = (type(batch), *((t.dtype, t.shape) for t in batch))
        concrete = self._concrete.get(key)
        if concrete is None:
            concrete = self._concrete[key] = function.get_concrete_function(batch)
        call_flat = getattr(concrete, "_call_flat", None) if self._flat_calls else None  # TF's private
        if call_flat is None:  # flat call (no argument binding); a TF without it: the public call
            return concrete(batch)
        try:
            return call_flat(list(batch), concrete.captured_inputs)
        except TypeError:  # a TF (the package allows < 3) whose private call takes other arguments:
            self._flat_calls = False  # arguments are checked before anything runs; the public call from now on
            return concrete(batch)

    def _next_seed(self):
        """(seed int32 `[2]`,) = ((config.seed, step),) and step_var += 1, inside the compiled step: a
        new seed tensor fed from Python every step costs a sizeable share of a small SVGP step."""
        step = self.step_var.assign_add(1) - 1
        return (tf.stack([tf.constant(self.config.seed, tf.int32), tf.cast(step, tf.int32)]),)

    def _sync_counter(self) -> None:
        """step_var = state.step when they differ (after a restore, a refused step or a caller's edit)."""
        if self._counted != self.state.step:
            self.step_var.assign(self.state.step)
            self._counted = self.state.step

    # ---- steps -----------------------------------------------------------------------------------
    def step(self, batch) -> float:
        """One training step on a global batch of tensors; returns the global-batch loss before the
        update. A non-finite loss or gradient raises `NumericalError` (no variable changed)."""
        self._sync_counter()
        loss, applied = self._run_step(batch)
        self._counted += 1
        value = float(loss)
        if not bool(applied) or not math.isfinite(value):
            raise NumericalError(f"non-finite loss {value} at step {self.state.step} "
                                 "(a Cholesky factor failed or the learning rate is too large)")
        self.state.step += 1
        return value

    def fit(self, data, max_steps: int | None = None, *, resume: bool = False) -> TrainState:
        """Trains on `data` (`SequenceData`, or an iterable / `tf.data.Dataset` of global batches) and
        returns the state: `max_steps` steps in all when given (passing over the data as often as
        needed), else `config.epochs` passes over it, at most `config.max_steps` steps. With
        `resume`, continues from the last checkpoint (iterables of batches are then read again from
        their start)."""
        cfg = self.config
        if resume and not self.restore_checkpoint():
            log.warning("resume requested but no checkpoint found in %s; starting fresh",
                        self.checkpoints.directory if self.checkpoints else None)
        if isinstance(data, SequenceData):
            per_epoch = batch_count(data.lengths, cfg.batch_size, cfg.batch_tokens)
            tokens = max(1, int(data.lengths.sum()))
        else:
            per_epoch, tokens = _epoch_length(data), 1
        if max_steps is not None:
            total = max_steps
        elif per_epoch is not None:
            total = per_epoch * cfg.epochs if cfg.max_steps is None else min(per_epoch * cfg.epochs, cfg.max_steps)
        elif cfg.max_steps is not None:
            total = cfg.max_steps
        else:
            raise ConfigError("training on batches of unknown number needs max_steps")
        step = self.state.step
        if isinstance(data, SequenceData):
            plan = batch_plan(data.lengths, cfg.batch_size, cfg.seed, step, total, max_tokens=cfg.batch_tokens)
            batches = distributed_batches(self.strategy, data, plan, self.model.dtype)
            step_fn = self._compiled_step(batches.element_spec)
        else:
            batches = _repeated(self.strategy, data, total - step)
            step_fn = self._run_step
        eval_every = cfg.eval_every or per_epoch
        start = time.perf_counter()
        bad_in_a_row = 0
        self._sync_counter()
        for batch in batches:
            if step >= total or self.state.stopped_early:
                break
            epoch = step // per_epoch if per_epoch else 0
            loss, applied = step_fn(batch)
            step += 1
            self.state.step = self._counted = step
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
            loss = float(loss)
            elbo = -loss / tokens
            self._emit(Progress(step, total, epoch, elbo, skipped_steps=self.state.skipped_steps,
                                elapsed_s=time.perf_counter() - start, loss=loss))
            if self.evaluate is not None and ((eval_every and step % eval_every == 0) or step == total):
                self._run_eval(step, total, epoch, elbo, start)
                if self.state.stopped_early:
                    break
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and self.checkpoints is not None:
                self.save_checkpoint()
                self._emit(Progress(step, total, epoch, elbo, event="checkpoint",
                                    elapsed_s=time.perf_counter() - start))
        if self._best_values is not None:
            for variable, value in zip(self.model.trainable_variables, self._best_values):
                variable.assign(value)
        self.save_checkpoint()
        self._emit(Progress(step, total, step // max(1, per_epoch or 1), float("nan"), event="done",
                            dev_score=self.state.best_score, elapsed_s=time.perf_counter() - start))
        return self.state

    # ---- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        """Writes model + optimisers + state to `checkpoint_dir/checkpoint` (chief only; atomic)."""
        if self.checkpoints is not None:
            self._sync_counter()  # the compiled step counts step_var up; this only repairs a stale value
            self.checkpoints.save({**asdict(self.state), "optimisation": self._optimisation()}, self._best_values)

    def _optimisation(self) -> dict:
        """The settings a resumed run must share with its checkpoint (they shape the optimiser's
        state and the batches; epochs, max_steps and patience may change to train further)."""
        config = self.config
        return {name: getattr(config, name) for name in
                ("learning_rate", "batch_size", "batch_tokens", "num_samples", "seed", "natgrad_gamma")
                if hasattr(config, name)}

    def restore_checkpoint(self) -> bool:
        """Loads the last checkpoint if there is one; returns whether one was found."""
        found = self.checkpoints.restore() if self.checkpoints is not None else None
        if found is None:
            return False
        state, self._best_values = found
        saved = state.pop("optimisation", None)
        if isinstance(saved, dict):  # a checkpoint saved without it has none to compare
            current = self._optimisation()
            changed = [f"training.{name} {saved.get(name)!r} in the checkpoint, {current[name]!r} now"
                       for name in current if name in saved and saved[name] != current[name]]
            if changed:
                raise ConfigError(f"{self.checkpoints.directory}: the checkpoint was trained with other optimiser "
                                  f"settings: {'; '.join(changed)}; resume with the same ones, or train without "
                                  "--resume")
        try:
            self.state = TrainState(**state)
        except TypeError as error:
            raise ConfigError(f"{self.checkpoints.directory}: unreadable checkpoint state ({error})") from None
        return True

    # ---- evaluation and progress -----------------------------------------------------------------
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


def _epoch_length(batches) -> int | None:
    """Batches per pass over `batches` (None when unknown or infinite)."""
    if isinstance(batches, tf.data.Dataset):
        count = int(batches.cardinality())
        return count if count > 0 else None
    try:
        return len(batches)
    except TypeError:
        return None


def _repeated(strategy: tf.distribute.Strategy, batches: Iterable, steps: int):
    """`steps` global batches, passing over `batches` again as often as needed; a dataset is
    distributed over the replicas (each gets its share of every global batch)."""
    if isinstance(batches, tf.data.Dataset) and strategy.num_replicas_in_sync > 1:
        batches = strategy.experimental_distribute_dataset(batches)
    produced = 0
    while produced < steps:
        before = produced
        for batch in batches:
            yield batch
            produced += 1
            if produced >= steps:
                return
        if produced == before:
            return
