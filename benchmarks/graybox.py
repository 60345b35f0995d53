"""Gray-box inference (issue 18) on CoNLL-2000 chunking: (a) the score-function vs the pathwise
estimator after the same wall time, (b) training from partial annotation.

    python benchmarks/graybox.py [--json OUT] [--parts a b] [--budget SECONDS] [--quick] [--workdir DIR]

Both parts: train.txt → test.txt, the `chunking` feature preset.

Part (a), `estimators/...`: the SVI model of `gpseq train --inducing 64` (kernel linear+rbf, M = 64,
the other settings defaults: batch 32, learning rate 0.02) with each estimator at its default
sample count (pathwise 1, score 16 draws per sentence), trained on every training sentence (no
dev split, no early stopping) for as many steps as fit in `--budget` seconds of training steps:
each estimator's seconds per step are measured first on a short run (steps 6–30), then the run of
budget / (seconds per step) steps is timed and scored on test.txt (chunk F1, token NLL with the
default predictive). Then, on the trained score-function model and a seeded batch of 32 training
sentences, the summed per-element variance of the expected-log-likelihood gradient over every
trainable variable across 50 seeded draws, with and without the control variates (seed §5.2),
and its ratio.

Part (b), `partial/...`: two annotation regimes of the training file, both seeded:
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
Metrics on test.txt: chunk F1 and token NLL (`gpseq.evaluation.evaluate`, each system with its own label set:
gold labels it cannot predict are errors, NLL clipped). In `np_vp` the models know only the labels
they were shown, so the test gold is projected the same way — NP and VP chunks kept, every other
token O — and the chunk F1 is that of NP and VP chunks (`chunk_f1`, and per type); token NLL is
over the test tokens inside NP and VP chunks. For reference, every label shown: the figures of
`benchmarks/versus_crf.py` (RESULTS.md) or `--reference` here.

--quick: the first 1,000 training and 300 test sentences (a smoke run; never commit its figures).
Output: tables, and with --json a flat JSON object `estimators/<estimator>/<metric>`,
`estimators/variance/...`, `partial/<regime>/<system>/<metric>`, `partial/<regime>/data/...` and
`meta/...`.
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
from gpseq.evaluation.evaluate import evaluate  # noqa: E402

HIDDEN_SHARE, SEED = 0.5, 0
BUDGET_S, CALIBRATION_STEPS, VARIANCE_DRAWS, VARIANCE_BATCH = 600.0, 30, 50, 32
KEPT_TYPES = ("NP", "VP")
QUICK_TRAIN, QUICK_TEST = 1000, 300
REPORTED = ("chunk_f1", "token_nll", "token_accuracy", "train_s", "train_sentences", "labelled_tokens")


def relabelled(sentence: Sentence, labels: list[str]) -> Sentence:
    """The sentence with `labels` in its label column (the last)."""
    columns = [[*row[:-1], label] for row, label in zip(sentence.columns, labels)]
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


# ---- part (a): the score-function vs the pathwise estimator ---------------------------------------
class StepClock:
    """A trainer callback: wall and CPU time after every training step."""

    def __init__(self):
        self.wall, self.cpu = [], []

    def __call__(self, progress) -> None:
        if progress.event == "step":
            self.wall.append(time.perf_counter())
            self.cpu.append(time.process_time())


def estimator_config(estimator: str, max_steps: int):
    """`gpseq train --inducing 64` with `estimator` (default draws), every sentence, `max_steps` steps."""
    from gpseq.config import TaggerConfig
    from gpseq.features import get_preset
    from gpseq.structured.config import ModelConfig
    from gpseq.training.config import TrainingConfig

    return TaggerConfig(features=get_preset("chunking"), model=ModelConfig(kernel="linear+rbf", estimator=estimator),
                        training=TrainingConfig(method="svi", epochs=10**6, max_steps=max_steps, dev_fraction=0.0,
                                                early_stopping="none", checkpoint_every=0))


def run_estimator(estimator: str, train: list[Sentence], test: list[Sentence], budget_s: float):
    """(figures, tagger) of `estimator` trained for `budget_s` seconds of steps (module docstring)."""
    from gpseq.tagger import Tagger

    clock = StepClock()
    Tagger.train(train, estimator_config(estimator, CALIBRATION_STEPS), callbacks=[clock])
    step_s = float(np.median(np.diff(clock.wall[5:])))
    steps = max(2, int(budget_s / step_s))
    print(f"  {estimator}: {1000 * step_s:.0f} ms / step → {steps} steps", flush=True)
    clock = StepClock()
    tagger = Tagger.train(train, estimator_config(estimator, steps), callbacks=[clock])
    tagged = tagger.tag(test)
    out = score(test, [t.labels for t in tagged], [t.probabilities for t in tagged], tagger.labels, "full")
    per_step = (clock.wall[-1] - clock.wall[0]) / (len(clock.wall) - 1)
    return {**out, "num_samples": tagger.model.num_samples, "steps": steps, "calibrated_step_ms": 1000 * step_s,
            "step_ms": 1000 * per_step, "train_steps_wall_s": per_step * len(clock.wall),
            "train_steps_cpu_s": (clock.cpu[-1] - clock.cpu[0]) * len(clock.cpu) / (len(clock.cpu) - 1),
            "epochs": steps * estimator_config(estimator, 1).training.batch_size / len(train)}, tagger


def gradient_variance(tagger, sentences: list[Sentence], draws: int) -> dict:
    """Summed per-element variance of the score-function ELL gradient over `draws` seeded draws,
    with and without control variates, on one batch of `sentences` (the model's sample count)."""
    import tensorflow as tf

    from gpseq.structured.estimators import score_function_ell
    from gpseq.training.batching import SequenceData, make_batch

    model = tagger.model
    data = SequenceData.featurised(tagger.featurizer, sentences, tagger.label_index)
    batch = {k: tf.convert_to_tensor(v) for k, v in make_batch(data, np.arange(len(sentences))).items()}
    out = {}
    for name, use_cv in (("with_cv", True), ("without_cv", False)):
        @tf.function
        def gradient(seed):
            with tf.GradientTape() as tape:
                ell = score_function_ell(model, batch, model.num_samples, seed, use_cv)
            grads = tape.gradient(ell, model.trainable_variables)
            return tf.concat([tf.reshape(tf.convert_to_tensor(g), [-1]) for g in grads], 0)

        total = squares = 0.0
        for draw in range(draws):  # running moments: the flat gradient has D·V elements
            g = gradient(tf.constant([draw, 7])).numpy().astype(np.float64)
            total, squares = total + g, squares + g * g
        out[name] = float(((squares - total * total / draws) / (draws - 1)).sum())
    out["ratio"] = out["without_cv"] / out["with_cv"]
    out.update(draws=draws, batch_sentences=len(sentences), num_samples=model.num_samples)
    return out


def run_estimators(train: list[Sentence], test: list[Sentence], budget_s: float) -> dict:
    """Part (a): both estimators after the same training time, and the control variates' effect."""
    results, taggers = {}, {}
    for estimator in ("pathwise", "score"):
        results[estimator], taggers[estimator] = run_estimator(estimator, train, test, budget_s)
    chosen = np.random.default_rng(SEED).choice(len(train), VARIANCE_BATCH, replace=False)
    variance = gradient_variance(taggers["score"], [train[i] for i in sorted(chosen)], VARIANCE_DRAWS)
    print(f"  variance without / with control variates: {variance['ratio']:.1f}×", flush=True)
    out = {f"estimators/{system}/{key}": value for system, values in {**results, "variance": variance}.items()
           for key, value in values.items()}
    out["estimators/budget_s"] = budget_s
    out["estimators/score_minus_pathwise_f1"] = results["score"]["chunk_f1"] - results["pathwise"]["chunk_f1"]
    out["estimators/score_over_pathwise_nll"] = results["score"]["token_nll"] / results["pathwise"]["token_nll"]
    return out


def estimator_table(results: dict) -> str:
    lines = ["| estimator | draws | steps | epochs | ms / step | training s (wall / CPU) | chunk F1 | token NLL |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for system in ("pathwise", "score"):
        r = {key.split("/")[-1]: value for key, value in results.items() if key.startswith(f"estimators/{system}/")}
        lines.append(f"| {system} | {r['num_samples']} | {r['steps']:,} | {r['epochs']:.1f} | {r['step_ms']:.0f} "
                     f"| {r['train_steps_wall_s']:.0f} / {r['train_steps_cpu_s']:.0f} | {r['chunk_f1']:.4f} "
                     f"| {r['token_nll']:.4f} |")
    v = {key.split("/")[-1]: value for key, value in results.items() if key.startswith("estimators/variance/")}
    lines.append(f"\nscore-function gradient variance, summed over every trainable variable ({v['draws']} draws, "
                 f"{v['batch_sentences']} sentences, S = {v['num_samples']}): {v['without_cv']:.4g} without / "
                 f"{v['with_cv']:.4g} with control variates = {v['ratio']:.1f}×")
    return "\n".join(lines)


# ---- output ------------------------------------------------------------------------------------
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
    parser.add_argument("--parts", nargs="+", choices=("a", "b"), default=["a", "b"],
                        help="(a) score-function vs pathwise estimator, (b) partial annotation")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="part (a): seconds of training steps each")
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
        if "a" in args.parts:
            print(f"estimators: {args.budget:.0f} s of training steps each", flush=True)
            results.update(run_estimators(train, test, args.budget))
        for regime in ("random50", "np_vp") if "b" in args.parts else ():
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
    if "a" in args.parts:
        print(estimator_table(results))
    if "b" in args.parts:
        print(table(results))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"figures → {args.json}")


if __name__ == "__main__":
    main()
