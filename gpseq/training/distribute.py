"""SVI under `tf.distribute`: strategies and the chief, the distributed step, and the tagger's
input pipeline.

Data parallelism (one host: `MirroredStrategy`; several: `MultiWorkerMirroredStrategy`): every
replica r gets its own sub-batch of B_r items of the global batch (B = Σ_r B_r) and evaluates the
model's own minibatch loss on it, −(N / B_r · Σ_{n ∈ r} ℓ_n − KL), weighted by B_r / B. The sum
over replicas is then exactly the global-batch loss −(N / B · Σ_n ℓ_n − KL): the likelihood is
rescaled by the global batch size and the KL counted once (Σ_r B_r / B = 1); its gradient is the
global-batch gradient. Weighted losses and gradients are summed across replicas in cross-replica
context, checked for non-finite values once, and applied — by Adam, and by natural-gradient steps
for q(u) when asked — to mirrored variables, so every replica (and every worker) takes the same
step or skips it together. A replica with an empty sub-batch contributes zero. On one device the
same code runs under the default strategy with weight 1.

The tagger's global batch (the sentences of one SVI step) is padded once by `make_batch`, so all
its sub-batches share its `feature_ids` (the union of the features it touches): every replica then
draws the same weights for a feature as one device would for the whole batch, and with the
weight-space kernel the distributed ELBO equals the one-device ELBO of the same global batch.
Each replica's rows are a contiguous slice (sentences are sorted by length inside a batch), cut
to that slice's longest sentence. Batching is vectorised numpy in the dataset's generator, on
the host, ahead of the step (prefetch): no Python per-token work inside the step.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Iterator

import numpy as np
import tensorflow as tf

from gpseq.errors import ConfigError
from gpseq.training.config import STRATEGIES
from gpseq.gp.natgrad import NaturalGradient, natural_variables
from gpseq.training.batching import SequenceData, batch_count, batch_signature, bucketed_batches, make_batch



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
    """B of a (sub-)batch → int32 scalar: a tagger batch's sentence count (its `lengths`), else the
    leading size of the first tensor of a tuple, list or dict of tensors."""
    if isinstance(batch, dict) and "lengths" in batch:
        return tf.shape(batch["lengths"])[0]
    return tf.shape(tf.nest.flatten(batch)[0])[0]


# ---- the distributed step -----------------------------------------------------------------------
def build_svi_step(
    strategy: tf.distribute.Strategy,
    loss_fn: Callable,
    variables: list,
    optimizer,
    *,
    natural: tuple[NaturalGradient, list] | None = None,
    size_fn: Callable = batch_size_of,
    jit_compile: bool = False,
    input_signature=None,
    loss_args: Callable[[], tuple] | None = None,
):
    """One compiled SVI step: `step(per_replica_batch, *args) → (global loss, applied)`.

    `loss_fn(batch, *args)` is the model's minimised loss on one replica's sub-batch, with its
    likelihood rescaled by N / B_r; `size_fn(batch)` is B_r. The returned loss is Σ_r (B_r / B) ·
    loss_r, the global-batch loss (module docstring); `applied` is False when the loss or a summed
    gradient was not finite (then no variable changed). `optimizer` steps `variables`; with
    `natural = (NaturalGradient, [(q_mu, q_sqrt), ...])` those Gaussians' variables are
    differentiated in the same pass and stepped by natural gradients instead. With `jit_compile`
    each replica's loss and gradient are one XLA cluster. A variable the loss does not reach (no
    gradient) is a ConfigError naming it, raised when the step is first traced. `loss_args()`, when
    given, runs inside the step (cross-replica context) and its tuple is passed to `loss_fn` after
    `*args` — e.g. a seed from a step counter variable, which saves feeding a new tensor per step.
    """
    variables = list(variables)
    natgrad, pairs = natural if natural is not None else (None, [])
    natural_vars = [v for q_mu, q_sqrt in pairs for v in natural_variables(q_mu, q_sqrt)]
    differentiated = variables + natural_vars
    def weighted_gradients(batch, weight, *args):
        with tf.GradientTape() as tape:
            loss = weight * loss_fn(batch, *args)
        grads = tape.gradient(loss, differentiated)
        missing = [v.name for g, v in zip(grads, differentiated) if g is None]
        if missing:  # never train a variable silently frozen (e.g. one the estimator does not reach)
            raise ConfigError(f"no gradient reaches trainable variable(s) {', '.join(missing)} from the loss")
        return loss, [tf.convert_to_tensor(g) for g in grads]

    if jit_compile:
        weighted_gradients = tf.function(weighted_gradients, jit_compile=True)

    def replica_fn(batch, *args):
        context = tf.distribute.get_replica_context()
        size = size_fn(batch)
        total = context.all_reduce(tf.distribute.ReduceOp.SUM, size)
        dtype = differentiated[0].dtype
        weight = tf.cast(size, dtype) / tf.cast(tf.maximum(total, 1), dtype)

        def empty():
            return tf.zeros([], dtype), [tf.zeros_like(v) for v in differentiated]

        return tf.cond(size > 0, lambda: weighted_gradients(batch, weight, *args), empty)

    def step(batch, *args):
        if loss_args is not None:
            args = (*args, *loss_args())
        loss, grads = strategy.run(replica_fn, args=(batch, *args))
        loss = strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)
        grads = [strategy.reduce(tf.distribute.ReduceOp.SUM, g, axis=None) for g in grads]
        finite = tf.math.is_finite(loss)
        for grad in grads:
            finite = tf.logical_and(finite, tf.reduce_all(tf.math.is_finite(grad)))

        def apply():
            if variables:
                optimizer.apply_gradients(zip(grads[:len(variables)], variables))
            if natgrad is not None:
                rest = grads[len(variables):]
                natgrad.apply_gradients([(rest[2 * i: 2 * i + 2], pair) for i, pair in enumerate(pairs)])
            return tf.constant(True)

        applied = tf.cond(finite, apply, lambda: tf.constant(False))
        return loss, applied

    return tf.function(step, input_signature=input_signature, reduce_retracing=input_signature is None)


# ---- the tagger's input pipeline ----------------------------------------------------------------
def batch_plan(lengths: np.ndarray, batch_size: int, seed: int, start_step: int, total_steps: int,
               max_tokens: int | None = None) -> Iterator[np.ndarray]:
    """Sentence ids of global steps `start_step … total_steps − 1`: epoch e's bucketed order is
    drawn from (seed, e), so the plan does not depend on the number of replicas or on resuming.
    Batches hold at most `batch_size` sentences and `max_tokens` padded tokens (`bucketed_batches`)."""
    per_epoch = batch_count(lengths, batch_size, max_tokens)
    step = start_step
    while step < total_steps:
        epoch, position = divmod(step, per_epoch)
        order = bucketed_batches(lengths, batch_size, np.random.default_rng([seed, epoch]), max_tokens)
        for sentence_ids in order[position:]:
            if step >= total_steps:
                return
            yield sentence_ids
            step += 1


def split_batch(batch: dict[str, np.ndarray], num_parts: int) -> list[dict[str, np.ndarray]]:
    """Cuts a padded batch into `num_parts` contiguous row slices (sizes differ by at most one;
    some are empty when B < num_parts), each cut to its longest sentence; `feature_ids` shared."""
    bounds = np.linspace(0, len(batch["lengths"]), num_parts + 1).round().astype(int)
    parts = []
    for start, stop in zip(bounds[:-1], bounds[1:]):
        lengths = batch["lengths"][start:stop]
        time = int(lengths.max()) if len(lengths) else 0
        parts.append({
            "indices": batch["indices"][start:stop, :time],
            "values": batch["values"][start:stop, :time],
            "feature_ids": batch["feature_ids"],
            "labels": batch["labels"][start:stop, :time],
            "lengths": lengths,
        })
    return parts


def distributed_batches(
    strategy: tf.distribute.Strategy,
    data: SequenceData,
    plan: Iterator[np.ndarray] | list[np.ndarray],
    dtype,
    *,
    prefetch: int = 2,
) -> tf.distribute.DistributedDataset:
    """The global batches of `plan` as a distributed dataset: one sub-batch per replica per step.

    Each worker's input pipeline builds every global batch of the plan and keeps the sub-batches
    of its own replicas (replica ids are worker-major), so all workers take the same steps.
    """
    dtype = tf.as_dtype(dtype)
    numpy_dtype = dtype.as_numpy_dtype
    plan = list(plan)
    replicas = strategy.num_replicas_in_sync

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        local = replicas // context.num_input_pipelines
        first = context.input_pipeline_id * local

        def generate():
            for sentence_ids in plan:
                parts = split_batch(make_batch(data, sentence_ids, dtype=numpy_dtype), replicas)
                yield from parts[first:first + local]

        dataset = tf.data.Dataset.from_generator(generate, output_signature=batch_signature(dtype))
        return dataset.prefetch(prefetch)

    return strategy.distribute_datasets_from_function(dataset_fn)
