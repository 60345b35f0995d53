"""The gpseq component inside spaCy's workflow: `spacy train` on pipelines/gpseq_ner_train.cfg fits
the model in `initialize` (the same model as `Tagger.train` on the same sentences), `spacy evaluate`
reports spaCy's scores and gpseq's calibration figures (the same as `gpseq.evaluation.evaluate`
gives), a trained pipeline packages with `spacy package`, installs into a fresh venv and tags there
as in this process; tags trained by `nlp.initialize`; the settings that would train on the wrong
data are refused."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT

spacy = pytest.importorskip("spacy")

NER_CFG = ROOT / "pipelines" / "gpseq_ner_train.cfg"

PEOPLE = [["John", "Smith"], ["Mary"], ["Ana", "Lopez"], ["Peter"], ["Li", "Wei"], ["Sarah", "Connor"]]
PLACES = [["Paris"], ["New", "York"], ["Berlin"], ["Tokyo"], ["San", "Diego"], ["Lagos"]]
ORGS = [["Acme", "Group"], ["United", "Nations"], ["Google"], ["Red", "Cross"]]
VERBS = ["visited", "left", "praised", "joined", "called"]
# Penn tags of the words above (all proper nouns but the verbs, "the", "on", "Monday", ".")
TAGS = {"visited": "VBD", "left": "VBD", "praised": "VBD", "joined": "VBD", "called": "VBD", "the": "DT",
        "on": "IN", "Monday": "NNP", ".": "."}


def _sentences(n: int, seed: int) -> list[tuple[list[str], list[str]]]:
    """`n` hand-made sentences (words, BIO entity labels): PER verb [the] GPE|ORG [on Monday] ."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        who, verb = rng.choice(PEOPLE), rng.choice(VERBS)
        kind, other = rng.choice([("GPE", rng.choice(PLACES)), ("ORG", rng.choice(ORGS))])
        words, labels = [*who, verb], ["B-PER"] + ["I-PER"] * (len(who) - 1) + ["O"]
        if kind == "ORG" and rng.random() < 0.5:
            words.append("the")
            labels.append("O")
        words += other
        labels += [f"B-{kind}"] + [f"I-{kind}"] * (len(other) - 1)
        if rng.random() < 0.5:
            words += ["on", "Monday"]
            labels += ["O", "O"]
        out.append(([*words, "."], [*labels, "O"]))
    return out


def _doc(vocab, words: list[str], labels: list[str]):
    from spacy.tokens import Doc

    spaces = [True] * (len(words) - 2) + [False, False]  # "… Paris." as spaCy's tokenizer splits it back
    return Doc(vocab, words=words, spaces=spaces, ents=labels, tags=[TAGS.get(word, "NNP") for word in words])


def _env() -> dict:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def _run(*args: str, cwd: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=_env(), capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """train.spacy (30 Docs), dev.spacy (12) and `spacy train` on pipelines/gpseq_ner_train.cfg."""
    from spacy.tokens import DocBin

    base = tmp_path_factory.mktemp("spacy_train")
    vocab = spacy.blank("en").vocab
    train, dev = _sentences(30, seed=1), _sentences(12, seed=2)
    for name, sentences in (("train", train), ("dev", dev)):
        DocBin(docs=[_doc(vocab, words, labels) for words, labels in sentences]).to_disk(base / f"{name}.spacy")
    started = time.perf_counter()
    output = _run("spacy", "train", str(NER_CFG), "--paths.train", "train.spacy", "--paths.dev", "dev.spacy",
                  "-o", "out", cwd=base).stdout
    return {"base": base, "train": train, "dev": dev, "output": output, "seconds": time.perf_counter() - started}


@pytest.fixture(scope="module")
def reference(trained):
    """`Tagger.train` with the config's settings on the same sentences, given as words and labels."""
    from gpseq.corpora import Sentence
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger, TaggerConfig

    sentences = [Sentence(words, labels) for words, labels in trained["train"]]
    return Tagger.train(sentences, TaggerConfig(features=get_preset("ner")))


def test_spacy_train_ends_after_one_evaluation_and_model_best_is_gpseqs_default_training(trained, reference):
    from gpseq.corpora import Sentence

    base = trained["base"]
    assert (base / "out" / "model-best" / "ner" / "model" / "tagger.json").is_file()
    rows = [line.split() for line in trained["output"].splitlines() if line.strip()[:1].isdigit()]
    assert [row[:2] for row in rows] == [["0", "0"]], trained["output"]  # one evaluation, at step 0
    print(f"spacy train: {trained['seconds']:.1f} s")

    dev = trained["dev"]
    expected = reference.tag([Sentence(words) for words, _ in dev])
    for directory in ("model-best", "model-last"):
        nlp = spacy.load(base / "out" / directory)
        for (words, _), tagged in zip(dev, expected):
            doc = nlp(" ".join(words[:-1]) + words[-1])
            assert [t.text for t in doc] == words
            assert [(e.label_, e.start, e.end) for e in doc.ents] == [span[:3] for span in tagged.spans]
            assert [e._.gpseq_prob for e in doc.ents] == pytest.approx([span[3] for span in tagged.spans],
                                                                        rel=1e-6)
            probs = np.array([[t._.gpseq_probs[label] for label in reference.labels] for t in doc])
            np.testing.assert_allclose(probs, tagged.probabilities, rtol=1e-6, atol=1e-9)


def test_spacy_evaluate_reports_ents_f_and_gpseqs_calibration_as_gpseq_evaluate(trained, reference):
    from gpseq.corpora import Sentence

    base = trained["base"]
    _run("spacy", "evaluate", "out/model-best", "dev.spacy", "--output", "scores.json", cwd=base)
    scores = json.loads((base / "scores.json").read_text())
    report = reference.evaluate([Sentence(words, labels) for words, labels in trained["dev"]]).to_dict()
    assert scores["ents_f"] == pytest.approx(report["chunk_f1"], rel=1e-9)
    for name in ("token_nll", "ece", "brier", "aurc", "entity_ece", "entity_brier", "entity_aurc"):
        assert scores[f"ents_{name}"] == pytest.approx(report[name], rel=1e-6, abs=1e-12), name
    assert 0.0 < scores["ents_token_nll"] and 0.0 < scores["ents_entity_ece"] < 1.0
    # the config's score weights keep gpseq's figures in the pipeline's meta.json
    meta = json.loads((base / "out" / "model-best" / "meta.json").read_text())
    assert meta["performance"]["ents_entity_ece"] == pytest.approx(report["entity_ece"], rel=1e-6)


def _fresh_venv(path: Path) -> Path:
    """A new venv at `path` (`python -m venv`, no network) that sees this environment's packages and the gpseq
    checkout without having them installed: a .pth file in its site-packages lists both directories, after its
    own site-packages. Returns its interpreter."""
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    site_packages = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    Path(site_packages, "gpseq-dev-environment.pth").write_text(f"{ROOT}\n{sysconfig.get_paths()['purelib']}\n")
    return python


TEXTS = ["Mary visited Paris on Monday.", "Peter joined the Red Cross."]
# tagged in the fresh venv and in this process: per Doc, its entities and their probabilities, its tokens' distributions
TAG_AND_DUMP = """
import json, sys
import spacy
nlp = spacy.load(sys.argv[1])
out = []
for doc in nlp.pipe(json.loads(sys.argv[2])):
    out.append({"ents": [[e.text, e.label_, e.start, e.end, e._.gpseq_prob] for e in doc.ents],
                "probs": [dict(t._.gpseq_probs) for t in doc]})
print(json.dumps({"prefix": sys.prefix, "package": spacy.util.get_package_path(sys.argv[1]).as_posix()
                  if spacy.util.is_package(sys.argv[1]) else None, "docs": out}))
"""


def test_train_evaluate_package_then_tag_in_a_fresh_venv(trained, tmp_path):
    """The whole workflow from .spacy files: `spacy train` (the fixture), `spacy evaluate`, `spacy package --build
    sdist`, `pip install --no-deps --no-index --no-build-isolation` of the sdist into a venv made here, and
    `spacy.load("en_gpseq_test")` in that venv's interpreter tags as the trained pipeline does in this process."""
    from spacy.training import Example
    from spacy.tokens import DocBin

    base = trained["base"]
    model_best = base / "out" / "model-best"
    _run("spacy", "evaluate", str(model_best), "dev.spacy", "--output", str(tmp_path / "scores.json"), cwd=base)
    scores = json.loads((tmp_path / "scores.json").read_text())
    nlp = spacy.load(model_best)
    gold = list(DocBin().from_disk(base / "dev.spacy").get_docs(nlp.vocab))
    expected_scores = nlp.evaluate([Example(nlp.make_doc(doc.text), doc) for doc in gold])
    for name in ("ents_f", "ents_token_nll", "ents_ece", "ents_entity_ece"):
        assert scores[name] == pytest.approx(expected_scores[name], rel=1e-6), name  # the JSON keeps 10 decimals

    _run("spacy", "package", str(model_best), str(tmp_path), "--name", "gpseq_test", "--version", "0.0.1",
         "--build", "sdist", cwd=base)
    sdist = tmp_path / "en_gpseq_test-0.0.1" / "dist" / "en_gpseq_test-0.0.1.tar.gz"
    assert sdist.is_file()
    venv = tmp_path / "venv"
    python = _fresh_venv(venv)

    def in_venv(*args: str) -> str:
        result = subprocess.run([str(python), *args], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                                timeout=180)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result.stdout

    # pip is this environment's (seen through the .pth file); run by the venv's interpreter, it installs there
    in_venv("-m", "pip", "install", "--no-deps", "--no-index", "--no-build-isolation", "--no-cache-dir", "--quiet",
            str(sdist))
    tagged = json.loads(in_venv("-c", TAG_AND_DUMP, "en_gpseq_test", json.dumps(TEXTS)))
    assert Path(tagged["prefix"]) == venv  # the venv's interpreter, which loaded the package installed there
    assert Path(tagged["package"]).is_relative_to(venv)

    docs = list(nlp.pipe(TEXTS))
    assert [[e[:4] for e in doc["ents"]] for doc in tagged["docs"]] == \
           [[[e.text, e.label_, e.start, e.end] for e in doc.ents] for doc in docs]
    assert [e[1] for doc in tagged["docs"] for e in doc["ents"]] == ["PER", "GPE", "PER", "ORG"]
    for got, doc in zip(tagged["docs"], docs):
        assert [e[4] for e in got["ents"]] == pytest.approx([e._.gpseq_prob for e in doc.ents], rel=1e-12)
        for probs, token in zip(got["probs"], doc, strict=True):
            assert probs == pytest.approx(dict(token._.gpseq_probs), rel=1e-12)


def test_tags_trained_by_initialize_score_tag_acc_and_gpseqs_calibration():
    """labels = "tag": trained on token.tag_ by `nlp.initialize`, scored by `nlp.evaluate` as
    `Tagger.train` + `gpseq.evaluation.evaluate` on the same sentences."""
    from spacy.training import Example

    from gpseq.corpora import Sentence
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger, TaggerConfig

    nlp = spacy.blank("en")
    nlp.add_pipe("gpseq", name="tagger", config={"labels": "tag", "features": "pos"})
    train, dev = _sentences(30, seed=3), _sentences(10, seed=4)
    examples = [Example(nlp.make_doc(doc.text), doc) for doc in (_doc(nlp.vocab, *s) for s in train)]
    nlp.initialize(lambda: examples)
    dev_docs = [_doc(nlp.vocab, *s) for s in dev]
    scores = nlp.evaluate([Example(nlp.make_doc(doc.text), doc) for doc in dev_docs])

    tags = lambda words: [TAGS.get(word, "NNP") for word in words]  # noqa: E731
    reference = Tagger.train([Sentence(words, tags(words)) for words, _ in train],
                             TaggerConfig(features=get_preset("pos")))
    report = reference.evaluate([Sentence(words, tags(words)) for words, _ in dev]).to_dict()
    assert scores["tag_acc"] == pytest.approx(report["token_accuracy"], rel=1e-9)
    for name in ("token_nll", "ece", "brier", "aurc"):
        assert scores[f"tag_{name}"] == pytest.approx(report[name], rel=1e-6, abs=1e-12), name
    assert not any(key.startswith(("ents_", "tag_entity")) for key in scores)
    # a sentence that spaCy's tokenizer splits otherwise ("Corp." is one token) has no gold path: left out
    other = _doc(nlp.vocab, ["Mary", "joined", "Acme", "Corp", "."], ["B-PER", "O", "B-ORG", "I-ORG", "O"])
    more = nlp.evaluate([Example(nlp.make_doc(doc.text), doc) for doc in [*dev_docs, other]])
    assert len(nlp.make_doc(other.text)) == 4 and more["tag_acc"] < scores["tag_acc"]
    assert {key: more[key] for key in scores if key.startswith("tag_") and key != "tag_acc"} == \
           {key: scores[key] for key in scores if key.startswith("tag_") and key != "tag_acc"}
    assert nlp.get_pipe("tagger").update(examples[:2]) == {"tagger": 0.0}


def test_a_span_group_trained_by_initialize_scores_spans_f_and_entity_calibration():
    """labels = "spans:chunks": trained on doc.spans["chunks"], written there, scored as spaCy's spancat
    scores that group and as `gpseq.evaluation.evaluate` on the same sentences."""
    from spacy.training import Example

    from gpseq.corpora import Sentence
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger, TaggerConfig

    def with_group(words, labels):
        doc = _doc(nlp.vocab, words, labels)
        doc.spans["chunks"] = list(doc.ents)
        doc.ents = []
        return doc

    nlp = spacy.blank("en")
    nlp.add_pipe("gpseq", config={"labels": "spans:chunks", "spans_key": "chunks", "features": "ner"})
    train, dev = _sentences(30, seed=6), _sentences(10, seed=7)
    nlp.initialize(lambda: [Example(nlp.make_doc(doc.text), doc) for doc in (with_group(*s) for s in train)])
    scores = nlp.evaluate([Example(nlp.make_doc(doc.text), doc) for doc in (with_group(*s) for s in dev)])

    reference = Tagger.train([Sentence(words, labels) for words, labels in train],
                             TaggerConfig(features=get_preset("ner")))
    report = reference.evaluate([Sentence(words, labels) for words, labels in dev]).to_dict()
    assert scores["spans_chunks_f"] == pytest.approx(report["chunk_f1"], rel=1e-9)
    for name in ("token_nll", "ece", "entity_ece", "entity_brier", "entity_aurc"):
        assert scores[f"spans_chunks_{name}"] == pytest.approx(report[name], rel=1e-6, abs=1e-12), name


@pytest.mark.parametrize("config, match", [
    ({"labels": "ents", "model": "models/any", "features": "ner"}, "set model = null"),
    ({"labels": "ents", "task": "tag"}, "written by task 'ents'"),
    ({"labels": "spans:chunks"}, "set spans_key = 'chunks'"),
    ({"labels": "entities"}, "spans:KEY"),
])
def test_settings_that_would_not_train_what_they_say_are_refused(config, match):
    from gpseq.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        spacy.blank("en").add_pipe("gpseq", config=config)


def test_initialize_without_labels_or_on_a_streamed_corpus_is_refused():
    from spacy.training import Example

    from gpseq.errors import ConfigError

    nlp = spacy.blank("en")
    nlp.add_pipe("gpseq")
    with pytest.raises(ConfigError, match="nothing to train on"):
        nlp.initialize()
    nlp = spacy.blank("en")
    nlp.add_pipe("gpseq", config={"labels": "ents", "features": "ner"})
    nlp.config["training"]["max_epochs"] = -1  # spaCy then initializes on the first 100 examples
    doc = _doc(nlp.vocab, *_sentences(1, seed=5)[0])
    with pytest.raises(ConfigError, match="max_epochs = -1"):
        nlp.initialize(lambda: [Example(nlp.make_doc(doc.text), doc)])
