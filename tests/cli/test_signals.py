"""SIGTERM and SIGHUP unwind a command as Ctrl-C does: `gpseq tag -o OUT` killed while it writes
leaves OUT as it was (absent, or the previous file) and no temporary file beside it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from helpers.files import snapshot
from helpers.tiny_model import corpus  # noqa: F401  (the tiny corpus fixture)
from helpers.tiny_model import model_of_the_default_training  # noqa: F401  (the fixture `model`: tagging without TensorFlow)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=["TERM", "HUP", "INT"])
@pytest.mark.parametrize("existing", [False, True], ids=["new-output", "existing-output"])
def test_a_signal_during_tag_leaves_no_temporary_and_the_output_as_it_was(model, tmp_path, signum, existing):
    big = tmp_path / "big.conll"
    big.write_text("".join(f"The\ncommittee\napproved\nthe\nbudget\n{i}\n.\n\n" for i in range(40_000)))
    out = tmp_path / "out.conll"
    if existing:
        out.write_text("previous results\n")
    before = snapshot(tmp_path)
    # SIGINT at its default in the child: a shell starts background jobs with it ignored, and Python
    # then keeps ignoring it (as a background job should), which is not what this test is about
    process = subprocess.Popen([sys.executable, "-m", "gpseq", "tag", str(model), str(big), "-o", str(out),
                                "--batch-size", "64"], stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    try:  # until the temporary output exists and has grown: the command is writing
        while not any(p.name.startswith(".out.conll.tmp-") and p.stat().st_size > 0 for p in tmp_path.iterdir()):
            assert process.poll() is None, process.stderr.read()
            assert time.monotonic() < deadline, "the temporary output never appeared"
            time.sleep(0.05)
        process.send_signal(signum)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signum, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("error: "), err
    assert snapshot(tmp_path) == before  # no temporary left, the output absent or unchanged
