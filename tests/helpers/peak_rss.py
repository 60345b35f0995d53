"""The peak memory of a command, measured from a small wrapper process: the test process cannot
measure its own child (Linux carries the RSS high-water mark of the memory a child starts from into
its ru_maxrss, and this process holds TensorFlow and models); the wrapper's child's peak is the
command's own. `peak_rss_mb` for long inputs (under PEAK_RSS_BOUND_MB), `run_gpseq` and
`assert_refused` for crafted inputs refused within a timeout (under PEAK_RSS_MB)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.tiny_model import subprocess_env


PEAK_RSS_BOUND_MB = 1536  # the bound (1.5 GB) for every run below, at default settings


# Runs argv[1:] and prints its exit code and the peak RSS (KB) of the children it waited for. The test
# process cannot measure its own child: Linux carries the RSS high-water mark of the memory a child
# starts from (the parent's, with vfork or fork) into the child's ru_maxrss, and this process holds
# TensorFlow and models; the wrapper is a small process, so its child's peak is the command's own.
PEAK_RSS_WRAPPER = """
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode
print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def peak_rss_mb(args: list, timeout: float = 600) -> tuple[int, float, str]:
    """Run `args` in a fresh process: (exit code, its peak RSS in MB, its stderr)."""
    done = subprocess.run([sys.executable, "-c", PEAK_RSS_WRAPPER, *map(str, args)], capture_output=True,
                          text=True, env=subprocess_env(), timeout=timeout)
    assert done.returncode == 0, done.stderr
    code, peak_kb = map(int, done.stdout.split())
    return code, peak_kb / 1024, done.stderr


PEAK_RSS_MB = 300


TIMEOUT_S = 120


# Runs argv[2:] with a timeout of argv[1] seconds (killing it then) and prints its exit code (or
# "timeout") and its peak RSS in KB: a small wrapper, so that the child's ru_maxrss is its own (a
# child forked from the test process would start from the test process's high-water mark)
WRAPPER = """
import resource, subprocess, sys
try:
    code = subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, timeout=float(sys.argv[1])).returncode
except subprocess.TimeoutExpired:
    code = "timeout"
print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def run_gpseq(*args) -> tuple[int | str, float, str]:
    """`python -m gpseq ARGS` in a fresh process: (exit code or "timeout", peak RSS in MB, stderr)."""
    done = subprocess.run([sys.executable, "-c", WRAPPER, str(TIMEOUT_S), sys.executable, "-m", "gpseq",
                           *map(str, args)], capture_output=True, text=True, env=subprocess_env(),
                          timeout=TIMEOUT_S + 60)
    code, peak_kb = done.stdout.split()
    return (int(code) if code != "timeout" else code), int(peak_kb) / 1024, done.stderr


def assert_refused(result, path: Path | None, problem: str, code: int = 3) -> None:
    """Exit `code`, one stderr line `error: PATH: …` (`error: …` for an option: `path` None) holding
    `problem`, peak RSS within PEAK_RSS_MB."""
    exit_code, peak_mb, stderr = result
    assert exit_code == code, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"error: {path}: " if path is not None else "error: ") and problem in lines[0], \
        lines[0]
    assert peak_mb <= PEAK_RSS_MB, f"peak RSS {peak_mb:.0f} MB"
