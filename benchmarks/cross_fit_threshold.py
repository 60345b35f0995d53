"""Where cross-fitting stops paying: the default training with and without it on mid-sized corpora.

    python benchmarks/cross_fit_threshold.py [--sentences 1000 1300 2000] [--seeds 0 1] [--json PATH]

Within CoNLL-2000's training file only (the test file is not read): 2,000 random training sentences
are held out and scored; from the rest, random training sets of each size are drawn (seeded), and
each is trained twice with the default chunking training — once with `cross_fit_tokens` = 0 (λ, σ²,
σ²_P, α and T chosen on a 10 % dev split, then the refit on train + dev) and once cross-fitting
(3 folds over train + dev, the final fit from the folds' average). Reported per set: tokens, chunk
F1, token NLL, the prior chosen and the training time of each, and the mean differences. This is
what `TrainingConfig.cross_fit_tokens` (40,000) rests on, with the sets active learning labels
(longer sentences, measured in this session's scratch runs; see its comment).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from _common import corpora_root, machine


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, nargs="+", default=[1000, 1300, 2000])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from gpseq.config import TaggerConfig
    from gpseq.corpora import read_conll
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger

    train = read_conll(corpora_root() / "conll2000" / "train.txt")
    order = np.random.default_rng(123).permutation(len(train))
    held_out, rest = [train[i] for i in order[:2000]], order[2000:]
    rows = []
    for size in args.sentences:
        for seed in args.seeds:
            chosen = np.random.default_rng([seed, size, 7]).choice(rest, size, replace=False)
            sentences = [train[i] for i in chosen]
            row = {"sentences": size, "seed": seed, "tokens": sum(len(s) for s in sentences)}
            for arm, tokens in (("dev_split", 0), ("cross_fit", 10**9)):
                config = TaggerConfig(features=get_preset("chunking"))
                config.training.cross_fit_tokens = tokens
                started = time.perf_counter()
                tagger = Tagger.train(sentences, config)
                seconds = time.perf_counter() - started
                report = tagger.evaluate(held_out).to_dict()
                scores = tagger.scores
                row[arm] = {"chunk_f1": report["chunk_f1"], "token_nll": report["token_nll"], "train_s": seconds,
                            "prior": f"{scores['prior_variance']:g}/{scores['l1']:g}/{scores['pairwise_prior_variance']:g}"}
            row["f1_gain"] = row["cross_fit"]["chunk_f1"] - row["dev_split"]["chunk_f1"]
            row["nll_gain"] = row["dev_split"]["token_nll"] - row["cross_fit"]["token_nll"]
            row["time_ratio"] = row["cross_fit"]["train_s"] / row["dev_split"]["train_s"]
            rows.append(row)
            print(f"{size} sentences ({row['tokens']:,} tokens), seed {seed}: F1 {row['dev_split']['chunk_f1']:.4f} → "
                  f"{row['cross_fit']['chunk_f1']:.4f}, NLL {row['dev_split']['token_nll']:.4f} → "
                  f"{row['cross_fit']['token_nll']:.4f}, prior {row['dev_split']['prior']} → {row['cross_fit']['prior']}, "
                  f"time ×{row['time_ratio']:.2f}", flush=True)
    summary = {}
    for size in args.sentences:
        mine = [r for r in rows if r["sentences"] == size]
        summary[str(size)] = {key: float(np.mean([r[key] for r in mine])) for key in ("f1_gain", "nll_gain", "time_ratio")}
        print(f"{size} sentences, mean over seeds: F1 {summary[str(size)]['f1_gain']:+.4f}, "
              f"NLL {-summary[str(size)]['nll_gain']:+.4f}, time ×{summary[str(size)]['time_ratio']:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"meta": {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"),
                                                  "argv": sys.argv[1:]}, "rows": rows, "mean": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
