"""A write that fails for want of space (ENOSPC) or past a file-size limit (EFBIG) is one line naming
the output, and leaves no temporary and no partial output behind."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys

import pytest

from helpers.files import snapshot
from helpers.tiny_model import corpus  # noqa: F401  (the tiny corpus fixture)
from helpers.tiny_model import model_of_the_default_training  # noqa: F401  (the fixture `model`: tagging without TensorFlow)


def gpseq(*args, file_size_limit: int | None = None):
    def limit():
        if file_size_limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    return subprocess.run([sys.executable, "-m", "gpseq", *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), preexec_fn=limit, timeout=300)


def last_line(result) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_full_device_is_named(model, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("The committee approved the budget .\n" * 200)
    result = gpseq("tag", model, notes, "-o", "/dev/full")
    assert result.returncode == 1
    assert last_line(result) == "error: /dev/full: No space left on device"


def test_a_file_size_limit_while_tagging_names_the_output_and_leaves_it_absent(model, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("The committee approved the budget .\n" * 2000)
    out = tmp_path / "out.conll"
    before = snapshot(tmp_path)
    result = gpseq("tag", model, notes, "-o", out, file_size_limit=200_000)
    assert result.returncode == 1, result.stderr
    assert last_line(result) == f"error: {out}: File too large"
    assert snapshot(tmp_path) == before


def test_a_file_size_limit_while_saving_a_model_names_it_and_writes_nothing(corpus, tmp_path):  # noqa: F811
    out = tmp_path / "model"
    before = snapshot(tmp_path)
    result = gpseq("train", corpus, "-o", out, "--features", "ner", file_size_limit=20_000)
    assert result.returncode == 1, result.stderr
    assert last_line(result) == f"error: {out}: File too large"
    assert snapshot(tmp_path) == before
