"""Simulated annotation: does choosing sentences from the posterior beat choosing them at random?

    python benchmarks/active_learning.py --json benchmarks/results/active_learning.json
    python benchmarks/active_learning.py --quick      # a reduced run in a few minutes

Protocol (issue 20), per corpus: start from `start` random training sentences; for `rounds`
rounds, train (`Tagger.train` defaults, cold), evaluate on the test file (chunk F1, token NLL),
then label the `step` sentences a strategy picks from the rest of the training file (the pool;
labels revealed when picked); the model after the last round is evaluated too. Strategies:

- gpseq `bald`, `entropy`, `least-confidence`, `random` (`Tagger.select`, defaults: token level,
  no length normalisation, near-duplicate filter 0.8, seed 0);
- `crfsuite-lc`: CRFsuite (sklearn-crfsuite, L-BFGS, c1 = c2 = 0.1, 100 iterations, as
  benchmarks/versus_crf.py) on gpseq's feature strings, least confidence 1 − P(Viterbi path) on
  its own marginals, its F1 and token NLL from its own labels and marginals; with each round's
  `token_nll_t` the NLL of CRFsuite + T, as a careful user would temper it (the same CRF trained
  on 90 % of the labelled sentences, its marginals p^(1/T) with T fitted by NLL on the other 10 %,
  at least one sentence; `crfsuite_tempered`);
- `random-warm` (measuring the warm start, not a strategy): the `random` picks, each round trained
  with `Tagger.train(init=previous round's tagger)`.

Every strategy starts from the same sentences. Corpora: CoNLL-2000 chunking (start 100, step 100,
8 rounds, the pool all the other 8,836 training sentences: 900 of 8,936 labelled at the end) and
the CRF++ JapaneseNE set (preset `ner`, EUC-JP). JapaneseNE has 216 training sentences only, so
100 + 8 × 100 does not fit; the protocol is scaled to the file so that the last round labels at
most half of it (the pool is never nearly exhausted, the strategies still choose): start = step =
⌊216 / 2 / 9⌋ = 12, 8 rounds, 108 of 216 labelled at the end (a rule fixed from the file's size
before any run). `--pool N` draws the pool from N random sentences of the rest of the training
file instead of all of it (a reduced configuration; the JSON says so).

Reported: per strategy and round the sentences and tokens labelled (in the JSON also the
training-file indices each round picked), chunk F1, token NLL, train and selection time; the
sentences each strategy needs to reach random's final F1 (first round at or above it; None if
never); the targets: bald reaches it with ≤ 60 % of random's final labels, and bald's F1 is above
crfsuite-lc's at every round — the `rounds` rounds of selection, each evaluated after its sentences
are labelled. The start (round 0: both models trained on the same random
sentences, nothing selected yet) compares the two learners, not the strategies: it is reported
beside the target (`start/bald_minus_crfsuite_lc_f1`), not in it. With --plot a PNG of the
learning curves.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import (corpora_root, crfsuite_features, crfsuite_marginals, fit_temperature, machine,  # noqa: E402
                     temper)

CRF_PARAMS = dict(algorithm="lbfgs", c1=0.1, c2=0.1, max_iterations=100, all_possible_transitions=True)
GPSEQ_STRATEGIES = ("bald", "entropy", "least-confidence", "random")
ALL = (*GPSEQ_STRATEGIES, "crfsuite-lc", "random-warm")
CORPORA = {  # name: (train, test, preset, encoding, start, step)
    "conll2000": ("conll2000/train.txt", "conll2000/test.txt", "chunking", "utf-8", 100, 100),
    "japanesene": ("crfpp/JapaneseNE/train.data", "crfpp/JapaneseNE/test.data", "ner", "euc-jp", 12, 12),
}


def scores_of(report: dict) -> dict:
    f1 = report.get("chunk_f1")
    return {"f1": f1 if f1 is not None else report.get("token_accuracy"), "token_nll": report.get("token_nll")}


def run_gpseq(strategy, train, labelled, pool_ids, test, config, rounds, step, seed, log):
    from gpseq.tagger import Tagger

    labelled = list(labelled)
    curve, previous = [], None
    for round_ in range(rounds + 1):
        started = time.perf_counter()
        warm = strategy == "random-warm" and previous is not None
        tagger = Tagger.train([train[i] for i in labelled], config, init=previous if warm else None)
        train_s = time.perf_counter() - started
        point = {"round": round_, "sentences": len(labelled), "tokens": sum(len(train[i]) for i in labelled),
                 **scores_of(tagger.evaluate(test).to_dict()), "train_s": train_s}
        if round_ < rounds:
            started = time.perf_counter()
            chosen = set(labelled)
            rest = [i for i in pool_ids if i not in chosen]
            kind = "random" if strategy == "random-warm" else strategy
            picked = tagger.select([train[i] for i in rest], step, kind, seed=seed + round_, tag=False)
            point["picked"] = [rest[p.index] for p in picked]  # training-file indices, in pick order
            labelled += point["picked"]
            point["select_s"] = time.perf_counter() - started
        previous = tagger
        curve.append(point)
        log(f"  {strategy:17s} round {round_}: {point['sentences']} sentences, F1 {point['f1']:.4f}, "
            f"NLL {point['token_nll']:.4f}, train {train_s:.1f} s, select {point.get('select_s', 0):.1f} s")
    return curve


def crfsuite_tempered(sentences, test, features, seed) -> tuple[float, float]:
    """(token NLL on `test`, T) of CRFsuite + T: trained on 90 % of `sentences` (a seeded split), T
    fitted by NLL on the held-out 10 % (at least one sentence), its marginals p^(1/T)."""
    import sklearn_crfsuite

    from gpseq.evaluation.evaluate import evaluate
    from gpseq.features import Featurizer

    order = np.random.default_rng(seed).permutation(len(sentences))
    held = max(1, round(0.1 * len(sentences)))
    dev, rest = [sentences[i] for i in order[:held]], [sentences[i] for i in order[held:]]
    featurizer = Featurizer(features).fit(rest)
    crf = sklearn_crfsuite.CRF(**CRF_PARAMS)
    crf.fit(crfsuite_features(featurizer, rest), [list(s.labels) for s in rest])
    labels = list(crf.classes_)
    index = {label: i for i, label in enumerate(labels)}
    dev_probs = np.concatenate(crfsuite_marginals(crf, crfsuite_features(featurizer, dev), labels))
    gold = np.array([index.get(label, -1) for s in dev for label in s.labels])
    temperature = fit_temperature(dev_probs, gold)
    X = crfsuite_features(featurizer, test)
    tempered = [temper(p, temperature) for p in crfsuite_marginals(crf, X, labels)]
    report = evaluate([list(s.labels) for s in test], [list(crf.predict_single(x)) for x in X], labels=labels,
                      probabilities=tempered).to_dict()
    return report["token_nll"], temperature


def run_crfsuite(train, labelled, pool_ids, test, features, rounds, step, log, seed=0):
    import sklearn_crfsuite

    from gpseq.evaluation.evaluate import evaluate
    from gpseq.features import Featurizer

    labelled = list(labelled)
    curve = []
    for round_ in range(rounds + 1):
        started = time.perf_counter()
        sentences = [train[i] for i in labelled]
        featurizer = Featurizer(features).fit(sentences)
        crf = sklearn_crfsuite.CRF(**CRF_PARAMS)
        crf.fit(crfsuite_features(featurizer, sentences), [list(s.labels) for s in sentences])
        train_s = time.perf_counter() - started
        labels = list(crf.classes_)
        X = crfsuite_features(featurizer, test)
        report = evaluate([list(s.labels) for s in test], [list(crf.predict_single(x)) for x in X], labels=labels,
                          probabilities=crfsuite_marginals(crf, X, labels)).to_dict()
        point = {"round": round_, "sentences": len(labelled), "tokens": sum(len(train[i]) for i in labelled),
                 **scores_of(report), "train_s": train_s}
        point["token_nll_t"], point["temperature"] = crfsuite_tempered(sentences, test, features, [seed, round_, 5])
        if round_ < rounds:
            started = time.perf_counter()
            chosen = set(labelled)
            rest = [i for i in pool_ids if i not in chosen]
            tagger = crf.tagger_
            confidence = []
            for x in crfsuite_features(featurizer, [train[i] for i in rest]):
                tagger.set(x)
                confidence.append(tagger.probability(tagger.tag()))
            order = np.argsort(np.asarray(confidence), kind="stable")[:step]  # least confident first
            point["picked"] = [rest[i] for i in order]
            labelled += point["picked"]
            point["select_s"] = time.perf_counter() - started
        curve.append(point)
        log(f"  {'crfsuite-lc':17s} round {round_}: {point['sentences']} sentences, F1 {point['f1']:.4f}, "
            f"NLL {point['token_nll']:.4f} (+T {point['token_nll_t']:.4f}, T = {point['temperature']:.2f}), "
            f"train {train_s:.1f} s, select {point.get('select_s', 0):.1f} s")
    return curve


def summarise(curves: dict) -> dict:
    out = {}
    random = curves.get("random")
    if not random:
        return out
    target = random[-1]["f1"]
    out["random_final_f1"], out["random_final_sentences"] = target, random[-1]["sentences"]
    for name, curve in curves.items():
        reached = next((p["sentences"] for p in curve if p["f1"] is not None and p["f1"] >= target), None)
        out[f"{name}/sentences_to_random_final_f1"] = reached
        out[f"{name}/share_of_random_labels"] = None if reached is None else reached / random[-1]["sentences"]
        out[f"{name}/final_f1"], out[f"{name}/final_token_nll"] = curve[-1]["f1"], curve[-1]["token_nll"]
    if "bald" in curves:
        share = out["bald/share_of_random_labels"]
        out["target/bald_reaches_random_final_f1_with_60pct"] = share is not None and share <= 0.6
        if "crfsuite-lc" in curves:
            pairs = list(zip(curves["bald"], curves["crfsuite-lc"]))
            above = [b["f1"] > c["f1"] for b, c in pairs[1:]]  # the rounds of selection
            out["bald/rounds_above_crfsuite_lc"] = f"{sum(above)}/{len(above)}"
            lower = [b["token_nll"] < c["token_nll"] for b, c in pairs[1:]]
            lower_t = [b["token_nll"] < c["token_nll_t"] for b, c in pairs[1:] if "token_nll_t" in c]
            out["bald/rounds_nll_below_crfsuite_lc"] = f"{sum(lower)}/{len(lower)}"
            out["bald/rounds_nll_below_crfsuite_lc_t"] = f"{sum(lower_t)}/{len(lower_t)}"
            out["start/bald_minus_crfsuite_lc_f1"] = pairs[0][0]["f1"] - pairs[0][1]["f1"]  # same sentences
            out["target/bald_beats_crfsuite_lc_every_round"] = bool(above) and all(above)
    if "random-warm" in curves:
        cold, warm = curves["random"], curves["random-warm"]
        out["warm_start/max_f1_drop"] = max(c["f1"] - w["f1"] for c, w in zip(cold[1:], warm[1:]))
        out["warm_start/max_nll_increase"] = max(w["token_nll"] - c["token_nll"] for c, w in zip(cold[1:], warm[1:]))
        out["warm_start/train_s_ratio"] = sum(w["train_s"] for w in warm[1:]) / sum(c["train_s"] for c in cold[1:])
    return out


def plot(results: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    names = list(results["corpora"])
    figure = Figure(figsize=(10, 4 * len(names)), layout="constrained")
    axes = figure.subplots(len(names), 2, squeeze=False)
    for row, name in enumerate(names):
        for strategy, curve in results["corpora"][name]["curves"].items():
            x = [p["sentences"] for p in curve]
            style = "--" if strategy in ("crfsuite-lc", "random-warm") else "-"
            axes[row, 0].plot(x, [p["f1"] for p in curve], style, marker="o", markersize=3, label=strategy)
            axes[row, 1].plot(x, [p["token_nll"] for p in curve], style, marker="o", markersize=3, label=strategy)
            if "token_nll_t" in curve[0]:
                axes[row, 1].plot(x, [p["token_nll_t"] for p in curve], ":", marker="o", markersize=3,
                                  label=f"{strategy} + T")
        axes[row, 0].set_title(f"{name}: chunk F1 (test)")
        axes[row, 1].set_title(f"{name}: token NLL (test)")
        for ax in axes[row]:
            ax.set_xlabel("sentences labelled")
            ax.grid(alpha=0.3)
        axes[row, 0].legend(fontsize=8)
        axes[row, 1].legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=90)


def text_report(results: dict) -> str:
    """The learning curves as Markdown tables (chunk F1 / token NLL against sentences labelled),
    tokens labelled, time, and the summary."""
    meta = results["meta"]
    lines = [f"python benchmarks/active_learning.py {' '.join(meta['argv'])}",
             f"{meta['date']} UTC, {meta['machine']}, load average at the start "
             f"{' '.join(f'{x:.2f}' for x in meta['load_average'])}; pool {meta['pool']}, test {meta['test']}, "
             f"seed {meta['seed']}" + (" (REDUCED)" if meta["reduced"] else ""), ""]
    for name, entry in results["corpora"].items():
        curves = entry["curves"]
        names = list(curves)
        lines += [f"{name} (start {entry['start']}, step {entry['step']}, pool {entry['pool_sentences']}, "
                  f"test {entry['test_sentences']}): chunk F1 / token NLL on test", "",
                  "| sentences | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for i, point in enumerate(curves[names[0]]):
            cells = [f"{c[i]['f1']:.4f} / {c[i]['token_nll']:.3f}" if i < len(c) else "" for c in curves.values()]
            lines.append(f"| {point['sentences']} | " + " | ".join(cells) + " |")
        if "token_nll_t" in curves.get("crfsuite-lc", [{}])[0]:
            lines += ["", "crfsuite-lc + T (90 % of the labelled sentences, T fitted on the other 10 %), token NLL: "
                      + ", ".join(f"{p['token_nll_t']:.3f} (T {p['temperature']:.2f})" for p in curves["crfsuite-lc"])]
        lines += ["", "tokens labelled at the end: " + ", ".join(f"{n} {c[-1]['tokens']:,}" for n, c in curves.items()),
                  "train s (sum): " + ", ".join(f"{n} {sum(p['train_s'] for p in c):.0f}" for n, c in curves.items()),
                  "select s (sum): " + ", ".join(f"{n} {sum(p.get('select_s', 0) for p in c):.0f}"
                                                 for n, c in curves.items()),
                  "summary: " + json.dumps(entry.get("summary", {}), indent=1), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--plot", type=Path, help="write the learning curves as a PNG here")
    parser.add_argument("--txt", type=Path, help="write the tables as text here")
    parser.add_argument("--corpora", default="conll2000,japanesene")
    parser.add_argument("--strategies", default=",".join(ALL))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--pool", type=int, default=0, help="draw the pool from this many training sentences (0: all)")
    parser.add_argument("--test", type=int, default=0, help="evaluate on the first N test sentences (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="conll2000 only, 3 rounds, pool 1500, test 500")
    args = parser.parse_args(argv)
    if args.quick:
        args.corpora, args.rounds, args.pool, args.test = "conll2000", 3, 1500, 500
    from gpseq.config import TaggerConfig
    from gpseq.corpora import read_conll
    from gpseq.features import get_preset

    strategies = [s for s in args.strategies.split(",") if s]
    results = {"meta": {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"), "argv": sys.argv[1:],
                        "load_average": os.getloadavg(), "rounds": args.rounds, "pool": args.pool or "all",
                        "test": args.test or "all", "seed": args.seed,
                        "reduced": bool(args.pool or args.test or args.rounds != 8)},
               "corpora": {}}

    def log(message):
        print(message, flush=True)

    def save():
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=1, default=float))

    for name in args.corpora.split(","):
        train_file, test_file, preset, encoding, start, step = CORPORA[name]
        root = corpora_root()
        train = read_conll(root / train_file, encoding=encoding)
        test = read_conll(root / test_file, encoding=encoding)
        if args.test:
            test = test[: args.test]
        rng = np.random.default_rng([args.seed, 20])
        order = rng.permutation(len(train))
        initial = sorted(order[:start].tolist())
        pool_ids = sorted(order[start:].tolist() if not args.pool else order[start:start + args.pool].tolist())
        config = TaggerConfig(features=get_preset(preset))
        log(f"{name}: {len(train)} training sentences (start {start}, step {step}, pool {len(pool_ids)}), "
            f"{len(test)} test sentences")
        entry = results["corpora"][name] = {"start": start, "step": step, "pool_sentences": len(pool_ids),
                                            "test_sentences": len(test), "curves": {}}
        for strategy in strategies:
            if strategy == "crfsuite-lc":
                curve = run_crfsuite(train, initial, pool_ids, test, get_preset(preset), args.rounds, step, log,
                                     args.seed)
            else:
                curve = run_gpseq(strategy, train, initial, pool_ids, test, config, args.rounds, step,
                                  args.seed, log)
            entry["curves"][strategy] = curve
            entry["summary"] = summarise(entry["curves"])
            save()
        log(json.dumps(entry["summary"], indent=1))
    save()
    if args.plot:
        plot(results, args.plot)
    if args.txt:
        args.txt.write_text(text_report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
