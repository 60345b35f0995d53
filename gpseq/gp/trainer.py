"""SVI steps under a `tf.distribute` strategy, and a small trainer for the GP core's models.

Data parallelism (one host: `MirroredStrategy`; several: `MultiWorkerMirroredStrategy`): every
replica r gets its own sub-batch of B_r items of the global batch (B = Σ_r B_r) and evaluates the
model's own minibatch loss on it, −(N / B_r · Σ_{n ∈ r} ℓ_n − KL), weighted by B_r / B. The sum
over replicas is then exactly the global-batch loss −(N / B · Σ_n ℓ_n − KL): the likelihood is
rescaled by the global batch size and the KL counted once (Σ_r B_r / B = 1); its gradient is the
global-batch gradient. Weighted losses and gradients are summed across replicas in cross-replica
context, checked for non-finite values once, and applied by one optimiser to mirrored variables,
so every replica (and every worker) takes the same step or skips it together. A replica with an
empty sub-batch contributes zero. On one device the same code runs under the default strategy
with weight 1.
"""

from __future__ import annotations

import json
import math
import os
from typing import Callable, Iterable

import tensorflow as tf

from gpseq.errors import ConfigError, NumericalError
from gpseq.gp.natgrad import natgrad_step

STRATEGIES = ("default", "mirrored", "multiworker")


# ---- strategies ---------------------------------------------------------------------------------
def make_strategy(name: str = "default", devices: int | None = None) -> tf.distribute.Strategy:
    """The `tf.distribute` strategy for `name` ∈ STRATEGIES on `devices` replicas of this host.

    default: one device (the first GPU when there is one, else the CPU); with devices > 1 the same
    as mirrored. mirrored: `devices` GPUs (default all), or — on a host without GPUs — the CPU
    split into `devices` logical devices (this must happen before TensorFlow initialises its
    devices). multiworker: `MultiWorkerMirroredStrategy` over the cluster in `TF_CONFIG`, each
    worker on its local GPUs or its CPU. Must be called before variables are created.
    """
    if name not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {', '.join(STRATEGIES)}; got {name!r}")
    if devices is not None and devices < 1:
        raise ConfigError(f"devices must be >= 1, got {devices}")
    if name == "multiworker":
        _check_tf_config()
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_physical_devices("GPU")
    if name == "default" and (devices or 1) == 1:
        return tf.distribute.OneDeviceStrategy("/gpu:0") if gpus else tf.distribute.get_strategy()
    count = devices or max(1, len(gpus))
    if gpus:
        if count > len(gpus):
            raise ConfigError(f"{count} devices requested but this host has {len(gpus)} GPU(s)")
        return tf.distribute.MirroredStrategy([f"/gpu:{i}" for i in range(count)])
    return tf.distribute.MirroredStrategy(_logical_cpus(count))


def _logical_cpus(count: int) -> list[str]:
    """Splits the CPU into `count` logical devices (if TensorFlow has not started yet) → names."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    configured = tf.config.get_logical_device_configuration(cpu)
    if configured is None or len(configured) < count:
        try:
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
        except RuntimeError:
            pass  # already initialised: use what is there, checked below
    have = len(tf.config.list_logical_devices("CPU"))
    if have < count:
        raise ConfigError(
            f"{count} devices requested on a host without GPUs, but TensorFlow already started with "
            f"{have} CPU device(s); choose the strategy before any TensorFlow work"
        )
    return [f"/cpu:{i}" for i in range(count)]


def _check_tf_config() -> None:
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        raise ConfigError("strategy multiworker needs TF_CONFIG (cluster and task) in the environment")
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ConfigError(f"TF_CONFIG is not valid JSON: {error.msg}") from None
    if not isinstance(spec, dict) or "cluster" not in spec or "task" not in spec:
        raise ConfigError("TF_CONFIG must be a JSON object with 'cluster' and 'task'")


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes checkpoints and models (always, except non-chief workers)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or resolver.task_type is None:
        return True
    if resolver.task_type == "chief":
        return True
    cluster = resolver.cluster_spec().as_dict()
    return resolver.task_type == "worker" and resolver.task_id == 0 and "chief" not in cluster


def is_chief_process(tf_config: str | None = None) -> bool:
    """Whether this process is the chief of the `TF_CONFIG` cluster (default: the environment's);
    True without one. For callers without the strategy, e.g. the CLI deciding who saves the model."""
    raw = os.environ.get("TF_CONFIG") if tf_config is None else tf_config
    if not raw:
        return True
    try:
        spec = json.loads(raw)
        task, cluster = spec.get("task", {}), spec.get("cluster", {})
    except (json.JSONDecodeError, AttributeError):
        return True  # make_strategy reports a malformed TF_CONFIG
    kind, index = task.get("type"), int(task.get("index", 0))
    return kind in (None, "chief") or (kind == "worker" and index == 0 and "chief" not in cluster)


def batch_size_of(batch) -> tf.Tensor:
    """Leading size of the first tensor of `batch` (a tuple, list or dict of tensors) → int32 scalar."""
    first = tf.nest.flatten(batch)[0]
    return tf.shape(first)[0]


# ---- the distributed step -----------------------------------------------------------------------
def build_svi_step(
    strategy: tf.distribute.Strategy,
    loss_fn: Callable,
    variables: list,
    optimizer,
    *,
    size_fn: Callable = batch_size_of,
    pre_step: Callable | None = None,
    jit_compile: bool = False,
    input_signature=None,
):
    """One compiled SVI step: `step(per_replica_batch, *args) → (global loss, applied)`.

    `loss_fn(batch, *args)` is the model's minibatch loss on one replica's sub-batch, with its
    likelihood rescaled by N / B_r; `size_fn(batch)` is B_r. The returned loss is Σ_r (B_r / B) ·
    loss_r, the global-batch loss (module docstring); `applied` is False when the loss or a summed
    gradient was not finite (then no variable changed). `pre_step(batch, *args)` runs first on each
    replica (natural-gradient steps; single replica only). With `jit_compile` each replica's loss
    and gradient are one XLA cluster.
    """
    variables = list(variables)
    connected: list[bool] = []  # which variables the loss reaches, found while tracing

    def weighted_gradients(batch, weight, *args):
        with tf.GradientTape() as tape:
            loss = weight * loss_fn(batch, *args)
        grads = tape.gradient(loss, variables)
        connected[:] = [g is not None for g in grads]
        return loss, [tf.convert_to_tensor(g) if g is not None else tf.zeros_like(v) for g, v in zip(grads, variables)]

    if jit_compile:
        weighted_gradients = tf.function(weighted_gradients, jit_compile=True)

    def replica_fn(batch, *args):
        context = tf.distribute.get_replica_context()
        size = size_fn(batch)
        total = context.all_reduce(tf.distribute.ReduceOp.SUM, size)
        if pre_step is not None:
            pre_step(batch, *args)
        dtype = variables[0].dtype
        weight = tf.cast(size, dtype) / tf.cast(tf.maximum(total, 1), dtype)

        def empty():
            return tf.zeros([], dtype), [tf.zeros_like(v) for v in variables]

        return tf.cond(size > 0, lambda: weighted_gradients(batch, weight, *args), empty)

    def step(batch, *args):
        loss, grads = strategy.run(replica_fn, args=(batch, *args))
        loss = strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)
        grads = [strategy.reduce(tf.distribute.ReduceOp.SUM, g, axis=None) for g in grads]
        finite = tf.math.is_finite(loss)
        for grad in grads:
            finite = tf.logical_and(finite, tf.reduce_all(tf.math.is_finite(grad)))

        def apply():
            pairs = [(g, v) for g, v, c in zip(grads, variables, connected) if c]
            if pairs:
                optimizer.apply_gradients(pairs)
            return tf.constant(True)

        applied = tf.cond(finite, apply, lambda: tf.constant(False))
        return loss, applied

    return tf.function(step, input_signature=input_signature, reduce_retracing=input_signature is None)


class Trainer:
    """Minimises `model.loss(batch)` under a `tf.distribute` strategy (default: the current one).

    With `natgrad_gamma`, each step first takes a natural-gradient step of that size on q(u) and
    then an Adam step on every other trainable variable (hyperparameters, inducing inputs).
    The model must have been built under `strategy.scope()`. `fit` distributes a `tf.data.Dataset`
    of global batches over the replicas (`experimental_distribute_dataset`); `step` takes a global
    batch of tensors (one replica) or an already distributed batch. Losses are global-batch losses
    (module docstring). Natural-gradient steps assign q(u) in replica context, so they need a
    single replica.
    """

    def __init__(self, model, learning_rate: float = 0.01, natgrad_gamma: float | None = None,
                 strategy: tf.distribute.Strategy | None = None, jit_compile: bool = False):
        self.strategy = strategy or tf.distribute.get_strategy()
        self.model, self.natgrad_gamma = model, natgrad_gamma
        if natgrad_gamma is not None and self.strategy.num_replicas_in_sync > 1:
            raise ConfigError("natural-gradient steps need a single replica")
        natural = {v.ref() for v in model.variational_parameters()} if natgrad_gamma is not None else set()
        self.adam_variables = [v for v in model.trainable_variables if v.ref() not in natural]
        with self.strategy.scope():
            self.optimizer = tf.keras.optimizers.Adam(learning_rate)
            self.optimizer.build(self.adam_variables)  # slots created here, not inside the tf.function
        pre_step = None
        if natgrad_gamma is not None:
            def pre_step(batch, *args):
                natgrad_step(model, batch, natgrad_gamma)
        self._step = build_svi_step(self.strategy, model.loss, self.adam_variables, self.optimizer,
                                    pre_step=pre_step, jit_compile=jit_compile)
        self.step_count = 0

    def step(self, batch) -> float:
        """One training step on `batch`; returns the global-batch loss before the Adam update."""
        loss, applied = self._step(batch)
        value = float(loss)
        if not bool(applied) or not math.isfinite(value):
            raise NumericalError(f"non-finite loss {value} at step {self.step_count} "
                                 "(a Cholesky factor failed or the learning rate is too large)")
        self.step_count += 1
        return value

    def fit(self, batches: Iterable, max_steps: int, callbacks: Iterable[Callable[[int, float], None]] = ()):
        """Runs `max_steps` steps, re-iterating `batches` (an iterable or `tf.data.Dataset`) as needed;
        calls each `callback(step, loss)` after every step. Returns the list of losses."""
        if isinstance(batches, tf.data.Dataset) and self.strategy.num_replicas_in_sync > 1:
            batches = self.strategy.experimental_distribute_dataset(batches)
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
