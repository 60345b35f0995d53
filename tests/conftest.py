"""Shared fixtures: where the third-party corpora are (tests that need them skip when absent), the
bundled sample, GPflow for the comparison tests. Helpers that test modules import are in tests/helpers/."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# raw text's tokenizer rules are cached here, not in the user's cache directory (CLI subprocesses inherit it)
_CACHE = None if "GPSEQ_CACHE_DIR" in os.environ else tempfile.mkdtemp(prefix="gpseq-test-cache-")
if _CACHE is not None:
    os.environ["GPSEQ_CACHE_DIR"] = _CACHE

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


def pytest_unconfigure(config):
    if _CACHE is not None:
        shutil.rmtree(_CACHE, ignore_errors=True)


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
