"""Plug-in likelihoods chosen by name: `package.module:function` and the entry-point group
`gpseq_likelihoods`, through the config, `gpseq train`, a saved model and its reload.

The plug-in is `tests/numpy_chain_likelihood.py`, the exact linear chain written in plain NumPy
(no gpseq import). It is checked against brute-force enumeration of the label paths and against
the built-in chain, then trained through the CLI beside the built-in exact likelihood with the same
settings; the two must reach the same test chunk F1 (to 1 point), which seqeval scores here.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import numpy_chain_likelihood  # tests/numpy_chain_likelihood.py, a user's plug-in module
from helpers import ROOT, TESTS

from gpseq.errors import ConfigError
from gpseq.structured.config import ModelConfig
from gpseq.structured.likelihoods import BlackBoxLikelihood, likelihood_by_name

SAMPLE = ROOT / "corpora" / "sample"
PLUGIN = "numpy_chain_likelihood:log_likelihood"
# the same small SVI run for the plug-in and the built-in likelihood (only --likelihood differs)
TRAIN_OPTIONS = ["--epochs", "3", "--seed", "0", "--set", "model.estimator=score", "--set", "training.method=svi",
                 "--set", "training.early_stopping=none", "--set", "training.dev_fraction=0",
                 "--set", "training.learning_rate=0.05"]

runner = CliRunner()


def invoke(*args):
    from gpseq.cli import app

    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def error_line(result) -> str:
    """The CLI's error output, asserted to be one line."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def brute_force_log_likelihood(labels, unary, pairwise):
    """log p(y) of one sequence by enumerating every label path: unary [T, V], pairwise [V, V]."""
    T, V = unary.shape

    def score(path):
        return sum(unary[t, path[t]] for t in range(T)) + sum(pairwise[a, b] for a, b in zip(path, path[1:]))

    log_z = np.logaddexp.reduce([score(path) for path in itertools.product(range(V), repeat=T)])
    return score(labels) - log_z


def read_gold(path: Path) -> list[list[str]]:
    """The last column of a CoNLL file, sentence by sentence (read by hand)."""
    sentences, current = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            current.append(line.split()[-1])
        elif current:
            sentences.append(current)
            current = []
    return sentences + ([current] if current else [])


# ---- the plug-in itself --------------------------------------------------------------------------
def test_numpy_plugin_is_the_exact_chain():
    """Brute-force enumeration per sequence, then the built-in chain on padded batches with sample
    dimensions and per-sample pairwise potentials (the score estimator's shapes)."""
    from gpseq.structured import chain

    rng = np.random.default_rng(0)
    K, S, B, T, V = 2, 3, 4, 5, 3
    unary = rng.normal(scale=2.0, size=(K, S, B, T, V))
    pairwise = rng.normal(size=(S, 1, V, V))
    lengths = np.array([5, 1, 3, 4])
    labels = rng.integers(0, V, size=(B, T))
    labels[1, 1:] = -7  # padding holds anything
    ours = numpy_chain_likelihood.log_likelihood(labels, unary, pairwise, lengths)
    assert ours.shape == (K, S, B)
    for k, s, b in itertools.product(range(K), range(S), range(B)):
        L = lengths[b]
        expected = brute_force_log_likelihood(labels[b, :L], unary[k, s, b, :L], pairwise[s, 0])
        np.testing.assert_allclose(ours[k, s, b], expected, rtol=1e-12)
    built_in = chain.log_likelihood(labels, unary, pairwise, lengths).numpy()
    np.testing.assert_allclose(ours, built_in, rtol=1e-12, atol=1e-12)


def test_black_box_by_name_evaluates_in_the_models_dtype():
    """`package.module:function` resolves to the function, wrapped and named; a float32 model gets
    float32 values from a function that computes in float64."""
    import tensorflow as tf

    likelihood = likelihood_by_name(PLUGIN)
    assert isinstance(likelihood, BlackBoxLikelihood)
    assert likelihood.function is numpy_chain_likelihood.log_likelihood
    assert likelihood.name == PLUGIN and not likelihood.differentiable
    rng = np.random.default_rng(1)
    unary = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)
    pairwise = rng.normal(size=(2, 1, 5, 5)).astype(np.float32)
    labels, lengths = rng.integers(0, 5, size=(3, 4)).astype(np.int32), np.array([4, 2, 3], np.int32)
    out = likelihood.log_prob(tf.constant(labels), tf.constant(unary), tf.constant(pairwise), tf.constant(lengths))
    assert out.dtype == tf.float32 and out.shape == (2, 3)
    expected = [[brute_force_log_likelihood(labels[b, :lengths[b]], unary[s, b, :lengths[b]].astype(float),
                                            pairwise[s, 0].astype(float)) for b in range(3)] for s in range(2)]
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5)


# ---- configuration ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name, problem", [
    ("bogus", "entry-point group gpseq_likelihoods"),
    ("no_such_package.chain:log_likelihood", "needs the Python module 'no_such_package.chain'"),
    ("numpy_chain_likelihood:no_such_function", "has no 'no_such_function'"),
    ("numpy_chain_likelihood:np", "is not a function"),
    ("numpy_chain_likelihood:", "entry-point group"),
    (3, "entry-point group"),  # e.g. --set model.likelihood=3
])
def test_a_bad_name_is_a_one_line_config_error(name, problem):
    """A name of the wrong form is refused when the config is validated; a function path whose code
    is absent when it is resolved for training (validating imports nothing)."""
    with pytest.raises(ConfigError) as caught:
        ModelConfig(likelihood=name, estimator="score").validate()
        likelihood_by_name(name)
    message = str(caught.value)
    assert "\n" not in message and problem in message and repr(name) in message


def test_plugin_needs_the_score_estimator_and_svi():
    """The default pathwise estimator cannot differentiate a NumPy function: refused by name; the
    automatic training method is SVI for a plug-in, and the Laplace fit (exact chain only) refuses it."""
    from gpseq.config import TaggerConfig
    from gpseq.training.config import TrainingConfig

    with pytest.raises(ConfigError, match=r"'numpy_chain_likelihood:log_likelihood' cannot be differentiated"
                                          r".*estimator=\"score\".*--set model.estimator=score"):
        ModelConfig(likelihood=PLUGIN).validate()
    config = TaggerConfig(model=ModelConfig(likelihood=PLUGIN, estimator="score"))
    config.validate()
    assert config.resolved_method() == "svi"
    assert TaggerConfig(model=ModelConfig(estimator="score")).resolved_method() == "laplace"  # the built-in
    with pytest.raises(ConfigError, match=r'"laplace" fits the exact chain.*numpy_chain_likelihood'):
        TaggerConfig(model=config.model, training=TrainingConfig(method="laplace")).validate()


def test_validating_a_plugin_config_imports_nothing():
    code = ("import sys; from gpseq.config import TaggerConfig; from gpseq.structured.config import ModelConfig; "
            f"TaggerConfig(model=ModelConfig(likelihood={PLUGIN!r}, estimator='score')).validate(); "
            "print('tensorflow' in sys.modules, 'numpy_chain_likelihood' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=str(TESTS))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.split() == ["False", "False"]


@pytest.fixture
def registered(tmp_path, monkeypatch):
    """A distribution on sys.path whose entry points register the NumPy chain as "numpy-chain" and an
    absent module as "gone-chain" in the group gpseq_likelihoods."""
    info = tmp_path / "gpseq_plugin_example-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpseq-plugin-example\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[gpseq_likelihoods]\nnumpy-chain = numpy_chain_likelihood:log_likelihood\n"
                                           "gone-chain = no_such_package.chain:log_likelihood\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_entry_point_names_resolve(registered):
    likelihood = likelihood_by_name("numpy-chain")
    assert likelihood.function is numpy_chain_likelihood.log_likelihood and likelihood.name == "numpy-chain"
    ModelConfig(likelihood="numpy-chain", estimator="score").validate()
    with pytest.raises(ConfigError, match="'numpy-chain' cannot be differentiated"):
        ModelConfig(likelihood="numpy-chain").validate()
    with pytest.raises(ConfigError, match="'gone-chain' needs the Python module 'no_such_package.chain'"):
        likelihood_by_name("gone-chain")


def test_entry_point_trains_through_the_cli_and_is_saved_by_name(registered, tmp_path):
    model = tmp_path / "model"
    result = invoke("train", SAMPLE / "train.conll", "-o", model, "--likelihood", "numpy-chain",
                    "--max-steps", "2", *TRAIN_OPTIONS)
    assert result.exit_code == 0, result.stderr
    saved = json.loads((model / "tagger.json").read_text())["config"]["model"]
    assert saved["likelihood"] == "numpy-chain" and saved["estimator"] == "score"
    tagged, gold = tag_labels(model, SAMPLE / "dev.conll"), read_gold(SAMPLE / "dev.conll")
    assert [len(s) for s in tagged] == [len(s) for s in gold]


# ---- the CLI ---------------------------------------------------------------------------------------
def test_cli_refuses_a_plugin_under_the_pathwise_estimator_and_a_bad_name(tmp_path):
    result = invoke("train", SAMPLE / "train.conll", "-o", tmp_path / "m", "--likelihood", PLUGIN)
    assert result.exit_code == 4
    assert 'estimator="score"' in error_line(result) and PLUGIN in error_line(result)
    result = invoke("train", SAMPLE / "train.conll", "-o", tmp_path / "m", "--likelihood", "mypkg.nowhere:fn",
                    "--set", "model.estimator=score")
    assert result.exit_code == 4
    assert "'mypkg.nowhere:fn' needs the Python module 'mypkg.nowhere'" in error_line(result)
    assert not (tmp_path / "m").exists()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """{likelihood: model directory} of the NumPy plug-in and the built-in exact chain, trained alike."""
    root = tmp_path_factory.mktemp("likelihoods")
    models = {}
    for likelihood in (PLUGIN, "exact"):
        models[likelihood] = root / likelihood.split(":")[0]
        result = invoke("train", SAMPLE / "train.conll", "-o", models[likelihood], "--likelihood", likelihood,
                        *TRAIN_OPTIONS)
        assert result.exit_code == 0, result.stderr
    return models


def tag_labels(model: Path, corpus: Path, *options) -> list[list[str]]:
    """The labels `gpseq tag` gives the tokens of a CoNLL corpus, sentence by sentence."""
    result = invoke("tag", model, corpus, "--input-format", "conll", *options)
    assert result.exit_code == 0, result.stderr
    return [[row.split("\t")[1] for row in block.splitlines()] for block in result.stdout.strip().split("\n\n")]


def test_numpy_plugin_trains_through_the_cli_like_the_built_in_chain(trained):
    """Same settings, same seed: test chunk F1 (seqeval) within 1 point, both far above chance."""
    from seqeval.metrics import f1_score

    gold = read_gold(SAMPLE / "test.conll")
    f1 = {name: f1_score(gold, tag_labels(model, SAMPLE / "test.conll", "--allow-plugin", name))
          for name, model in trained.items()}
    assert f1["exact"] > 0.8, f1
    assert abs(f1[PLUGIN] - f1["exact"]) < 0.01, f1


def test_a_plugin_model_reloads_when_allowed_and_tags_and_names_its_likelihood(trained):
    """Loading imports no code a model names: the user allows the plug-in (Python: the function;
    CLI: --allow-plugin NAME), and without that the model is refused by name."""
    from gpseq.errors import ModelFormatError
    from gpseq.tagger import Tagger

    model = trained[PLUGIN]
    assert json.loads((model / "tagger.json").read_text())["config"]["model"]["likelihood"] == PLUGIN
    with pytest.raises(ModelFormatError, match=f"names the plug-in likelihood {PLUGIN!r}"):
        Tagger.load(model)
    tagger = Tagger.load(model, likelihoods={PLUGIN: numpy_chain_likelihood.log_likelihood})
    assert tagger.config.model.likelihood == PLUGIN
    assert tagger.model.likelihood.function is numpy_chain_likelihood.log_likelihood
    result = invoke("tag", model, SAMPLE / "test.conll", "--input-format", "conll")
    assert result.exit_code == 3 and f"--allow-plugin {PLUGIN}" in error_line(result)
    gold = read_gold(SAMPLE / "test.conll")
    tagged = tag_labels(model, SAMPLE / "test.conll", "--allow-plugin", PLUGIN)
    assert [len(s) for s in tagged] == [len(s) for s in gold]
    accuracy = np.mean([p == g for ps, gs in zip(tagged, gold) for p, g in zip(ps, gs)])
    assert accuracy > 0.85


def test_loading_a_plugin_model_without_its_module_is_a_one_line_error(trained, tmp_path):
    """A fresh interpreter whose path lacks tests/, the plug-in allowed: the allowed name cannot be
    imported, a configuration error (exit 4) before anything is tagged."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-m", "gpseq", "tag", str(trained[PLUGIN]), str(SAMPLE / "test.conll"),
                             "--allow-plugin", PLUGIN], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert result.returncode == 4 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"likelihood {PLUGIN!r} needs the Python module 'numpy_chain_likelihood'" in lines[0]
    assert "PYTHONPATH" in lines[0]
