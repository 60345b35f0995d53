"""gpseq's default command against CRFsuite and CRFsuite + temperature, on every corpus at hand (issue 16),
CRFsuite given gpseq's features and, as its users run it, the reference features.

    python benchmarks/versus_crf.py [--json OUT] [--quick] [--only NAME ...] [--workdir DIR]
                                    [--small-features template|preset] [--repeats N]

Systems, trained and tested in the same run:
- `gpseq`: `gpseq train TRAIN --features PRESET -o DIR`, nothing else (plus `--label-column` /
  `--encoding` where the corpus format forces it), run as a subprocess: its wall time is
  train_s and its own peak RSS (ru_maxrss from os.wait4) is peak_rss_mb. The model is then
  loaded in this process with `Tagger.load` and tested with default settings:
  `tagger.tag(test)` is timed for tokens/s, the median of TAG_REPEATS calls (featurisation
  included; after a warm-up call on 8 sentences that traces the compiled functions, timed as
  tag_warmup_s; CRFsuite's featurisation, Viterbi and marginals likewise), and
  `tagger.evaluate(test)` gives the metrics.
- `crfsuite`: sklearn-crfsuite, L-BFGS, c1 = c2 = 0.1, 100 iterations,
  all_possible_transitions=True, trained on the full training file, given exactly gpseq's
  feature strings (a `Featurizer` with the gpseq model's feature configuration, fitted on the
  CRF's own training sentences). Trained as a user would run it, by its own process
  (`_crf_train.py`: read the training file, featurise, train with python-crfsuite's Trainer —
  the library sklearn-crfsuite wraps, the same training without sklearn's 1 s import — and
  write the model), timed from its
  start to its exit exactly like `gpseq train` (interpreter start, imports, reading and
  writing included for both; until 2026-11-23 the CRF was timed inside a worker after its
  imports and with the corpus already read, which left out about 0.3–0.5 s that gpseq's time
  included); peak RSS is that process's own. Tagging: feature dicts, Viterbi labels and
  marginals, timed together.
  (Both training processes are forked from a light fork server started first: a child of this
  process would inherit this process's RSS as the floor of its ru_maxrss.)
- `crfsuite_t`: CRFsuite as above trained on train minus the dev split
  `gpseq.corpora.splits.train_dev_split(len(train), 0.1, seed=0)`; its token marginals tempered
  p^(1/T), renormalised per token, with T fitted by minimising the token NLL on that dev split
  (grid over log T, then a bounded scalar search; `_common.fit_temperature`); labels = its
  Viterbi labels. train_s includes fitting T.
- `crfsuite_ref`, `crfsuite_ref_t`: the same two trainings and tests with the features CRFsuite's
  users configure instead of gpseq's: the sklearn-crfsuite tutorial's (`_common.reference_features`:
  a bias, the lower-cased word, istitle / isupper / isdigit, its 3-character prefix and suffix,
  the lower-cased words at −2, −1, +1, +2 with `__BOS__` / `__EOS__` markers; where the corpus has
  a POS column that is not the label, also the token's POS tag and its `postag[:2]`, the POS tags
  at −2..+2 and `postag[:2]` at ±1), the same parameters; crfsuite_ref on the whole training file,
  crfsuite_ref_t on the same train part with T fitted on the same dev split as crfsuite_t. POS
  column: CoNLL-2000 chunking, CRF++ basenp and chunking: column 1; CRF++ JapaneseNE: column 2 (its
  IPADIC tags, e.g. 名詞-固有名詞-地域-一般, so postag[:2] is a coarse tag such as 名詞; its
  char-type column 1 is not used: the tutorial has no such feature); none for CoNLL-2000 POS
  tagging (POS is the label) and CRF++ seg (character class is not a POS).

Timing: `--repeats N` rounds (default 3; 1 with --quick) of the training processes, alternated
(gpseq, crfsuite, crfsuite_t, crfsuite_ref, crfsuite_ref_t, gpseq, …): train_s and peak_rss_mb
are the medians over the rounds, `train_s_runs` / `peak_rss_mb_runs` every round's, in order; the
quality metrics are those of the first round's models (later rounds' models are deleted).
Ratios `<corpus>/ratio/{train_s,peak_rss_mb}_gpseq_over_{crfsuite,crfsuite_ref}` (gpseq's
training process over CRFsuite's, with gpseq's and with the reference features) are shown side by
side under each table. Against the reference CRFsuite: `wins/<corpus>/train_s_le_1x_crfsuite_ref`
and `wins/<corpus>/peak_rss_le_crfsuite_ref` for each corpus with its own training file, and
their counts `wins/reference_count/...` ("default training ≤ 1.0× reference CRFsuite on k/n
corpora of ≥ 2,000 training tokens", "peak training RSS ≤ reference CRFsuite's on k/n") over those
of at least 2,000 training tokens (JapaneseNE counts; basenp, chunking and seg, under 2,000, are
reported and left out of the counts; small-* and shift-* are not counted).

Metrics (gpseq.evaluation.evaluate, each system with its own label set; gold labels it never saw are
errors with clipped NLL): score = chunk F1 when the labels are chunk labels, else token
accuracy; token NLL; ECE (15 bins) on the returned labels and their probabilities, and
ece_argmax; Brier; AURC and error at 90 % coverage; train_s; tagging tokens/s (featurisation
included); peak_rss_mb (training); model_mb on disk. For each target's metric, the difference
gpseq − peer with a 95 % interval from a paired bootstrap over the test sentences
(`_bootstrap.py`: 1,000 draws, the same for both systems) and a better / tie / worse verdict.
ece_if_calibrated (mean and 95th percentile): the ECE a perfectly calibrated system with each
system's confidences would show on the test set (correctness drawn from the confidences,
`_bootstrap.calibrated_ece`): an ECE below it is not miscalibration this test set can detect.
OOV tokens: those whose word form (the token column the corpus is read with; exact,
case-sensitive) does not occur in the training file the systems are trained on (with --quick the
cut file; for shift-* the source corpus's; for small-* the fold's training sentences), as in
shift.py (`_bootstrap.unseen` and `restrict`). For every system: oov_tokens (their count),
oov_token_nll, oov_ece (15 bins, returned labels) and oov_accuracy (token accuracy, on chunk
corpora too), left out where there is no OOV token; gpseq − crfsuite_t on oov_token_nll and
oov_ece by the same paired bootstrap (whole sentences drawn, their OOV tokens kept) with a
verdict; oov_ece_if_calibrated[_q95], the calibrated-system ECE on the OOV tokens alone (the floor
below which an OOV ECE difference is not one the test set can show). The OOV target: both below
crfsuite_t's on a corpus (small-*: the fold means; no bootstrap there), counted over every corpus run.

Corpora (`--only` takes names or prefixes: conll2000, crfpp, small, shift …):
  conll2000-chunk   CoNLL-2000 train.txt → test.txt, --features chunking
  conll2000-pos     same files, POS column (1) as label, --features pos (word features only)
  crfpp-basenp      CRF++ basenp train.data → test.data, --features chunking (word, POS columns)
  crfpp-chunking    CRF++ chunking, --features chunking
  crfpp-seg         CRF++ seg (character, char class, tag), --features segmentation
  crfpp-japanesene  CRF++ JapaneseNE (EUC-JP; word, char type, POS, tag), --features ner: the
                    only NE preset; it uses word features only (no preset reads the char-type
                    and POS columns of this layout except through a CRF++ template)
  small-<set>       the seed's small-scale protocol, as benchmarks/tagger.py --protocol paper:
                    pool train+test, 5 seeded folds, N_seq = 150/50/20/50 training sequences
                    drawn from outside the fold; metrics are means over folds. gpseq gets
                    `--features <the set's CRF++ template>` (the seed's features; the CLI takes
                    a template file as --features), or the preset above with
                    --small-features preset
  masc-pos          a POS tagger trained on nine MASC genres (their files joined in name order,
                    `masc_pos_train`), tested on the tenth (travel-guides), --features pos
  shift-chunk       the conll2000-chunk models (all five systems) tested on the project's
                    corpora/sample/test.conll (word POS NER chunk; chunk = last column)
  shift-pos         the conll2000-pos models tested on the same file, POS column as label

--quick: CoNLL-2000 cut to 500 training / 300 test sentences, other test files to 300
sentences, one fold of the small-scale protocol; the same commands otherwise (gpseq's default
training included, so pick one or two corpora with --only: about 1–3 minutes each here). Its
JSON carries meta/quick = true and is refused over a file git tracks. Never commit quick
figures as results.

Output: a table per corpus, and with --json a flat JSON object: `<corpus>/<system>/<metric>`
(`oov_tokens`, `oov_token_nll`, `oov_ece`, `oov_accuracy` among them),
`<corpus>/crfsuite_t/temperature`, `<corpus>/data/...`, `<corpus>/ratio/...`,
`<corpus>/gpseq_minus_<peer>/<metric>` ([difference, low, high]; crfsuite_t: token_nll, ece,
oov_token_nll, oov_ece; crfsuite: brier, aurc, score), `significance/<corpus>/<metric>_vs_<peer>`
(better / tie / worse for gpseq; the same pairs, e.g. `oov_token_nll_vs_crfsuite_t`),
`significance/count/<metric>_vs_<peer>` ("n better, n tie, n worse" over the corpora),
`wins/<corpus>/<target>` booleans for issue 16's targets and the OOV target
(`oov_nll_below_crfsuite_t`, `oov_ece_below_crfsuite_t`), `wins/every_corpus/<target>` and
`wins/count/<target>` (corpora other than small-*), `wins/small-scale/...`,
`wins/reference_count/...`, `wins/oov_count/nll_and_ece_below_crfsuite_t` ("k/n" over every
corpus run, small-* included; one with no OOV token counts as missed), `wins/oov_count/corpora`,
`wins/oov_count/missed`, `wins/oov_count/summary` ("OOV: NLL and ECE below CRF+T on k/n
corpora"), and `meta/...`.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _bootstrap import calibrated_ece, metric, outcomes, paired_bootstrap, restrict, unseen, verdict  # noqa: E402
from _common import (  # noqa: E402
    PAPER_SETS,
    REFERENCE_FEATURES,
    corpora_root,
    crfsuite_features,
    crfsuite_gold_log_probs,
    crfsuite_marginals,
    gpseq_command,
    in_fresh_process,
    machine,
    paper_folds,
    paper_pool,
    reference_features,
    run_meta,
    run_timed,
    temper,
)
from gpseq.corpora import read_conll, write_conll  # noqa: E402
from gpseq.evaluation.evaluate import evaluate  # noqa: E402

SYSTEMS = ("gpseq", "crfsuite", "crfsuite_t", "crfsuite_ref", "crfsuite_ref_t")
BASE_SYSTEMS = SYSTEMS[:3]  # what `run_systems` / `test_all` train and test by default (shift.py's use)
CRF_RUNS = {  # system: (file name suffix, tempered, reference features)
    "crfsuite": ("crf", False, False), "crfsuite_t": ("crf_t", True, False),
    "crfsuite_ref": ("crf_ref", False, True), "crfsuite_ref_t": ("crf_ref_t", True, True),
}
CRF_PARAMS = dict(algorithm="lbfgs", c1=0.1, c2=0.1, max_iterations=100, all_possible_transitions=True)
TRAINER_PARAMS = {"c1": 0.1, "c2": 0.1, "max_iterations": 100, "feature.possible_transitions": True}  # the same, as
# python-crfsuite's Trainer takes them (L-BFGS is its default algorithm)
DEV_FRACTION, DEV_SEED = 0.1, 0
TRAINING_KEYS = ("train_s", "train_s_runs", "peak_rss_mb", "peak_rss_mb_runs", "model_mb", "temperature", "prior",
                 "decode")  # copied from the trained state into each system's metrics
OOV_MEASURED = {"oov_token_nll": "token_nll", "oov_ece": "ece", "oov_accuracy": "score"}  # ours: `_bootstrap.metric`'s
# name on the OOV tokens (`_bootstrap.restrict` keeps no chunk counts: score is token accuracy there)
OOV_BOOTSTRAPPED = {"crfsuite_t": ("token_nll", "ece")}  # the OOV target's peer and metrics
REPORTED = ("score", "chunk_f1", "token_accuracy", "token_error", "token_nll", "seq_nll", "ece", "ece_argmax",
            "brier", "aurc", "error_at_90", "n_unseen_gold_tokens", "oov_tokens", *OOV_MEASURED, "train_s",
            "train_s_runs", "tag_tokens_per_s", "tag_warmup_s", "peak_rss_mb", "peak_rss_mb_runs", "model_mb",
            "temperature", "prior", "decode")
SMALL_PRESETS = {"basenp": "chunking", "chunking": "chunking", "segmentation": "segmentation", "japanesene": "ner"}
SMALL_POS = {"basenp": 1, "chunking": 1, "segmentation": None, "japanesene": 2}  # reference features' POS column
MIN_COUNTED_TOKENS = 2000  # the reference-CRFsuite counts take corpora of at least this many training tokens
DEFAULT_REPEATS = 3  # alternated rounds of training processes (--quick: 1)
TAG_REPEATS = 5  # timed taggings of the test file per system, warm: the throughput is the median's
QUICK_CONLL_TRAIN, QUICK_TEST = 500, 300


@dataclass
class Corpus:
    name: str
    train: Path
    test: Path
    features: str  # preset name or a CRF++ template path, as given to --features
    label_column: int = -1
    encoding: str = "utf-8"
    quick_train: int | None = None  # --quick: first sentences of train
    pos_column: int | None = None  # the reference features' POS column (file order); None: no POS features
    source: str | None = None  # shift corpora: the corpus whose models they reuse

    def read(self, path: Path, encoding: str | None = None):
        return read_conll(path, label_column=self.label_column, encoding=encoding or self.encoding)

    def cli_extras(self) -> list[str]:
        extras = []
        if self.label_column != -1:
            extras += ["--label-column", str(self.label_column)]
        if self.encoding.lower().replace("_", "-") not in ("utf-8", "utf8"):
            extras += ["--encoding", self.encoding]
        return extras


def corpora() -> list[Corpus]:
    root = corpora_root()
    conll, crfpp = root / "conll2000", root / "crfpp"
    sample = ROOT / "corpora" / "sample" / "test.conll"
    return [
        Corpus("conll2000-chunk", conll / "train.txt", conll / "test.txt", "chunking", quick_train=QUICK_CONLL_TRAIN,
               pos_column=1),
        Corpus("conll2000-pos", conll / "train.txt", conll / "test.txt", "pos", label_column=1,
               quick_train=QUICK_CONLL_TRAIN),
        Corpus("crfpp-basenp", crfpp / "basenp" / "train.data", crfpp / "basenp" / "test.data", "chunking",
               pos_column=1),
        Corpus("crfpp-chunking", crfpp / "chunking" / "train.data", crfpp / "chunking" / "test.data", "chunking",
               pos_column=1),
        Corpus("crfpp-seg", crfpp / "seg" / "train.data", crfpp / "seg" / "test.data", "segmentation"),
        Corpus("crfpp-japanesene", crfpp / "JapaneseNE" / "train.data", crfpp / "JapaneseNE" / "test.data", "ner",
               encoding="euc-jp", pos_column=2),
        Corpus("masc-pos", masc_pos_train(root / "masc"), root / "masc" / f"{MASC_TEST}.conll", "pos",
               quick_train=QUICK_CONLL_TRAIN),
        Corpus("shift-chunk", conll / "train.txt", sample, "chunking", source="conll2000-chunk", pos_column=1),
        Corpus("shift-pos", conll / "train.txt", sample, "pos", label_column=1, source="conll2000-pos"),
    ]


MASC_TEST = "travel-guides"  # the genre masc-pos is tested on; the other nine are its training file


def masc_pos_train(masc: Path) -> Path:
    """The nine MASC genres other than MASC_TEST joined in name order, one file in the system's
    temporary directory (written once; a sentence never spans two files)."""
    parts = sorted(p for p in masc.glob("*.conll") if p.stem != MASC_TEST)
    target = Path(tempfile.gettempdir()) / "gpseq-masc-pos-train.conll"
    text = "".join(p.read_text(encoding="utf-8").rstrip("\n") + "\n\n" for p in parts) if parts else ""
    if not target.is_file() or target.read_text(encoding="utf-8") != text:
        tmp = target.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(target)
    return target


def small_names() -> list[str]:
    return [f"small-{name}" for name in PAPER_SETS]


def selected(name: str, only: list[str] | None) -> bool:
    return not only or any(name == o or name.startswith(o + "-") for o in only)


# ---- gpseq: the default command, then Tagger.load / tag / evaluate --------------------------
def dir_size_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file()) / 2**20


def train_gpseq(train_file: Path, features: str, extras: list[str], model_dir: Path) -> dict:
    """Run `gpseq train` as a subprocess; its wall time and its own peak RSS."""
    args = ["train", str(train_file), "--features", features, "-o", str(model_dir), *extras]
    for stale in (model_dir, model_dir.with_name(model_dir.name + ".ckpt")):  # a reused --workdir
        shutil.rmtree(stale, ignore_errors=True)
    log_path = model_dir.with_name(model_dir.name + ".log")
    code, train_s, rss = in_fresh_process(run_timed, [*gpseq_command(), *args], str(log_path))
    if code != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"gpseq train exited with {code}; log {log_path}:\n{tail}")
    return {"train_s": train_s, "peak_rss_mb": rss, "model_mb": dir_size_mb(model_dir),
            "command": shlex.join(["gpseq", *args])}


_TAGGERS: dict = {}


def load_tagger(model_dir: Path):
    from gpseq.tagger import Tagger

    key = str(model_dir)
    if key not in _TAGGERS:
        _TAGGERS[key] = Tagger.load(model_dir)
    return _TAGGERS[key]


def median_time(run, repeats: int = TAG_REPEATS):
    """The median wall time of `repeats` calls of `run()` and the last call's result: one call of
    a fraction of a second on a shared machine varies by a third."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return float(np.median(times)), result


def test_gpseq(model_dir: Path, test) -> dict:
    tagger = load_tagger(model_dir)
    n_tokens = sum(len(s) for s in test)
    start = time.perf_counter()
    tagger.tag(test[:8])  # traces the compiled prediction function once
    warmup_s = time.perf_counter() - start
    tag_s, tagged = median_time(lambda: tagger.tag(test))
    report = tagger.evaluate(test).to_dict()
    results = outcomes([list(s.labels) for s in test], [t.labels for t in tagged], [t.probabilities for t in tagged],
                       tagger.labels, chunked=report.get("chunk_f1") is not None)
    return {**report, "tag_tokens_per_s": n_tokens / tag_s, "tag_warmup_s": warmup_s, "outcomes": results}


# ---- CRFsuite and CRFsuite + T ----------------------------------------------------------------
def train_crf(train_file: Path, read_options: dict, feature_config: dict | str, workdir: Path, name: str,
              tempered: bool, pos_column: int | None = None) -> dict:
    """CRFsuite (tempered: on the train part of train_dev_split, T fitted on its dev part) as its own
    process (`_crf_train.py`), timed from start to exit like `gpseq train`; feature_config: gpseq's
    (a FeatureConfig dict) or `REFERENCE_FEATURES` (`_common.reference_features`, with the POS
    features of `pos_column` when it is not None)."""
    reference = feature_config == REFERENCE_FEATURES
    if reference and pos_column is not None and pos_column == read_options.get("label_column"):
        raise ValueError(f"pos_column {pos_column} is the label column")
    model_path = workdir / f"{name}.crfsuite"
    featurizer_dir = workdir / f"{name}.features"
    spec = {"train_file": str(train_file), **read_options, "feature_config": feature_config, "params": TRAINER_PARAMS,
            "model_path": str(model_path), "featurizer_dir": str(featurizer_dir),
            "result": str(workdir / f"{name}.result.json")}
    if reference:
        spec["pos_column"] = pos_column
    if tempered:
        spec.update(dev_fraction=DEV_FRACTION, dev_seed=DEV_SEED)
    spec_path = workdir / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    log_path = workdir / f"{name}.log"
    command = [sys.executable, str(Path(__file__).with_name("_crf_train.py")), str(spec_path)]
    code, train_s, rss = in_fresh_process(run_timed, command, str(log_path))
    if code != 0:
        raise RuntimeError(f"CRFsuite training exited with {code}; log {log_path}:\n"
                           f"{log_path.read_text(errors='replace')[-3000:]}")
    out = json.loads(Path(spec["result"]).read_text())
    out.update(train_s=train_s, peak_rss_mb=rss, model_path=model_path, featurizer_dir=featurizer_dir,
               model_mb=model_path.stat().st_size / 2**20, reference_features=reference,
               pos_column=pos_column if reference else None)
    return out


def test_crf(state: dict, test) -> dict:
    import sklearn_crfsuite

    from gpseq.features import Featurizer

    if state.get("reference_features"):
        featurise = partial(reference_features, pos_column=state.get("pos_column"))
    else:
        featurise = partial(crfsuite_features, Featurizer.load(state["featurizer_dir"]))
    crf = sklearn_crfsuite.CRF(model_filename=str(state["model_path"]), **CRF_PARAMS)
    labels = list(crf.classes_)
    n_tokens = sum(len(s) for s in test)
    temperature = state.get("temperature")
    start = time.perf_counter()
    for x in featurise(test[:8]):  # as gpseq's: first use of the featuriser and model
        crf.predict_single(x)
    warmup_s = time.perf_counter() - start

    def tag():
        X = featurise(test)
        probs = crfsuite_marginals(crf, X, labels)
        return X, [list(crf.predict_single(x)) for x in X], \
            probs if temperature is None else [temper(p, temperature) for p in probs]

    tag_s, (X, predicted, probs) = median_time(tag)
    seq_logp = None if temperature is not None else crfsuite_gold_log_probs(crf, X, test)
    gold = [list(s.labels) for s in test]
    report = evaluate(gold, predicted, labels=labels, probabilities=probs, sequence_log_probs=seq_logp).to_dict()
    results = outcomes(gold, predicted, probs, labels, chunked=report.get("chunk_f1") is not None)
    return {**report, "tag_tokens_per_s": n_tokens / tag_s, "tag_warmup_s": warmup_s, "outcomes": results}


# ---- one corpus -------------------------------------------------------------------------------
def score_of(metrics: dict) -> float | None:
    return metrics.get("chunk_f1") if metrics.get("chunk_f1") is not None else metrics.get("token_accuracy")


def run_systems(train_file: Path, read_options: dict, train, test, features: str, extras: list[str], workdir: Path,
                tag: str, *, reference: bool = False, pos_column: int | None = None, repeats: int = 1):
    """Train the systems, test them on `test`. Returns (metrics per system, trained state per system).

    Systems: gpseq, crfsuite, crfsuite_t, and with `reference` crfsuite_ref and crfsuite_ref_t
    (`_common.reference_features`, POS features from `pos_column` unless None). `repeats` rounds
    of the training processes, alternated (gpseq, crfsuite, crfsuite_t[, crfsuite_ref,
    crfsuite_ref_t], then again): train_s and peak_rss_mb are the medians, `*_runs` every round's;
    the models tested are the first round's (later rounds' models are deleted)."""
    systems = SYSTEMS if reference else BASE_SYSTEMS
    runs: dict[str, list] = {system: [] for system in systems}
    state: dict = {}
    feature_config = None
    for round_ in range(repeats):
        suffix = "" if round_ == 0 else f".rep{round_}"
        if repeats > 1:
            print(f"  round {round_ + 1}/{repeats}:", flush=True)
        for system in systems:
            if system == "gpseq":
                model_dir = workdir / f"{tag}{suffix}.gpseq"
                print(f"  gpseq train ({len(train)} sentences) …", flush=True)
                trained = train_gpseq(train_file, features, extras, model_dir)
                if round_ == 0:
                    state["gpseq"] = {**trained, "model_dir": model_dir}
                    feature_config = load_tagger(model_dir).config.features.to_dict()
                else:
                    for stale in (model_dir, model_dir.with_name(model_dir.name + ".ckpt")):
                        shutil.rmtree(stale, ignore_errors=True)
            else:
                short, tempered, ref = CRF_RUNS[system]
                trained = train_crf(train_file, read_options, REFERENCE_FEATURES if ref else feature_config, workdir,
                                    f"{tag}{suffix}.{short}", tempered=tempered, pos_column=pos_column if ref else None)
                if round_ == 0:
                    state[system] = trained
                else:
                    Path(trained["model_path"]).unlink(missing_ok=True)
                    shutil.rmtree(trained["featurizer_dir"], ignore_errors=True)
            runs[system].append((trained["train_s"], trained["peak_rss_mb"]))
            temperature = trained.get("temperature") if system != "gpseq" else None
            print(f"    {system}: {trained['train_s']:.1f} s, {trained['peak_rss_mb']:,.0f} MB"
                  + (f" (T = {temperature:.3f})" if temperature is not None else ""), flush=True)
    trained = load_tagger(state["gpseq"]["model_dir"])
    chosen = trained.scores or {}  # what the default training chose: prior (σ²/λ/σ²_P) and T
    state["gpseq"]["temperature"] = (chosen.get("calibration") or {}).get("temperature")
    state["gpseq"]["prior"] = "/".join(f"{chosen[key]:g}" for key in ("prior_variance", "l1", "pairwise_prior_variance")
                                       if key in chosen)
    state["gpseq"]["decode"] = trained.config.decode  # the decoder the training kept (viterbi / max-marginal)
    for system in systems:
        times, rss = [t for t, _ in runs[system]], [r for _, r in runs[system]]
        state[system].update(train_s=statistics.median(times), peak_rss_mb=statistics.median(rss))
        if repeats > 1:
            state[system].update(train_s_runs=times, peak_rss_mb_runs=rss)
    print("  testing …", flush=True)
    return test_all(state, test, systems), state


def test_all(state: dict, test, systems=BASE_SYSTEMS) -> dict:
    metrics = {"gpseq": test_gpseq(state["gpseq"]["model_dir"], test)}
    for system in systems[1:]:
        metrics[system] = test_crf(state[system], test)
    for system in systems:
        for key in TRAINING_KEYS:
            if state[system].get(key) is not None:
                metrics[system][key] = state[system][key]
        metrics[system]["score"] = score_of(metrics[system])
    return metrics


BOOTSTRAPPED = {"crfsuite_t": ("token_nll", "ece"), "crfsuite": ("brier", "aurc", "score")}  # the targets' peers


def measure_oov(metrics: dict, oov: np.ndarray) -> None:
    """Add `oov_tokens` (the count) and the `OOV_MEASURED` metrics to each system's `metrics`, from
    its per-token outcomes restricted to the tokens where `oov` [N] holds (`_bootstrap.unseen`: word
    form absent from the training file); no OOV metrics where there is no OOV token."""
    for values in metrics.values():
        values["oov_tokens"] = int(oov.sum())
        if oov.any():
            narrowed = restrict(values["outcomes"], oov)
            values.update({key: metric(narrowed, name) for key, name in OOV_MEASURED.items()})


def bootstrap(corpus: str, metrics: dict, oov: np.ndarray | None = None) -> dict:
    """`<corpus>/gpseq_minus_<peer>/<metric>`: [gpseq − peer on the test set, 95 % interval] by a
    paired bootstrap over the test sentences (`_bootstrap`), for the metric of each target; and
    `significance/<corpus>/<metric>_vs_<peer>`: "better" / "worse" for gpseq when the interval
    excludes 0, else "tie"; the same on the tokens where `oov` holds (`OOV_BOOTSTRAPPED`; the
    sentences drawn as a whole, their OOV tokens kept) as `oov_<metric>`;
    `<corpus>/<system>/ece_if_calibrated[_q95]` (`calibrated_ece`), and `oov_ece_if_calibrated[_q95]`
    on the OOV tokens. Pops the per-token outcomes
    from `metrics`."""
    results = {system: values.pop("outcomes") for system, values in metrics.items()}
    out = {}
    for system, result in results.items():  # the ECE that chance alone gives on this test set
        out[f"{corpus}/{system}/ece_if_calibrated"], out[f"{corpus}/{system}/ece_if_calibrated_q95"] = \
            calibrated_ece(result)
    for peer, names in BOOTSTRAPPED.items():
        for name, (diff, low, high) in paired_bootstrap(results["gpseq"], results[peer], names).items():
            for system, value in (("gpseq", metric(results["gpseq"], name)), (peer, metric(results[peer], name))):
                reported = metrics[system].get(name)
                if reported is not None and not math.isclose(value, reported, rel_tol=1e-6, abs_tol=1e-9):
                    print(f"    note: bootstrap {name} of {system} {value:.6f} vs reported {reported:.6f}", flush=True)
            out[f"{corpus}/gpseq_minus_{peer}/{name}"] = [diff, low, high]
            out[f"significance/{corpus}/{name}_vs_{peer}"] = verdict(low, high, higher_is_better=name == "score")
    if oov is not None and oov.any():
        narrowed = {system: restrict(result, oov) for system, result in results.items()}  # each system's once
        for system, result in narrowed.items():  # the calibrated floor on the OOV tokens alone (fewer: higher)
            floor = calibrated_ece(result)
            out[f"{corpus}/{system}/oov_ece_if_calibrated"], out[f"{corpus}/{system}/oov_ece_if_calibrated_q95"] = floor
        for peer, names in OOV_BOOTSTRAPPED.items():
            for name, (diff, low, high) in paired_bootstrap(narrowed["gpseq"], narrowed[peer], names).items():
                out[f"{corpus}/gpseq_minus_{peer}/oov_{name}"] = [diff, low, high]
                out[f"significance/{corpus}/oov_{name}_vs_{peer}"] = verdict(low, high)
    return out


def count_verdicts(results: dict, corpora=None) -> dict:
    """`significance/count/<metric>_vs_<peer>`: "n better, n tie, n worse" over the verdicts
    `significance/<corpus>/...` of `corpora` (None: every corpus in `results`)."""
    verdicts: dict[str, list] = {}
    for key, value in results.items():
        parts = key.split("/")
        if parts[0] == "significance" and parts[1] != "count" and (corpora is None or parts[1] in corpora):
            verdicts.setdefault(parts[-1], []).append(value)
    return {f"significance/count/{comparison}": ", ".join(f"{values.count(v)} {v}" for v in ("better", "tie", "worse"))
            for comparison, values in verdicts.items()}


def flatten(corpus: str, metrics: dict, data: dict, command: str) -> dict:
    out = {f"{corpus}/data/{k}": v for k, v in data.items()}
    out[f"{corpus}/gpseq/command"] = command
    for system, values in metrics.items():
        for key in REPORTED:
            if values.get(key) is not None:
                out[f"{corpus}/{system}/{key}"] = values[key]
    return out


def wins(corpus: str, results: dict) -> dict:
    """issue 16's per-corpus targets (None where a metric is missing)."""
    def get(system, metric):
        return results.get(f"{corpus}/{system}/{metric}")

    def check(a, b, op):
        return None if a is None or b is None else bool(op(a, b))

    return {
        "nll_below_crfsuite_t": check(get("gpseq", "token_nll"), get("crfsuite_t", "token_nll"), lambda a, b: a < b),
        "ece_le_crfsuite_t": check(get("gpseq", "ece"), get("crfsuite_t", "ece"), lambda a, b: a <= b),
        "brier_below_crfsuite": check(get("gpseq", "brier"), get("crfsuite", "brier"), lambda a, b: a < b),
        "aurc_le_crfsuite": check(get("gpseq", "aurc"), get("crfsuite", "aurc"), lambda a, b: a <= b),
        "score_ge_crfsuite_minus_0.2": check(get("gpseq", "score"), get("crfsuite", "score"),
                                             lambda a, b: 100 * a >= 100 * b - 0.2),
        "train_s_le_2x_crfsuite": check(get("gpseq", "train_s"), get("crfsuite", "train_s"), lambda a, b: a <= 2 * b),
        **oov_wins(corpus, results),
    }


def oov_wins(corpus: str, results: dict) -> dict:
    """The OOV target on one corpus: gpseq's OOV token NLL and OOV ECE below crfsuite_t's (None where
    one is missing: no OOV token)."""
    out = {}
    for target, key in (("oov_nll_below_crfsuite_t", "oov_token_nll"), ("oov_ece_below_crfsuite_t", "oov_ece")):
        ours, theirs = results.get(f"{corpus}/gpseq/{key}"), results.get(f"{corpus}/crfsuite_t/{key}")
        out[target] = None if ours is None or theirs is None else bool(ours < theirs)
    return out


def oov_count(results: dict, done: list[str]) -> dict:
    """`wins/oov_count/...`: on how many of the corpora `done` (small-* included) gpseq's OOV token
    NLL and OOV ECE are both below crfsuite_t's ("k/n"; a corpus with no OOV token counts as missed)."""
    if not done:
        return {}
    missed = [c for c in done if not all(results.get(f"wins/{c}/{target}") is True
                                         for target in ("oov_nll_below_crfsuite_t", "oov_ece_below_crfsuite_t"))]
    k, n = len(done) - len(missed), len(done)
    return {"wins/oov_count/corpora": list(done), "wins/oov_count/missed": missed,
            "wins/oov_count/nll_and_ece_below_crfsuite_t": f"{k}/{n}",
            "wins/oov_count/summary": f"OOV: NLL and ECE below CRF+T on {k}/{n} corpora"}


def run_corpus(spec: Corpus, args, workdir: Path, states: dict) -> dict:
    test = spec.read(spec.test)
    if args.quick:
        test = test[:QUICK_TEST]
    if spec.source is not None:  # domain shift: reuse the source corpus's trained systems
        source = states[spec.source]
        metrics = test_all(source["state"], test, [s for s in SYSTEMS if s in source["state"]])
        data = {"source": spec.source, "train_sentences": source["train_sentences"]}
        command = source["command"]
        vocabulary = source["vocabulary"]
    else:
        train = spec.read(spec.train)
        train_file = spec.train
        if args.quick and spec.quick_train:
            train = train[: spec.quick_train]
            train_file = workdir / f"{spec.name}.train{spec.train.suffix}"
            write_conll(train_file, train, encoding=spec.encoding)
        metrics, state = run_systems(train_file, {"label_column": spec.label_column, "encoding": spec.encoding},
                                     train, test, spec.features, spec.cli_extras(), workdir, spec.name,
                                     reference=True, pos_column=spec.pos_column, repeats=args.repeats)
        command = state["gpseq"]["command"]
        vocabulary = {word for sentence in train for word in sentence.tokens}  # the file trained on
        states[spec.name] = {"state": state, "train_sentences": len(train), "command": command,
                             "vocabulary": vocabulary}
        data = {"train_sentences": len(train), "train_tokens": sum(len(s) for s in train),
                "dev_sentences_crfsuite_t": state["crfsuite_t"]["dev_sentences"],
                "dev_sentences_crfsuite_ref_t": state["crfsuite_ref_t"]["dev_sentences"],
                "repeats": args.repeats}
    data["reference_pos_column"] = spec.pos_column
    data.update(test_file=str(spec.test), test_sentences=len(test), test_tokens=sum(len(s) for s in test),
                features=spec.features)
    oov = unseen(test, vocabulary)
    measure_oov(metrics, oov)
    significance = bootstrap(spec.name, metrics, oov)
    return {**flatten(spec.name, metrics, data, command), **significance}


def run_small(name: str, args, workdir: Path) -> dict:
    """The seed's small-scale protocol on one CRF++ set: means over folds."""
    folder, n_seq, encoding = PAPER_SETS[name]
    pool, _ = paper_pool(name)
    template = corpora_root() / "crfpp" / folder / "template"
    features = str(template) if args.small_features == "template" else SMALL_PRESETS[name]
    extras = [] if encoding == "utf-8" else ["--encoding", encoding]
    per_fold: list[dict] = []
    command = None
    for fold, train, test in paper_folds(pool, n_seq, max_folds=1 if args.quick else None):
        print(f"  fold {fold}: {len(train)} train / {len(test)} test sentences", flush=True)
        tag = f"small-{name}-fold{fold}"
        train_file = workdir / f"{tag}.train.data"
        write_conll(train_file, train, encoding=encoding)
        metrics, state = run_systems(train_file, {"label_column": -1, "encoding": encoding}, train, test, features,
                                     extras, workdir, tag, reference=True, pos_column=SMALL_POS[name],
                                     repeats=args.repeats)
        command = state["gpseq"]["command"]
        measure_oov(metrics, unseen(test, {word for sentence in train for word in sentence.tokens}))
        for values in metrics.values():
            values.pop("outcomes")  # means over folds: no bootstrap of one test set
        per_fold.append(metrics)
        print("    " + ", ".join(f"{s} err={m['token_error']:.4f} nll={m['token_nll']:.4f}"
                                 for s, m in metrics.items()), flush=True)
    corpus = f"small-{name}"
    mean = {}
    for system in SYSTEMS:
        mean[system] = {}
        for key in REPORTED:
            values = [m[system].get(key) for m in per_fold]
            values = [v for v in values if isinstance(v, (int, float)) and v is not None and math.isfinite(v)]
            if len(values) == len(per_fold):
                mean[system][key] = float(np.mean(values))
    data = {"n_folds": len(per_fold), "n_seq": n_seq, "pool_sentences": len(pool), "features": features,
            "repeats": args.repeats, "reference_pos_column": SMALL_POS[name]}
    out = flatten(corpus, mean, data, command)
    for system in SYSTEMS:
        for key in ("token_nll", "token_error"):
            values = [m[system][key] for m in per_fold]
            out[f"{corpus}/{system}/{key}_std"] = float(np.std(values))
    return out


# ---- output -------------------------------------------------------------------------------------
ROWS = (  # (metric, label, format)
    ("score", "F1 / accuracy %", lambda v: f"{100 * v:.2f}"),
    ("token_nll", "token NLL", lambda v: f"{v:.4f}"),
    ("ece", "ECE (returned labels)", lambda v: f"{v:.4f}"),
    ("ece_argmax", "ECE (argmax)", lambda v: f"{v:.4f}"),
    ("ece_if_calibrated", "ECE if calibrated, mean", lambda v: f"{v:.4f}"),
    ("ece_if_calibrated_q95", "ECE if calibrated, 95 %", lambda v: f"{v:.4f}"),
    ("brier", "Brier", lambda v: f"{v:.4f}"),
    ("aurc", "AURC", lambda v: f"{v:.5f}"),
    ("error_at_90", "error at 90 % coverage", lambda v: f"{v:.4f}"),
    ("token_error", "token error", lambda v: f"{v:.4f}"),
    ("oov_tokens", "OOV tokens", lambda v: f"{v:,.0f}"),
    ("oov_accuracy", "OOV accuracy %", lambda v: f"{100 * v:.2f}"),
    ("oov_token_nll", "OOV token NLL", lambda v: f"{v:.4f}"),
    ("oov_ece", "OOV ECE", lambda v: f"{v:.4f}"),
    ("oov_ece_if_calibrated", "OOV ECE if calibrated, mean", lambda v: f"{v:.4f}"),
    ("oov_ece_if_calibrated_q95", "OOV ECE if calibrated, 95 %", lambda v: f"{v:.4f}"),
    ("train_s", "train s (median)", lambda v: f"{v:.1f}"),
    ("tag_tokens_per_s", "tag tokens/s", lambda v: f"{v:,.0f}"),
    ("tag_warmup_s", "tag warm-up s", lambda v: f"{v:.1f}"),
    ("peak_rss_mb", "peak train RSS MB (median)", lambda v: f"{v:,.0f}"),
    ("model_mb", "model MB", lambda v: f"{v:.2f}"),
    ("temperature", "temperature T", lambda v: f"{v:.3f}"),
    ("prior", "prior σ²/λ/σ²_P chosen", str),
    ("decode", "decoder kept", str),
)


def table(corpus: str, results: dict) -> str:
    data = {k.split("/", 2)[2]: v for k, v in results.items() if k.startswith(f"{corpus}/data/")}
    head = ", ".join(f"{k} {v}" for k, v in data.items() if k != "test_file")
    lines = [f"== {corpus}  ({head})", f"{'':<26}" + "".join(f"{s:>15}" for s in SYSTEMS)]
    for name, label, fmt in ROWS:
        cells = [results.get(f"{corpus}/{s}/{name}") for s in SYSTEMS]
        if all(c is None for c in cells):
            continue
        lines.append(f"{label:<26}" + "".join(f"{fmt(c) if c is not None else '-':>15}" for c in cells))
    for name, label, fmt in (("train_s_runs", "train s", "{:.1f}"), ("peak_rss_mb_runs", "peak RSS MB", "{:,.0f}")):
        cells = [(s, results.get(f"{corpus}/{s}/{name}")) for s in SYSTEMS]
        if any(c for _, c in cells):
            lines.append(f"{label}, every run (alternated, in order): "
                         + "; ".join(f"{s} " + " ".join(fmt.format(v) for v in c) for s, c in cells if c))
    shown = {key: results.get(f"{corpus}/ratio/{key}") for key in RATIOS}
    if any(v is not None for v in shown.values()):
        cell = lambda v: f"{v:.2f}×" if v is not None else "-"  # noqa: E731
        lines.append(f"{'gpseq ÷ CRFsuite (training)':<26}{'gpseq features':>18}{'reference features':>20}")
        for metric, label in (("train_s", "wall time"), ("peak_rss_mb", "peak RSS")):
            lines.append(f"{'  ' + label:<26}{cell(shown[f'{metric}_gpseq_over_crfsuite']):>18}"
                         f"{cell(shown[f'{metric}_gpseq_over_crfsuite_ref']):>20}")
    for peer in BOOTSTRAPPED:
        prefix = f"{corpus}/gpseq_minus_{peer}/"
        cells = [f"{k[len(prefix):]} {d:+.5f} [{low:+.5f}, {high:+.5f}]"
                 for k, (d, low, high) in ((k, v) for k, v in results.items()
                                           if k.startswith(prefix) and not k.startswith(prefix + "oov_"))]
        if cells:
            lines.append(f"gpseq − {peer} (95 % paired bootstrap over sentences): " + "; ".join(cells))
    for peer, names in OOV_BOOTSTRAPPED.items():
        cells = []
        for name in names:
            interval = results.get(f"{corpus}/gpseq_minus_{peer}/oov_{name}")
            if interval is not None:
                d, low, high = interval
                cells.append(f"oov_{name} {d:+.5f} [{low:+.5f}, {high:+.5f}] "
                             f"{results[f'significance/{corpus}/oov_{name}_vs_{peer}']}")
        if cells:
            lines.append(f"OOV tokens, gpseq − {peer} (95 % paired bootstrap over sentences): " + "; ".join(cells))
    targets = {k.rsplit("/", 1)[1]: v for k, v in results.items() if k.startswith(f"wins/{corpus}/")}
    if targets:
        lines.append("targets: " + ", ".join(f"{k} {'yes' if v else ('-' if v is None else 'NO')}"
                                              for k, v in targets.items()))
    return "\n".join(lines)


RATIOS = tuple(f"{metric}_gpseq_over_{peer}" for metric in ("train_s", "peak_rss_mb")
               for peer in ("crfsuite", "crfsuite_ref"))


def ratios(corpus: str, results: dict) -> dict:
    """`<corpus>/ratio/<metric>_gpseq_over_<peer>`: gpseq's training wall time / peak RSS over
    CRFsuite's (gpseq's features: crfsuite; reference features: crfsuite_ref), the whole processes."""
    out = {}
    for metric in ("train_s", "peak_rss_mb"):
        for peer in ("crfsuite", "crfsuite_ref"):
            ours, theirs = results.get(f"{corpus}/gpseq/{metric}"), results.get(f"{corpus}/{peer}/{metric}")
            if ours is not None and theirs:
                out[f"{corpus}/ratio/{metric}_gpseq_over_{peer}"] = ours / theirs
    return out


def reference_counts(results: dict, done: list[str]) -> dict:
    """Against the reference CRFsuite (crfsuite_ref), per corpus with its own training file (not
    small-*, not shift-*): `wins/<corpus>/train_s_le_1x_crfsuite_ref` and
    `wins/<corpus>/peak_rss_le_crfsuite_ref`; and their counts "k/n" over those of at least
    MIN_COUNTED_TOKENS training tokens (`wins/reference_count/...`; the others are listed as excluded)."""
    out: dict = {}
    counted, excluded = [], []
    tally = {"train_s_le_1x_crfsuite_ref": 0, "peak_rss_le_crfsuite_ref": 0}
    for corpus in done:
        if corpus.startswith(("small-", "shift-")):
            continue
        get = lambda system, metric: results.get(f"{corpus}/{system}/{metric}")  # noqa: E731
        values = {"train_s_le_1x_crfsuite_ref": (get("gpseq", "train_s"), get("crfsuite_ref", "train_s")),
                  "peak_rss_le_crfsuite_ref": (get("gpseq", "peak_rss_mb"), get("crfsuite_ref", "peak_rss_mb"))}
        if any(v is None for pair in values.values() for v in pair):
            continue
        tokens = results.get(f"{corpus}/data/train_tokens") or 0
        (counted if tokens >= MIN_COUNTED_TOKENS else excluded).append(corpus)
        for target, (ours, theirs) in values.items():
            out[f"wins/{corpus}/{target}"] = won = bool(ours <= theirs)
            if tokens >= MIN_COUNTED_TOKENS:
                tally[target] += won
    if counted or excluded:
        n = len(counted)
        out["wins/reference_count/corpora"] = counted
        out[f"wins/reference_count/excluded_under_{MIN_COUNTED_TOKENS}_tokens"] = excluded
        for target, k in tally.items():
            out[f"wins/reference_count/{target}"] = f"{k}/{n}"
        out["wins/reference_count/summary"] = [
            f"default training ≤ 1.0× reference CRFsuite on {tally['train_s_le_1x_crfsuite_ref']}/{n} corpora of "
            f"≥ {MIN_COUNTED_TOKENS:,} training tokens",
            f"peak training RSS ≤ reference CRFsuite's on {tally['peak_rss_le_crfsuite_ref']}/{n}"]
    return out


def refuse_tracked(path: Path) -> None:
    """--quick must not overwrite a results file git tracks."""
    probe = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--error-unmatch", str(path.resolve())],
                           capture_output=True)
    if probe.returncode == 0:
        sys.exit(f"--quick: refusing to write over {path}, a file tracked by git (committed results)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the flat JSON results here")
    parser.add_argument("--quick", action="store_true", help="reduced run (see above)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="corpora (names or prefixes) to run")
    parser.add_argument("--workdir", type=Path, help="keep models and logs here (default: a temporary folder)")
    parser.add_argument("--small-features", choices=("template", "preset"), default="template",
                        help="small-scale protocol: the set's CRF++ template (the seed's) or the preset")
    parser.add_argument("--repeats", type=int, metavar="N",
                        help=f"alternated rounds of the training processes; timings are the medians "
                             f"(default {DEFAULT_REPEATS}, with --quick 1)")
    args = parser.parse_args()
    if args.repeats is None:
        args.repeats = 1 if args.quick else DEFAULT_REPEATS
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.quick and args.json is not None:
        refuse_tracked(args.json)
    from multiprocessing import forkserver

    forkserver.ensure_running()  # now, while this process is still light (see in_fresh_process)
    specs = [c for c in corpora() if selected(c.name, args.only)]
    small = [n for n in small_names() if selected(n, args.only)]
    needed = {c.source for c in specs if c.source} - {c.name for c in specs}
    specs = [c for c in corpora() if c.name in needed] + specs  # shift corpora need their source's models
    if not specs and not small:
        sys.exit(f"--only {args.only}: no corpus matches; names: "
                 f"{', '.join([c.name for c in corpora()] + small_names())}")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="versus_crf."))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"versus_crf: {machine()}; work dir {workdir}", flush=True)
    started = time.perf_counter()
    results: dict = {}
    states: dict = {}
    done = []
    try:
        for spec in specs:
            print(f"{spec.name}:", flush=True)
            try:
                results.update(run_corpus(spec, args, workdir, states))
                done.append(spec.name)
            except Exception as error:  # noqa: BLE001 — record and go on with the other corpora
                traceback.print_exc()
                results[f"{spec.name}/error"] = f"{type(error).__name__}: {error}"[:2000]
        for name in small:
            print(f"{name}:", flush=True)
            try:
                results.update(run_small(name.removeprefix("small-"), args, workdir))
                done.append(name)
            except Exception as error:  # noqa: BLE001
                traceback.print_exc()
                results[f"{name}/error"] = f"{type(error).__name__}: {error}"[:2000]
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    # wins: per corpus, every corpus, small-scale counts
    per_target: dict[str, list] = {}
    for corpus in done:
        if corpus.startswith("small-"):
            nll = results.get(f"{corpus}/gpseq/token_nll"), results.get(f"{corpus}/crfsuite/token_nll")
            err = results.get(f"{corpus}/gpseq/token_error"), results.get(f"{corpus}/crfsuite/token_error")
            results[f"wins/{corpus}/nll_below_crfsuite"] = bool(nll[0] < nll[1])
            results[f"wins/{corpus}/error_le_crfsuite"] = bool(err[0] <= err[1])
            results.update({f"wins/{corpus}/{target}": value for target, value in oov_wins(corpus, results).items()})
            continue
        for target, value in wins(corpus, results).items():
            results[f"wins/{corpus}/{target}"] = value
            per_target.setdefault(target, []).append(value)
    for target, values in per_target.items():
        results[f"wins/every_corpus/{target}"] = all(v is True for v in values)
        results[f"wins/count/{target}"] = f"{sum(v is True for v in values)}/{len(values)}"
    for corpus in done:
        results.update(ratios(corpus, results))
    results.update(reference_counts(results, done))
    results.update(oov_count(results, done))
    small_done = [c for c in done if c.startswith("small-")]
    if small_done:
        n_nll = sum(results[f"wins/{c}/nll_below_crfsuite"] for c in small_done)
        n_err = sum(results[f"wins/{c}/error_le_crfsuite"] for c in small_done)
        results["wins/small-scale/n_sets"] = len(small_done)
        results["wins/small-scale/nll_below_crfsuite_sets"] = n_nll
        results["wins/small-scale/error_le_crfsuite_sets"] = n_err
        complete = len(small_done) == len(PAPER_SETS)
        results["wins/small-scale/nll_below_crfsuite_4_of_4"] = (n_nll == 4) if complete else None
        results["wins/small-scale/error_le_crfsuite_3_of_4"] = (n_err >= 3) if complete else None

    results.update(count_verdicts(results))
    results.update(run_meta("versus_crf.py", args.quick, started))

    print()
    for corpus in done:
        print(table(corpus, results))
        print()
    for key, value in results.items():
        if key.startswith(("wins/every_corpus/", "wins/count/", "wins/small-scale/", "significance/count/")) \
                or key.endswith("/error"):
            print(f"{key}: {value}")
    for corpus in done:
        if results.get(f"{corpus}/ratio/train_s_gpseq_over_crfsuite_ref") is not None:
            print(f"{corpus}: gpseq_train_s / crfsuite_ref_train_s = "
                  f"{results[f'{corpus}/ratio/train_s_gpseq_over_crfsuite_ref']:.2f}")
    for line in results.get("wins/reference_count/summary", []):
        print(line)
    excluded = results.get(f"wins/reference_count/excluded_under_{MIN_COUNTED_TOKENS}_tokens")
    if excluded:
        print(f"  (reported, not counted: {', '.join(excluded)}, under {MIN_COUNTED_TOKENS:,} training tokens)")
    if "wins/oov_count/summary" in results:
        missed = results["wins/oov_count/missed"]
        print(results["wins/oov_count/summary"] + (f" (not on: {', '.join(missed)})" if missed else ""))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
