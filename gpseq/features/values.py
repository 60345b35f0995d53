"""Token values: every token's value of each feature source as an integer id.

A source is a lexical attribute of the word (computed once per word type and cached; from the
text, `lexical.text_function`, or where only spaCy has it through spaCy's blank Vocab), a corpus
column, or a spaCy pipeline attribute; `ValueSpace` maps its value strings to ids (ids below
`n_boundary` are the sentence-boundary values BOS1…, EOS1…).
"""

from __future__ import annotations

import hashlib
from itertools import chain, repeat

import numpy as np

from gpseq.corpora.text import blank_nlp
from gpseq.corpora.types import TokenRows
from gpseq.errors import ConfigError, InputFormatError
from gpseq.features.config import FeatureConfig
from gpseq.features.lexical import LEXICAL_ATTRIBUTES, is_lexical, text_function
from gpseq.features.templates import boundary_string

_TYPE_CACHE_MAX = 2_000_000  # word types cached before the cache is reset


class ValueSpace:
    """Value strings of one source ↔ integer ids; ids 0..n_boundary-1 are the boundary values."""

    def __init__(self, n_boundary: int, strings=(), frozen: bool = False):
        self.n_boundary = n_boundary
        self.strings: list[str] = list(strings)
        self.index = {s: i + n_boundary for i, s in enumerate(self.strings)}
        self.frozen = frozen
        self._hashes = np.zeros(0, dtype=np.uint64)

    @property
    def radix(self) -> int:
        return self.n_boundary + len(self.strings)

    def id(self, value: str) -> int:
        """Id of `value`; a new id when not frozen, -1 for an unseen value when frozen."""
        found = self.index.get(value)
        if found is not None:
            return found
        if self.frozen:
            return -1
        new = self.radix
        self.index[value] = new
        self.strings.append(value)
        return new

    def ids(self, values: list[str]) -> np.ndarray:
        """Ids `[N]` (int64) of a list of value strings."""
        found = np.fromiter(map(self.index.get, values, repeat(-1)), dtype=np.int64, count=len(values))
        if not self.frozen:
            for i in np.flatnonzero(found < 0):
                found[i] = self.id(values[i])
        return found

    def string(self, value_id: int, crfpp: bool) -> str:
        half = self.n_boundary // 2
        if value_id < half:
            return boundary_string(value_id + 1, True, crfpp)
        if value_id < self.n_boundary:
            return boundary_string(value_id - half + 1, False, crfpp)
        return self.strings[value_id - self.n_boundary]

    def hashes(self) -> np.ndarray:
        """Stable 64-bit hash of every value id `[radix]` (uint64), for the hashing trick."""
        if len(self._hashes) < self.radix:
            half = self.n_boundary // 2
            new = []
            for value_id in range(len(self._hashes), self.radix):
                if value_id < self.n_boundary:
                    text = f"\x00BOS{value_id + 1}" if value_id < half else f"\x00EOS{value_id - half + 1}"
                else:
                    text = self.strings[value_id - self.n_boundary]
                new.append(stable_hash(text))
            self._hashes = np.concatenate([self._hashes, np.array(new, dtype=np.uint64)])
        return self._hashes


def stable_hash(text: str) -> int:
    """A 64-bit hash of `text` that is the same in every process (unlike `hash`)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class TokenValues:
    """Value ids `[N_tokens]` of every feature source for sentences or spaCy Docs, with the value
    spaces (`spaces`: source → ValueSpace) and a cache of the lexical values of each word type.
    `nlp` optionally supplies the loaded spaCy pipeline instead of loading `config.pipeline`."""

    def __init__(self, config: FeatureConfig, sources: list, n_boundary: int, nlp=None):
        self.config, self.sources, self.n_boundary = config, list(sources), n_boundary
        self._nlp = nlp
        self._lexical_sources = [s for s in self.sources if is_lexical(s)]
        self._lexical_functions = [self._lexical_function(s) for s in self._lexical_sources]
        self.reset(frozen=False)

    def reset(self, frozen: bool) -> None:
        """Start from empty value spaces (frozen: unseen values get id -1)."""
        self.use_spaces({s: ValueSpace(self.n_boundary, frozen=frozen) for s in self.sources})

    def use_spaces(self, spaces: dict) -> None:
        """Replace the value spaces (after fitting the vocabulary, or loading one); the word-type
        cache is emptied since its ids index the old spaces."""
        self.spaces = spaces
        self._type_index: dict[str, int] = {}
        self._type_values = np.zeros((1024, len(self._lexical_sources)), dtype=np.int64)

    def bound_caches(self, hashing: bool) -> None:
        """Bound the caches of a long-running tagger (they only speed up repeated values)."""
        if hashing and sum(space.radix for space in self.spaces.values()) > _TYPE_CACHE_MAX:
            self.reset(frozen=False)  # hashing needs no stable ids: start afresh
        elif len(self._type_index) > _TYPE_CACHE_MAX:
            self._type_index = {}

    def _vocab(self):
        return blank_vocab(self.config.lang)

    def _lexical_function(self, source: str):
        """function(words) -> value strings of lexical attribute `source`: from the text where
        `text_function` has it, else from spaCy's lexemes."""
        text = text_function(source, self.config.lang)
        if text is not None:
            return lambda words: list(map(text, words))
        lexeme = LEXICAL_ATTRIBUTES[source]

        def from_lexemes(words):
            vocab = self._vocab()
            return [lexeme(vocab[word], word) for word in words]

        return from_lexemes

    def _pipeline(self):
        if self._nlp is None:
            if self.config.pipeline is None:
                raise ConfigError(
                    "features use spaCy token attributes "
                    f"{[s for s in self.sources if isinstance(s, str) and not is_lexical(s)]} "
                    "but features.pipeline is not set (or use transform_docs on processed Docs)"
                )
            import spacy

            try:
                self._nlp = spacy.load(self.config.pipeline)
            except OSError as err:
                raise ConfigError(f"cannot load spaCy pipeline {self.config.pipeline!r}: {err}") from None
        return self._nlp

    def _type_ids(self, words: list[str]) -> np.ndarray:
        """Word-type id of every word `[N]`, adding (and computing lexical values of) new types."""
        index = self._type_index
        ids = np.fromiter(map(index.get, words, repeat(-1)), dtype=np.int64, count=len(words))
        missing = np.flatnonzero(ids < 0)
        if missing.size:
            new_words = list(dict.fromkeys(words[i] for i in missing))
            first = len(index)
            needed = first + len(new_words)
            if needed > len(self._type_values):
                size = max(needed, 2 * len(self._type_values))
                grown = np.zeros((size, self._type_values.shape[1]), dtype=np.int64)
                grown[:first] = self._type_values[:first]
                self._type_values = grown
            for j, (source, strings_of) in enumerate(zip(self._lexical_sources, self._lexical_functions)):
                self._type_values[first:needed, j] = self.spaces[source].ids(strings_of(new_words))
            index.update(zip(new_words, range(first, needed)))
            ids[missing] = np.fromiter(map(index.__getitem__, (words[i] for i in missing)), dtype=np.int64,
                                       count=len(missing))
        return ids

    def _lexical_values(self, words: list[str], values: dict) -> None:
        if not self._lexical_sources:
            return
        type_ids = self._type_ids(words)  # may grow self._type_values: index after
        type_values = self._type_values[type_ids]
        for j, source in enumerate(self._lexical_sources):
            values[source] = type_values[:, j]

    def of_sentences(self, sentences: list) -> tuple[np.ndarray, dict]:
        """Sentence lengths `[B]` and value ids `[N]` of every source, for `Sentence` objects."""
        lengths = np.fromiter((len(s.tokens) for s in sentences), dtype=np.int64, count=len(sentences))
        values: dict = {}
        words = list(chain.from_iterable(s.tokens for s in sentences))
        self._lexical_values(words, values)
        column_sources = [s for s in self.sources if isinstance(s, int)]
        if column_sources:
            for s in sentences:
                if len(s.columns) != len(s.tokens):
                    raise InputFormatError(s.source or "<sentences>", s.line,
                                           f"{len(s.tokens)} tokens but {len(s.columns)} column rows")
            for source in column_sources:
                try:
                    strings = list(chain.from_iterable(_column(s.columns, source) for s in sentences))
                except IndexError:
                    raise missing_column(sentences, source) from None
                values[source] = self.spaces[source].ids(strings)
        token_sources = [s for s in self.sources if isinstance(s, str) and not is_lexical(s)]
        if token_sources:
            from spacy.tokens import Doc

            nlp = self._pipeline()
            docs = list(nlp.pipe(Doc(nlp.vocab, words=list(s.tokens)) for s in sentences))
            tokens = list(chain.from_iterable(docs))
            for source in token_sources:
                values[source] = self.spaces[source].ids(token_strings(tokens, source))
        return lengths, values

    def of_docs(self, docs: list) -> tuple[np.ndarray, dict]:
        """Sentence lengths `[B]` and value ids `[N]` of every source, for spaCy Docs (pipeline
        attributes and mapped columns read from the tokens)."""
        lengths = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
        tokens = list(chain.from_iterable(docs))
        words = [t.text for t in tokens]
        values: dict = {}
        self._lexical_values(words, values)
        for source in self.sources:
            if is_lexical(source):
                continue
            if isinstance(source, int):
                attribute = self.config.column_attributes.get(source, "word" if source == 0 else None)
                if attribute is None:
                    raise ConfigError(
                        f"feature column {source} has no token attribute for spaCy Docs: "
                        f"set features.column_attributes, e.g. {{{source}: 'tag_'}}"
                    )
            else:
                attribute = source
            if is_lexical(attribute):
                strings = self._lexical_function(attribute)(words)
            else:
                strings = token_strings(tokens, attribute)
            values[source] = self.spaces[source].ids(strings)
        return lengths, values


def blank_vocab(lang: str):
    """The Vocab of the blank pipeline of `lang` (lexical attributes only), shared by all featurizers
    and the raw-text reader."""
    return blank_nlp(lang, "features.lang").vocab


def token_strings(tokens: list, attribute: str) -> list[str]:
    """String value of a spaCy Token attribute (or `_.extension`) for each token."""
    if attribute.startswith("_."):
        name = attribute[2:]
        return [str(t._.get(name)) for t in tokens]
    return [str(getattr(t, attribute)) for t in tokens]


def _column(rows, index: int):
    """Field `index` of every row of a sentence's `columns` (IndexError where a row lacks it)."""
    if isinstance(rows, TokenRows):
        return rows.column(index)
    return [row[index] for row in rows]


def missing_column(sentences: list, column: int) -> InputFormatError:
    """The error naming the first token without feature column `column`: the line of its sentence
    (a sentence's tokens are one line each in CoNLL, all on one line in JSON Lines) and its place."""
    for s in sentences:
        for t, row in enumerate(s.columns):
            if len(row) <= column:
                return InputFormatError(
                    s.source or "<sentences>", s.line,
                    f"token {t + 1} of the sentence ({row[0] if row else ''!r}) has {len(row)} column(s); "
                    f"feature column {column} needed",
                )
    return InputFormatError("<sentences>", None, f"feature column {column} missing")
