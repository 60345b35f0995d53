"""Atomic file writes: a sibling temp file (normal permissions, umask applied), then os.replace.

Temporaries are named `.NAME.tmp-PID-RANDOM`: concurrent writers (other processes, or threads of
one) never share one, and those left by a process that was killed (its PID no longer running)
are removed by the next write of the same file."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from gpseq.errors import OutputError


@contextmanager
def atomic_target(path: str | os.PathLike):
    """Yield an empty temp file `.NAME.tmp-PID-RANDOM` beside `path` (mode 0o666 & ~umask);
    os.replace it onto `path` on success, delete it on any failure. Temporaries of the same
    `path` left by dead processes are deleted first."""
    path = Path(path)
    prefix = f".{path.name}.tmp-"
    for stale in stale_temp_siblings(path.parent, (prefix,)):
        if stale.is_file() and not stale.is_symlink():
            stale.unlink(missing_ok=True)
    while True:
        temp = path.with_name(f"{prefix}{os.getpid()}-{secrets.token_hex(4)}")
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


@contextmanager
def replacing(path: str | os.PathLike):
    """The path to write the file `path` through: a temporary sibling of the file it names (through a
    symlink, its target: the link is kept) renamed onto it at the end (`atomic_target`; an existing
    file keeps its permissions, a failure leaves it untouched). A device or a FIFO (e.g. /dev/null)
    is written directly: a rename would replace it with a regular file. An OSError of the writing
    that names no file (ENOSPC, EFBIG) is given `path` as its file name, for the one-line error."""
    path = Path(path)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        if os.path.exists(target) and not os.path.isfile(target):
            yield target
            return
        with atomic_target(target) as temp:
            if os.path.exists(target):
                shutil.copymode(target, temp)
            yield temp
    except OSError as error:  # a write's error (a full disk, a file-size limit) names no file: this one
        if error.filename is None:
            error.filename = str(path)
        raise


def temp_dir_beside(target: str | os.PathLike) -> Path:
    """A new empty directory `.NAME.tmp-PID-RANDOM` beside the directory `target` (mode 0o777 &
    ~umask), to be renamed onto it by `swap_dir`; temporaries of `target` left by dead processes
    (`.NAME.tmp-PID…`, `.NAME.old-PID…`) are deleted first."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in stale_temp_siblings(target.parent, (f".{target.name}.tmp-", f".{target.name}.old-")):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
    temp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-{os.getpid()}-", dir=target.parent))
    os.chmod(temp, 0o777 & ~current_umask())
    return temp


def swap_dir(written: Path, target: Path, check: Callable[[Path], None] | None = None) -> None:
    """Rename the complete directory `written` (a sibling of `target`) onto `target`.

    An existing `target` is first renamed aside (`.NAME.old-PID-RANDOM`) and `check(aside)` called:
    if it raises, `target` is renamed back and the error propagates (nothing lost); otherwise
    `written` takes its place and the old one is deleted. A process killed in between leaves the
    old directory aside, where the next `temp_dir_beside(target)` removes it."""
    old = None
    if os.path.lexists(target):
        old = target.with_name(f".{target.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
        os.replace(target, old)
        if check is not None:
            try:
                check(old)
            except BaseException:
                os.replace(old, target)
                raise
    os.replace(written, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def writable_dir(path: str | os.PathLike, what: str | os.PathLike) -> None:
    """OutputError (naming `what`) unless `path`, or the nearest ancestor that exists, is a writable
    directory: what creating `what` there needs."""
    probe = Path(path).absolute()
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise OutputError(what, f"cannot be created: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OutputError(what, f"cannot be written: directory {probe} is not writable (permission denied)")


def write_bytes_atomic(path: str | os.PathLike, payload: bytes) -> None:
    """Write `payload` to `path` through `atomic_target`, synced to disk before the rename."""
    with atomic_target(path) as temp, open(temp, "wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())


def current_umask() -> int:
    """The process umask (read from /proc on Linux; elsewhere set and restored at once)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(root: str | os.PathLike) -> None:
    """chmod `root` and everything under it as a plain mkdir/open would have: directories
    0o777 & ~umask, files 0o666 & ~umask (tempfile.mkdtemp/mkstemp make them 0700/0600)."""
    mask = current_umask()
    os.chmod(root, 0o777 & ~mask)
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(folder, name), 0o777 & ~mask)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o666 & ~mask)


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists on this machine (True when that cannot be told)."""
    if pid == os.getpid():
        return True
    if os.name == "nt" or pid <= 0:  # os.kill(pid, 0) would terminate the process on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError, OverflowError):
        return True  # someone else's process, or a pid we cannot ask about: leave its files alone
    return True


def stale_temp_siblings(parent: str | os.PathLike, prefixes: tuple[str, ...]) -> list[Path]:
    """Entries of `parent` named `<prefix><pid>-<anything>` or `<prefix><pid>` whose writer `pid`
    is no longer running: the temporaries of a write that was killed."""
    stale = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return stale
    for entry in entries:
        for prefix in prefixes:
            if not entry.name.startswith(prefix):
                continue
            pid_text = entry.name[len(prefix):].split("-", 1)[0]
            if pid_text.isdigit() and not process_alive(int(pid_text)):
                stale.append(Path(entry.path))
            break
    return stale
