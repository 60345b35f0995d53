"""The catalogue of public corpora (catalogue.json): list, fetch (download or mirror), locate, load."""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import math
import os
import shutil
from functools import lru_cache
from importlib import resources
from pathlib import Path

from gpseq.corpora._atomic import atomic_target
from gpseq.corpora.conll import read_conll
from gpseq.corpora.types import Sentence
from gpseq.errors import ConfigError, GpseqError

_CHUNK = 1 << 20


@lru_cache(maxsize=1)
def _catalogue() -> dict:
    text = resources.files("gpseq.corpora").joinpath("catalogue.json").read_text(encoding="utf-8")
    return json.loads(text)


def list_corpora() -> list[dict]:
    """Every catalogue entry (name, description, task, columns, encoding, tag_scheme, licence, files …)."""
    return copy.deepcopy(_catalogue()["corpora"])


def get_corpus(name: str) -> dict:
    """The catalogue entry of `name` (case-insensitive); ConfigError listing the names if unknown."""
    for entry in _catalogue()["corpora"]:
        if entry["name"].lower() == name.lower():
            return copy.deepcopy(entry)
    names = ", ".join(entry["name"] for entry in _catalogue()["corpora"])
    raise ConfigError(f"unknown corpus {name!r}; known: {names}")


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes."""
    with open(path, "rb") as handle:
        return sha256_stream(handle)


def sha256_stream(handle, limit: float = math.inf) -> str:
    """Hex sha256 of what the binary `handle` holds from its position on, at most `limit` bytes of it
    (read in blocks: memory stays bounded)."""
    digest = hashlib.sha256()
    while limit > 0:
        block = handle.read(int(min(_CHUNK, limit)))
        if not block:
            break
        digest.update(block)
        limit -= len(block)
    return digest.hexdigest()


def _check(path: Path, expected: str | None, origin: str) -> None:
    if expected is None:
        return
    actual = sha256_file(path)
    if actual != expected:
        raise GpseqError(f"{origin}: sha256 {actual} does not match the catalogue's {expected}")


def _download(url: str, compression: str | None, target: Path) -> None:
    import urllib.request  # here: slow to import, and only a download needs it

    with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 (catalogue URLs are https)
        stream = gzip.GzipFile(fileobj=response) if compression == "gzip" else response
        with open(target, "wb") as out:
            shutil.copyfileobj(stream, out, _CHUNK)


def fetch_corpus(
    name: str,
    dest_dir: str | os.PathLike,
    *,
    mirror: str | os.PathLike | None = None,
    force: bool = False,
    verify: bool = True,
) -> Path:
    """Put a catalogue corpus under `dest_dir` in mirror layout (dest/conll2000/train.txt); return its folder.

    With `mirror` (a directory laid out like ../shared/corpora) files are copied from it, no
    network; otherwise downloaded from the official URLs (gzip is decompressed). Each file's
    sha256 is checked where the catalogue knows it (GpseqError naming the file on mismatch; the
    partial file is removed). Existing files are kept (and checked) unless `force`.
    """
    entry = get_corpus(name)
    dest_dir = Path(dest_dir)
    folders = set()
    for split, spec in entry["files"].items():
        relative = Path(spec["path"])
        target = dest_dir / relative
        folders.add(target.parent)
        expected = spec["sha256"] if verify else None
        if target.exists() and not target.is_file():  # a directory, …: neither checked nor replaced
            raise GpseqError(f"{target}: exists and is not a file; move it away to fetch {entry['name']} here")
        if target.exists() and not force:
            _check(target, expected, f"{target} (already present; fetch with force to replace it)")
            continue
        if mirror is not None:
            source = Path(mirror) / relative
            if not source.is_file():
                raise GpseqError(f"{source}: not in the mirror (corpus {entry['name']}, {split})")
            if target.exists() and source.resolve() == target.resolve():
                _check(target, expected, str(source))
                continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_target(target) as temp:
            if mirror is not None:
                shutil.copyfile(source, temp)
                _check(temp, expected, str(source))
            else:
                try:
                    _download(spec["url"], spec.get("compression"), temp)
                except OSError as err:  # URLError, HTTPError, timeouts, bad gzip
                    raise GpseqError(f"{spec['url']}: download failed ({err})") from None
                _check(temp, expected, f"{spec['url']} (saved as {target})")
    return folders.pop() if len(folders) == 1 else Path(os.path.commonpath([str(f) for f in folders]))


def corpora_root(root: str | os.PathLike | None = None) -> Path:
    """Where corpora live: `root`, else $GPSEQ_CORPORA, else ../shared/corpora beside a gpseq checkout."""
    if root is not None:
        return Path(root)
    env = os.environ.get("GPSEQ_CORPORA")
    if env:
        return Path(env)
    checkout = Path(__file__).resolve().parents[2]
    default = checkout.parent / "shared" / "corpora"
    if default.is_dir():
        return default
    raise ConfigError(
        "no corpora directory: set GPSEQ_CORPORA (e.g. after `gpseq corpus fetch NAME --dest DIR`)"
    )


def corpus_path(name: str, split: str, *, root: str | os.PathLike | None = None) -> Path:
    """Path of one file (`split`: train, test, testa, template …) of a catalogue corpus."""
    entry = get_corpus(name)
    if split not in entry["files"]:
        raise ConfigError(f"corpus {entry['name']} has no {split!r}; it has {', '.join(entry['files'])}")
    path = corpora_root(root) / entry["files"][split]["path"]
    if not path.is_file():
        raise ConfigError(f"{path}: missing (fetch it: gpseq corpus fetch {entry['name']} --dest DIR)")
    return path


def load_corpus(name: str, split: str, *, root: str | os.PathLike | None = None) -> list[Sentence]:
    """Read one split of a catalogue corpus with the catalogue's encoding, columns and -DOCSTART- rule."""
    entry = get_corpus(name)
    return read_conll(
        corpus_path(name, split, root=root),
        token_column=entry["token_column"],
        label_column=entry["label_column"],
        encoding=entry["encoding"],
        docstart=entry["docstart"],
    )
