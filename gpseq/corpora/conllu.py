"""CoNLL-U (Universal Dependencies): words with their UPOS or XPOS tag.

Ten tab-separated fields per line (FORM may contain spaces); `#` comment lines; multi-word token
ranges (`1-2`) and empty nodes (`1.1`) are skipped, their words are kept.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpseq.corpora.lines import Source, numbered_lines
from gpseq.corpora.types import Sentence
from gpseq.errors import ConfigError, InputFormatError

FIELDS = ("id", "form", "lemma", "upos", "xpos", "feats", "head", "deprel", "deps", "misc")
_LABEL_FIELD = {"upos": 3, "xpos": 4}
_WORD_ID = re.compile(r"[1-9][0-9]*")
_RANGE_ID = re.compile(r"([1-9][0-9]*)-([1-9][0-9]*)")
_EMPTY_ID = re.compile(r"(0|[1-9][0-9]*)\.[1-9][0-9]*")


def iter_conllu(
    source: Source, *, label: str | None = "upos", encoding: str = "utf-8", name: str | None = None
) -> Iterator[Sentence]:
    """Stream CoNLL-U sentences: tokens are FORMs, labels the UPOS/XPOS field (None: unlabelled).

    `columns[t]` holds the word's ten fields. Raises InputFormatError(file, line, problem) for a
    wrong field count, a malformed or out-of-order ID, or an unannotated (`_`) label.
    """
    if label is not None and label not in _LABEL_FIELD:
        raise ConfigError(f"CoNLL-U label must be 'upos', 'xpos' or None, not {label!r}")
    label_index = None if label is None else _LABEL_FIELD[label]
    with numbered_lines(source, encoding, name) as (name, lines):
        rows: list[list[str]] = []
        first_line = 0
        range_end = 0  # last word id covered by the latest multi-word token

        def sentence() -> Sentence:
            tokens = [row[1] for row in rows]
            labels = None if label_index is None else [row[label_index] for row in rows]
            return Sentence(tokens, labels, rows, source=name, line=first_line)

        for number, line in lines:
            if not line.strip(" \t"):
                if range_end > len(rows):
                    raise InputFormatError(
                        name,
                        number,
                        f"sentence ends at word {len(rows)} inside a multi-word token ending at {range_end}",
                    )
                if rows:
                    yield sentence()
                rows, range_end = [], 0
                continue
            if line.startswith("#"):
                if rows:
                    raise InputFormatError(name, number, "comment line inside a sentence")
                continue
            fields = line.split("\t")
            if len(fields) != 10:
                raise InputFormatError(name, number, f"{len(fields)} tab-separated field(s), CoNLL-U has 10")
            word_id = fields[0]
            expected = len(rows) + 1
            if _WORD_ID.fullmatch(word_id):
                if int(word_id) != expected:
                    raise InputFormatError(name, number, f"word ID {word_id}, expected {expected}")
                if label_index is not None and fields[label_index] == "_":
                    raise InputFormatError(
                        name, number, f"{label.upper()} of {fields[1]!r} is '_' (not annotated)"
                    )
                if not rows:
                    first_line = number
                rows.append(fields)
            elif match := _RANGE_ID.fullmatch(word_id):
                start, end = int(match.group(1)), int(match.group(2))
                if start != expected or end <= start:
                    raise InputFormatError(
                        name,
                        number,
                        f"multi-word token range {word_id}, expected {expected}-N with N > {expected}",
                    )
                range_end = end
            elif match := _EMPTY_ID.fullmatch(word_id):
                if int(match.group(1)) != len(rows):
                    raise InputFormatError(name, number, f"empty node {word_id} after word {len(rows)}")
            else:
                raise InputFormatError(name, number, f"malformed ID {word_id!r}")
        if range_end > len(rows):
            raise InputFormatError(
                name, None, f"file ends at word {len(rows)} inside a multi-word token ending at {range_end}"
            )
        if rows:
            yield sentence()


def read_conllu(
    source: Source, *, label: str | None = "upos", encoding: str = "utf-8", name: str | None = None
) -> list[Sentence]:
    """All sentences of a CoNLL-U file (see `iter_conllu`)."""
    return list(iter_conllu(source, label=label, encoding=encoding, name=name))
