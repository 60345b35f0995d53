"""CoNLL-style column files (CoNLL-2000/2002, CRF++ `train.data`/`test.data`): read and write.

One token per line, columns separated by runs of ASCII spaces or tabs (never by other Unicode
white space: U+3000 is a token in the CRF++ Japanese sets), a blank line between sentences,
optional `-DOCSTART-` document separators and optional comment lines.
"""

from __future__ import annotations

import codecs
import io
import os
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from gpseq.corpora._atomic import atomic_target
from gpseq.corpora.lines import Source, numbered_lines, source_name
from gpseq.corpora.types import Sentence, TokenRows
from gpseq.errors import InputFormatError

DOCSTART = "-DOCSTART-"
_SEPARATORS = re.compile(r"[ \t]+")
_FORBIDDEN_IN_FIELD = re.compile(r"[ \t\r\n]")


def split_columns(line: str) -> list[str]:
    """The fields of one line, split on runs of ASCII space/tab only ([] for a blank line)."""
    stripped = line.strip(" \t")
    return _SEPARATORS.split(stripped) if stripped else []


def iter_conll(
    source: Source,
    *,
    token_column: int = 0,
    label_column: int | None = -1,
    encoding: str = "utf-8",
    comment_prefix: str | None = None,
    n_columns: int | None = None,
    docstart: bool = True,
    name: str | None = None,
) -> Iterator[Sentence]:
    """Stream the sentences of a CoNLL-style column file, one `Sentence` at a time.

    Every token line must have the same number of columns: `n_columns` when given, otherwise as
    many as the file's first token line. `label_column=None` reads tokens only (unlabelled).
    `-DOCSTART-` lines (first column) are document separators when `docstart`; lines starting
    with `comment_prefix` are skipped. Raises InputFormatError(file, line, problem) for ragged
    columns, an absent token/label column, undecodable bytes or a line that `numbered_lines`
    refuses (longer than MAX_LINE_BYTES, a CR inside it, a NUL byte); no token line is dropped.
    """
    if n_columns is not None and n_columns < 1:
        raise ValueError("n_columns must be >= 1")
    with numbered_lines(source, encoding, name) as (name, lines):
        rows: list[tuple[str, ...]] = []
        first_line = 0
        expected = n_columns
        expected_from: int | None = None
        token_index = label_index = 0

        def sentence() -> Sentence:
            columns = TokenRows.from_rows(rows)
            tokens = list(columns.column(token_index))
            labels = None if label_column is None else list(columns.column(label_index))
            return Sentence(tokens, labels, columns, source=name, line=first_line)

        def resolve(index: int, what: str, count: int, number: int) -> int:
            resolved = index + count if index < 0 else index
            if not 0 <= resolved < count:
                raise InputFormatError(
                    name, number, f"{what} column {index} missing: the line has {count} column(s)"
                )
            return resolved

        for number, line in lines:
            if comment_prefix is not None and line.startswith(comment_prefix):
                continue
            fields = split_columns(line)
            if not fields or (docstart and fields[0] == DOCSTART):
                if rows:
                    yield sentence()
                    rows = []
                continue
            if expected_from is None:
                if expected is not None and len(fields) != expected:
                    raise InputFormatError(name, number, f"{len(fields)} column(s), expected {expected}")
                expected, expected_from = len(fields), number
                token_index = resolve(token_column, "token", expected, number)
                if label_column is not None:
                    label_index = resolve(label_column, "label", expected, number)
                    if label_index == token_index:
                        raise InputFormatError(
                            name,
                            number,
                            f"label column missing: the line has {expected} column(s) and the label column "
                            f"({label_column}) is the token column "
                            "(use label_column=None for unlabelled text)",
                        )
            elif len(fields) != expected:
                origin = "as required" if n_columns is not None else f"as on line {expected_from}"
                raise InputFormatError(
                    name, number, f"{len(fields)} column(s), expected {expected} ({origin})"
                )
            if not rows:
                first_line = number
            rows.append(tuple(map(sys.intern, fields)))  # one object per distinct string
        if rows:
            yield sentence()


def read_conll(
    source: Source,
    *,
    token_column: int = 0,
    label_column: int | None = -1,
    encoding: str = "utf-8",
    comment_prefix: str | None = None,
    n_columns: int | None = None,
    docstart: bool = True,
    name: str | None = None,
) -> list[Sentence]:
    """All sentences of a CoNLL-style column file (see `iter_conll` for the format and errors)."""
    return list(
        iter_conll(
            source,
            token_column=token_column,
            label_column=label_column,
            encoding=encoding,
            comment_prefix=comment_prefix,
            n_columns=n_columns,
            docstart=docstart,
            name=name,
        )
    )


def sentence_rows(sentence: Sentence) -> list[list[str]]:
    """The columns to write for a sentence: `columns`, plus the labels when columns hold only tokens."""
    rows = (
        sentence.columns if len(sentence.columns) == len(sentence.tokens) else [[t] for t in sentence.tokens]
    )
    if sentence.labels is not None and all(len(row) == 1 for row in rows):
        if len(sentence.labels) != len(rows):
            raise ValueError(f"sentence has {len(rows)} tokens but {len(sentence.labels)} labels")
        rows = [[row[0], label] for row, label in zip(rows, sentence.labels)]
    return rows


def _format(sentences: Iterable[Sentence], name: str, separator: str) -> Iterator[str]:
    width: int | None = None
    for number, sentence in enumerate(sentences, start=1):
        rows = sentence_rows(sentence)
        if not rows:
            raise InputFormatError(name, None, f"sentence {number} is empty (it would not survive a read)")
        lines = []
        for position, row in enumerate(rows, start=1):
            if width is None:
                width = len(row)
            if len(row) != width:
                raise InputFormatError(
                    name,
                    None,
                    f"sentence {number} token {position}: {len(row)} column(s), the file has {width}",
                )
            for field in row:
                if not field or _FORBIDDEN_IN_FIELD.search(field):
                    raise InputFormatError(
                        name,
                        None,
                        f"sentence {number} token {position}: field {field!r} is empty "
                        "or holds a space, tab or newline",
                    )
            if row[0] == DOCSTART:
                raise InputFormatError(
                    name, None, f"sentence {number} token {position}: a token cannot be {DOCSTART}"
                )
            lines.append(separator.join(row))
        yield "\n".join(lines) + "\n\n"


def write_conll(
    path_or_file, sentences: Iterable[Sentence], *, encoding: str = "utf-8", separator: str = " "
) -> None:
    """Write sentences as a CoNLL column file (`Sentence.columns`, a blank line after each sentence).

    Paths are written atomically (temp file + os.replace). Fields must be non-empty and free of
    ASCII space/tab/newline, and every row must have the same column count, so that reading the
    file back gives the same sentences; otherwise InputFormatError names the sentence and token.
    """
    if separator not in (" ", "\t"):
        raise ValueError("separator must be ' ' or '\\t'")
    if not isinstance(path_or_file, (str, os.PathLike)):
        name = source_name(path_or_file, None)
        text_file = isinstance(path_or_file, io.TextIOBase) or hasattr(path_or_file, "encoding")
        encoder = _encoder(encoding)
        for number, chunk in enumerate(_format(sentences, name, separator), start=1):
            path_or_file.write(chunk if text_file else _encode(encoder, chunk, encoding, name, number))
        return
    path = Path(path_or_file)
    name = os.fspath(path)
    encoder = _encoder(encoding)
    with atomic_target(path) as temp, open(temp, "wb") as handle:
        for number, chunk in enumerate(_format(sentences, name, separator), start=1):
            handle.write(_encode(encoder, chunk, encoding, name, number))


def _encoder(encoding: str):
    # incremental, so that a BOM (UTF-16) is written once, not once per sentence
    return codecs.getincrementalencoder(encoding)()


def _encode(encoder, text: str, encoding: str, name: str, number: int) -> bytes:
    try:
        return encoder.encode(text)
    except UnicodeEncodeError as err:
        raise InputFormatError(
            name, None, f"sentence {number}: {text[err.start : err.end]!r} cannot be encoded as {encoding}"
        ) from None
