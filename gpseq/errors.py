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


class ModelFormatError(GpseqError):
    """A model directory that is missing, corrupt, or written by a newer gpseq format."""

    exit_code = 3


class ConfigError(GpseqError):
    """An invalid configuration value or an unknown preset/name."""

    exit_code = 4


class NumericalError(GpseqError):
    """A numerical failure that jitter escalation or step skipping could not recover from."""

    exit_code = 5
