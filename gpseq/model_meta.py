"""The model directory's metadata, `tagger.json`: read and checked in one place (no TensorFlow).

tagger.json holds the format marker and version, the gpseq version that wrote it, the labels,
the configuration (features, model, training), the scores, the array shapes and the "files"
manifest (size and sha256 of every other file). `Tagger.load`, the spaCy component and
`gpseq info` read it through `read_model_meta`.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpseq import __version__
from gpseq.errors import ModelFormatError

META_FILE = "tagger.json"
FORMAT = "gpseq-tagger"
FORMAT_VERSION = 1


def read_model_meta(directory: str | os.PathLike) -> dict:
    """tagger.json of a model directory, checked: present, non-empty, JSON, gpseq's format marker,
    a format version this gpseq reads. Anything else is a one-line ModelFormatError naming the file."""
    import json

    directory = Path(directory)
    meta_path = directory / META_FILE
    if not meta_path.is_file():
        raise ModelFormatError(f"{directory}: not a gpseq model directory (no {META_FILE})")
    try:
        with open(meta_path, "rb") as handle:
            raw = handle.read()
        if not raw.strip():
            raise ModelFormatError(f"{meta_path}: empty file ({len(raw)} bytes); the model directory is damaged")
        meta = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError) as error:  # ValueError: JSON and UTF-8 decoding
        raise ModelFormatError(f"{meta_path}: unreadable model metadata ({error})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ModelFormatError(f"{meta_path}: not a gpseq tagger model")
    version = meta.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ModelFormatError(
            f"{meta_path}: model format version {version} is newer than this gpseq "
            f"({__version__}) reads (<= {FORMAT_VERSION}); upgrade gpseq"
        )
    return meta


def n_parameters(meta: dict) -> int:
    """The number of numbers in the model's arrays (tagger.json's "arrays": name -> shape)."""
    total = 0
    for shape in (meta.get("arrays") or {}).values():
        size = 1
        for dim in shape:
            size *= int(dim)
        total += size
    return total


def json_default(value):
    """JSON of what tagger.json and `--json` output hold besides plain values: numpy scalars and
    arrays, paths."""
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
