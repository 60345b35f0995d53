"""Every corpus format behind one name: `read_corpus(path, format="auto")` and its registry.

    sentences = read_corpus("train.conll")                          # CoNLL columns
    sentences = read_corpus("en_ewt-ud-train.conllu")               # CoNLL-U, UPOS labels
    sentences = read_corpus("corrected.jsonl")                      # JSON Lines: tokens, labels
    sentences = read_corpus("notes.txt", "text", labelled=False)    # raw text, spaCy-tokenised
    sentences = read_corpus("train.spacy", spacy_labels="ents")     # spaCy DocBin, entities as B-/I-/O

A format is a reader `(source, options) -> Iterator[Sentence]` registered under a name with the
file suffixes `auto` knows it by; adding one is `@register_format("name", suffixes)` here (or
anywhere imported before use) and a test in tests/corpora/test_corpora.py.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from gpseq.corpora.conll import Source, iter_conll
from gpseq.corpora.conllu import iter_conllu
from gpseq.corpora.docbin import iter_docbin
from gpseq.corpora.jsonl import iter_jsonl
from gpseq.corpora.text import TEXT_MAX_TOKENS, iter_text, text_pipeline
from gpseq.corpora.types import Sentence
from gpseq.errors import ConfigError, InputFormatError


@dataclass
class ReadOptions:
    """How to read a corpus: columns (column formats), encoding, whether labels are wanted, for
    raw text the spaCy language and the longest sentence, for a spaCy DocBin the annotation its
    labels come from and the tag scheme entities and spans become."""

    token_column: int = 0
    label_column: int = -1
    labelled: bool = True
    encoding: str = "utf-8"
    lang: str = "en"
    text_max_tokens: int = TEXT_MAX_TOKENS
    nlp: object = None  # a spaCy pipeline for raw text (default: blank `lang` + sentencizer, made once)
    spacy_labels: str = "tag"  # DocBin labels: tag, pos, ents or spans:KEY (`gpseq.corpora.docbin`)
    tag_scheme: str = "iob2"  # DocBin entities and spans as chunk labels of this scheme


Reader = Callable[[Source, str, ReadOptions], Iterator[Sentence]]
FORMATS: dict[str, Reader] = {}
SUFFIXES: dict[str, str] = {}  # ".conllu" -> "conllu"


def register_format(name: str, suffixes: tuple[str, ...] = ()) -> Callable[[Reader], Reader]:
    """Register `reader(source, name, options)` as corpus format `name`, known by `suffixes` under auto."""

    def register(reader: Reader) -> Reader:
        FORMATS[name] = reader
        SUFFIXES.update({suffix: name for suffix in suffixes})
        return reader

    return register


@register_format("conll", (".conll", ".conllx", ".iob", ".iob2", ".bio", ".bioes", ".data", ".tsv", ".col"))
def _read_conll(source: Source, name: str, options: ReadOptions) -> Iterator[Sentence]:
    """CoNLL columns: token and label columns, a blank line between sentences, -DOCSTART- separators."""
    return iter_conll(source, token_column=options.token_column,
                      label_column=options.label_column if options.labelled else None,
                      encoding=options.encoding, name=name)


@register_format("crfpp")
def _read_crfpp(source: Source, name: str, options: ReadOptions) -> Iterator[Sentence]:
    """CRF++ `train.data`: CoNLL columns without -DOCSTART- (a token may be spelled so)."""
    return iter_conll(source, token_column=options.token_column,
                      label_column=options.label_column if options.labelled else None,
                      encoding=options.encoding, name=name, docstart=False)


@register_format("conllu", (".conllu",))
def _read_conllu(source: Source, name: str, options: ReadOptions) -> Iterator[Sentence]:
    """CoNLL-U (Universal Dependencies): FORM tokens, UPOS labels (the default label column, or
    column 3) or XPOS (column 4); any other column is an error, never silently UPOS."""
    where = name if name is not None else (source if isinstance(source, (str, Path)) else "<stream>")
    if options.token_column not in (0, 1):
        raise InputFormatError(where, None, f"CoNLL-U tokens are the FORM column (1), not column "
                                           f"{options.token_column}")
    label = {-1: "upos", 3: "upos", 4: "xpos"}.get(options.label_column)
    if options.labelled and label is None:
        raise InputFormatError(where, None, f"CoNLL-U labels are UPOS (label column 3, the default) or XPOS "
                                           f"(4), not column {options.label_column}")
    return iter_conllu(source, label=label if options.labelled else None, encoding=options.encoding, name=name)


@register_format("jsonl", (".jsonl",))
def _read_jsonl(source: Source, name: str, options: ReadOptions) -> Iterator[Sentence]:
    """JSON Lines: {"tokens": [...], "labels": [...]} per line (null, "" or "?": unlabelled)."""
    return iter_jsonl(source, labelled=options.labelled, encoding=options.encoding, name=name)


@register_format("spacy", (".spacy",))
def _read_spacy(source: Source, name: str, options: ReadOptions) -> Iterator[Sentence]:
    """spaCy DocBin: a sentence per `doc.sents` (per doc without sentence boundaries), labels from
    token.tag_ (default), token.pos_, doc.ents or a span group (`options.spacy_labels`)."""
    return iter_docbin(source, labels=options.spacy_labels if options.labelled else None,
                       scheme=options.tag_scheme, name=name)


@register_format("text")
def _read_text(source: Source, name: str, options: ReadOptions) -> Iterator[Sentence]:
    """Raw text, tokenised and split into sentences by spaCy (unlabelled)."""
    if options.labelled:
        where = name if name is not None else (source if isinstance(source, (str, Path)) else "<stream>")
        raise InputFormatError(where, None, "raw text has no labels; a labelled corpus is needed "
                                            "(--format conll, crfpp, conllu, jsonl or spacy)")
    if options.nlp is None:
        options.nlp = text_pipeline(options.lang)
    return iter_text(source, options.nlp, encoding=options.encoding, name=name, max_tokens=options.text_max_tokens)


def detect_format(path: str | Path, format: str = "auto", *, labelled: bool = True) -> str:
    """The format a path is read as: `format` itself unless auto; auto goes by the suffix (.conllu
    → conllu, .jsonl → jsonl, .spacy → spacy, CoNLL suffixes → conll) and otherwise is conll for a
    labelled corpus and raw text for an unlabelled input (stdin, `-`, included)."""
    if format != "auto":
        if format not in FORMATS:
            raise ConfigError(f"unknown corpus format {format!r}; known: auto, {', '.join(FORMATS)}")
        return format
    suffix = "" if str(path) == "-" else Path(path).suffix.lower()
    return SUFFIXES.get(suffix, "conll" if labelled else "text")


def iter_corpus(source: Source, format: str = "auto", *, name: str | None = None,
                options: ReadOptions | None = None, **settings) -> Iterator[Sentence]:
    """Stream the sentences of `source` (a path, `-` for stdin or a file object) in `format`;
    `settings` are ReadOptions fields (token_column, label_column, labelled, encoding, lang, …)."""
    options = options or ReadOptions(**settings)
    path = source if isinstance(source, (str, os.PathLike)) else "-"
    if str(source) == "-":
        source, name = sys.stdin.buffer, name or "<stdin>"
    resolved = detect_format(path, format, labelled=options.labelled)
    return FORMATS[resolved](source, name, options)


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off for the block (as it was before, after it)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_corpus(path: str | Path, format: str = "auto", **settings) -> list[Sentence]:
    """All sentences of a corpus file in `format` (see `iter_corpus`); InputFormatError if it has none."""
    with _collector_paused():  # sentences hold no reference cycles: no collector passes over them as they pile up
        sentences = list(iter_corpus(path, format, **settings))
    if not sentences:
        raise InputFormatError(path, None, "no sentences in the file")
    return sentences


class CorpusFile:
    """A corpus file that is read anew each time it is iterated (`iter_corpus` with these
    settings): a training corpus `Tagger.train` reads in passes instead of holding its sentences.
    Iterating it raises InputFormatError if it has no sentence."""

    def __init__(self, path: str | Path, format: str = "auto", **settings):
        if str(path) == "-":
            raise ConfigError("a corpus read in passes needs a file, not stdin")
        self.path, self.format, self.settings = Path(path), format, settings

    def __iter__(self) -> Iterator[Sentence]:
        empty = True
        for sentence in iter_corpus(self.path, self.format, **self.settings):
            empty = False
            yield sentence
        if empty:
            raise InputFormatError(self.path, None, "no sentences in the file")

    def __repr__(self) -> str:
        return f"CorpusFile({str(self.path)!r})"
