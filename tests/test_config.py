"""The tagger's configuration (gpseq/config.py and the configs of features, model and training):
every numeric field is checked for type, finiteness and range, and hostile options are refused by
the commands with one line (exit 4) before any work (training and loading are patched to fail the
test, and no output is created). The tiny model and corpus of `helpers.tiny_model` are trained once
for the module."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from helpers.cli import invoke, one_line
from helpers.peak_rss import assert_refused, run_gpseq
from helpers.tiny_model import corpus, model  # noqa: F401  (fixtures: a tiny trained model)

from gpseq.config import MAX_NBEST, MAX_SAMPLES, TaggerConfig
from gpseq.errors import ConfigError
from gpseq.features.config import MAX_WINDOW, FeatureConfig
from gpseq.saved.meta import MAX_LABELS
from gpseq.structured.config import ModelConfig
from gpseq.training.config import TrainingConfig


class WorkStarted(Exception):
    """Raised by the patched Tagger.train / Tagger.load: the command got past its checks."""


@pytest.fixture()
def no_work(monkeypatch):
    from gpseq.tagger import Tagger

    def started(*args, **kwargs):
        raise WorkStarted

    monkeypatch.setattr(Tagger, "train", started)
    monkeypatch.setattr(Tagger, "load", started)


@pytest.fixture()
def no_fit(monkeypatch):
    """The first work of a training, after its corpus is scanned: fitting the featurizer."""
    from gpseq.features import Featurizer

    def started(*args, **kwargs):
        raise WorkStarted

    monkeypatch.setattr(Featurizer, "fit", started)


def _invoke_refused(*args, problem: str):
    result = invoke(*args)
    assert result.exit_code == 4, result.stderr
    line = one_line(result)
    assert problem in line, line
    return line


@pytest.mark.parametrize("assignment, problem", [
    ("tag_scheme=xyz", "unknown tag scheme 'xyz'"),
    ("model.prior_variance=-1", "model.prior_variance must be a finite number > 0, got -1"),
    ("model.prior_variance=NaN", "model.prior_variance must be a finite number > 0, got nan"),
    ('model.prior_variance="abc"', "model.prior_variance must be a finite number > 0, got 'abc'"),
    ("model.prior_variance=true", "model.prior_variance must be a finite number > 0, got True"),
    ("model.num_inducing=0", "model.num_inducing must be an integer >= 1"),
    ("training.seed=-1", "training.seed must be an integer >= 0 and <= 2,147,483,647, got -1"),
    ("training.seed=1e30", "training.seed must be an integer >= 0 and <= 2,147,483,647, got 1e+30"),
    ("training.learning_rate=Infinity", "training.learning_rate must be a finite number >= 0, got inf"),
    ("features.window=11", f"features.window must be an integer in [0, {MAX_WINDOW}], got 11"),
    ("predict_samples=100000", f"predict_samples must be an integer >= 1 and <= {MAX_SAMPLES:,}"),
    ("training.seed=" + "9" * 5000, "(5,000 characters) is not a value a configuration holds"),
    ('features.conjunctions=[[["lower","x"]]]', "invalid tagger configuration: invalid literal for int()"),
])
def test_bad_training_options_are_refused_before_training(corpus, tmp_path, no_work, assignment, problem):
    out = tmp_path / "out"
    _invoke_refused("train", corpus, "-o", out, "--set", assignment, problem=problem)
    assert sorted(tmp_path.iterdir()) == []  # no model, no checkpoint, no lock


def test_a_huge_window_is_refused_before_any_template_is_built(corpus, tmp_path):
    """features.window=1000000 built two million templates (7.5 GB) before failing."""
    result = run_gpseq("train", corpus, "-o", tmp_path / "out", "--set", "features.window=1000000")
    assert_refused(result, None, f"features.window must be an integer in [0, {MAX_WINDOW}], got 1000000", code=4)
    assert not (tmp_path / "out").exists()


def _labelled_file(path: Path, n_labels: int) -> Path:
    path.write_text("".join(f"w{i} L{i}\n" + ("\n" if i % 50 == 49 else "") for i in range(n_labels)),
                    encoding="utf-8")
    return path


def test_too_many_labels_are_refused_naming_the_training_file(tmp_path, no_fit):
    """100,000 labels asked 74.5 GiB of one pairwise array."""
    train = _labelled_file(tmp_path / "many.conll", 100_000)
    line = _invoke_refused("train", train, "-o", tmp_path / "out", "--features", "ner",
                           problem=f"more than {MAX_LABELS:,} distinct labels")
    assert line.startswith(f"error: {train}: ")
    assert not (tmp_path / "out").exists()


def test_labels_up_to_the_limit_reach_training(tmp_path, no_fit):
    train = _labelled_file(tmp_path / "many.conll", MAX_LABELS)
    with pytest.raises(WorkStarted):
        invoke("train", train, "-o", tmp_path / "out", "--features", "ner")


@pytest.mark.parametrize("option, value, problem", [
    ("--nbest", 1_000_000, f"--nbest must be in [0, {MAX_NBEST}]"),
    ("--samples", 100_000, f"--samples must be in [1, {MAX_SAMPLES:,}]"),
])
def test_bad_tag_options_are_refused_before_loading(model, tmp_path, no_work, option, value, problem):
    notes = tmp_path / "notes.txt"
    notes.write_text("The committee approved the budget.\n", encoding="utf-8")
    _invoke_refused("tag", model, notes, option, value, "-o", tmp_path / "out.conll", problem=problem)
    assert not (tmp_path / "out.conll").exists()
    with pytest.raises(WorkStarted):  # the limits themselves are allowed
        invoke("tag", model, notes, option, MAX_NBEST if option == "--nbest" else MAX_SAMPLES)


# ---- every numeric configuration field: type, finiteness and range


def _numeric_fields():
    for section, cls in (("features", FeatureConfig), ("model", ModelConfig), ("training", TrainingConfig),
                         (None, TaggerConfig)):
        for field in dataclasses.fields(cls):
            if field.type in ("int", "float", "int | None", "float | None"):
                yield section, field.name


@pytest.mark.parametrize("section, name", list(_numeric_fields()))
@pytest.mark.parametrize("bad", ["abc", True, math.nan, -1])
def test_every_numeric_field_is_checked(section, name, bad):
    data = TaggerConfig().to_dict()
    (data[section] if section else data)[name] = bad
    with pytest.raises(ConfigError, match=name):
        TaggerConfig.from_dict(data).validate()


@pytest.mark.parametrize("grid", ["prior_variance_grid", "pairwise_variance_grid", "l1_grid"])
@pytest.mark.parametrize("bad", ["abc", True, math.nan, -1])
def test_grid_values_are_checked(grid, bad):
    data = TaggerConfig().to_dict()
    data["training"][grid] = [1.0, bad]
    with pytest.raises(ConfigError, match=grid):
        TaggerConfig.from_dict(data).validate()
