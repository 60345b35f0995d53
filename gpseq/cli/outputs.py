"""Where the commands write: outputs checked before any work (never an input, never a foreign
file, never inside the model), written atomically, and the lock of a model directory in training."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Optional

from gpseq.corpora._atomic import writable_dir
from gpseq.errors import ConfigError, OutputError
from gpseq.saved.directory import check_checkpoint_target, check_save_target


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name the same file: equal once resolved, or the same inode (hard links)."""
    try:
        if a.resolve() == b.resolve():
            return True
    except (OSError, RuntimeError):
        pass
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def standard_output(hint: str = "give -o FILE"):
    """`sys.stdout`; OutputError when there is none: a process started with standard output closed
    (`gpseq tag … >&-`) has no `sys.stdout`, and the output has nowhere to go (`hint`: what to do)."""
    import sys

    if sys.stdout is None:
        raise OutputError("<stdout>", f"standard output is closed; {hint}")
    return sys.stdout


def file_or_standard_output(output: Optional[Path]) -> Optional[Path]:
    """The file `-o` names, or None for standard output (no `-o`, or `-o -` as for an input `-`),
    which must then be open (`standard_output`)."""
    if output is not None and str(output) == "-":
        output = None
    if output is None:
        standard_output()
    return output


def output_format(given: Optional[str], output: Optional[Path], suffixes: dict[str, tuple[str, ...]],
                  default: str) -> str:
    """The format a command writes: `--format` when given, else the one the suffix of `-o` names
    (`suffixes`: format → the suffixes of its files; a suffix names the first format listing it),
    else `default`. ConfigError when the given format is not written under a suffix that names
    another one (`--format conll -o out.jsonl`): the file would not read back as its name says."""
    suffix = output.suffix.lower() if output is not None and str(output) != "-" else ""
    named = next((format for format, known in suffixes.items() if suffix in known), None)
    if given is None:
        return named or default
    if named is not None and suffix not in suffixes.get(given, ()):
        raise ConfigError(f"--format {given} does not match -o {output}: a {suffix} file is written as {named}; "
                          f"leave out --format, or give the file a name for {given}")
    return given


def is_standard_input(path: Path) -> bool:
    """Whether `path` names what standard input is (the same device and inode; a pipe or terminal
    on stdin is never a file that `path` can name)."""
    import sys

    try:
        given, stdin = os.stat(path), os.fstat(sys.stdin.fileno())
    except (OSError, ValueError, AttributeError):  # no such file, or no descriptor behind stdin
        return False
    return stat.S_ISREG(stdin.st_mode) and (given.st_dev, given.st_ino) == (stdin.st_dev, stdin.st_ino)


def check_train_outputs(output: Path, checkpoints: Path) -> None:
    """Before training: `-o` must be absent, empty, or a gpseq model directory holding only the
    files gpseq wrote, in a writable directory; the checkpoint directory must be writable."""
    if checkpoints.resolve() == output.resolve() or output.resolve() in checkpoints.resolve().parents:
        raise OutputError(checkpoints, f"the checkpoint directory must not be inside the model directory {output}")
    check_save_target(output)
    if os.path.lexists(checkpoints) and not checkpoints.is_dir():
        raise OutputError(checkpoints, "exists and is not a directory (needed for checkpoints)")
    writable_dir(checkpoints, checkpoints)
    check_checkpoint_target(checkpoints / "checkpoint")


def check_tag_output(output: Optional[Path], files: list[Path], model_dir: Path, option: str = "-o") -> None:
    """Before tagging: `-o` (`option`) must not be an input, the model, a directory or a read-only
    file, and its directory must exist and be writable."""
    if output is None:
        return
    if output.is_dir():
        raise OutputError(output, f"is a directory; {option} needs a file name")
    for path in files:
        if str(path) != "-" and same_file(output, path):
            raise OutputError(output, f"is the same file as the input {path}; refusing to overwrite an input "
                                      f"(choose another {option})")
        if str(path) == "-" and is_standard_input(output):
            raise OutputError(output, f"is the file standard input reads (-); refusing to overwrite an input "
                                      f"(choose another {option})")
    try:
        inside_model = model_dir.resolve() in output.resolve().parents
    except (OSError, RuntimeError):
        inside_model = False
    if inside_model:
        raise OutputError(output, f"is inside the model directory {model_dir}; refusing to write there")
    if os.path.lexists(output):
        try:
            mode = output.stat().st_mode
        except OSError as error:
            raise OutputError(output, f"cannot be written ({error.strerror or error})") from None
        if stat.S_ISREG(mode) and (not os.access(output, os.W_OK) or not mode & 0o222):
            raise OutputError(output, "is a read-only file; refusing to overwrite it")
    parent = Path(os.path.realpath(output)).parent  # where the temporary file goes (beside a symlink's target)
    if not parent.is_dir():
        raise OutputError(output, f"cannot be written: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(output, f"cannot be written: directory {parent} is not writable (permission denied)")


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_plot_outputs(plots: list[Path], files: list[Path], model_dir: Path) -> None:
    """Before evaluating: each PNG `--plot` writes (the one named and the ones derived from its name)
    is checked as `-o` is, and an existing file that is not a PNG image is never overwritten."""
    for path in plots:
        check_tag_output(path, files, model_dir, option="--plot")
        if path.is_file():
            with open(path, "rb") as handle:
                if handle.read(len(PNG_SIGNATURE)) != PNG_SIGNATURE:
                    raise OutputError(path, "exists and is not a PNG image; refusing to overwrite it "
                                            "(choose another --plot)")


def _check_lock_file(lock: Path) -> None:
    """OutputError unless `lock` is absent or what `train_lock` writes: a regular file, empty or one
    PID line (a lock left by a killed training) — a user's file of that name is never taken."""
    if not os.path.lexists(lock):
        return
    ours = lock.is_file() and not lock.is_symlink()
    if ours:
        with open(lock, "rb") as handle:
            content = handle.read(64).strip()
        ours = not content or content.isdigit()
    if not ours:
        raise OutputError(lock, "exists and is not a gpseq lock file; refusing to use or remove it "
                                "(move it, or choose another -o)")


@contextlib.contextmanager
def train_lock(output: Path):
    """Hold `OUTPUT.lock` (beside the model directory) for the whole training: a second training
    writing the same -o fails at start (OutputError naming the directory and the holder's PID).

    The lock is an flock on the file, which the kernel releases when its holder dies, so a lock
    left by a killed training is stale by construction and simply taken over; the file holds the
    holder's PID for the message and is removed at the end. (Without fcntl, i.e. not on a POSIX
    system, there is no lock.)"""
    try:
        import fcntl
    except ImportError:
        yield None
        return

    absolute = Path(os.path.abspath(output))
    lock = absolute.with_name(absolute.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)  # as the save would (checked writable before)
    _check_lock_file(lock)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                holder = os.read(fd, 32).decode("ascii", "replace").strip() or "?"
            finally:
                os.close(fd)
            raise OutputError(output, f"another gpseq train (PID {holder}) is writing this model directory "
                                      f"(lock {lock}); wait for it to finish or choose another -o") from None
        try:  # the holder we waited for may have removed the file: lock the one at `lock`
            current = os.stat(lock)
            opened = os.fstat(fd)
            same = (current.st_dev, current.st_ino) == (opened.st_dev, opened.st_ino)
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        yield lock
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)  # while still holding it: a waiting opener then sees another inode and retries
        os.close(fd)
