"""What every benchmark script needs: where the corpora are, what machine it ran on, peak RSS.

Imported by the scripts as `from _common import ...` (they run as `python benchmarks/<name>.py`,
which puts this folder on sys.path)."""

from __future__ import annotations

import os
import platform
import resource
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def corpora_root() -> Path:
    """`GPSEQ_CORPORA`, default `../shared/corpora` beside the repository."""
    return Path(os.environ.get("GPSEQ_CORPORA", ROOT.parent / "shared" / "corpora"))


def cpu_model() -> str:
    """The CPU's model string from /proc/cpuinfo."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine() -> str:
    return f"{os.cpu_count()} cores, {cpu_model()}, Python {platform.python_version()}"


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, MiB (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
