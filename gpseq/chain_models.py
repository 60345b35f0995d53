"""Models that feed one another: each model's decoded labels become the next column of the tokens
the later models read, so a chunker whose features read a POS column tags raw text after a POS
tagger (`gpseq tag models/en_pos_conll2000 models/en_chunk_conll2000 notes.txt`).

    chain = ModelChain.load(["models/en_pos_conll2000", "models/en_chunk_conll2000"])
    for result in chain.tag([["The", "cat", "sat", "."]]):
        print(result.labels, result.confidences, result.chain)  # chunks; [("en_pos_conll2000", POS tags)]

Columns: model i of k (from 1) reads a sentence's columns as the input gives them — column 0 the
token, columns 1 … w−1 the input's other fields (a CoNLL file's POS column, …) — followed by the
labels of models 1 … i−1, model j's at column w + j − 1. On raw text (w = 1) the first model's
labels are column 1, the second's column 2, and so on. A column the input has is never replaced:
a CoNLL file's own POS column stays column 1, and the earlier models' labels come after it.

The chain's result is the last model's `TaggedSentence` (labels, probabilities, spans, n-best,
abstention: the options of `Tagger.tag` apply to the last model), with the earlier models' labels
in its `chain` field. The earlier models tag with their own defaults (decoder, predictive). The
last model's probabilities are conditional on the earlier models' labels: a pipeline carries the
labels forward, not their uncertainty.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from gpseq.corpora.types import Sentence, as_sentences
from gpseq.errors import ConfigError, InputFormatError

__all__ = ["ModelChain", "model_name", "is_model_dir"]

log = logging.getLogger("gpseq")


def model_name(directory: str | os.PathLike) -> str:
    """A model's name: its directory's name (of the resolved path for `.` and `..`)."""
    path = Path(directory)
    return path.resolve().name if path.name in ("", ".", "..") else path.name


def is_model_dir(path: str | os.PathLike) -> bool:
    """Whether `path` is a model directory (holds tagger.json), as opposed to an input file."""
    return str(path) != "-" and os.path.isfile(os.path.join(path, "tagger.json"))


def columns_read(tagger) -> list[int]:
    """The corpus columns other than the token (> 0) that the features of `tagger` read, sorted."""
    return sorted(c for c in tagger.featurizer.config.sources() if isinstance(c, int) and c > 0)


def _column_range(first: int, last: int) -> str:
    return f"{first}" if first == last else f"{first}–{last}"


class ModelChain:
    """Taggers applied in order, each one's labels a column for the later ones (module docstring).

    `config`, `labels`, `featurizer`, `scores` and `span_scheme` are the last model's: the chain
    returns its labels."""

    def __init__(self, taggers: Sequence, names: Sequence[str] | None = None):
        if not taggers:
            raise ConfigError("a model chain needs at least one model")
        self.taggers = list(taggers)
        self.names = [f"model {i + 1}" for i in range(len(self.taggers))] if names is None else list(names)
        if len(self.names) != len(self.taggers):
            raise ConfigError(f"{len(self.names)} names for {len(self.taggers)} models")
        self.reads = [columns_read(tagger) for tagger in self.taggers]  # per model: the columns > 0 it reads
        self._warned_widths: set[int] = set()

    @classmethod
    def load(cls, directories: Sequence[str | os.PathLike], likelihoods: dict[str, Callable] | None = None,
             names: Sequence[str] | None = None) -> "ModelChain":
        """The models of `directories` in order (`Tagger.load` each), named after their directories
        unless `names` are given."""
        from gpseq.tagger import Tagger

        taggers = [Tagger.load(directory, likelihoods=likelihoods) for directory in directories]
        return cls(taggers, [model_name(d) for d in directories] if names is None else names)

    @classmethod
    def of(cls, tagger) -> "ModelChain":
        """`tagger` if it is a chain, else the chain of that one model."""
        return tagger if isinstance(tagger, ModelChain) else cls([tagger])

    # the last model's, so that a chain serves where a `Tagger` does (`gpseq serve`)
    @property
    def last(self):
        return self.taggers[-1]

    @property
    def config(self):
        return self.last.config

    @property
    def labels(self) -> list[str]:
        return self.last.labels

    @property
    def featurizer(self):
        return self.last.featurizer

    @property
    def scores(self) -> dict:
        return self.last.scores

    @property
    def span_scheme(self):
        return self.last.span_scheme

    @property
    def lang(self) -> str:
        """The language raw text is tokenised in: the first model's, the one that reads it first."""
        return self.taggers[0].config.features.lang

    # ---- columns ------------------------------------------------------------------------------
    @property
    def input_width(self) -> int:
        """The fields per token the input needs at least (1: raw text will do). Model i (from 0)
        sees width w + i, so it needs w > c − i for every column c it reads."""
        return max([1] + [max(read) + 1 - i for i, read in enumerate(self.reads) if read])

    @property
    def input_columns(self) -> list[int]:
        """The input's own columns (> 0) that some model reads when the input has `input_width` fields."""
        width = self.input_width
        return sorted({c for read in self.reads for c in read if c < width})

    def text_problem(self) -> str | None:
        """Why raw text (tokens only: column 0) cannot feed this chain, naming the first model that
        reads a column neither the text nor the models before it give; None when it can."""
        for i, read in enumerate(self.reads):
            missing = [c for c in read if c > i]
            if not missing:
                continue
            features = self.taggers[i].featurizer.config
            if len(self.taggers) == 1:
                return (f"raw text has only tokens, but this model's features (preset {features.preset!r}) read "
                        f"corpus column(s) {read}; tag a CoNLL file that has them (--input-format conll), put a "
                        "model whose labels give them before it (gpseq tag POS_MODEL MODEL FILE), or train with "
                        "features that raw text can feed (e.g. --features ner or pos)")
            given = f", and the models before it give column(s) {_column_range(1, i)}" if i else ""
            return (f"model {self.names[i]!r} (features preset {features.preset!r}) reads column(s) {missing}, "
                    f"but raw text has only tokens (column 0){given}; put a model whose labels give them before "
                    "it, or tag a CoNLL file that has them (--input-format conll)")
        return None

    def _check_columns(self, i: int, sentences: Sequence[Sentence], input_widths: Sequence[int]) -> None:
        """InputFormatError naming model i, the column and the sentence when a sentence fed to model i
        lacks a column it reads (`input_widths[s]`: sentence s's fields before the earlier labels)."""
        needed = max(self.reads[i], default=0)
        if not needed:
            return
        for sentence, width in zip(sentences, input_widths):
            if width + i > needed:
                continue
            missing = next(c for c in self.reads[i] if c >= width + i)
            token = sentence.tokens[0] if sentence.tokens else ""
            earlier = (f", then column(s) {_column_range(width, width + i - 1)} the labels of "
                       f"{', '.join(map(repr, self.names[:i]))}" if i else "")
            raise InputFormatError(
                sentence.source or "<sentences>", sentence.line,
                f"model {self.names[i]!r} reads column {missing}, but the tokens of this sentence ({token!r} …) "
                f"have column(s) {_column_range(0, width - 1)} from the input{earlier}; give an input with column "
                f"{missing}, or put a model whose labels give it before this one")

    # ---- tagging ------------------------------------------------------------------------------
    def feed(self, sentences: Iterable, *, batch_size: int = 256, max_tokens: int | None = None,
             should_stop: Callable[[], bool] | None = None) -> list[Sentence]:
        """`sentences` with the labels of every model but the last appended to each token's columns
        (the input of the last model)."""
        sentences = as_sentences(sentences)
        if len(self.taggers) == 1:
            return sentences
        widths = [min(map(len, s.columns), default=1) for s in sentences]
        for i in range(len(self.taggers)):  # before any tagging: the columns each model will see are known
            self._check_columns(i, sentences, widths)
        for width in sorted(set(widths) - self._warned_widths):
            self._warn_unread(width)
        for tagger in self.taggers[:-1]:
            # spans: the product of marginals, the cheap one: the earlier models' spans are not returned
            results = tagger.tag(sentences, batch_size=batch_size, max_tokens=max_tokens, spans="product",
                                 should_stop=should_stop)
            sentences = [dataclasses.replace(s, columns=[[*row, label] for row, label in zip(s.columns, r.labels)])
                         for s, r in zip(sentences, results)]
        return sentences

    def _warn_unread(self, width: int) -> None:
        """Log, once per input width, each earlier model whose labels no later model reads: with an
        input of `width` columns they come after the input's own, and a later model that reads one of
        the input's columns (a CoNLL file's own POS column) reads that instead."""
        self._warned_widths.add(width)
        for j, name in enumerate(self.names[:-1]):
            column = width + j
            later = sorted({c for read in self.reads[j + 1:] for c in read})
            if column not in later:
                reads = f"they read column(s) {later}" if later else "they read no corpus column"
                log.warning("the labels of model %r are column %d, after the input's %d column(s), and no later "
                            "model reads it (%s): they are written, not used", name, column, width, reads)

    def earlier_labels(self, sentence: Sentence) -> list[tuple[str, list[str]]]:
        """(name, labels) of each earlier model, read back from a sentence that `feed` gave: its
        last k − 1 columns."""
        k = len(self.taggers) - 1
        return [(name, [row[len(row) - k + j] for row in sentence.columns]) for j, name in enumerate(self.names[:-1])]

    def tag(self, sentences: Iterable, *, batch_size: int = 256, max_tokens: int | None = None,
            should_stop: Callable[[], bool] | None = None, **options) -> list:
        """The last model's `Tagger.tag` (`options`: samples, mean, decode, spans, nbest,
        abstain_below) on the sentences the earlier models fed, each result's `chain` holding the
        earlier models' labels."""
        fed = self.feed(sentences, batch_size=batch_size, max_tokens=max_tokens, should_stop=should_stop)
        results = self.last.tag(fed, batch_size=batch_size, max_tokens=max_tokens, should_stop=should_stop,
                                **options)
        if len(self.taggers) > 1:
            for sentence, result in zip(fed, results):
                result.chain = self.earlier_labels(sentence)
        return results

    def select(self, sentences: Iterable, n: int, strategy: str = "entropy", **options) -> list:
        """`Tagger.select` of the last model over the pool the earlier models fed (read and fed a
        chunk at a time): the acquisition scores are the last model's; each picked sentence keeps
        the earlier models' labels as its last columns, and its tagging's `chain` holds them."""
        from gpseq.active.selection import CHUNK_SENTENCES

        if len(self.taggers) == 1:
            return self.last.select(sentences, n, strategy, **options)
        chunk_size = options.get("chunk_size", CHUNK_SENTENCES)
        picked = self.last.select(self._fed_stream(sentences, chunk_size), n, strategy, **options)
        for item in picked:
            if item.tagged is not None:
                item.tagged.chain = self.earlier_labels(item.sentence)
        return picked

    def _fed_stream(self, sentences: Iterable, size: int) -> Iterator[Sentence]:
        from gpseq.active.selection import _chunks

        if isinstance(sentences, str):  # refused as `Tagger.select` refuses it, not read as characters
            self.feed(sentences)
        for chunk in _chunks(sentences, size):
            yield from self.feed(chunk, batch_size=min(size, 256))
