"""gpseq's default command against spaCy's own default CPU components, trained and tested in one run:
spaCy's `tagger` on CoNLL-2000 POS, its `ner` on CoNLL-2000 chunks (as entities) and on the CRF++
JapaneseNE set; then the two POS models on the ten MASC genres (shift).

    python benchmarks/versus_spacy.py [--json OUT] [--quick] [--only NAME ...] [--workdir DIR]

Systems:
- `gpseq`: `gpseq train TRAIN --features PRESET -o DIR`, nothing else (plus `--label-column` /
  `--encoding` where the corpus format forces it), as benchmarks/versus_crf.py runs it (its
  `train_gpseq`, `test_gpseq`): the training process's wall time and peak RSS; tested with
  `Tagger.load` and default settings. PRESET: `pos` (word features) for POS, `chunking` (words and
  the corpus's gold POS column) for CoNLL-2000 chunks, `ner` (word features) for JapaneseNE.
- `gpseq_words` (CoNLL-2000 chunks only): `gpseq train TRAIN --features ner`, word features only,
  what spaCy's default `ner` reads; `gpseq` there also reads the gold POS column.
- `spacy`: `python -m spacy init config CFG --lang LANG --pipeline tagger|ner --optimize efficiency`
  (spaCy's default CPU config: tok2vec of hashed NORM / PREFIX / SUFFIX / SHAPE embeddings and a
  CNN, no pretrained vectors; the tagger's label_smoothing 0.05 and normalize = false are its
  defaults), nothing changed, trained by `python -m spacy train CFG --paths.train train.spacy
  --paths.dev dev.spacy -o DIR` (its defaults: at most 20,000 steps, an evaluation every 200,
  stopping after 1,600 steps without a better dev score; model-best is tested). LANG: en, and xx
  (spaCy's multi-language class) for JapaneseNE: spaCy's `ja` tokenizer needs SudachiPy, and the
  tokens are given anyway. The DocBins hold one sentence per Doc (as `spacy convert` writes them),
  words with a space between them, the labels as token.tag_ (tagger) or doc.ents (ner; chunks
  read from the IOB2 labels with `gpseq.corpora.spans`, an I- after O starting a chunk);
  train.spacy and dev.spacy split the training file with
  `gpseq.corpora.splits.train_dev_split(n, 0.1, seed=0)` (spaCy picks model-best on dev; gpseq's
  default training carves its own dev split from the same file); the test file is never seen.
  The timed process is `spacy train` (reading the DocBins, initialising, training, evaluating,
  saving), from its start to its exit, as gpseq's.

Testing, on the test file's own tokens for every system (Docs built from the words; spaCy's
tokenizer is not run): labels from `nlp.pipe(docs)`; the tagger's per-token distribution is the
softmax of its output layer, `softmax(tagger.model.predict(docs))` on the processed Docs (the
layer's `normalize = false` returns the scores before the softmax its training applies), whose
argmax is the tag it sets. spaCy's `ner` has no per-token probabilities (its transition-based
parser gives none; spaCy's maintainers point users to beam_ner or spancat for scores): for it
only F1, P, R and the timings are reported. Metrics: `gpseq.evaluation.evaluate.evaluate` (score
= chunk F1 for chunk labels, token accuracy for tags; token NLL, ECE of the returned labels over
15 bins, Brier, AURC; a gold label a system never saw is an error with clipped NLL), and gpseq −
spacy with a 95 % interval from a paired bootstrap over the test sentences
(`_bootstrap.paired_bootstrap`, 1,000 draws) with a better / tie / worse verdict for gpseq.
Timings: train_s, peak_rss_mb (training process), model_mb on disk, and `pipeline_words_per_s`:
words tagged per second by `nlp.pipe` over the test Docs in a spaCy pipeline (gpseq: the `gpseq`
component alone in a blank pipeline; spaCy: its trained pipeline; tokenisation left out for
both; after a warm-up on 8 Docs); gpseq's `tag_tokens_per_s` is `Tagger.tag` outside spaCy.

Corpora (`--only` takes names or prefixes):
  conll2000-pos     CoNLL-2000 train.txt → test.txt, POS (column 1) as label: tagger
  conll2000-chunk   same files, chunks (last column) as entities: ner
  crfpp-japanesene  CRF++ JapaneseNE train.data → test.data (EUC-JP), named entities: ner
  masc-<genre>      the conll2000-pos models on MASC's ten genres (`masc/<genre>.conll`, POS)

--quick: training files cut to their first 300 sentences, test files to 200 (MASC genres to 100),
spaCy's training to 100 steps with an evaluation every 50 (`--training.max_steps 100
--training.eval_frequency 50`); the JSON carries meta/quick = true and is refused over a file git
tracks. Never commit quick figures as results.

Output: a table per corpus, the MASC overview, the figures where spaCy is ahead, and with --json
a flat JSON object: `<corpus>/<system>/<metric>`, `<corpus>/data/...`,
`<corpus>/<system>_minus_spacy/<metric>` ([difference, low, high]),
`significance/<corpus>/<metric>_vs_spacy` (gpseq; `significance/<corpus>/gpseq_words/...`),
`significance/count_masc/...`, `spacy_ahead/<corpus>/<system>/<metric>` (how far spaCy is ahead
of that gpseq system, where it is), `<corpus>/<system>/command` and `meta/...`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _bootstrap import METRICS, Outcomes, calibrated_ece, outcomes, paired_bootstrap, verdict  # noqa: E402
from _common import corpora_root, in_fresh_process, machine, run_meta, run_timed  # noqa: E402
from versus_crf import dir_size_mb, load_tagger, refuse_tracked, test_gpseq, train_gpseq  # noqa: E402
from gpseq.corpora import Sentence, read_conll, spans, write_conll  # noqa: E402
from gpseq.corpora.schemes import spans_to_tags  # noqa: E402
from gpseq.corpora.splits import train_dev_split  # noqa: E402
from gpseq.evaluation.evaluate import evaluate  # noqa: E402

DEV_FRACTION, DEV_SEED = 0.1, 0
QUICK_TRAIN, QUICK_TEST, QUICK_MASC = 300, 200, 100
QUICK_SPACY = ["--training.max_steps", "100", "--training.eval_frequency", "50"]
GENRES = ("blog", "essays", "ficlets", "govt-docs", "jokes", "journal", "letters", "movie-script", "non-fiction",
          "travel-guides")
WARMUP_DOCS = 8
REPORTED = ("score", "chunk_f1", "chunk_precision", "chunk_recall", "token_accuracy", "token_nll", "ece", "brier",
            "aurc", "error_at_90", "train_s", "peak_rss_mb", "model_mb", "pipeline_words_per_s", "tag_tokens_per_s",
            "steps", "temperature")
LOWER_IS_BETTER = {"token_nll", "ece", "brier", "aurc", "error_at_90", "train_s", "peak_rss_mb", "model_mb"}


@dataclass
class Corpus:
    name: str
    train: Path
    test: Path
    features: str  # gpseq's --features
    component: str  # spaCy's: tagger or ner
    lang: str  # spaCy's language class
    label_column: int = -1
    encoding: str = "utf-8"
    words_only_gpseq: bool = False  # also train gpseq_words (--features ner)

    def read(self, path: Path) -> list[Sentence]:
        return read_conll(path, label_column=self.label_column, encoding=self.encoding)

    def cli_extras(self) -> list[str]:
        extras = ["--label-column", str(self.label_column)] if self.label_column != -1 else []
        return extras + (["--encoding", self.encoding] if self.encoding != "utf-8" else [])


def corpora() -> list[Corpus]:
    conll, crfpp = corpora_root() / "conll2000", corpora_root() / "crfpp"
    return [
        Corpus("conll2000-pos", conll / "train.txt", conll / "test.txt", "pos", "tagger", "en", label_column=1),
        Corpus("conll2000-chunk", conll / "train.txt", conll / "test.txt", "chunking", "ner", "en",
               words_only_gpseq=True),
        Corpus("crfpp-japanesene", crfpp / "JapaneseNE" / "train.data", crfpp / "JapaneseNE" / "test.data", "ner",
               "ner", "xx", encoding="euc-jp"),
    ]


# ---- spaCy's side: DocBins, `spacy init config`, `spacy train`, tagging -------------------------
def make_docs(vocab, sentences: list[Sentence], component: str, with_labels: bool = True, pos_column: bool = False):
    """One Doc per sentence, the words with a space between them; with `with_labels` the labels as
    token.tag_ (tagger) or doc.ents (ner); with `pos_column` column 1 as token.tag_ (what gpseq's
    chunking preset reads in a pipeline)."""
    from spacy.tokens import Doc, Span

    docs = []
    for sentence in sentences:
        tags = None
        if with_labels and component == "tagger":
            tags = list(sentence.labels)
        elif pos_column:
            tags = [row[1] for row in sentence.columns]
        doc = Doc(vocab, words=list(sentence.tokens), tags=tags)
        if with_labels and component == "ner":
            doc.ents = [Span(doc, start, end, label=kind) for kind, start, end in spans(list(sentence.labels))]
        docs.append(doc)
    return docs


def train_spacy(spec: Corpus, train: list[Sentence], workdir: Path, quick: bool) -> dict:
    """spaCy's default CPU config for the component, trained by `spacy train` on train/dev DocBins
    of `train` (the dev part carved by `train_dev_split`), as a timed process of its own."""
    import spacy
    from spacy.tokens import DocBin

    base = workdir / f"{spec.name}.spacy"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    train_idx, dev_idx = train_dev_split(len(train), DEV_FRACTION, seed=DEV_SEED)
    vocab = spacy.blank(spec.lang).vocab
    for name, indices in (("train", train_idx), ("dev", dev_idx)):
        docs = make_docs(vocab, [train[i] for i in indices], spec.component)
        DocBin(docs=docs).to_disk(base / f"{name}.spacy")
    config = base / "config.cfg"
    init = [sys.executable, "-m", "spacy", "init", "config", str(config), "--lang", spec.lang, "--pipeline",
            spec.component, "--optimize", "efficiency", "--force"]
    subprocess.run(init, check=True, capture_output=True, timeout=300)
    command = [sys.executable, "-m", "spacy", "train", str(config), "--paths.train", str(base / "train.spacy"),
               "--paths.dev", str(base / "dev.spacy"), "-o", str(base / "out"), *(QUICK_SPACY if quick else [])]
    log_path = base / "train.log"
    code, train_s, rss = in_fresh_process(run_timed, command, str(log_path))
    if code != 0:
        raise RuntimeError(f"spacy train exited with {code}; log {log_path}:\n"
                           f"{log_path.read_text(errors='replace')[-3000:]}")
    log = log_path.read_text(errors="replace")
    steps = [int(line.split()[1]) for line in log.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    model_dir = base / "out" / "model-best"
    return {"model_dir": model_dir, "train_s": train_s, "peak_rss_mb": rss, "model_mb": dir_size_mb(model_dir),
            "steps": steps[-1] if steps else None, "train_sentences": len(train_idx), "dev_sentences": len(dev_idx),
            "command": shlex.join(["python", "-m", "spacy", "init", "config", "config.cfg", *init[6:-1]]) + " && "
                       + shlex.join(["python", "-m", "spacy", "train", "config.cfg", "--paths.train", "train.spacy",
                                     "--paths.dev", "dev.spacy", "-o", "out", *(QUICK_SPACY if quick else [])])}


_PIPELINES: dict = {}


def load_spacy(model_dir: Path):
    import spacy

    if str(model_dir) not in _PIPELINES:
        _PIPELINES[str(model_dir)] = spacy.load(model_dir)
    return _PIPELINES[str(model_dir)]


def pipe_timed(nlp, make) -> tuple[list, float]:
    """(`nlp.pipe` of the Docs `make()` builds, words per second), after a warm-up on the first Docs."""
    list(nlp.pipe(make()[:WARMUP_DOCS]))
    docs = make()
    n_words = sum(len(doc) for doc in docs)
    start = time.perf_counter()
    docs = list(nlp.pipe(docs))
    return docs, n_words / (time.perf_counter() - start)


def softmax(scores: np.ndarray) -> np.ndarray:
    """Row-wise softmax. scores: [T, V]."""
    shifted = scores - scores.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


def test_spacy(spec: Corpus, model_dir: Path, test: list[Sentence]) -> dict:
    """spaCy's metrics on `test` (its tokens), pipeline words/s and the per-token outcomes."""
    nlp = load_spacy(model_dir)
    docs, words_per_s = pipe_timed(nlp, lambda: make_docs(nlp.vocab, test, spec.component, with_labels=False))
    gold = [list(s.labels) for s in test]
    if spec.component == "tagger":
        tagger = nlp.get_pipe("tagger")
        labels = list(tagger.labels)
        scores = tagger.model.predict(docs)  # reads the tok2vec output that nlp.pipe left in doc.tensor
        normalized = tagger.model.get_ref("softmax").attrs["softmax_normalize"]  # the config's `normalize`
        probabilities = [np.asarray(tagger.model.ops.to_numpy(s), np.float64) for s in scores]
        probabilities = probabilities if normalized else [softmax(s) for s in probabilities]
        predicted = [[t.tag_ for t in doc] for doc in docs]
        mismatch = sum(labels[int(i)] != tag for p, tags in zip(probabilities, predicted)
                       for i, tag in zip(p.argmax(axis=1), tags))
        if mismatch:
            print(f"    note: {mismatch} tags differ from the argmax of the softmax", flush=True)
        report = evaluate(gold, predicted, labels=labels, probabilities=probabilities, scheme=None).to_dict()
        result = outcomes(gold, predicted, probabilities, labels, chunked=False)
    else:
        predicted = [spans_to_tags(len(doc), [(e.label_, e.start, e.end) for e in doc.ents]) for doc in docs]
        report = evaluate(gold, predicted).to_dict()
        result = label_outcomes(gold, predicted)
    return {**report, "pipeline_words_per_s": words_per_s, "outcomes": result}


def label_outcomes(gold, predicted) -> Outcomes:
    """Outcomes of labels without probabilities (spaCy's ner): chunk counts and correctness; the
    probability-based figures NaN (left out of the bootstrap)."""
    result = outcomes(gold, predicted, [np.zeros((len(g), 1)) for g in gold], ["?"], chunked=True)
    unknown = np.full(len(result.correct), np.nan)
    return dataclasses.replace(result, nll=unknown, confidence=unknown, brier=unknown)


# ---- gpseq in a spaCy pipeline ------------------------------------------------------------------
def gpseq_pipeline_words_per_s(spec: Corpus, model_dir: Path, test: list[Sentence]) -> float:
    """Words per second of the `gpseq` component alone in a blank spaCy pipeline over the test Docs
    (with the gold POS column as token.tag_ where the features read it)."""
    import spacy

    nlp = spacy.blank(spec.lang)
    nlp.add_pipe("gpseq", config={"model": str(model_dir)})
    reads_pos = 1 in load_tagger(model_dir).featurizer.config.sources()
    _, words_per_s = pipe_timed(nlp, lambda: make_docs(nlp.vocab, test, spec.component, with_labels=False,
                                                       pos_column=reads_pos))
    return words_per_s


def run_gpseq(spec: Corpus, system: str, train_file: Path, test, workdir: Path) -> tuple[dict, dict]:
    features = "ner" if system == "gpseq_words" else spec.features
    model_dir = workdir / f"{spec.name}.{system}"
    print(f"  {system}: gpseq train --features {features} …", flush=True)
    state = {**train_gpseq(train_file, features, spec.cli_extras(), model_dir), "model_dir": model_dir}
    print(f"    {state['train_s']:.1f} s, {state['peak_rss_mb']:,.0f} MB", flush=True)
    return state, test_gpseq_system(spec, state, test)


def test_gpseq_system(spec: Corpus, state: dict, test) -> dict:
    metrics = test_gpseq(state["model_dir"], test)
    metrics["pipeline_words_per_s"] = gpseq_pipeline_words_per_s(spec, state["model_dir"], test)
    chosen = load_tagger(state["model_dir"]).scores or {}
    metrics["temperature"] = (chosen.get("calibration") or {}).get("temperature")
    return metrics


# ---- one corpus -----------------------------------------------------------------------------------
def score_of(metrics: dict) -> float | None:
    return metrics.get("chunk_f1") if metrics.get("chunk_f1") is not None else metrics.get("token_accuracy")


def compare(corpus: str, metrics: dict) -> dict:
    """`<corpus>/<system>/ece_if_calibrated`, and each gpseq system − spacy by the paired bootstrap
    (the metrics spaCy has: all of them for the tagger, the score for the ner) with verdicts:
    `<corpus>/<system>_minus_spacy/<metric>`, `significance/<corpus>/<metric>_vs_spacy` (gpseq) and
    `significance/<corpus>/<system>/<metric>_vs_spacy` (gpseq_words). Pops the outcomes."""
    results = {system: values.pop("outcomes") for system, values in metrics.items()}
    out = {}
    for system, result in results.items():
        if np.isfinite(result.confidence).all():
            out[f"{corpus}/{system}/ece_if_calibrated"], out[f"{corpus}/{system}/ece_if_calibrated_q95"] = \
                calibrated_ece(result)
    names = METRICS if np.isfinite(results["spacy"].nll).all() else ("score",)
    for system in (s for s in results if s != "spacy"):
        for name, (diff, low, high) in paired_bootstrap(results[system], results["spacy"], names).items():
            out[f"{corpus}/{system}_minus_spacy/{name}"] = [diff, low, high]
            key = f"significance/{corpus}/{name}_vs_spacy" if system == "gpseq" else \
                f"significance/{corpus}/{system}/{name}_vs_spacy"
            out[key] = verdict(low, high, higher_is_better=name == "score")
    return out


def flatten(corpus: str, metrics: dict, commands: dict, data: dict) -> dict:
    out = {f"{corpus}/data/{key}": value for key, value in data.items()}
    for system, values in metrics.items():
        values["score"] = score_of(values)
        for key in REPORTED:
            if values.get(key) is not None:
                out[f"{corpus}/{system}/{key}"] = values[key]
        if system in commands:
            out[f"{corpus}/{system}/command"] = commands[system]
    return out


def run_corpus(spec: Corpus, args, workdir: Path, states: dict) -> dict:
    train, test = spec.read(spec.train), spec.read(spec.test)
    train_file = spec.train
    if args.quick:
        train, test = train[:QUICK_TRAIN], test[:QUICK_TEST]
        train_file = workdir / f"{spec.name}.train{spec.train.suffix}"
        write_conll(train_file, train, encoding=spec.encoding)
    state, metrics = {}, {}
    for system in ("gpseq", "gpseq_words") if spec.words_only_gpseq else ("gpseq",):
        state[system], metrics[system] = run_gpseq(spec, system, train_file, test, workdir)
    print(f"  spacy: spacy train ({spec.component}, --optimize efficiency) …", flush=True)
    state["spacy"] = train_spacy(spec, train, workdir, args.quick)
    print(f"    {state['spacy']['train_s']:.1f} s, {state['spacy']['peak_rss_mb']:,.0f} MB, "
          f"{state['spacy']['steps']} steps", flush=True)
    metrics["spacy"] = test_spacy(spec, state["spacy"]["model_dir"], test)
    for system, values in state.items():
        for key in ("train_s", "peak_rss_mb", "model_mb", "steps"):
            if values.get(key) is not None:
                metrics[system][key] = values[key]
    states[spec.name] = state
    data = {"train_file": str(spec.train), "train_sentences": len(train), "train_tokens": sum(map(len, train)),
            "spacy_train_sentences": state["spacy"]["train_sentences"],
            "spacy_dev_sentences": state["spacy"]["dev_sentences"], "test_file": str(spec.test),
            "test_sentences": len(test), "test_tokens": sum(map(len, test)), "spacy_component": spec.component,
            "spacy_lang": spec.lang}
    significance = compare(spec.name, metrics)
    commands = {system: values["command"] for system, values in state.items()}
    return {**flatten(spec.name, metrics, commands, data), **significance}


def run_masc(genre: str, args, states: dict) -> dict:
    """The conll2000-pos models (gpseq, spaCy's tagger) on one MASC genre."""
    spec = next(c for c in corpora() if c.name == "conll2000-pos")
    path = corpora_root() / "masc" / f"{genre}.conll"
    test = spec.read(path)
    if args.quick:
        test = test[:QUICK_MASC]
    state = states["conll2000-pos"]
    metrics = {"gpseq": test_gpseq_system(spec, state["gpseq"], test),
               "spacy": test_spacy(spec, state["spacy"]["model_dir"], test)}
    corpus = f"masc-{genre}"
    data = {"test_file": str(path), "test_sentences": len(test), "test_tokens": sum(map(len, test)),
            "source": "conll2000-pos"}
    significance = compare(corpus, metrics)
    return {**flatten(corpus, metrics, {}, data), **significance}


def spacy_ahead(corpus: str, results: dict) -> dict:
    """`spacy_ahead/<corpus>/<system>/<metric>`: spaCy's lead over a gpseq system (points for
    accuracy / F1), where it has one; timings on the MASC genres (a few hundred sentences) left out."""
    metrics = ("score", "token_nll", "ece", "brier", "aurc")
    if not corpus.startswith("masc-"):
        metrics += ("train_s", "peak_rss_mb", "model_mb", "pipeline_words_per_s")
    out = {}
    for system in ("gpseq", "gpseq_words"):
        for metric in metrics:
            ours, theirs = results.get(f"{corpus}/{system}/{metric}"), results.get(f"{corpus}/spacy/{metric}")
            if ours is None or theirs is None or not (math.isfinite(ours) and math.isfinite(theirs)):
                continue
            lead = ours - theirs if metric in LOWER_IS_BETTER else theirs - ours
            if lead > 0:
                out[f"spacy_ahead/{corpus}/{system}/{metric}"] = 100 * lead if metric == "score" else lead
    return out


# ---- output -----------------------------------------------------------------------------------------
ROWS = (  # (metric, label, format)
    ("score", "F1 / accuracy %", lambda v: f"{100 * v:.2f}"),
    ("chunk_precision", "precision %", lambda v: f"{100 * v:.2f}"),
    ("chunk_recall", "recall %", lambda v: f"{100 * v:.2f}"),
    ("token_nll", "token NLL", lambda v: f"{v:.4f}"),
    ("ece", "ECE (returned labels)", lambda v: f"{v:.4f}"),
    ("ece_if_calibrated_q95", "ECE if calibrated, 95 %", lambda v: f"{v:.4f}"),
    ("brier", "Brier", lambda v: f"{v:.4f}"),
    ("aurc", "AURC", lambda v: f"{v:.5f}"),
    ("train_s", "train s", lambda v: f"{v:.1f}"),
    ("steps", "spaCy steps", lambda v: f"{v:,}"),
    ("peak_rss_mb", "peak train RSS MB", lambda v: f"{v:,.0f}"),
    ("model_mb", "model MB", lambda v: f"{v:.2f}"),
    ("pipeline_words_per_s", "pipeline words/s", lambda v: f"{v:,.0f}"),
    ("tag_tokens_per_s", "Tagger.tag tokens/s", lambda v: f"{v:,.0f}"),
    ("temperature", "temperature T", lambda v: f"{v:.3f}"),
)
SYSTEMS = ("gpseq", "gpseq_words", "spacy")
UNITS = {"score": "points", "train_s": "s", "peak_rss_mb": "MB", "model_mb": "MB", "pipeline_words_per_s": "words/s"}


def table(corpus: str, results: dict) -> str:
    data = {k.split("/", 2)[2]: v for k, v in results.items() if k.startswith(f"{corpus}/data/")}
    head = ", ".join(f"{k} {v}" for k, v in data.items() if not k.endswith("_file"))
    systems = [s for s in SYSTEMS if any(k.startswith(f"{corpus}/{s}/") for k in results)]
    lines = [f"== {corpus}  ({head})", f"{'':<26}" + "".join(f"{s:>15}" for s in systems)]
    for name, label, fmt in ROWS:
        cells = [results.get(f"{corpus}/{s}/{name}") for s in systems]
        if all(c is None for c in cells):
            continue
        lines.append(f"{label:<26}" + "".join(f"{fmt(c) if c is not None else '-':>15}" for c in cells))
    for system in (s for s in systems if s != "spacy"):
        prefix = f"{corpus}/{system}_minus_spacy/"
        cells = []
        for key, (diff, low, high) in ((k, v) for k, v in results.items() if k.startswith(prefix)):
            name = key[len(prefix):]
            where = "" if system == "gpseq" else f"{system}/"
            mark = {"better": "+", "worse": "−", "tie": "="}[results[f"significance/{corpus}/{where}{name}_vs_spacy"]]
            scale = 100 if name == "score" else 1
            cells.append(f"{name} {scale * diff:+.4f} [{scale * low:+.4f}, {scale * high:+.4f}]{mark}")
        if cells:
            lines.append(f"{system} − spacy (95 % paired bootstrap over sentences; + better, = tie, − worse): "
                         + "; ".join(cells))
    if results.get(f"{corpus}/spacy/token_nll") is None:
        lines.append("spaCy's ner gives no per-token probabilities: F1 only")
    return "\n".join(lines)


def masc_overview(results: dict, genres: list[str]) -> str:
    lines = []
    for key, label, fmt in (ROWS[0], ROWS[3], ROWS[4], ROWS[6], ROWS[7]):
        lines.append(f"{label:<24}" + "".join(f"{s:>12}" for s in ("gpseq", "spacy")) + "   gpseq − spacy [95 %]")
        for genre in genres:
            corpus = f"masc-{genre}"
            cells = [results.get(f"{corpus}/{s}/{key}") for s in ("gpseq", "spacy")]
            name = "score" if key == "score" else key
            diff = results.get(f"{corpus}/gpseq_minus_spacy/{name}")
            scale = 100 if key == "score" else 1
            bootstrap = (f"   {scale * diff[0]:+.4f} [{scale * diff[1]:+.4f}, {scale * diff[2]:+.4f}]"
                         if diff else "")
            lines.append(f"  {genre:<22}" + "".join(f"{fmt(c) if c is not None else '-':>12}" for c in cells)
                         + bootstrap)
    return "\n".join(lines)


def selected(name: str, only: list[str] | None) -> bool:
    return not only or any(name.startswith(o) for o in only)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the flat JSON results here")
    parser.add_argument("--quick", action="store_true", help="reduced run (see above)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="corpora (names or prefixes) to run")
    parser.add_argument("--workdir", type=Path, help="keep models, DocBins and logs here (default: a temporary "
                                                     "folder)")
    args = parser.parse_args()
    if args.quick and args.json is not None:
        refuse_tracked(args.json)
    from multiprocessing import forkserver

    forkserver.ensure_running()  # while this process is still light (`_common.in_fresh_process`)
    specs = [c for c in corpora() if selected(c.name, args.only)]
    genres = [g for g in GENRES if selected(f"masc-{g}", args.only)]
    if genres and not any(c.name == "conll2000-pos" for c in specs):
        specs = [c for c in corpora() if c.name == "conll2000-pos"] + specs  # the MASC tests need its models
    if not specs:
        sys.exit(f"--only {args.only}: no corpus matches; names: {', '.join(c.name for c in corpora())}, "
                 f"masc-<genre> ({', '.join(GENRES)})")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="versus_spacy."))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"versus_spacy: {machine()}; work dir {workdir}", flush=True)
    started = time.perf_counter()
    results: dict = {}
    states: dict = {}
    done: list[str] = []
    try:
        for spec in specs:
            print(f"{spec.name}:", flush=True)
            try:
                results.update(run_corpus(spec, args, workdir, states))
                done.append(spec.name)
            except Exception as error:  # noqa: BLE001 — record and go on with the other corpora
                traceback.print_exc()
                results[f"{spec.name}/error"] = f"{type(error).__name__}: {error}"[:2000]
        for genre in genres if "conll2000-pos" in states else []:
            print(f"masc-{genre}:", flush=True)
            try:
                results.update(run_masc(genre, args, states))
                done.append(f"masc-{genre}")
            except Exception as error:  # noqa: BLE001
                traceback.print_exc()
                results[f"masc-{genre}/error"] = f"{type(error).__name__}: {error}"[:2000]
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    for corpus in done:
        results.update(spacy_ahead(corpus, results))
    masc = [c for c in done if c.startswith("masc-")]
    for metric in ("score", "token_nll", "ece", "aurc"):
        for verdict_ in ("better", "tie", "worse"):
            count = sum(results.get(f"significance/{c}/{metric}_vs_spacy") == verdict_ for c in masc)
            if masc:
                results[f"significance/count_masc/{metric}_vs_spacy/{verdict_}"] = count
    results.update(run_meta("versus_spacy.py", args.quick, started))
    import spacy

    results["meta/spacy_version"] = spacy.__version__

    print()
    for corpus in done:
        if not corpus.startswith("masc-"):
            print(table(corpus, results))
            print()
    if masc:
        print("== MASC genres: the conll2000-pos models (POS accuracy, token NLL, ECE, Brier, AURC)")
        print(masc_overview(results, [c.removeprefix("masc-") for c in masc]))
        print()
    ahead = {k: v for k, v in results.items() if k.startswith("spacy_ahead/")}
    print("where spaCy is ahead, by:" if ahead else "spaCy is ahead on no figure")
    for key, value in ahead.items():
        unit = UNITS.get(key.rsplit("/", 1)[1], "")
        print(f"  {key.removeprefix('spacy_ahead/')}: {value:.4g}{' ' + unit if unit else ''}")
    for key, value in results.items():
        if key.startswith("significance/count_masc/") or key.endswith("/error"):
            print(f"{key}: {value}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
