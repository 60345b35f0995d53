"""User-facing errors: one clear line each, with a documented CLI exit code; and `check_number`, the
numeric check of every configuration, which raises one."""

from __future__ import annotations

import math
import numbers


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


def check_number(name: str, value, *, low=None, high=None, above=None, below=None, integer: bool = False,
                 optional: bool = False) -> None:
    """ConfigError unless `value` is a finite number (an integer with `integer`; never a boolean;
    None too with `optional`) with low <= value <= high and above < value < below, where given.
    Every configuration's `validate` checks its numeric fields with it."""
    if optional and value is None:
        return
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, kind) and not isinstance(value, bool) \
            and (isinstance(value, numbers.Integral) or math.isfinite(value)) \
            and (low is None or value >= low) and (high is None or value <= high) \
            and (above is None or value > above) and (below is None or value < below):
        return
    bounds = [f"{sign} {bound:,}" for sign, bound in ((">=", low), (">", above), ("<=", high), ("<", below))
              if bound is not None]
    what = ("an integer" if integer else "a finite number") + "".join(f" {bound}" for bound in bounds[:1]) \
        + "".join(f" and {bound}" for bound in bounds[1:])
    raise ConfigError(f"{name} must be {what}{' or null' if optional else ''}, got {value!r}")
