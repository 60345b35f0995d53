"""The in-memory form of a labelled (or unlabelled) corpus sentence."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from gpseq.errors import GpseqError

UNLABELLED = "?"  # the label of a token whose gold label is not given (partial annotation); never a label of a model


@dataclass
class Sentence:
    """One sentence: its tokens, its labels (None when unlabelled) and every column as read.

    A label `UNLABELLED` ("?") marks a token whose gold label is not given: training marginalises
    it (partial annotation), evaluation leaves its sentence out.

    `columns[t]` holds all fields of token t in file order (token and label columns included),
    so feature extractors can use extra columns (e.g. the POS column of CoNLL-2000); a column
    file's reader gives each token's as a tuple.
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
