"""What a feature `min_count` costs on a dev split carved from CoNLL-2000 train (never the test set).

    python models/min_count_dev.py --task chunk --min-count 1 3 --epochs 4 --json /tmp/chunk_mc.json

Trains one model per min_count on 90 % of train (`train_dev_split(n, 0.1, seed=0)`), tags the other
10 % and prints features D, the size of the saved model, dev token accuracy, chunk F1 (chunker),
token NLL and ECE. The pretrained models of this folder were sized with it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=["pos", "chunk"], required=True)
    parser.add_argument("--min-count", type=int, nargs="+", required=True)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from gpseq.corpora import Sentence, read_conll, train_dev_split
    from gpseq.evaluation.evaluate import evaluate
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger, TaggerConfig
    from gpseq.training.trainer import TrainingConfig

    corpora = Path(os.environ.get("GPSEQ_CORPORA", ROOT.parent / "shared" / "corpora"))
    corpus = read_conll(corpora / "conll2000" / "train.txt")
    if args.task == "pos":  # labels: the POS column
        corpus = [Sentence(s.tokens, [row[1] for row in s.columns], s.columns, s.source, s.line) for s in corpus]
    train_idx, dev_idx = train_dev_split(len(corpus), 0.1, seed=0)
    train, dev = [corpus[i] for i in train_idx], [corpus[i] for i in dev_idx]
    rows = []
    for min_count in args.min_count:
        config = TaggerConfig(
            features=get_preset("pos" if args.task == "pos" else "chunking", min_count=min_count),
            training=TrainingConfig(epochs=args.epochs, early_stopping="none"),
        )
        started = time.perf_counter()
        tagger = Tagger.train(train, config)
        seconds = time.perf_counter() - started
        with tempfile.TemporaryDirectory() as tmp:
            saved = tagger.save(Path(tmp) / "model")
            size = sum(f.stat().st_size for f in saved.rglob("*") if f.is_file())
        tagged = tagger.tag(dev)
        report = evaluate([s.labels for s in dev], [t.labels for t in tagged], labels=tagger.labels,
                          probabilities=[t.probabilities for t in tagged],
                          scheme="iob2" if args.task == "chunk" else None).to_dict()
        row = {"task": args.task, "min_count": min_count, "epochs": args.epochs,
               "features": tagger.featurizer.n_features,
               "model_bytes": size, "train_seconds": round(seconds, 1), "dev_sentences": len(dev),
               "dev_token_accuracy": report["token_accuracy"], "dev_chunk_f1": report.get("chunk_f1"),
               "dev_token_nll": report["token_nll"], "dev_ece": report["ece"]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    sys.exit(main())
