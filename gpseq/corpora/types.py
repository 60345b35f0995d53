"""The in-memory form of a labelled (or unlabelled) corpus sentence."""

from __future__ import annotations

from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from gpseq.errors import GpseqError

UNLABELLED = "?"  # the label of a token whose gold label is not given (partial annotation); never a label of a model


class TokenRows(SequenceABC):
    """A sentence's token rows stored column by column: `rows[t]` is token t's fields (a tuple),
    `column(j)` field j of every token. A column file's reader keeps each sentence's rows so: k
    tuples of n strings where a tuple per token costs a tuple object per token (a corpus in
    memory is a third smaller). Compares equal to any sequence of the same rows."""

    __slots__ = ("_columns",)

    def __init__(self, columns: Sequence[Sequence[str]]):
        self._columns = tuple(tuple(column) for column in columns)
        if len({len(column) for column in self._columns}) > 1:
            raise ValueError("the columns of a sentence's rows differ in length")

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[str]]) -> "TokenRows":
        """The rows given token by token (each the same number of fields)."""
        try:
            return cls(zip(*rows, strict=True))
        except ValueError:
            raise ValueError("the rows of a sentence differ in length") from None

    def column(self, index: int) -> tuple[str, ...]:
        """Field `index` of every token (IndexError where the rows have fewer fields)."""
        return self._columns[index]

    @property
    def width(self) -> int:
        """The number of fields of each row."""
        return len(self._columns)

    def __len__(self) -> int:
        return len(self._columns[0]) if self._columns else 0

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [tuple(column[t] for column in self._columns) for t in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError("token row index out of range")
        return tuple(column[index] for column in self._columns)

    def __iter__(self):
        return iter(zip(*self._columns)) if self._columns else iter(())

    def __eq__(self, other) -> bool:
        if isinstance(other, (str, bytes)) or not isinstance(other, SequenceABC):
            return NotImplemented
        return len(self) == len(other) and all(tuple(a) == tuple(b) for a, b in zip(self, other))

    __hash__ = None  # equal to lists, which have no hash

    def __repr__(self) -> str:
        return f"TokenRows({list(self)!r})"


@dataclass
class Sentence:
    """One sentence: its tokens, its labels (None when unlabelled) and every column as read.

    A label `UNLABELLED` ("?") marks a token whose gold label is not given: training marginalises
    it (partial annotation), evaluation leaves its sentence out.

    `columns[t]` holds all fields of token t in file order (token and label columns included),
    so feature extractors can use extra columns (e.g. the POS column of CoNLL-2000); a column
    file's reader gives them as `TokenRows` (each row a tuple, stored column by column).
    `source` and `line` (1-based line of the first token) locate it for error messages.
    `spaces[t]` says whether whitespace follows token t, where the source tells (raw text); a
    spaCy Doc of the sentence uses it.
    """

    tokens: list[str]
    labels: list[str] | None = None
    columns: list[Sequence[str]] = field(default_factory=list)
    source: str | None = None
    line: int | None = None
    spaces: list[bool] | None = None

    def __post_init__(self) -> None:
        if not self.columns:
            self.columns = [[token] for token in self.tokens]

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def fully_labelled(self) -> bool:
        """Whether every token has a gold label (labels given, none `UNLABELLED`)."""
        return self.labels is not None and UNLABELLED not in self.labels


def as_sentences(sentences: Iterable) -> list[Sentence]:
    """Sentences given as `Sentence`s or token lists, as `Sentence`s; strings are refused (a string
    would be read as its characters)."""
    if isinstance(sentences, str):
        raise GpseqError(f"expected a list of tokenised sentences, got one string ({sentences[:40]!r}): give "
                         "each sentence as a list of tokens (raw text: gpseq.corpora.read_corpus(path, "
                         "labelled=False) tokenises a file)")
    out = []
    for sentence in sentences:
        if isinstance(sentence, Sentence):
            out.append(sentence)
        elif isinstance(sentence, str):
            raise GpseqError(f"expected tokenised sentences (each a list of tokens or a Sentence), got a string "
                             f"({sentence[:40]!r})")
        else:
            out.append(Sentence(tokens=list(sentence)))
    return out
