"""Throughput of the linear-chain log-likelihood + gradient on CoNLL-2000-shaped batches.

V = 23 labels, sequence lengths from the CoNLL-2000 training corpus, batches of 128 sequences
bucketed by length (as the trainer does), S ∈ {1, 16} samples of the potentials, float32, XLA.
Compares gpseq's sequential scan and parallel prefix with a textbook broadcast-log-sum-exp
forward pass (autodiff) in the same process.

    python benchmarks/chain.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from gpseq.structured import chain  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NUM_LABELS = 23
BATCH = 128


def corpus_lengths() -> np.ndarray:
    corpora = Path(os.environ.get("GPSEQ_CORPORA", ROOT.parent / "shared" / "corpora"))
    path = corpora / "conll2000" / "train.txt"
    lengths, current = [], 0
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                current += 1
            elif current:
                lengths.append(current)
                current = 0
    if current:
        lengths.append(current)
    return np.array(lengths, np.int32)


def bucketed_batches(lengths, rng, num_batches):
    """Batches of BATCH sequences of similar length: sort, cut, then sample batches uniformly."""
    order = np.sort(lengths)
    batches = [order[i : i + BATCH] for i in range(0, len(order) - BATCH + 1, BATCH)]
    picks = rng.choice(len(batches), size=min(num_batches, len(batches)), replace=False)
    return [batches[i] for i in picks]


def reference_log_likelihood(labels, unary, pairwise, lengths):
    """Textbook forward pass: broadcast log-sum-exp per step, autodiff (the peer)."""
    unary_tm = tf.transpose(unary, [2, 0, 1, 3])
    mask = tf.transpose(tf.sequence_mask(lengths, tf.shape(unary)[-2]), [1, 0])[:, None, :, None]

    def step(alpha, inputs):
        unary_t, valid = inputs
        new = tf.reduce_logsumexp(alpha[..., :, None] + pairwise, axis=-2) + unary_t
        return tf.where(valid, new, alpha)

    alpha = tf.scan(step, (unary_tm[1:], mask[1:]), initializer=unary_tm[0])[-1]
    return chain.sequence_score(labels, unary, pairwise, lengths) - tf.reduce_logsumexp(alpha, -1)


def make_step(fn):
    @tf.function(jit_compile=True)
    def step(labels, unary, pairwise, lengths):
        with tf.GradientTape() as tape:
            tape.watch([unary, pairwise])
            total = tf.reduce_sum(fn(labels, unary, pairwise, lengths))
        return total, tape.gradient(total, [unary, pairwise])

    return step


def throughput(step, batches, samples, rng, repeats):
    inputs = []
    for lengths in batches:
        T = int(lengths.max())
        unary = tf.constant(rng.normal(size=(samples, len(lengths), T, NUM_LABELS)), tf.float32)
        pairwise = tf.constant(rng.normal(size=(samples, 1, NUM_LABELS, NUM_LABELS)), tf.float32)
        labels = tf.constant(rng.integers(0, NUM_LABELS, size=(len(lengths), T)), tf.int32)
        inputs.append((labels, unary, pairwise, tf.constant(lengths)))
    for args in inputs:  # compile every distinct T first
        step(*args)[0].numpy()
    start = time.perf_counter()
    for _ in range(repeats):
        for args in inputs:
            step(*args)[0].numpy()
    elapsed = time.perf_counter() - start
    return repeats * sum(len(b) for b in batches) / elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one batch instead of three (XLA compilation per length dominates)")
    parser.add_argument("--json", type=Path, help="write the figures as flat JSON here")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    lengths = corpus_lengths()
    num_batches, repeats = (1, 1) if args.quick else (3, 1)
    batches = bucketed_batches(lengths, rng, num_batches)
    print(f"CoNLL-2000 train: {len(lengths)} sequences, mean length {lengths.mean():.1f}, max {lengths.max()}")
    print(f"{len(batches)} bucketed batches of {BATCH}, max T per batch {[int(b.max()) for b in batches]}")
    contenders = {
        "scan": lambda *a: chain.log_likelihood(*a, method="scan"),
        "prefix": lambda *a: chain.log_likelihood(*a, method="parallel"),
        "reference": reference_log_likelihood,
    }
    results = {}
    print(f"{'method':<10} {'S':>3} {'seqs/s':>10}")
    for name, fn in contenders.items():
        step = make_step(fn)
        for samples in (1, 16):
            # the parallel prefix does V× more work; one pass is enough to measure it
            reps = 1 if name == "prefix" else repeats
            rate = throughput(step, batches, samples, rng, reps)
            results[f"seqs_per_s_{name}_s{samples}"] = round(rate, 1)
            print(f"{name:<10} {samples:>3} {rate:>10.1f}")
    results.update(num_labels=NUM_LABELS, batch_size=BATCH, num_batches=len(batches), dtype="float32", xla=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
