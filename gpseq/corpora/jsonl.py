"""JSON Lines corpora: one sentence per line, an object with "tokens" and (labelled) "labels".

    {"tokens": ["He", "reckons", "the", "deficit"], "labels": ["B-NP", null, "B-NP", "?"]}

Optional "columns": per token its fields as a CoNLL line would hold them (token first, e.g.
`["He", "PRP"]`), for features that read corpus columns (the `chunking` preset reads column 1).
The records of `gpseq tag --format jsonl` and `gpseq select --format jsonl` read back as they are
(their other keys are ignored), so a tagged file corrected by hand trains. A label that is null,
"" or "?", and every label of a record without "labels" (or with "labels": null), is
`UNLABELLED`: the default training marginalises it (partial annotation). Blank lines are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from gpseq.corpora.lines import MAX_JSONL_LINE_BYTES, Source, numbered_lines
from gpseq.corpora.types import UNLABELLED, Sentence
from gpseq.errors import InputFormatError


def iter_jsonl(source: Source, *, labelled: bool = True, encoding: str = "utf-8",
               name: str | None = None) -> Iterator[Sentence]:
    """Stream the sentences of a JSON Lines corpus (module docstring). Raises
    InputFormatError(file, line, problem) for a line that is not a JSON object, tokens that are
    not a non-empty list of non-empty strings, labels that are not one per token, or a line longer
    than MAX_JSONL_LINE_BYTES."""
    with numbered_lines(source, encoding, name, max_line_bytes=MAX_JSONL_LINE_BYTES) as (name, lines):
        for number, line in lines:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise InputFormatError(name, number, f"not JSON ({error.msg} at column {error.colno})") from None
            except RecursionError:
                raise InputFormatError(name, number, "not a sentence (JSON nested too deeply)") from None
            if not isinstance(record, dict):
                raise InputFormatError(name, number, 'a sentence is a JSON object {"tokens": [...], "labels": [...]}')
            tokens = record.get("tokens")
            if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) and t for t in tokens):
                raise InputFormatError(name, number, '"tokens" must be a non-empty list of non-empty strings')
            columns = record.get("columns")
            if columns is not None and not (isinstance(columns, list) and len(columns) == len(tokens) and all(
                    isinstance(row, list) and row and row[0] == token and all(isinstance(f, str) for f in row)
                    for row, token in zip(columns, tokens))):
                raise InputFormatError(name, number, '"columns" must hold one list of strings per token, the token '
                                                     "first")
            labels = None
            if labelled:
                labels = _labels(record.get("labels"), len(tokens), name, number)
            yield Sentence(tokens, labels, columns or [], source=name, line=number)


def _labels(given, count: int, name: str, number: int) -> list[str]:
    """One label per token, `UNLABELLED` where none is given."""
    if given is None:
        return [UNLABELLED] * count
    if not isinstance(given, list) or len(given) != count:
        size = len(given) if isinstance(given, list) else type(given).__name__
        raise InputFormatError(name, number, f'"labels" must be a list of one label per token ({count}); got {size}')
    labels = []
    for position, label in enumerate(given, start=1):
        if label is None or label == "":
            label = UNLABELLED
        if not isinstance(label, str) or label != label.strip() or any(c.isspace() for c in label):
            raise InputFormatError(name, number, f"label {position} ({label!r}) must be a string without white space "
                                                 "(null or \"\" for an unlabelled token)")
        labels.append(label)
    return labels


def read_jsonl(source: Source, *, labelled: bool = True, encoding: str = "utf-8",
               name: str | None = None) -> list[Sentence]:
    """All sentences of a JSON Lines corpus (see `iter_jsonl`)."""
    return list(iter_jsonl(source, labelled=labelled, encoding=encoding, name=name))
