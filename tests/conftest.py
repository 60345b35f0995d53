"""Shared fixtures: where the third-party corpora are (tests that need them skip when absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "corpora" / "sample"


def _corpora_dir() -> Path | None:
    env = os.environ.get("GPSEQ_CORPORA")
    path = Path(env) if env else ROOT.parent / "shared" / "corpora"
    return path if path.is_dir() else None


@pytest.fixture(scope="session")
def corpora_dir() -> Path:
    """The shared third-party corpora (CoNLL-2000, CRF++ sets); skips the test when absent."""
    path = _corpora_dir()
    if path is None:
        pytest.skip("third-party corpora absent (set GPSEQ_CORPORA)")
    return path


@pytest.fixture(scope="session")
def sample_dir() -> Path:
    """The bundled sample corpus of the project's own sentences."""
    return SAMPLE


def train_sample_pos_and_chunker(base: Path, chunk_model) -> dict:
    """Tiny models trained on the bundled sample, saved under `base`: a POS tagger (column 1 as the
    label, `ModelConfig(kernel="linear")`) and a chunker (POS features, `chunk_model`). Returns their
    directories ("pos", "chunk") and taggers ("pos_tagger", "chunk_tagger"); skips without the sample."""
    from gpseq.corpora import Sentence, read_conll
    from gpseq.features import get_preset
    from gpseq.structured.model import ModelConfig
    from gpseq.tagger import Tagger, TaggerConfig
    from gpseq.training.trainer import TrainingConfig

    if not (SAMPLE / "train.conll").is_file():
        pytest.skip("the bundled sample corpus is absent")
    train = read_conll(SAMPLE / "train.conll")
    pos_train = [Sentence(s.tokens, [row[1] for row in s.columns], s.columns) for s in train]
    training = TrainingConfig(max_steps=15, early_stopping="none", dev_fraction=0.0, batch_size=32, seed=1)
    pos = Tagger.train(pos_train, TaggerConfig(features=get_preset("pos"), model=ModelConfig(kernel="linear"),
                                               training=training, predict_samples=4))
    chunk = Tagger.train(train, TaggerConfig(features=get_preset("chunking"), model=chunk_model,
                                             training=training, predict_samples=4))
    return {"pos": pos.save(base / "pos"), "chunk": chunk.save(base / "chunk"), "pos_tagger": pos,
            "chunk_tagger": chunk}


# ---- GPflow: reference implementation for the GP tests, in its own environment -------------------
# `pip install -e ".[test]"` has no GPflow (recent GPflow pins numpy < 2; users get numpy 2): the
# tests that compare against GPflow take the `gpflow` fixture, are marked `gpflow`, and skip with
# the reason below. .ci/run runs them (`-m gpflow`) in a second venv with the gpflow-test extra and
# GPSEQ_REQUIRE_GPFLOW=1, where a missing GPflow fails them instead of skipping.

GPFLOW_ABSENT = ("gpflow not installed: the GPflow comparison tests run in a second environment "
                 "(pip install -e \".[gpflow-test]\"; .ci/run does this)")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpflow: compares against GPflow (the `gpflow` fixture); skipped when "
                                       "gpflow is absent, run by .ci/run in its gpflow-test venv")


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path, parent):
    """Before a test module that imports TensorFlow Probability directly is imported, load TFP the way
    gpseq does (`gpseq._tfp`): TFP 0.25 imports `tf_keras` when it loads, which is not a gpseq
    dependency and which the test extra no longer brings (GPflow did, through
    tensorflow-probability[tf]); a later `import tensorflow_probability` then finds it loaded."""
    try:
        source = Path(module_path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if "tensorflow_probability" in source:
        import gpseq._tfp  # noqa: F401
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpflow" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.gpflow)


@pytest.fixture(scope="session")
def gpflow():
    """The gpflow module; skips the test when it is not installed (fails under GPSEQ_REQUIRE_GPFLOW=1)."""
    try:
        import gpflow as module
    except ImportError as error:
        if os.environ.get("GPSEQ_REQUIRE_GPFLOW") == "1":
            pytest.fail(f"GPSEQ_REQUIRE_GPFLOW=1 but gpflow cannot be imported: {error}")
        pytest.skip(GPFLOW_ABSENT)
    return module


def random_q(q, rng):
    """Set a one-component `VariationalGaussian` q(u) to random values: means N(0, 1), a lower
    triangular scale with diagonal in [0.2, 0.9] (or diagonal standard deviations in that range)."""
    import numpy as np
    import tensorflow as tf

    M, P = q.num_inducing, q.num_latent
    q.q_mu.assign(rng.normal(size=(1, M, P)))
    if q.full_cov:
        L = np.tril(0.2 * rng.normal(size=(1, P, M, M)), -1) + np.eye(M) * rng.uniform(0.2, 0.9, (1, P, M, 1))
        q.q_sqrt.assign(tf.constant(L))
    else:
        q.q_sqrt.assign(tf.constant(rng.uniform(0.2, 0.9, size=(1, M, P))))
