"""The model directory on disk: what gpseq wrote there, what it may replace, how it is swapped in.

`Tagger.save` and the spaCy component write a model directory through `writing_model_dir`: a
temporary sibling, renamed onto the target by `replace_model_dir`, which replaces only a directory
that is absent, empty, or holds nothing but what gpseq wrote (tagger.json's "files" manifest of
sizes and sha256; for a model saved without a manifest, the fixed set `_LEGACY_MODEL_FILES`).
`Tagger.load` checks the files against that manifest (`verify_manifest`) and reads arrays.npz
(`read_arrays`). Every file is read within bounds (`gpseq.saved.files`). No TensorFlow.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from gpseq.corpora.catalogue import sha256_file, sha256_stream
from gpseq.corpora._atomic import apply_umask, swap_dir, temp_dir_beside, writable_dir
from gpseq.errors import ModelFormatError, OutputError
from gpseq.saved.files import MAX_ARRAY_BYTES, MAX_JSON_BYTES, open_model_file, read_npz
from gpseq.saved.meta import FORMAT, META_FILE, read_model_meta

# The only entries a model directory saved without a manifest may hold.
_LEGACY_MODEL_FILES = frozenset({"tagger.json", "arrays.npz", "features/featurizer.json", "features/vocabulary.npz"})
_LEGACY_MODEL_DIRS = frozenset({"features"})


def file_manifest(root: Path) -> dict:
    """{relative path: {"sha256", "size"}} of every file under `root` but tagger.json."""
    manifest = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        name = path.relative_to(root).as_posix()
        if name != "tagger.json":
            manifest[name] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    return manifest


def _entries(root: Path) -> tuple[set[str], set[str], list[str]]:
    """(regular files, directories, anything else such as symlinks) under `root`, relative POSIX paths."""
    files, dirs, other = set(), set(), []
    stack = [root]
    while stack:
        folder = stack.pop()
        with os.scandir(folder) as scan:
            for entry in scan:
                name = Path(entry.path).relative_to(root).as_posix()
                if entry.is_symlink():
                    other.append(name)
                elif entry.is_dir():
                    dirs.add(name)
                    stack.append(Path(entry.path))
                elif entry.is_file():
                    files.add(name)
                else:
                    other.append(name)
    return files, dirs, sorted(other)


def _foreign_content(directory: Path) -> str | None:
    """Why `directory` may not be replaced by a model (None: it is an empty directory, or a gpseq
    model directory holding only what gpseq wrote, unchanged)."""
    try:
        files, dirs, other = _entries(directory)
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    if not files and not dirs and not other:
        return None
    meta_path = directory / "tagger.json"
    if "tagger.json" not in files:
        return "exists and is not a gpseq model directory (no tagger.json)"
    try:
        with open_model_file(directory, "tagger.json", max_bytes=MAX_JSON_BYTES) as handle:
            meta = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError, RecursionError, ModelFormatError):
        return "is not a gpseq model directory (its tagger.json is not gpseq's)"
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        return "is not a gpseq model directory (its tagger.json has no gpseq-tagger format marker)"
    manifest = meta.get("files")
    if manifest is None:  # saved without a manifest: only the files gpseq writes
        allowed_files, allowed_dirs = _LEGACY_MODEL_FILES, _LEGACY_MODEL_DIRS
    else:
        if not isinstance(manifest, dict) or not all(
                isinstance(k, str) and isinstance(v, dict) for k, v in manifest.items()):
            return "is not a gpseq model directory (tagger.json has a malformed file manifest)"
        allowed_files = set(manifest) | {"tagger.json"}
        allowed_dirs = {parent.as_posix() for name in allowed_files for parent in Path(name).parents
                        if parent != Path(".")}
    foreign = sorted(other) + sorted((files - set(allowed_files)) | (dirs - set(allowed_dirs)))
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        return f"holds {foreign[0]}{more}, which gpseq did not write"
    if manifest is not None:
        for name, record in sorted(manifest.items()):
            path = directory / name
            if name not in files:
                continue  # a missing file loses nothing
            try:
                changed = path.stat().st_size != record.get("size") or sha256_file(path) != record.get("sha256")
            except OSError:
                changed = True
            if changed:
                return f"holds {name}, changed since gpseq wrote it (size or sha256 differ from tagger.json)"
    return None


def check_save_target(directory: str | os.PathLike) -> None:
    """OutputError unless `Tagger.save(directory)` may write there: the parent can be written, and
    `directory` is absent, empty, or a gpseq model directory holding only the files gpseq wrote."""
    directory = Path(directory)
    if os.path.lexists(directory):
        if directory.is_symlink():
            raise OutputError(directory, "is a symbolic link; give the model directory itself")
        if not directory.is_dir():
            raise OutputError(directory, "exists and is not a directory; refusing to replace it")
        problem = _foreign_content(directory)
        if problem is not None:
            raise OutputError(directory, f"{problem}; refusing to replace it")
    writable_dir(directory.absolute().parent, directory)


def check_checkpoint_target(directory: str | os.PathLike) -> None:
    """OutputError unless a checkpoint may replace `directory` (`CHECKPOINT/checkpoint`): absent, or
    a directory holding only what `training.checkpoint.Checkpoints.save` writes (`ckpt*`,
    `state.json`, `best.npz`) — never a user's directory of that name."""
    directory = Path(directory)
    if not os.path.lexists(directory):
        return
    if directory.is_symlink() or not directory.is_dir():
        raise OutputError(directory, "exists and is not a gpseq checkpoint directory; refusing to replace it "
                                     "(use another --checkpoint-dir)")
    foreign = sorted(entry.name for entry in directory.iterdir()
                     if not entry.is_file() or entry.is_symlink()
                     or not (entry.name.startswith("ckpt") or entry.name in ("state.json", "best.npz")))
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" (and {len(foreign) - 3} more)" if len(foreign) > 3 else "")
        raise OutputError(directory, f"holds files gpseq did not write ({shown}); refusing to replace it "
                                     "(use another --checkpoint-dir)")


def copy_model_files(source: Path, destination: Path) -> None:
    """Copy what gpseq wrote in the model directory `source` (tagger.json and the files of its
    manifest, checked against it; for a model without a manifest, the files `save` writes) into
    the existing directory `destination`; anything else in `source` is left behind."""
    meta_path = source / META_FILE
    meta = read_model_meta(source)
    manifest = meta.get("files")
    if manifest is not None:
        verify_manifest(source, meta_path, manifest)
        names = sorted(manifest)
    else:
        names = sorted(name for name in _LEGACY_MODEL_FILES - {"tagger.json"} if (source / name).is_file())
    for name in ["tagger.json", *names]:
        (destination / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / name, destination / name)


def replace_model_dir(written: Path, directory: Path) -> None:
    """Rename the complete model directory `written` (a sibling of `directory`) onto `directory`.

    `directory` is replaced only if it is absent, empty, or a gpseq model directory holding only
    what gpseq wrote: checked now and once more after moving it aside (nothing can be added to it
    then), so files put there at any time before are never deleted (`OutputError`, `directory`
    left as it was)."""
    directory = Path(directory)
    check_save_target(directory)  # again: files may have been put there since the first check

    def still_ours(aside: Path) -> None:
        problem = _foreign_content(aside)
        if problem is not None:
            raise OutputError(directory, f"{problem}; refusing to replace it")

    swap_dir(written, directory, check=still_ours)


@contextmanager
def writing_model_dir(directory: str | os.PathLike) -> Iterator[Path]:
    """Yield a new empty temporary sibling of `directory` (`.NAME.tmp-PID-…`) to write a model
    directory into; on success give it the umask's permissions and `replace_model_dir` it onto
    `directory`. `directory` is checked first (`check_save_target`); temporaries of dead saves are
    removed; this one is removed whatever happens."""
    directory = Path(directory)
    check_save_target(directory)
    tmp = temp_dir_beside(directory)
    try:
        yield tmp
        apply_umask(tmp)
        replace_model_dir(tmp, directory)
    except OSError as error:  # a write's error (a full disk, a file-size limit) names no file: this one
        if error.filename is None:
            error.filename = str(directory)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def verify_manifest(directory: Path, meta_path: Path, manifest) -> None:
    """ModelFormatError naming the first file that is missing or differs from tagger.json's manifest;
    each file is read through `open_model_file` (a regular file inside `directory`), its size
    compared before its sha256 is computed over that many bytes."""
    if not isinstance(manifest, dict):
        raise ModelFormatError(f"{meta_path}: malformed file manifest ('files')")
    for name, record in sorted(manifest.items()):
        path = directory / name
        if not isinstance(record, dict) or not name or ".." in Path(name).parts or Path(name).is_absolute():
            raise ModelFormatError(f"{meta_path}: malformed file manifest entry {name!r}")
        recorded = record.get("size")
        valid = isinstance(recorded, int) and not isinstance(recorded, bool)
        with open_model_file(directory, name, max_bytes=MAX_ARRAY_BYTES + MAX_JSON_BYTES,
                             if_missing=f"missing (listed in {meta_path.name})") as handle:
            size = os.fstat(handle.fileno()).st_size
            if not valid or size != recorded:
                what = "empty file" if size == 0 else f"{size:,} bytes"
                raise ModelFormatError(f"{path}: {what}, {meta_path.name} records {recorded:,} bytes "
                                       "(truncated or changed since gpseq wrote it)" if valid else
                                       f"{path}: {what}; {meta_path.name} records no valid size")
            digest = sha256_stream(handle, size)  # no further than the size checked
        if digest != record.get("sha256"):
            raise ModelFormatError(f"{path}: sha256 does not match {meta_path.name} (changed since gpseq wrote it)")


def read_arrays(path: Path, shapes: dict | None = None) -> dict[str, np.ndarray]:
    """The arrays of arrays.npz (`read_npz`), of the shapes `shapes` ({name: shape}; None: the
    "arrays" of the tagger.json beside it, which `gpseq.saved.meta.check_meta_shapes` checks first): a
    missing, empty, truncated, non-npz or mis-shaped file is a ModelFormatError, raised before any
    array is decompressed."""
    if shapes is None:
        shapes = read_model_meta(path.parent).get("arrays")
        if not isinstance(shapes, dict):
            raise ModelFormatError(f"{path.parent / META_FILE}: no array shapes ('arrays')")
    with open_model_file(path.parent, path.name, max_bytes=MAX_ARRAY_BYTES) as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            raise ModelFormatError(f"{path}: empty file (0 bytes); the model directory is damaged")
        return read_npz(handle, path, shapes=shapes, listed_in=META_FILE)


