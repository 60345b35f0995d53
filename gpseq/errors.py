"""User-facing errors: one clear line each, with a documented CLI exit code."""

from __future__ import annotations


class GpseqError(Exception):
    """Base class of errors caused by the user's input, not by a bug; the CLI prints one line."""

    exit_code = 1


class InputFormatError(GpseqError):
    """A malformed input file: names the file, the 1-based line and the problem."""

    exit_code = 2

    def __init__(self, path, line: int | None, problem: str):
        self.path = str(path)
        self.line = line
        self.problem = problem
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {problem}")


class OutputError(GpseqError):
    """An output that cannot or must not be written: the same file as an input, a directory where
    a file is expected, read-only, in a directory that does not exist or is not writable, or a
    directory to replace that holds files gpseq did not write. Names the path and the problem."""

    exit_code = 2

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class ModelFormatError(GpseqError):
    """A model directory that is missing, corrupt, or written by a newer gpseq format."""

    exit_code = 3


class ConfigError(GpseqError):
    """An invalid configuration value or an unknown preset/name."""

    exit_code = 4


class NumericalError(GpseqError):
    """A numerical failure that jitter escalation or step skipping could not recover from."""

    exit_code = 5
