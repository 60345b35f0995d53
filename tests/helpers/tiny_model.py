"""The tiny corpus and models the tests of faults, limits and bad inputs start from.

`corpus`: 20 sentences of the bundled sample. `model`: a tiny model directory of them (2 steps,
with its checkpoint directory MODEL.ckpt beside it), trained once per test module that imports it;
`copy` makes fresh copies of it, `notes` a small text to tag. `model_of_the_default_training` is
another fixture named `model` (the default training: the NumPy predictive, tagging starts without
TensorFlow): a module imports one of the two."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from helpers import ROOT, SAMPLE
from helpers.cli import invoke
from helpers.files import strip_manifest

TINY = ["--features", "ner", "--inducing", "8", "--max-steps", "2", "--seed", "3",
        "--set", "training.dev_fraction=0", "--set", "predict_samples=2", "--set", "training.batch_size=8"]

# The SVI trainer (checkpoints every 5 of its 40 steps); the default method is a one-shot L-BFGS fit
KILL_OPTIONS = ["--features", "ner", "--max-steps", "40", "--epochs", "20", "--seed", "3",
                "--set", "training.method=svi", "--set", "training.checkpoint_every=5",
                "--set", "training.dev_fraction=0", "--set", "training.batch_size=8", "--set", "predict_samples=2"]

def subprocess_env() -> dict[str, str]:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    if not (SAMPLE / "train.conll").is_file():
        pytest.skip("the bundled sample corpus (corpora/sample/train.conll) is not there")
    blocks = (SAMPLE / "train.conll").read_text(encoding="utf-8").split("\n\n")[:20]
    path = tmp_path_factory.mktemp("corpus") / "small.conll"
    path.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def model(corpus, tmp_path_factory) -> Path:
    """A tiny model directory (with its checkpoint directory MODEL.ckpt beside it); do not modify."""
    model_dir = tmp_path_factory.mktemp("tiny") / "model"
    result = invoke("train", corpus, "-o", model_dir, *TINY)
    assert result.exit_code == 0, result.stderr
    return model_dir


@pytest.fixture(scope="module", name="model")
def model_of_the_default_training(corpus, tmp_path_factory):
    """A tiny default model (the NumPy predictive: tagging starts without TensorFlow)."""
    path = tmp_path_factory.mktemp("signals") / "model"
    result = invoke("train", corpus, "-o", path, "--features", "ner")
    assert result.exit_code == 0, result.stderr
    return path


@pytest.fixture()
def copy(model, tmp_path):
    """A fresh copy of the tiny model directory: copy(name) → path."""
    def make(name="m", manifest=True):
        target = tmp_path / name
        shutil.copytree(model, target)
        if not manifest:
            strip_manifest(target)
        return target

    return make


@pytest.fixture()
def notes(tmp_path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("The committee approved the budget. It funds three projects.\n", encoding="utf-8")
    return path
