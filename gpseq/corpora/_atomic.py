"""Atomic file writes: a sibling temp file (normal permissions, umask applied), then os.replace."""

from __future__ import annotations

import os
import secrets
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_target(path: str | os.PathLike):
    """Yield an empty temp file beside `path` (mode 0o666 & ~umask); os.replace it onto `path` on success."""
    path = Path(path)
    while True:
        temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(temp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            break
        except FileExistsError:
            continue
    try:
        yield temp
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
