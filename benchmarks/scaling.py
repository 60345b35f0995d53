"""Training throughput under tf.distribute, and epoch time as the corpus grows (CoNLL-2000 train).

    python benchmarks/scaling.py [--quick] [--json out.json] [--batch-size 32] [--steps 40] [--large-batch 256]

1. tokens/s of the SVI training step (Trainer, default tagger model, chunking features) with 1
   replica and with 2 replicas, at the default batch size and at a large one, (MirroredStrategy on this host: its GPUs, or the CPU split into
   2 logical devices), in the same process on the same batches;
2. seconds per epoch (1 replica) on growing prefixes of the shuffled corpus, 1k → 211k tokens,
   with a least-squares line through them: the cost is linear in tokens when the line fits and
   the seconds per token stay flat;
3. on a host with a GPU, tokens/s on it (1 replica); otherwise reported as not measured.

Timings exclude the first step of each run (tracing); a run's rate is tokens / time of steps
2…n. The corpus is featurised once (vocabulary over the whole train set), inducing inputs are
K-means centroids of the first 5,000 tokens, the same for every run. JSON keys:
tokens_per_s_1rep, tokens_per_s_2rep (default batch), epoch_s_by_tokens ([[tokens, seconds], …]),
plus tokens_per_s_{1,2}rep_large_batch, seconds_per_token_by_tokens, linear_fit_r2, gpu_tokens_per_s (null when not measured), machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

FULL_SIZES = [1_000, 3_000, 10_000, 30_000, 100_000, None]  # None = the whole corpus
QUICK_SIZES = [1_000, 3_000, 10_000]


from _common import corpora_root, machine  # noqa: E402
def featurise(path: Path):
    """CoNLL-2000 train → (SequenceData, number of features, number of labels)."""
    import scipy.sparse as sp

    from gpseq.corpora import read_conll
    from gpseq.features import Featurizer, get_preset
    from gpseq.training.batching import SequenceData

    sentences = list(read_conll(path))
    labels = sorted({label for s in sentences for label in s.labels})
    index = {label: i for i, label in enumerate(labels)}
    featurizer = Featurizer(get_preset("chunking")).fit(sentences)
    matrix = featurizer.transform(sentences)
    label_ids = np.fromiter((index[l] for s in sentences for l in s.labels), dtype=np.int32)
    data = SequenceData(sp.csr_matrix(matrix.rows), np.asarray(matrix.offsets, dtype=np.int64), label_ids)
    return data, featurizer.n_features, len(labels)


def prefix(data, order: np.ndarray, tokens: int | None):
    """The first sentences of `order` holding at least `tokens` tokens (all for None)."""
    if tokens is None:
        return data.subset(order)
    count = int(np.searchsorted(np.cumsum(data.lengths[order]), tokens)) + 1
    return data.subset(order[:count])


def timed_run(strategy, data, n_features, n_labels, inducing, *, batch_size, max_steps=None, seed=0):
    """Trains a fresh model under `strategy` → (tokens/s and seconds of steps 2…n, steps, tokens in them)."""
    import tensorflow as tf

    from gpseq.structured.model import ModelConfig, build_structured_gp
    from gpseq.training.trainer import Trainer, TrainingConfig

    with strategy.scope():
        model = build_structured_gp(ModelConfig(kernel="linear+rbf"), n_features, n_labels, inducing, tf.float32,
                                    num_data=len(data))
    config = TrainingConfig(batch_size=batch_size, epochs=1, max_steps=max_steps, seed=seed,
                            early_stopping="none", dev_fraction=0.0, checkpoint_every=0)
    stamps = []
    Trainer(model, config, strategy=strategy, callbacks=[
        lambda p: stamps.append(time.perf_counter()) if p.event == "step" else None]).fit(data)
    from gpseq.training.distribute import batch_plan

    plan = list(batch_plan(data.lengths, batch_size, seed, 0, len(stamps)))
    step_tokens = np.array([data.lengths[ids].sum() for ids in plan])
    if len(stamps) < 2:
        return float("nan"), float("nan"), len(stamps), 0
    seconds = stamps[-1] - stamps[0]
    timed_tokens = int(step_tokens[1:].sum())
    return timed_tokens / seconds, seconds, len(stamps), timed_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small corpus prefixes and few steps (< 1 min)")
    parser.add_argument("--json", type=Path, help="write the figures as flat JSON here")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=None, help="steps per throughput run (default 40; quick 8)")
    parser.add_argument("--large-batch", type=int, default=256, help="a second throughput row at this batch size")
    args = parser.parse_args()
    steps = args.steps or (8 if args.quick else 40)
    large_steps = max(3, steps // 4)

    import tensorflow as tf

    from gpseq.training.distribute import make_strategy

    gpus = tf.config.list_physical_devices("GPU")
    two = make_strategy("mirrored", 2)  # before TensorFlow starts: splits the CPU when there is no GPU
    one = tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")

    from gpseq.gp.inducing import kmeans_inducing

    path = corpora_root() / "conll2000" / "train.txt"
    if not path.is_file():
        sys.exit(f"CoNLL-2000 not found at {path} (set GPSEQ_CORPORA)")
    start = time.perf_counter()
    data, n_features, n_labels = featurise(path)
    order = np.random.default_rng(0).permutation(len(data))
    inducing = kmeans_inducing(data.rows[:5000], 64, seed=0, snap=True)
    inducing = inducing[0] if isinstance(inducing, tuple) else inducing
    inducing = inducing.toarray() if hasattr(inducing, "toarray") else np.asarray(inducing)
    total_tokens = int(data.lengths.sum())
    print(f"CoNLL-2000 train: {len(data)} sentences, {total_tokens} tokens, {n_features} features, "
          f"{n_labels} labels (featurised in {time.perf_counter() - start:.1f} s)")
    print(f"machine: {machine()}; replicas for the 2-replica run: {list(two.extended.worker_devices)}")

    # 1. throughput, 1 vs 2 replicas, same batches (a shuffled prefix large enough for the steps)
    sample = prefix(data, order, None if not args.quick else 60_000)
    rates = {}
    for batch_size, n_steps in ((args.batch_size, steps), (args.large_batch, large_steps)):
        for replicas, strategy in ((1, one), (2, two)):
            rates[batch_size, replicas] = timed_run(strategy, sample, n_features, n_labels, inducing,
                                                    batch_size=batch_size, max_steps=n_steps)[0]
    rate_1, rate_2 = rates[args.batch_size, 1], rates[args.batch_size, 2]
    print(f"\nthroughput, tokens/s (first step of each run excluded)")
    print(f"{'batch (sentences)':>18} {'steps':>6} {'1 replica':>10} {'2 replicas':>11} {'ratio':>6}")
    for batch_size, n_steps in ((args.batch_size, steps), (args.large_batch, large_steps)):
        r1, r2 = rates[batch_size, 1], rates[batch_size, 2]
        print(f"{batch_size:>18} {n_steps:>6} {r1:>10.0f} {r2:>11.0f} {r2 / r1:>6.2f}")

    # 2. seconds per epoch as the corpus grows (1 replica)
    epochs = []
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    print(f"\nepoch time, 1 replica (steps 2…n timed, scaled to the epoch's tokens)")
    print(f"{'tokens':>8} {'sentences':>10} {'steps':>6} {'epoch s':>9} {'µs/token':>9}")
    for size in sizes:
        subset = prefix(data, order, size)
        tokens = int(subset.lengths.sum())
        rate, _, n_steps, _ = timed_run(one, subset, n_features, n_labels, inducing, batch_size=args.batch_size)
        epoch_s = tokens / rate
        epochs.append([tokens, round(epoch_s, 3)])
        print(f"{tokens:>8} {len(subset):>10} {n_steps:>6} {epoch_s:>9.2f} {1e6 * epoch_s / tokens:>9.1f}")
    x = np.array([e[0] for e in epochs], float)
    y = np.array([e[1] for e in epochs], float)
    slope, intercept = np.polyfit(x, y, 1)
    r2 = 1.0 - np.sum((y - (slope * x + intercept)) ** 2) / np.sum((y - y.mean()) ** 2)
    print(f"least squares: epoch s = {slope * 1e6:.1f} µs × tokens + {intercept:.2f} s (R² = {r2:.4f})")

    # 3. GPU
    gpu_rate = None
    if gpus:
        gpu_rate = rate_1  # the 1-replica strategy above ran on /gpu:0
        print(f"\nGPU ({len(gpus)}): 1 replica {gpu_rate:.0f} tokens/s")
    else:
        print("\nGPU: not measured (no GPU visible to TensorFlow on this machine)")

    figures = {
        "tokens_per_s_1rep": round(rate_1, 1),
        "tokens_per_s_2rep": round(rate_2, 1),
        "speedup_2rep": round(rate_2 / rate_1, 3),
        "large_batch": args.large_batch,
        "tokens_per_s_1rep_large_batch": round(rates[args.large_batch, 1], 1),
        "tokens_per_s_2rep_large_batch": round(rates[args.large_batch, 2], 1),
        "epoch_s_by_tokens": epochs,
        "seconds_per_token_by_tokens": [[t, s / t] for t, s in epochs],
        "linear_fit_s_per_token": slope,
        "linear_fit_intercept_s": intercept,
        "linear_fit_r2": r2,
        "gpu_tokens_per_s": gpu_rate,
        "gpu": "not measured: no GPU" if not gpus else f"{len(gpus)} GPU(s)",
        "replica_devices": "GPUs" if gpus else "2 logical CPU devices on one host",
        "batch_size": args.batch_size,
        "throughput_steps": steps,
        "corpus_tokens": total_tokens,
        "machine": machine(),
        "quick": args.quick,
    }
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
