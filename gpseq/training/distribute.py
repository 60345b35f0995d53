"""The tagger's input pipeline under `tf.distribute`: length-bucketed global batches, each cut
into one sub-batch per replica, as a `tf.data` dataset that `distribute_datasets_from_function`
spreads over the replicas of every worker.

A global batch (the sentences of one SVI step) is padded once by `make_batch`, so all its
sub-batches share its `feature_ids` (the union of the features it touches): every replica then
draws the same weights for a feature as one device would for the whole batch, and with the
weight-space kernel the distributed ELBO equals the one-device ELBO of the same global batch.
Each replica's rows are a contiguous slice (sentences are sorted by length inside a batch), cut
to that slice's longest sentence. Batching is vectorised numpy in the dataset's generator, on
the host, ahead of the step (prefetch): no Python per-token work inside the step.
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np
import tensorflow as tf

from gpseq.gp.trainer import STRATEGIES, batch_size_of, build_svi_step, is_chief, make_strategy
from gpseq.training.batching import SequenceData, batch_signature, bucketed_batches, make_batch

__all__ = [
    "STRATEGIES", "batch_plan", "batch_size_of", "build_svi_step", "distributed_batches", "is_chief",
    "make_strategy", "sequence_count", "split_batch",
]


def batch_plan(lengths: np.ndarray, batch_size: int, seed: int, start_step: int, total_steps: int) -> Iterator[np.ndarray]:
    """Sentence ids of global steps `start_step … total_steps − 1`: epoch e's bucketed order is
    drawn from (seed, e), so the plan does not depend on the number of replicas or on resuming."""
    per_epoch = math.ceil(len(lengths) / batch_size)
    step = start_step
    while step < total_steps:
        epoch, position = divmod(step, per_epoch)
        order = bucketed_batches(lengths, batch_size, np.random.default_rng([seed, epoch]))
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


def sequence_count(batch) -> tf.Tensor:
    """B_r of a tagger sub-batch (its `lengths`) → int32 scalar."""
    return tf.shape(batch["lengths"])[0]
