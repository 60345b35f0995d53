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
