"""The score-function estimator's sample count (issue 18): what its control variates buy and what
draws cost. Three measurements, each for S draws per sequence:

1. variance: the summed per-element variance of the ELL gradient over 100 seeded repetitions, with
   and without control variates, on a 16-sentence batch of the sample corpus (chunking features,
   linear+rbf, M = 8, after one epoch of training at the default S);
2. cost: median wall and CPU time per SVI step on the first 1,000 CoNLL-2000 training sentences
   (chunking features, linear+rbf, M = 64, batch 32; steps 10–70), pathwise at S = 1 for reference;
3. accuracy: chunk F1 and token NLL on the sample test set after 10 epochs on the sample train set.

    python benchmarks/score_estimator.py --json OUT [--samples 1 2 4 8 16] [--skip cost]

Each cost and accuracy configuration runs in its own process. Results of a run:
`benchmarks/results/score_estimator.json`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "corpora" / "sample"
CONLL = ROOT.parent / "shared" / "corpora" / "conll2000" / "train.txt"


def _tagger_config(estimator, num_samples, **training):
    from gpseq.features import get_preset
    from gpseq.structured.model import ModelConfig
    from gpseq.tagger import TaggerConfig
    from gpseq.training.trainer import TrainingConfig

    params = dict(batch_size=16, learning_rate=0.05, seed=1, early_stopping="none", dev_fraction=0.0,
                  num_samples=num_samples, checkpoint_every=0)
    params.update(training)
    model = dict(kernel="linear+rbf", estimator=estimator)
    if "num_inducing" in params:
        model["num_inducing"] = params.pop("num_inducing")
    return TaggerConfig(features=get_preset("chunking"), model=ModelConfig(**model),
                        training=TrainingConfig(**params), predict_samples=4)


def variance(samples):
    import numpy as np
    import tensorflow as tf

    from gpseq.corpora import read_conll
    from gpseq.structured import estimators
    from gpseq.tagger import Tagger
    from gpseq.training.batching import SequenceData, make_batch

    train = read_conll(SAMPLE / "train.conll")
    tagger = Tagger.train(train, _tagger_config("score", None, epochs=1, num_inducing=8))
    model = tagger.model
    data = SequenceData.featurised(tagger.featurizer, train, tagger.label_index)
    batch = {k: tf.convert_to_tensor(v) for k, v in make_batch(data, np.arange(16), dtype=np.float32).items()}
    out = {}
    for S in samples:
        row = {}
        for cv in (True, False):
            @tf.function
            def gradient(seed):
                with tf.GradientTape() as tape:
                    ell = estimators.score_function_ell(model, batch, S, seed, cv)
                grads = tape.gradient(ell, model.trainable_variables)
                return tf.concat([tf.reshape(tf.convert_to_tensor(g), [-1]) for g in grads], 0)

            grads = np.array([gradient(tf.constant([rep, 3])).numpy() for rep in range(100)])
            row["with_cv" if cv else "without_cv"] = float(grads.var(0, ddof=1).sum())
        row["ratio"] = row["without_cv"] / row["with_cv"]
        out[S] = row
        print(f"variance S={S}: {row}", flush=True)
    return out


def cost(estimator, S):
    import numpy as np

    from gpseq.corpora import read_conll
    from gpseq.tagger import Tagger

    wall, cpu = [], []

    def callback(progress):
        if progress.event == "step":
            wall.append(time.perf_counter())
            cpu.append(time.process_time())

    config = _tagger_config(estimator, S, max_steps=70, batch_size=32)
    Tagger.train(read_conll(CONLL)[:1000], config, callbacks=[callback])
    return {"wall_ms": 1000 * float(np.median(np.diff(wall[10:]))),
            "cpu_ms": 1000 * float(np.median(np.diff(cpu[10:])))}


def accuracy(estimator, S):
    from gpseq.corpora import read_conll
    from gpseq.tagger import Tagger

    start = time.perf_counter()
    tagger = Tagger.train(read_conll(SAMPLE / "train.conll"), _tagger_config(estimator, S, epochs=10, num_inducing=8))
    report = tagger.evaluate(read_conll(SAMPLE / "test.conll")).to_dict()
    return {"chunk_f1": report.get("chunk_f1"), "token_nll": report["token_nll"],
            "token_accuracy": report["token_accuracy"], "train_s": time.perf_counter() - start}


def _in_subprocess(kind, estimator, S):
    command = [sys.executable, __file__, "--one", kind, estimator, str(S)]
    result = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--samples", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--skip", nargs="*", default=[], choices=["variance", "cost", "accuracy"])
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        kind, estimator, S = args.one
        print(json.dumps((cost if kind == "cost" else accuracy)(estimator, int(S))))
        return
    results = {}
    if "variance" not in args.skip:
        results["variance"] = variance(args.samples)
    runs = [("pathwise", 1)] + [("score", S) for S in args.samples]
    for kind in ("cost", "accuracy"):
        if kind in args.skip:
            continue
        results[kind] = {}
        for estimator, S in runs:
            results[kind][f"{estimator} S={S}"] = row = _in_subprocess(kind, estimator, S)
            print(f"{kind} {estimator} S={S}: {row}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
