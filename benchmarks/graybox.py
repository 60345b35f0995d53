"""Gray-box likelihoods (issue 18), part (b): training from partial annotation on CoNLL-2000.

    python benchmarks/graybox.py [--json OUT] [--quick] [--workdir DIR]

CoNLL-2000 chunking, train.txt → test.txt, the `chunking` feature preset. Two annotation regimes
of the training file, both seeded:
- `random50`: each training token's label hidden (`?`) with probability 0.5;
- `np_vp`: only the labels of the NP and VP chunks kept (whole chunks: their B- and I- tokens);
  every other token (O, PP, ADJP, …) `?`.
Systems, trained and tested in the same run:
- `partial`: gpseq's default training (`Tagger.train`, in this process, timed) on every sentence,
  the `?` tokens marginalised by the partial-annotation likelihood;
- `dropped`: the same on the fully labelled sentences only (the partially labelled ones dropped);
- `crfsuite`: CRFsuite (c1 = c2 = 0.1, 100 iterations, all transitions; `versus_crf.train_crf`,
  its own process) on the same fully labelled subset, given gpseq's feature strings;
- `random50` only, the same annotation budget spent otherwise: `half_sentences` (gpseq) and
  `crfsuite_half`, on half of the sentences (seeded) with every label, none of the others;
- `np_vp` only, the common workaround for entity-only annotation: `as_o` (gpseq) and
  `crfsuite_as_o`, every `?` read as O, all sentences.
Metrics on test.txt: chunk F1 and token NLL (`gpseq.evaluate`, each system with its own label set:
gold labels it cannot predict are errors, NLL clipped). In `np_vp` the models know only the labels
they were shown, so the test gold is projected the same way — NP and VP chunks kept, every other
token O — and the chunk F1 is that of NP and VP chunks (`chunk_f1`, and per type); token NLL is
over the test tokens inside NP and VP chunks. For reference, every label shown: the figures of
`benchmarks/versus_crf.py` (RESULTS.md) or `--reference` here.

--quick: the first 1,000 training and 300 test sentences (a smoke run; never commit its figures).
Output: a table, and with --json a flat JSON object `partial/<regime>/<system>/<metric>`,
`partial/<regime>/data/...` and `meta/...`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import corpora_root, crfsuite_features, crfsuite_marginals, run_meta  # noqa: E402
from versus_crf import CRF_PARAMS, refuse_tracked, train_crf  # noqa: E402
from gpseq.corpora import UNLABELLED, Sentence, read_conll, split_label, write_conll  # noqa: E402
from gpseq.evaluate import evaluate  # noqa: E402

HIDDEN_SHARE, SEED = 0.5, 0
KEPT_TYPES = ("NP", "VP")
QUICK_TRAIN, QUICK_TEST = 1000, 300
REPORTED = ("chunk_f1", "token_nll", "token_accuracy", "train_s", "train_sentences", "labelled_tokens")


def relabelled(sentence: Sentence, labels: list[str]) -> Sentence:
    """The sentence with `labels` in its label column (the last)."""
    columns = [row[:-1] + [label] for row, label in zip(sentence.columns, labels)]
    return Sentence(sentence.tokens, labels, columns, sentence.source, sentence.line)


def kept(label: str) -> bool:
    """Whether a chunk label belongs to a kept chunk type (NP, VP)."""
    return label != "O" and split_label(label)[1] in KEPT_TYPES


def hide_random(train: list[Sentence], share: float, seed: int) -> list[Sentence]:
    """Each token's label replaced by `?` with probability `share` (one seeded stream)."""
    rng = np.random.default_rng(seed)
    return [relabelled(s, [UNLABELLED if hide else label for label, hide in zip(s.labels, rng.random(len(s)) < share)])
            for s in train]


def keep_types(train: list[Sentence]) -> list[Sentence]:
    """Only the labels of NP and VP chunks kept; every other token `?`."""
    return [relabelled(s, [label if kept(label) else UNLABELLED for label in s.labels]) for s in train]


def as_o(train: list[Sentence]) -> list[Sentence]:
    """Every `?` read as O (annotation of some chunk types taken as complete)."""
    return [relabelled(s, ["O" if label == UNLABELLED else label for label in s.labels]) for s in train]


def projected(labels: list[str]) -> list[str]:
    """Test gold as the np_vp regime's annotators would see it: NP and VP chunks, O elsewhere."""
    return [label if kept(label) else "O" for label in labels]


def score(test: list[Sentence], predicted, probabilities, labels: list[str], regime: str) -> dict:
    """Chunk F1, token accuracy and token NLL of one system's output on `test` (module docstring)."""
    gold = [list(s.labels) for s in test]
    if regime == "np_vp":
        gold = [projected(g) for g in gold]
    report = evaluate(gold, predicted, labels=labels, probabilities=probabilities)
    out = {"chunk_f1": report.chunk_f1, "token_accuracy": report.token_accuracy, "token_nll": report.token_nll}
    if regime == "np_vp":
        index = {label: i for i, label in enumerate(labels)}
        p_gold = [p[t, index[g]] if g in index else 0.0 for s, p in zip(gold, probabilities)
                  for t, g in enumerate(s) if kept(g)]
        out["token_nll"] = float(np.mean(-np.log(np.maximum(p_gold, report.eps))))
        for kind in KEPT_TYPES:
            out[f"chunk_f1[{kind}]"] = report.per_type[kind].f1 if kind in (report.per_type or {}) else 0.0
    return out


def run_gpseq(train: list[Sentence], test: list[Sentence], regime: str) -> dict:
    """`Tagger.train` defaults (the chunking preset) on `train`, timed; scored on `test`."""
    from gpseq.config import TaggerConfig
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger

    if not train:
        return {"train_sentences": 0, "error": "no fully labelled sentence"}
    start = time.perf_counter()
    tagger = Tagger.train(train, TaggerConfig(features=get_preset("chunking")))
    train_s = time.perf_counter() - start
    tagged = tagger.tag(test)
    out = score(test, [t.labels for t in tagged], [t.probabilities for t in tagged], tagger.labels, regime)
    return {**out, "train_s": train_s, "train_sentences": len(train), "_features": tagger.config.features.to_dict()}


def run_crfsuite(train: list[Sentence], test: list[Sentence], regime: str, feature_config: dict, workdir: Path,
                 name: str) -> dict:
    """CRFsuite (`versus_crf.train_crf`, its own process) on `train`, scored on `test`."""
    import sklearn_crfsuite

    from gpseq.features import Featurizer

    if not train:
        return {"train_sentences": 0, "error": "no fully labelled sentence"}
    train_file = workdir / f"{name}.train.conll"
    write_conll(train_file, train)
    state = train_crf(train_file, {"label_column": -1, "encoding": "utf-8"}, feature_config, workdir, name,
                      tempered=False)
    featurizer = Featurizer.load(state["featurizer_dir"])
    crf = sklearn_crfsuite.CRF(model_filename=str(state["model_path"]), **CRF_PARAMS)
    labels = list(crf.classes_)
    X = crfsuite_features(featurizer, test)
    predicted = [list(crf.predict_single(x)) for x in X]
    out = score(test, predicted, crfsuite_marginals(crf, X, labels), labels, regime)
    return {**out, "train_s": state["train_s"], "train_sentences": len(train)}


def run_regime(regime: str, train: list[Sentence], test: list[Sentence], workdir: Path) -> dict:
    """Every system of one annotation regime; flat results `partial/<regime>/...`."""
    shown = hide_random(train, HIDDEN_SHARE, SEED) if regime == "random50" else keep_types(train)
    full = [s for s in shown if s.fully_labelled]
    labelled = sum(label != UNLABELLED for s in shown for label in s.labels)
    tokens = sum(len(s) for s in shown)
    print(f"{regime}: {labelled:,} of {tokens:,} training tokens labelled; {len(full)} of {len(shown)} "
          "sentences fully labelled", flush=True)
    results = {"partial": run_gpseq(shown, test, regime)}
    features = results["partial"].pop("_features")
    results["partial"]["labelled_tokens"] = labelled
    print(f"  partial: {results['partial']['train_s']:.1f} s", flush=True)
    results["dropped"] = run_gpseq(full, test, regime)
    results["dropped"].pop("_features", None)
    results["crfsuite"] = run_crfsuite(full, test, regime, features, workdir, f"{regime}.crf")
    for system in ("dropped", "crfsuite"):
        results[system]["labelled_tokens"] = sum(len(s) for s in full)
    if regime == "random50":
        chosen = np.random.default_rng(SEED + 1).choice(len(train), len(train) // 2, replace=False)
        half = [train[i] for i in sorted(chosen)]
        results["half_sentences"] = run_gpseq(half, test, regime)
        results["half_sentences"].pop("_features")
        results["crfsuite_half"] = run_crfsuite(half, test, regime, features, workdir, f"{regime}.crf_half")
        for system in ("half_sentences", "crfsuite_half"):
            results[system]["labelled_tokens"] = sum(len(s) for s in half)
    if regime == "np_vp":
        everything = as_o(shown)
        results["as_o"] = run_gpseq(everything, test, regime)
        results["as_o"].pop("_features")
        results["crfsuite_as_o"] = run_crfsuite(everything, test, regime, features, workdir, f"{regime}.crf_as_o")
        for system in ("as_o", "crfsuite_as_o"):
            results[system]["labelled_tokens"] = tokens
    out = {f"partial/{regime}/data/{key}": value for key, value in
           (("train_sentences", len(shown)), ("train_tokens", tokens), ("labelled_tokens", labelled),
            ("fully_labelled_sentences", len(full)), ("test_sentences", len(test)))}
    for system, values in results.items():
        for key, value in values.items():
            out[f"partial/{regime}/{system}/{key}"] = value
    return out


def table(results: dict) -> str:
    lines = ["| regime | system | train sentences | labelled tokens | chunk F1 | token NLL | train s |",
             "|---|---|---|---|---|---|---|"]
    for regime in ("random50", "np_vp", "reference"):
        for system in ("partial", "dropped", "crfsuite", "half_sentences", "crfsuite_half", "as_o", "crfsuite_as_o",
                       "gpseq"):
            key = f"partial/{regime}/{system}/"
            if key + "train_sentences" not in results:
                continue

            def cell(metric, fmt):
                value = results.get(key + metric)
                return "-" if value is None else format(value, fmt)

            lines.append(f"| {regime} | {system} | {cell('train_sentences', ',')} | {cell('labelled_tokens', ',')} "
                         f"| {cell('chunk_f1', '.4f')} | {cell('token_nll', '.4f')} | {cell('train_s', '.1f')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures as a flat JSON object")
    parser.add_argument("--quick", action="store_true", help=f"first {QUICK_TRAIN} train / {QUICK_TEST} test sentences")
    parser.add_argument("--workdir", type=Path, help="keep the CRFsuite files here (default: a temporary directory)")
    parser.add_argument("--reference", action="store_true", help="also train gpseq on every label (the upper bound)")
    args = parser.parse_args()
    if args.quick and args.json is not None:
        refuse_tracked(args.json)
    root = corpora_root() / "conll2000"
    train, test = read_conll(root / "train.txt"), read_conll(root / "test.txt")
    if args.quick:
        train, test = train[:QUICK_TRAIN], test[:QUICK_TEST]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="graybox-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results: dict = {}
    try:
        for regime in ("random50", "np_vp"):
            results.update(run_regime(regime, train, test, workdir))
        if args.reference:
            reference = run_gpseq(train, test, "random50")
            reference.pop("_features")
            results.update({f"partial/reference/gpseq/{key}": value for key, value in reference.items()})
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    results.update(run_meta("graybox.py", args.quick, started))
    print()
    print(table(results))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"figures → {args.json}")


if __name__ == "__main__":
    main()
