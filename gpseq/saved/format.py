"""The JSON header of what gpseq saves (tagger.json, featurizer.json): read and checked in one place."""

from __future__ import annotations

import json
from pathlib import Path

from gpseq import __version__
from gpseq.errors import ModelFormatError


def read_format_json(path: str | Path, *, marker: str, version_key: str, max_version: int, kind: str) -> dict:
    """The JSON object in `path`, checked: present, non-empty, UTF-8 JSON, an object whose "format"
    is `marker` and whose `version_key` is an integer this gpseq reads (<= `max_version`).
    Anything else is a one-line ModelFormatError naming the file (`kind`: "tagger model", …)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ModelFormatError(f"{path}: missing; the model directory is incomplete") from None
    except OSError as error:
        raise ModelFormatError(f"{path}: unreadable model metadata ({error})") from None
    if not raw.strip():
        raise ModelFormatError(f"{path}: empty file ({len(raw)} bytes); the model directory is damaged")
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError as error:  # JSON and UTF-8 decoding
        raise ModelFormatError(f"{path}: unreadable model metadata ({error})") from None
    if not isinstance(data, dict) or data.get("format") != marker:
        raise ModelFormatError(f"{path}: not a gpseq {kind}")
    version = data.get(version_key)
    if not isinstance(version, int) or isinstance(version, bool) or version > max_version:
        raise ModelFormatError(f"{path}: {kind} format version {version!r} is newer than this gpseq "
                               f"({__version__}) reads (<= {max_version}); upgrade gpseq")
    return data
