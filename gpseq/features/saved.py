"""A fitted featurizer on disk: `featurizer.json` (format, config, value strings) and, with a
vocabulary, `vocabulary.npz` (each template's keys and columns; its sha256 recorded in the JSON).
Each file is written atomically; reading checks the header, the checksum and the arrays, and is
bounded as a model's files are (`gpseq.saved.files.open_model_file`, `read_npz`): regular files
only, not through a symbolic link (the featurizer directory included), sizes capped, every
vocabulary table's size checked against featurizer.json's n_features before it is decompressed."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import numpy as np

from gpseq.corpora import sha256_file
from gpseq.corpora._atomic import atomic_target, write_bytes_atomic
from gpseq.errors import ModelFormatError
from gpseq.features.config import MAX_FEATURES
from gpseq.saved.files import MAX_ARRAY_BYTES, MAX_JSON_BYTES, open_model_file, read_npz, write_npz
from gpseq.saved.format import read_format_json

FORMAT_NAME = "gpseq.features"
FORMAT_VERSION = 1
META_FILE = "featurizer.json"
VOCABULARY_FILE = "vocabulary.npz"


def write_featurizer(directory: str | Path, data: dict, arrays: dict[str, np.ndarray] | None) -> None:
    """Write `data` as featurizer.json and, unless None, `arrays` as vocabulary.npz into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = dict(data)
    if arrays is not None:  # written to its file, then hashed from it: no copy of it in memory
        with atomic_target(directory / VOCABULARY_FILE) as temp:
            with open(temp, "wb") as handle:
                write_npz(handle, arrays, compress=False)
                handle.flush()
                os.fsync(handle.fileno())
            data["vocabulary_sha256"] = sha256_file(temp)
    write_bytes_atomic(directory / META_FILE, json.dumps(data, ensure_ascii=False).encode("utf-8"))


def _open(directory: str | Path, name: str, max_bytes: int):
    """`name` in the featurizer directory, opened by `open_model_file` from the directory's parent:
    the featurizer directory (a model's features/) must not be a symbolic link either."""
    directory = Path(directory).absolute()
    if directory.name in ("", "..") or directory.parent == directory:
        return open_model_file(directory, name, max_bytes=max_bytes)
    return open_model_file(directory.parent, f"{directory.name}/{name}", max_bytes=max_bytes)


def read_featurizer_json(directory: str | Path) -> tuple[Path, dict]:
    """(path, contents) of featurizer.json, a regular file of at most MAX_JSON_BYTES, its format
    marker and version checked."""
    meta_path = Path(directory) / META_FILE
    with _open(directory, META_FILE, MAX_JSON_BYTES):
        pass  # a regular file, not a link, of a size gpseq parses: read next
    try:
        return meta_path, read_format_json(meta_path, marker=FORMAT_NAME, version_key="version",
                                           max_version=FORMAT_VERSION, kind="featurizer")
    except RecursionError:  # the JSON parser's nesting limit
        raise ModelFormatError(f"{meta_path}: unreadable model metadata (nested too deeply)") from None


def read_vocabulary(directory: str | Path, data: dict) -> dict[str, np.ndarray]:
    """The arrays of vocabulary.npz, checked against featurizer.json's sha256 (never unpickled):
    the tables `keys_i`, `columns_i` of its templates only, each of at most n_features − 1 entries
    (checked in the .npy headers, before anything is decompressed), the columns together exactly
    1 … n_features − 1."""
    npz_path = Path(directory) / VOCABULARY_FILE
    templates, n_features = data.get("templates"), data.get("n_features")
    if not isinstance(templates, list) or not isinstance(n_features, int) or isinstance(n_features, bool) \
            or not 1 <= n_features <= MAX_FEATURES:
        raise ModelFormatError(f"{Path(directory) / META_FILE}: n_features must be an integer in [1, "
                               f"{MAX_FEATURES:,}] with a list of templates, got {n_features!r}")
    with _open(directory, VOCABULARY_FILE, MAX_ARRAY_BYTES) as handle:
        payload = handle.read()
    if hashlib.sha256(payload).hexdigest() != data.get("vocabulary_sha256"):
        raise ModelFormatError(f"{npz_path}: does not match {META_FILE} (checksum)")
    names = {f"{table}_{i}" for i in range(len(templates)) for table in ("keys", "columns")}
    arrays = read_npz(io.BytesIO(payload), npz_path, names=names, max_elements=n_features - 1,
                      what="vocabulary arrays")
    columns = [arrays[name] for name in sorted(names) if name.startswith("columns_") and name in arrays]
    if sum(len(c) for c in columns) != n_features - 1 or any(
            len(c) and (c.dtype.kind not in "iu" or c.min() < 1 or c.max() >= n_features) for c in columns):
        raise ModelFormatError(f"{npz_path}: its columns are not 1 to n_features - 1 ({n_features - 1:,}, "
                               f"{META_FILE})")
    return arrays
