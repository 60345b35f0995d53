"""A fitted featurizer on disk: `featurizer.json` (format, config, value strings) and, with a
vocabulary, `vocabulary.npz` (each template's keys and columns; its sha256 recorded in the JSON).
Each file is written atomically; reading checks the header, the checksum and the arrays."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
import zlib
from pathlib import Path

import numpy as np

from gpseq.corpora._atomic import write_bytes_atomic
from gpseq.errors import ModelFormatError
from gpseq.saved_format import read_format_json

FORMAT_NAME = "gpseq.features"
FORMAT_VERSION = 1
META_FILE = "featurizer.json"
VOCABULARY_FILE = "vocabulary.npz"


def write_featurizer(directory: str | Path, data: dict, arrays: dict[str, np.ndarray] | None) -> None:
    """Write `data` as featurizer.json and, unless None, `arrays` as vocabulary.npz into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = dict(data)
    if arrays is not None:
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        payload = buffer.getvalue()
        data["vocabulary_sha256"] = hashlib.sha256(payload).hexdigest()
        write_bytes_atomic(directory / VOCABULARY_FILE, payload)
    write_bytes_atomic(directory / META_FILE, json.dumps(data, ensure_ascii=False).encode("utf-8"))


def read_featurizer_json(directory: str | Path) -> tuple[Path, dict]:
    """(path, contents) of featurizer.json, its format marker and version checked."""
    meta_path = Path(directory) / META_FILE
    return meta_path, read_format_json(meta_path, marker=FORMAT_NAME, version_key="version",
                                       max_version=FORMAT_VERSION, kind="featurizer")


def read_vocabulary(directory: str | Path, data: dict) -> dict[str, np.ndarray]:
    """The arrays of vocabulary.npz, checked against featurizer.json's sha256 (never unpickled)."""
    npz_path = Path(directory) / VOCABULARY_FILE
    try:
        payload = npz_path.read_bytes()
    except OSError as err:
        raise ModelFormatError(f"{npz_path}: unreadable ({err})") from None
    if hashlib.sha256(payload).hexdigest() != data.get("vocabulary_sha256"):
        raise ModelFormatError(f"{npz_path}: does not match {META_FILE} (checksum)")
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as arrays:
            return {name: arrays[name] for name in arrays.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as err:
        # ValueError includes an object array (a pickle), which is never unpickled
        detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ModelFormatError(f"{npz_path}: unreadable vocabulary arrays, truncated or corrupt ({detail})") from None
