"""A small trainer for models exposing `loss(batch)` and `trainable_variables`: Adam, optionally with
natural-gradient steps on q(u) (models exposing `variational_parameters()` and `elbo(batch, q_mu, q_sqrt)`).
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import tensorflow as tf

from gpseq.errors import ConfigError, NumericalError
from gpseq.gp.natgrad import natgrad_step


class Trainer:
    """Minimises `model.loss(batch)`; the training step is one `tf.function` (optionally XLA).

    With `natgrad_gamma`, each step first takes a natural-gradient step of that size on q(u) and
    then an Adam step on every other trainable variable (hyperparameters, inducing inputs).
    With a `tf.distribute` strategy the model must have been built under `strategy.scope()` and
    `batches` should come from `strategy.experimental_distribute_dataset`; each replica's gradients
    are all-reduced by the optimiser and the reported loss is the replicas' mean. Natural-gradient
    steps assign q(u) in replica context, so they need a single replica.
    """

    def __init__(self, model, learning_rate: float = 0.01, natgrad_gamma: float | None = None,
                 strategy: tf.distribute.Strategy | None = None, jit_compile: bool = False):
        self.model, self.natgrad_gamma, self.strategy = model, natgrad_gamma, strategy
        if natgrad_gamma is not None and strategy is not None and strategy.num_replicas_in_sync > 1:
            raise ConfigError("natural-gradient steps need a single replica")
        natural = {v.ref() for v in model.variational_parameters()} if natgrad_gamma is not None else set()
        self.adam_variables = [v for v in model.trainable_variables if v.ref() not in natural]
        scope = strategy.scope() if strategy is not None else _null_scope()
        with scope:
            self.optimizer = tf.keras.optimizers.Adam(learning_rate)
            self.optimizer.build(self.adam_variables)  # slots created here, not inside the tf.function
        self._step = tf.function(self._replica_step, jit_compile=jit_compile)
        self.step_count = 0

    def _replica_step(self, batch):
        if self.natgrad_gamma is not None:
            natgrad_step(self.model, batch, self.natgrad_gamma)
        with tf.GradientTape() as tape:
            loss = self.model.loss(batch)
        grads = tape.gradient(loss, self.adam_variables)
        pairs = [(g, v) for g, v in zip(grads, self.adam_variables) if g is not None]
        if pairs:
            self.optimizer.apply_gradients(pairs)
        return loss

    def step(self, batch) -> float:
        """One training step on `batch`; returns the loss before the Adam update."""
        if self.strategy is None:
            loss = self._step(batch)
        else:
            per_replica = self.strategy.run(self._step, args=(batch,))
            loss = self.strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None)
        value = float(loss)
        if not math.isfinite(value):
            raise NumericalError(f"non-finite loss {value} at step {self.step_count} "
                                 "(a Cholesky factor failed or the learning rate is too large)")
        self.step_count += 1
        return value

    def fit(self, batches: Iterable, max_steps: int, callbacks: Iterable[Callable[[int, float], None]] = ()):
        """Runs `max_steps` steps, re-iterating `batches` (an iterable or `tf.data.Dataset`) as needed;
        calls each `callback(step, loss)` after every step. Returns the list of losses."""
        losses: list[float] = []
        while len(losses) < max_steps:
            produced = False
            for batch in batches:
                produced = True
                losses.append(self.step(batch))
                for callback in callbacks:
                    callback(self.step_count, losses[-1])
                if len(losses) >= max_steps:
                    break
            if not produced:
                break
        return losses


class _null_scope:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
