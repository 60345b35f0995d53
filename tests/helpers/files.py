"""sha256 snapshots of folders (what a failed command must leave as it was), and model directories
made to look older or half-written."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file under `root` (hidden ones too), and every directory (as "dir")."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.relpath(os.path.join(folder, name), root)] = "dir"
        for name in files:
            path = Path(folder, name)
            out[os.path.relpath(path, root)] = sha(path)
    return out


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def strip_manifest(model: Path) -> None:
    """Make `model` look like a model written before tagger.json had a file manifest."""
    meta = json.loads((model / "tagger.json").read_text())
    del meta["files"]
    (model / "tagger.json").write_text(json.dumps(meta, indent=2))
