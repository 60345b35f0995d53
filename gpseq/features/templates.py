"""Feature templates: which token values (source, offset) a feature combines, and how it is named.

A template is a tuple of parts `(source, offset)`: the value of `source` at token t + offset
(a lexical attribute name, an int corpus column, or a spaCy token attribute such as "tag_").
Each token emits exactly one feature per template, its value tuple; positions outside the
sentence take boundary values (`__BOS-1__`, `__EOS+1__`, … or CRF++'s `_B-1`, `_B+1`, …).

CRF++ templates (`U01:%x[-1,0]/%x[0,0]`) are templates whose parts are corpus columns and whose
feature string is the line with every `%x[row,col]` replaced by its value, as CRF++ expands it
(taku910/crfpp `FeatureIndex::applyRule` / `getIndex`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from gpseq.errors import ConfigError

# CRF++ (0.58) accepts rows in -8..8 (kMaxContextSize) and writes _B-1.._B-8 / _B+1.._B+8.
CRFPP_MAX_CONTEXT = 8


def source_name(source) -> str:
    """Display name of a value source: `col1` for corpus column 1, else the attribute name."""
    return f"col{source}" if isinstance(source, int) else str(source)


def boundary_string(index: int, before: bool, crfpp: bool) -> str:
    """The padding value `index` (1-based) positions before/after the sentence."""
    if crfpp:
        return f"_B-{index}" if before else f"_B+{index}"
    return f"__BOS-{index}__" if before else f"__EOS+{index}__"


@dataclass(frozen=True)
class FeatureTemplate:
    """One feature template: `parts` = ((source, offset), ...); CRF++ templates keep `pieces`.

    `pieces` (CRF++ only) are the literal strings around the macros, len(parts) + 1 of them, so
    the feature string is pieces[0] + v0 + pieces[1] + v1 + ... A template without parts is a
    constant feature (the bias, or a CRF++ line without macros).
    """

    name: str
    parts: tuple
    pieces: tuple | None = None

    @property
    def is_crfpp(self) -> bool:
        return self.pieces is not None

    def render(self, values: list[str]) -> str:
        """The feature string for the value strings of `parts`."""
        if self.pieces is not None:
            out = [self.pieces[0]]
            for value, piece in zip(values, self.pieces[1:]):
                out.append(value)
                out.append(piece)
            return "".join(out)
        if not self.parts:
            return self.name
        return f"{self.name}={'|'.join(values)}"


def window_template(source, offset: int) -> FeatureTemplate:
    """Template `lower[-1]`: the value of `source` at offset `offset`."""
    return FeatureTemplate(f"{source_name(source)}[{offset}]", ((source, offset),))


def conjunction_template(parts) -> FeatureTemplate:
    """Template `lower[-1]|lower[0]`: the tuple of the parts' values."""
    parts = tuple((source, int(offset)) for source, offset in parts)
    name = "|".join(f"{source_name(s)}[{o}]" for s, o in parts)
    return FeatureTemplate(name, parts)


BIAS_TEMPLATE = FeatureTemplate("bias", ())


def _parse_macro(line: str, start: int, lineno: int) -> tuple[int, int, int]:
    """Parse `[row,col]` at line[start:] as CRF++ getIndex does → (row, col, end index)."""

    def fail(problem: str):
        raise ConfigError(f"CRF++ template line {lineno} {line!r}: {problem}")

    pos = start
    if pos >= len(line) or line[pos] != "[":
        fail("expected '[' after %x")
    pos += 1
    sign = 1
    if pos < len(line) and line[pos] == "-":
        sign, pos = -1, pos + 1
    digits = pos
    while pos < len(line) and line[pos].isdigit() and line[pos].isascii():
        pos += 1
    if pos >= len(line) or line[pos] != ",":
        fail("expected %x[row,col] with integer row and column")
    row = sign * int(line[digits:pos] or "0")
    pos += 1
    digits = pos
    while pos < len(line) and line[pos].isdigit() and line[pos].isascii():
        pos += 1
    if pos >= len(line) or line[pos] != "]":
        fail("expected %x[row,col] with integer row and column")
    col = int(line[digits:pos] or "0")
    if abs(row) > CRFPP_MAX_CONTEXT:
        fail(f"row offset {row} outside -{CRFPP_MAX_CONTEXT}..{CRFPP_MAX_CONTEXT}")
    return row, col, pos + 1


def parse_crfpp_line(line: str, lineno: int = 0) -> FeatureTemplate:
    """One CRF++ `U` line → FeatureTemplate whose feature strings are CRF++'s expansions."""
    pieces: list[str] = []
    parts: list[tuple[int, int]] = []
    literal: list[str] = []
    pos = 0
    while pos < len(line):
        ch = line[pos]
        if ch != "%":
            literal.append(ch)
            pos += 1
            continue
        if pos + 1 >= len(line) or line[pos + 1] != "x":
            raise ConfigError(f"CRF++ template line {lineno} {line!r}: only %x[row,col] macros exist")
        row, col, pos = _parse_macro(line, pos + 2, lineno)
        pieces.append("".join(literal))
        literal = []
        parts.append((col, row))
    pieces.append("".join(literal))
    return FeatureTemplate(line, tuple(parts), tuple(pieces))


def parse_crfpp_template(text: str) -> tuple[list[FeatureTemplate], list[str]]:
    """CRF++ template text → (unigram templates, bigram lines).

    As CRF++ `openTemplate`: empty lines and lines starting with '#' are skipped, `U` lines are
    unigram templates, `B` lines bigram templates; anything else is an error. Bigram lines select
    the pairwise factor (which the GP model always has); bigram lines with %x macros would make
    it observation-dependent, which the model does not support, so they are accepted with a
    warning and otherwise ignored. Repeated identical U lines are kept once.
    """
    unigram: list[FeatureTemplate] = []
    bigram: list[str] = []
    seen: set[str] = set()
    for lineno, raw in enumerate(text.split("\n"), start=1):
        line = raw.rstrip("\r")
        if not line.strip() or line.startswith("#"):
            continue
        if line[0] == "U":
            if line not in seen:
                seen.add(line)
                unigram.append(parse_crfpp_line(line, lineno))
        elif line[0] == "B":
            if "%x" in line:
                parse_crfpp_line(line, lineno)  # still validate the syntax
                warnings.warn(
                    f"CRF++ bigram template {line!r} uses observations; gpseq's pairwise factor "
                    "is observation-independent, so it is treated as a plain 'B'",
                    stacklevel=2,
                )
            bigram.append(line)
        else:
            raise ConfigError(f"CRF++ template line {lineno} {line!r}: unknown type (expected U, B or #)")
    if not unigram and not bigram:
        raise ConfigError("CRF++ template has no U or B lines")
    return unigram, bigram
