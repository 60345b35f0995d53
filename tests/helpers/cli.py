"""The `gpseq` command line, in-process (typer's CliRunner on the top-level app of cli.py) and as a
subprocess, with readers of its output written independently of gpseq.corpora; and one tiny model
of it (the fixtures `trained`, `library_tagger`), trained once per test module that imports them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import ROOT, SAMPLE

sys.path.insert(0, str(ROOT))

import cli  # noqa: E402  (the top-level typer app, as `python cli.py` runs it)

# A tiny, fast configuration: lexical features only (raw text has no POS column), few steps.
TRAIN_OPTIONS = [
    "--features", "ner", "--inducing", "8", "--max-steps", "8", "--seed", "3",
    "--set", "training.batch_size=32", "--set", "predict_samples=4", "--set", "training.eval_every=8",
]
TEXT = "The committee approved the new budget on Tuesday. It will fund three small projects.\n\nA second paragraph follows here."

runner = CliRunner()


def invoke(*args, input=None):
    return runner.invoke(cli.app, [str(a) for a in args], input=input, catch_exceptions=False)


def one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def run(*args, input=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([str(a) for a in args], input=input, capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)


def parse_conll_output(text: str) -> list[list[list[str]]]:
    """Sentences of rows of tab-separated fields."""
    sentences, current = [], []
    for line in text.splitlines():
        if line.strip():
            current.append(line.split("\t"))
        elif current:
            sentences.append(current)
            current = []
    if current:
        sentences.append(current)
    return sentences


def read_first_columns(path: Path) -> list[list[str]]:
    """Token column of a CoNLL file, read by hand (independent of gpseq.corpora)."""
    sentences, current = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            if current:
                sentences.append(current)
            current = []
        else:
            current.append(fields)
    if current:
        sentences.append(current)
    return sentences


def spacy_sentences(text: str) -> list[list[str]]:
    import spacy

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    out = []
    for paragraph in text.split("\n\n"):
        for sent in nlp(paragraph).sents:
            tokens = [t.text for t in sent if not t.is_space]
            if tokens:
                out.append(tokens)
    return out


@pytest.fixture(scope="module")
def sample() -> Path:
    if not (SAMPLE / "train.conll").is_file():
        pytest.skip("the bundled sample corpus (corpora/sample/train.conll) is not there yet")
    return SAMPLE


@pytest.fixture(scope="module")
def trained(sample, tmp_path_factory):
    """(model_dir, train CLI result): trained once for the whole module."""
    base = tmp_path_factory.mktemp("cli")
    model_dir = base / "model"
    result = invoke("train", sample / "train.conll", "-o", model_dir, "--dev", sample / "dev.conll", *TRAIN_OPTIONS)
    assert result.exit_code == 0, result.output + result.stderr
    return model_dir, result


@pytest.fixture(scope="module")
def library_tagger(trained):
    from gpseq.tagger import Tagger

    return Tagger.load(trained[0])


@pytest.fixture()
def text_file(tmp_path) -> Path:
    path = tmp_path / "input.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path
