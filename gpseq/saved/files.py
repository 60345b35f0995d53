"""A model's files read within bounds: a regular file inside the model directory, never a link,
FIFO, device or socket, never past a cap; an .npz archive checked member by member.

A model directory is data from anywhere, so every read is bounded before it starts
(`open_model_file`): a model is read only from regular files inside its directory, never through a
symbolic link below it (gpseq writes none; the model directory itself may be reached through one),
never from a FIFO, device or socket (opened non-blocking, so a FIFO cannot hang the loader), never
past the size the manifest records or a cap. An .npz archive is read member by member
(`read_npz`): each member's .npy header is read first, and its shape × item size is checked
against the member's declared size, the shape tagger.json records and the caps before anything is
allocated or decompressed; `write_npz` writes an archive `np.load` reads, in bounded pieces. The
model directory (`gpseq.saved.directory`), its tagger.json
(`gpseq.saved.meta`) and the featurizer's files (`gpseq.features.saved`) are read through here.
"""

from __future__ import annotations

import math
import os
import stat
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO

import numpy as np

from gpseq.errors import ModelFormatError

# What a model may make gpseq read and allocate. tagger.json and featurizer.json are read whole and
# parsed (featurizer.json holds every feature value string: tens of MB for a large vocabulary).
MAX_JSON_BYTES = 256 << 20
# The arrays of one .npz archive, decompressed (the en_chunk_conll2000 model's hold 16 MB)
MAX_ARRAY_BYTES = 4 << 30
MAX_NPZ_MEMBERS = 4096  # gpseq writes at most 24 arrays, and 2 vocabulary tables per feature template
# deflate emits at most 258 bytes per 2 bits of input (1032:1): a member that claims more is crafted.
# Other zip methods (bzip2, lzma: ratios of 10^6 and more) numpy never writes: refused
_DEFLATE_MAX_RATIO = 1032
_NUMBER_KINDS = "biuf"  # booleans, integers, floats: every array gpseq writes

_FILE_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
               stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symbolic link"}


def _kind(mode: int) -> str:
    return "a regular file" if stat.S_ISREG(mode) else _FILE_KINDS.get(stat.S_IFMT(mode), "not a regular file")


# POSIX opens each component relative to its parent (openat): nothing can be swapped for a link
# between a component's check and its open. Elsewhere (Windows) the same checks go by path.
_RELATIVE_OPEN = os.open in os.supports_dir_fd and os.stat in os.supports_dir_fd \
    and hasattr(os, "O_NOFOLLOW") and hasattr(os, "O_DIRECTORY")


def _check_kind(where: Path, mode: int, last: bool) -> None:
    """ModelFormatError unless `where` (of `mode`, not followed) is a regular file (`last`) or a directory."""
    kind = _kind(mode)
    if kind == "a symbolic link":
        raise ModelFormatError(f"{where}: a symbolic link; gpseq reads a model only from the regular files "
                               "inside its directory")
    if kind != ("a regular file" if last else "a directory"):
        raise ModelFormatError(f"{where}: {kind}, not a regular file; gpseq reads a model only from regular files"
                               if last else f"{where}: {kind}, not a directory")


def _open_below(root: Path, parts: tuple[str, ...]) -> int:
    """A read-only descriptor of the regular file `root/parts…`, no component below `root` a link
    (`_check_kind`); OSError as `os.open` raises it."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    if not _RELATIVE_OPEN:
        for depth in range(len(parts)):
            where = root.joinpath(*parts[:depth + 1])
            _check_kind(where, os.stat(where, follow_symlinks=False).st_mode, depth == len(parts) - 1)
        return os.open(root.joinpath(*parts), flags)
    fd = os.open(root, flags | os.O_DIRECTORY)
    try:
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            _check_kind(root.joinpath(*parts[:depth + 1]), os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode,
                        last)
            opened = os.open(part, flags | os.O_NOFOLLOW | (os.O_NONBLOCK if last else os.O_DIRECTORY), dir_fd=fd)
            os.close(fd)
            fd = opened
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_model_file(root: str | os.PathLike, name: str, *, max_bytes: int,
                    if_missing: str = "missing; the model directory is incomplete") -> BinaryIO:
    """The regular file `root/name` of a model directory, open for binary reading; a one-line
    ModelFormatError naming it unless it is safe to read: no component below `root` is a symbolic
    link (each is checked, then opened relative to its parent with O_NOFOLLOW), the file is a
    regular file (checked before it is opened and again once open: a FIFO, device or socket is
    never read; O_NONBLOCK, so that opening a FIFO swapped in meanwhile does not wait for a
    writer), of at most `max_bytes` bytes. `root` itself may be a symbolic link: the user names it."""
    path = Path(root) / name
    try:
        fd = _open_below(Path(root), Path(name).parts)
    except (FileNotFoundError, NotADirectoryError):
        raise ModelFormatError(f"{path}: {if_missing}") from None
    except OSError as error:  # e.g. ELOOP: a component replaced by a link since its check
        raise ModelFormatError(f"{path}: unreadable ({error.strerror or error})") from None
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode) or status.st_size > max_bytes:
        os.close(fd)
        raise ModelFormatError(f"{path}: {_kind(status.st_mode)}, not a regular file"  # replaced since its check
                               if not stat.S_ISREG(status.st_mode) else
                               f"{path}: {status.st_size:,} bytes, more than the {max_bytes:,} gpseq reads from "
                               "such a model file")
    return os.fdopen(fd, "rb")


def _npy_header(member: BinaryIO, name: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, header length in bytes) of the .npy stream `member`; its data is not read."""
    version = np.lib.format.read_magic(member)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(member)
    elif version in ((2, 0), (3, 0)):
        shape, _, dtype = np.lib.format.read_array_header_2_0(member)
    else:
        raise ValueError(f"array {name!r}: .npy format version {version}")
    if dtype.kind not in _NUMBER_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise ValueError(f"array {name!r} holds {'Python objects' if dtype.hasobject else 'no plain numbers'} "
                         f"(dtype {dtype.str!r}), which gpseq never reads")
    return tuple(int(d) for d in shape), dtype, member.tell()


def read_npz(handle: BinaryIO, path: Path, *, shapes: dict | None = None, names: set[str] | None = None,
             max_elements: int | None = None, max_bytes: int = MAX_ARRAY_BYTES, listed_in: str = "",
             what: str = "arrays") -> dict[str, np.ndarray]:
    """The arrays of the .npz archive open in `handle`, every member checked before any is
    decompressed: at most MAX_NPZ_MEMBERS; stored, or deflated within deflate's ratio; together at
    most `max_bytes` bytes decompressed; each one's .npy header read first, of a number dtype, its
    shape × item size exactly what the member holds, equal to `shapes[name]` (when given: then
    each array listed there is present and no other), at most `max_elements` numbers, its name in
    `names` (when given). Anything else is a one-line ModelFormatError naming `path` ("unreadable
    `what`"; `listed_in`: the file `shapes` come from)."""
    try:
        with zipfile.ZipFile(handle) as archive:
            members = archive.infolist()
            if len(members) > MAX_NPZ_MEMBERS:
                raise ValueError(f"{len(members):,} archive members (gpseq writes at most {MAX_NPZ_MEMBERS:,})")
            declared: dict[str, zipfile.ZipInfo] = {}
            for info in members:
                name = info.filename.removesuffix(".npy")
                if name == info.filename or name in declared:
                    raise ValueError(f"archive member {info.filename!r} is not an array of its own")
                if shapes is not None and name not in shapes:
                    raise ModelFormatError(f"{path}: holds an array {name!r} not listed in {listed_in}")
                if names is not None and name not in names:
                    raise ModelFormatError(f"{path}: holds an array {name!r} gpseq does not write")
                if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                    raise ValueError(f"array {name!r} is compressed by zip method {info.compress_type}; numpy "
                                     "writes arrays stored or deflated")
                stored = info.compress_type == zipfile.ZIP_STORED
                if info.file_size > (1 if stored else _DEFLATE_MAX_RATIO) * info.compress_size + 64:
                    raise ValueError(f"array {name!r} claims {info.file_size:,} bytes from {info.compress_size:,} "
                                     f"{'stored' if stored else 'deflated'}, more than that can hold")
                declared[name] = info
            missing = sorted(set(shapes or ()) - set(declared))
            if missing:
                raise ModelFormatError(f"{path}: lacks the array {missing[0]!r} listed in {listed_in}")
            total = sum(info.file_size for info in members)
            if total > max_bytes:
                raise ModelFormatError(f"{path}: its arrays hold {total:,} bytes decompressed, more than the "
                                       f"{max_bytes:,} gpseq reads")
            for name, info in declared.items():
                with archive.open(info) as member:
                    shape, dtype, header = _npy_header(member, name)
                elements = math.prod(shape)
                if shapes is not None and list(shape) != list(shapes[name]):
                    raise ModelFormatError(f"{path}: array {name!r} has shape {list(shape)}, {listed_in} "
                                           f"records {list(shapes[name])}")
                if max_elements is not None and elements > max_elements:
                    raise ModelFormatError(f"{path}: array {name!r} of shape {list(shape)} holds more than the "
                                           f"{max_elements:,} numbers its model can have")
                if header + elements * dtype.itemsize != info.file_size:
                    raise ValueError(f"array {name!r} declares shape {list(shape)} "
                                     f"({elements * dtype.itemsize:,} bytes), its archive member holds "
                                     f"{info.file_size - header:,}")
            arrays = {}
            for name, info in declared.items():
                with archive.open(info) as member:
                    arrays[name] = np.lib.format.read_array(member, allow_pickle=False)
            return arrays
    except ModelFormatError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as error:
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ModelFormatError(f"{path}: unreadable {what}, truncated or corrupt ({detail})") from None


WRITE_PIECE_BYTES = 1 << 20  # `write_npz` hands the archive an array's bytes this many at a time


def write_npz(target: str | os.PathLike | BinaryIO, arrays: dict[str, np.ndarray], *, compress: bool) -> None:
    """`arrays` as an .npz archive (what `np.savez` / `np.savez_compressed` write: one .npy member
    per array, ZIP64, stored or deflated) into the path or binary file `target`, each array's bytes
    passed on in pieces of WRITE_PIECE_BYTES straight from its memory: `np.savez` copies an array
    16 MiB at a time first, which on a large model's [D, V] arrays is the save's peak."""
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(target, mode="w", compression=method, allowZip64=True) as archive:
        for name, value in arrays.items():
            array = np.asarray(value)
            if array.dtype.hasobject:
                raise ValueError(f"array {name!r} holds Python objects, which gpseq never writes")
            array = array if array.flags.c_contiguous else array.copy(order="C")
            with archive.open(f"{name}.npy", mode="w", force_zip64=True) as member:
                np.lib.format.write_array_header_1_0(member, np.lib.format.header_data_from_array_1_0(array))
                data = memoryview(array.reshape(-1).view(np.uint8))
                for start in range(0, len(data), WRITE_PIECE_BYTES):
                    member.write(data[start : start + WRITE_PIECE_BYTES])
