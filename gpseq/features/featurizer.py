"""Extractor + vectoriser: sentences (or spaCy Docs) → sparse feature rows X `[N_tokens, D]`.

How it is fast: every token value (a lexical attribute of its word, a corpus column, a pipeline
attribute) becomes an integer value id, lexical ones once per word type (cached). A template's
feature for every token of a batch is then a vectorised mixed-radix key over the value ids of
its parts (shifted by their offsets, boundary ids outside the sentence), looked up in the
template's vocabulary table (or hashed). Python touches each token only for dictionary lookups.

Column PAD_ID = 0 is never emitted. In vocabulary mode columns are assigned template by
template, so the active columns of a row come out sorted without a sort.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
import zlib
from dataclasses import dataclass
from itertools import chain, repeat
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from gpseq.corpora._atomic import write_bytes_atomic
from gpseq.errors import ConfigError, InputFormatError, ModelFormatError
from gpseq.features.config import FeatureConfig
from gpseq.features.lexical import LEXICAL_ATTRIBUTES, is_lexical
from gpseq.features.padded import PAD_ID, ranges
from gpseq.features.templates import FeatureTemplate, boundary_string, source_name

FORMAT_NAME = "gpseq.features"
FORMAT_VERSION = 1
_DENSE_TABLE_MAX = 1 << 20  # templates whose key space is at most this use a direct lookup table
_TYPE_CACHE_MAX = 2_000_000  # word types cached before the cache is reset
_KEY_LIMIT = 1 << 62


@dataclass
class FeatureMatrix:
    """Feature rows of a batch of sentences: CSR `rows [N_tokens, D]`, `offsets [B+1]` (int64).

    Sentence b is rows `offsets[b]:offsets[b+1]`.
    """

    rows: sp.csr_matrix
    offsets: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        """Sentence lengths `[B]` (int64)."""
        return np.diff(self.offsets)

    @property
    def n_features(self) -> int:
        return self.rows.shape[1]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def sentence(self, b: int) -> sp.csr_matrix:
        """The rows `[T_b, D]` of sentence b."""
        return self.rows[int(self.offsets[b]) : int(self.offsets[b + 1])]

    def padded_batch(self, sentence_ids, width: int | None = None):
        """Sentences `sentence_ids` as padded tensors, vectorised (no loop over tokens or sentences).

        Returns `(indices [B, T, F] int32, values [B, T, F], lengths [B] int32)`, T = longest
        sentence, F = `width` or the largest row nnz (at least 1); padding has index PAD_ID = 0
        and value 0.
        """
        sentence_ids = np.asarray(sentence_ids, dtype=np.int64).reshape(-1)
        starts, stops = self.offsets[sentence_ids], self.offsets[sentence_ids + 1]
        lengths = (stops - starts).astype(np.int32)
        n_seq = len(sentence_ids)
        time = int(lengths.max()) if n_seq else 0
        token_ids = ranges(starts, stops)
        indptr = self.rows.indptr
        row_nnz = (indptr[token_ids + 1] - indptr[token_ids]).astype(np.int64)
        needed = int(row_nnz.max()) if row_nnz.size else 0
        if width is None:
            width = max(1, needed)
        elif width < needed:
            raise ValueError(f"width {width} < largest row nnz {needed}")
        indices = np.full((n_seq, time, width), PAD_ID, dtype=np.int32)
        values = np.zeros((n_seq, time, width), dtype=self.rows.dtype)
        seq_of = np.repeat(np.arange(n_seq), lengths)
        pos = np.arange(len(token_ids)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        element = ranges(indptr[token_ids], indptr[token_ids + 1])
        element_token = np.repeat(np.arange(len(token_ids)), row_nnz)
        slot = np.arange(len(element)) - np.repeat(np.cumsum(row_nnz) - row_nnz, row_nnz)
        indices[seq_of[element_token], pos[element_token], slot] = self.rows.indices[element]
        values[seq_of[element_token], pos[element_token], slot] = self.rows.data[element]
        return indices, values, lengths


class _ValueSpace:
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
                new.append(_stable_hash(text))
            self._hashes = np.concatenate([self._hashes, np.array(new, dtype=np.uint64)])
        return self._hashes


def _stable_hash(text: str) -> int:
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    h = h ^ (h >> np.uint64(30))
    h = h * _M1
    h = h ^ (h >> np.uint64(27))
    h = h * _M2
    return h ^ (h >> np.uint64(31))


class _Table:
    """A template's vocabulary: sorted keys → columns, with a direct table for small key spaces."""

    def __init__(self, keys: np.ndarray, columns: np.ndarray, key_space: int):
        self.keys = np.asarray(keys, dtype=np.int64)
        self.columns = np.asarray(columns, dtype=np.int32)
        self.dense = None
        if key_space <= _DENSE_TABLE_MAX:
            self.dense = np.zeros(max(key_space, 1), dtype=np.int32)
            self.dense[self.keys] = self.columns

    def lookup(self, keys: np.ndarray, valid: np.ndarray | None) -> np.ndarray:
        """Columns `[N]` (int32) of `keys [N]`; 0 where invalid or not in the vocabulary."""
        if valid is not None:
            keys = np.where(valid, keys, 0)
        if self.dense is not None:
            found = self.dense[keys]
        elif len(self.keys) == 0:
            return np.zeros(len(keys), dtype=np.int32)
        else:
            at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
            found = np.where(self.keys[at] == keys, self.columns[at], 0).astype(np.int32)
        if valid is not None:
            found = np.where(valid, found, 0).astype(np.int32)
        return found


class Featurizer:
    """Feature extractor + vectoriser for one `FeatureConfig`.

    `fit(sentences)` builds the vocabulary (or sets up hashing), `transform(sentences)` gives a
    `FeatureMatrix` (features unseen in fit are ignored), `transform_docs(docs)` does the same
    for spaCy Docs (pipeline attributes read from the Docs). `nlp` optionally supplies the
    loaded spaCy pipeline instead of loading `config.pipeline`.
    """

    def __init__(self, config: FeatureConfig, nlp=None):
        self.config = config.validate()
        self._templates: list[FeatureTemplate] = config.templates()
        self._sources: list = config.sources()
        self._max_offset = max((abs(o) for t in self._templates for _, o in t.parts), default=0)
        self._nlp = nlp
        self._tables: list[_Table] | None = None
        self._n_features: int | None = config.hashing_dim
        self._reset_spaces(frozen=False)

    # ------------------------------------------------------------------ public API
    @property
    def hashing(self) -> bool:
        return self.config.hashing_dim is not None

    @property
    def is_fitted(self) -> bool:
        return self.hashing or self._tables is not None

    @property
    def n_features(self) -> int:
        """D, the number of columns, including the reserved PAD column 0."""
        if not self.is_fitted:
            raise ConfigError("the featurizer is not fitted (call fit first)")
        return int(self._n_features)

    @property
    def templates(self) -> list[FeatureTemplate]:
        return list(self._templates)

    def fit(self, sentences) -> "Featurizer":
        """Build the vocabulary on training `sentences` (min_count, max_features); returns self."""
        if self.hashing:
            return self
        self._reset_spaces(frozen=False)
        lengths, values = self._values_from_sentences(list(sentences))
        return self._fit_values(lengths, values)

    def fit_docs(self, docs) -> "Featurizer":
        """`fit` for spaCy Docs (attributes read from the Docs, as `transform_docs`)."""
        if self.hashing:
            return self
        self._reset_spaces(frozen=False)
        lengths, values = self._values_from_docs(list(docs))
        return self._fit_values(lengths, values)

    def transform(self, sentences) -> FeatureMatrix:
        """Feature rows of `sentences` (`Sentence` objects) → FeatureMatrix `[N_tokens, D]`."""
        self._check_fitted()
        self._maybe_reset_type_cache()
        lengths, values = self._values_from_sentences(list(sentences))
        return self._vectorise(lengths, values)

    def fit_transform(self, sentences) -> FeatureMatrix:
        sentences = list(sentences)
        return self.fit(sentences).transform(sentences)

    def transform_docs(self, docs) -> FeatureMatrix:
        """Feature rows of spaCy Docs: pipeline attributes and mapped columns read from the tokens."""
        self._check_fitted()
        self._maybe_reset_type_cache()
        lengths, values = self._values_from_docs(list(docs))
        return self._vectorise(lengths, values)

    def feature_names(self) -> list[str]:
        """Name of every column `[D]`: "<pad>" for column 0, else the feature string."""
        self._check_fitted()
        if self.hashing:
            return ["<pad>"] + [f"hash[{i}]" for i in range(1, self.n_features)]
        names = [""] * self.n_features
        names[PAD_ID] = "<pad>"
        for template, table in zip(self._templates, self._tables):
            parts = self._decode(template, table.keys)
            spaces = [self._spaces[s] for s, _ in template.parts]
            for row, column in enumerate(table.columns):
                values = [space.string(int(ids[row]), template.is_crfpp) for space, ids in zip(spaces, parts)]
                names[column] = template.render(values)
        return names

    def column_groups(self) -> tuple[np.ndarray, list[str]]:
        """The template each column belongs to: group ids `[D]` into the returned names (the
        priors of the weights are shared within a template). Column 0 (padding) is group 0,
        "<pad>"; with the hashing trick every other column is one group, "<hashed>"."""
        self._check_fitted()
        groups = np.zeros(self.n_features, dtype=np.int32)
        if self.hashing:
            groups[PAD_ID + 1 :] = 1
            return groups, ["<pad>", "<hashed>"]
        for number, table in enumerate(self._tables, start=1):
            groups[table.columns] = number
        return groups, ["<pad>"] + [template.name for template in self._templates]

    def to_dict(self) -> dict:
        """The JSON part of the saved featurizer (config, value strings, format version)."""
        self._check_fitted()
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "config": self.config.to_dict(),
            "mode": "hashing" if self.hashing else "vocabulary",
            "n_features": self.n_features,
            "max_offset": self._max_offset,
            "templates": [t.name for t in self._templates],
            "sources": self._sources,
            "values": None if self.hashing else [self._spaces[s].strings for s in self._sources],
        }

    def save(self, directory) -> None:
        """Write `featurizer.json` (+ `vocabulary.npz`) into `directory`, each file atomically."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        data = self.to_dict()
        if not self.hashing:
            arrays = {}
            for i, table in enumerate(self._tables):
                arrays[f"keys_{i}"] = table.keys
                arrays[f"columns_{i}"] = table.columns
            buffer = io.BytesIO()
            np.savez(buffer, **arrays)
            payload = buffer.getvalue()
            data["vocabulary_sha256"] = hashlib.sha256(payload).hexdigest()
            write_bytes_atomic(directory / "vocabulary.npz", payload)
        write_bytes_atomic(directory / "featurizer.json", json.dumps(data, ensure_ascii=False).encode("utf-8"))

    @classmethod
    def load(cls, directory, nlp=None) -> "Featurizer":
        """Read a featurizer written by `save`; a missing, corrupt or newer one → ModelFormatError."""
        directory = Path(directory)
        meta_path = directory / "featurizer.json"
        try:
            data = json.loads(meta_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ModelFormatError(f"{meta_path}: no saved featurizer") from None
        except (OSError, ValueError) as err:
            raise ModelFormatError(f"{meta_path}: unreadable ({err})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
            raise ModelFormatError(f"{meta_path}: not a gpseq featurizer")
        version = data.get("version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise ModelFormatError(
                f"{meta_path}: format version {version!r} is newer than this gpseq ({FORMAT_VERSION})"
            )
        try:
            config = FeatureConfig.from_dict(data["config"])
        except ConfigError as err:
            raise ModelFormatError(f"{meta_path}: bad feature configuration: {err}") from None
        featurizer = cls(config, nlp=nlp)
        names = [t.name for t in featurizer._templates]
        if names != data.get("templates") or featurizer._sources != data.get("sources"):
            raise ModelFormatError(f"{meta_path}: templates do not match the configuration")
        if data.get("max_offset") != featurizer._max_offset:
            raise ModelFormatError(f"{meta_path}: max_offset does not match the configuration")
        if featurizer.hashing:
            return featurizer
        npz_path = directory / "vocabulary.npz"
        try:
            payload = npz_path.read_bytes()
        except OSError as err:
            raise ModelFormatError(f"{npz_path}: unreadable ({err})") from None
        if hashlib.sha256(payload).hexdigest() != data.get("vocabulary_sha256"):
            raise ModelFormatError(f"{npz_path}: does not match featurizer.json (checksum)")
        values = data.get("values")
        if not isinstance(values, list) or len(values) != len(featurizer._sources):
            raise ModelFormatError(f"{meta_path}: bad value lists")
        n_boundary = 2 * featurizer._max_offset
        featurizer._spaces = {
            source: _ValueSpace(n_boundary, strings, frozen=True)
            for source, strings in zip(featurizer._sources, values)
        }
        try:
            with np.load(io.BytesIO(payload), allow_pickle=False) as arrays:
                tables = []
                for i, template in enumerate(featurizer._templates):
                    key_space = featurizer._key_space(template)
                    tables.append(_Table(arrays[f"keys_{i}"], arrays[f"columns_{i}"], key_space))
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as err:
            # ValueError includes an object array (a pickle), which is never unpickled
            detail = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ModelFormatError(f"{npz_path}: unreadable vocabulary arrays, truncated or corrupt ({detail})") from None
        featurizer._tables = tables
        featurizer._n_features = int(data["n_features"])
        return featurizer

    # ------------------------------------------------------------------ value extraction
    def _reset_spaces(self, frozen: bool) -> None:
        n_boundary = 2 * self._max_offset
        self._spaces = {s: _ValueSpace(n_boundary, frozen=frozen) for s in self._sources}
        self._lexical_sources = [s for s in self._sources if is_lexical(s)]
        self._lexical_functions = [LEXICAL_ATTRIBUTES[s] for s in self._lexical_sources]
        self._type_index: dict[str, int] = {}
        self._type_values = np.zeros((1024, len(self._lexical_sources)), dtype=np.int64)

    def _maybe_reset_type_cache(self) -> None:
        """Bound the caches of a long-running tagger (they only speed up repeated values)."""
        if self.hashing and sum(space.radix for space in self._spaces.values()) > _TYPE_CACHE_MAX:
            self._reset_spaces(frozen=False)  # hashing needs no stable ids: start afresh
        elif len(self._type_index) > _TYPE_CACHE_MAX:
            self._type_index = {}

    def _vocab(self):
        return _blank_vocab(self.config.lang)

    def _pipeline(self):
        if self._nlp is None:
            if self.config.pipeline is None:
                raise ConfigError(
                    "features use spaCy token attributes "
                    f"{[s for s in self._sources if isinstance(s, str) and not is_lexical(s)]} "
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
            vocab = self._vocab()
            lexemes = [vocab[word] for word in new_words]
            for j, (source, fn) in enumerate(zip(self._lexical_sources, self._lexical_functions)):
                strings = [fn(lexeme, word) for lexeme, word in zip(lexemes, new_words)]
                self._type_values[first:needed, j] = self._spaces[source].ids(strings)
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

    def _values_from_sentences(self, sentences: list) -> tuple[np.ndarray, dict]:
        """Sentence lengths `[B]` and value ids `[N]` of every source."""
        lengths = np.fromiter((len(s.tokens) for s in sentences), dtype=np.int64, count=len(sentences))
        values: dict = {}
        words = list(chain.from_iterable(s.tokens for s in sentences))
        self._lexical_values(words, values)
        column_sources = [s for s in self._sources if isinstance(s, int)]
        if column_sources:
            for s in sentences:
                if len(s.columns) != len(s.tokens):
                    raise InputFormatError(s.source or "<sentences>", s.line,
                                           f"{len(s.tokens)} tokens but {len(s.columns)} column rows")
            rows = list(chain.from_iterable(s.columns for s in sentences))
            for source in column_sources:
                try:
                    strings = [row[source] for row in rows]
                except IndexError:
                    raise _missing_column(sentences, source) from None
                values[source] = self._spaces[source].ids(strings)
        token_sources = [s for s in self._sources if isinstance(s, str) and not is_lexical(s)]
        if token_sources:
            from spacy.tokens import Doc

            nlp = self._pipeline()
            docs = list(nlp.pipe(Doc(nlp.vocab, words=list(s.tokens)) for s in sentences))
            tokens = list(chain.from_iterable(docs))
            for source in token_sources:
                values[source] = self._spaces[source].ids(_token_strings(tokens, source))
        return lengths, values

    def _values_from_docs(self, docs: list) -> tuple[np.ndarray, dict]:
        lengths = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
        tokens = list(chain.from_iterable(docs))
        words = [t.text for t in tokens]
        values: dict = {}
        self._lexical_values(words, values)
        for source in self._sources:
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
                fn, vocab = LEXICAL_ATTRIBUTES[attribute], self._vocab()
                strings = [fn(vocab[w], w) for w in words]
            else:
                strings = _token_strings(tokens, attribute)
            values[source] = self._spaces[source].ids(strings)
        return lengths, values

    # ------------------------------------------------------------------ keys and vocabulary
    def _key_space(self, template: FeatureTemplate) -> int:
        space = 1
        for source, _ in template.parts:
            space *= self._spaces[source].radix
        return space

    def _shifted(self, values: dict, source, offset: int, geometry, cache: dict) -> np.ndarray:
        """Value ids of `source` at t + offset for every token t `[N]`, boundary ids outside."""
        key = (source, offset)
        if key not in cache:
            ids = values[source]
            if offset == 0:
                cache[key] = ids
            else:
                pos, length = geometry
                target = pos + offset
                n = len(ids)
                src = np.clip(np.arange(n) + offset, 0, max(n - 1, 0))
                boundary = np.where(target < 0, -target - 1, self._max_offset + target - length)
                inside = (target >= 0) & (target < length)
                cache[key] = np.where(inside, ids[src], boundary)
        return cache[key]

    def _keys(self, template: FeatureTemplate, values: dict, geometry, cache: dict, n: int):
        """Mixed-radix key `[N]` (int64) of each token's value tuple, and validity (None = all)."""
        if not template.parts:
            return np.zeros(n, dtype=np.int64), None
        if self._key_space(template) >= _KEY_LIMIT:
            raise ConfigError(f"feature template {template.name!r}: conjunction key space too large")
        key = None
        valid = None
        for source, offset in template.parts:
            ids = self._shifted(values, source, offset, geometry, cache)
            if self._spaces[source].frozen:
                ok = ids >= 0
                valid = ok if valid is None else valid & ok
            key = ids.copy() if key is None else key * self._spaces[source].radix + ids
        return key, valid

    def _decode(self, template: FeatureTemplate, keys: np.ndarray) -> list[np.ndarray]:
        """Inverse of `_keys`: value ids of each part `[n_parts][K]`."""
        parts = []
        rest = np.asarray(keys, dtype=np.int64)
        for source, _ in reversed(template.parts):
            radix = self._spaces[source].radix
            parts.append(rest % radix)
            rest = rest // radix
        return parts[::-1]

    @staticmethod
    def _geometry(lengths: np.ndarray):
        starts = np.cumsum(lengths) - lengths
        pos = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(starts, lengths)
        return pos, np.repeat(lengths, lengths)

    def _fit_values(self, lengths: np.ndarray, values: dict) -> "Featurizer":
        n = int(lengths.sum())
        geometry, cache = self._geometry(lengths), {}
        uniques, counts = [], []
        for template in self._templates:
            keys, _ = self._keys(template, values, geometry, cache, n)
            key_space = self._key_space(template)
            if key_space <= min(_DENSE_TABLE_MAX * 4, 8 * n + 1024):  # counting beats sorting
                count = np.bincount(keys, minlength=key_space)
                unique = np.flatnonzero(count)
                count = count[unique]
            else:
                unique, count = np.unique(keys, return_counts=True)
            uniques.append(unique)
            counts.append(count)
        all_counts = np.concatenate(counts) if counts else np.zeros(0, dtype=np.int64)
        keep = all_counts >= self.config.min_count
        if self.config.max_features is not None and keep.sum() > self.config.max_features:
            candidates = np.flatnonzero(keep)
            order = np.argsort(-all_counts[candidates], kind="stable")
            keep = np.zeros_like(keep)
            keep[candidates[order[: self.config.max_features]]] = True
        bounds = np.cumsum([0] + [len(u) for u in uniques])
        kept_keys = [u[keep[bounds[i] : bounds[i + 1]]] for i, u in enumerate(uniques)]
        # old value ids of every kept feature, per template part
        kept_parts = [self._decode(t, k) for t, k in zip(self._templates, kept_keys)]
        # new value spaces: only the values some kept feature uses, in first-seen order
        n_boundary = 2 * self._max_offset
        used: dict = {s: [] for s in self._sources}
        for template, parts in zip(self._templates, kept_parts):
            for (source, _), ids in zip(template.parts, parts):
                used[source].append(ids)
        remap, spaces = {}, {}
        for source in self._sources:
            old = self._spaces[source]
            ids = np.unique(np.concatenate(used[source])) if used[source] else np.zeros(0, dtype=np.int64)
            real = ids[ids >= n_boundary]
            table = np.full(old.radix, -1, dtype=np.int64)
            table[:n_boundary] = np.arange(n_boundary)
            table[real] = n_boundary + np.arange(len(real))
            remap[source] = table
            spaces[source] = _ValueSpace(n_boundary, [old.strings[i - n_boundary] for i in real], frozen=True)
        self._spaces = spaces
        tables, next_column = [], PAD_ID + 1
        for template, parts, kept in zip(self._templates, kept_parts, kept_keys):
            key = np.zeros(len(kept), dtype=np.int64)
            for (source, _), ids in zip(template.parts, parts):
                key = key * spaces[source].radix + remap[source][ids]
            key = np.sort(key)
            columns = np.arange(next_column, next_column + len(key), dtype=np.int32)
            next_column += len(key)
            tables.append(_Table(key, columns, self._key_space(template)))
        self._tables = tables
        self._n_features = next_column
        self._type_index = {}  # lexical value ids changed with the new spaces
        return self

    # ------------------------------------------------------------------ vectorisation
    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise ConfigError("the featurizer is not fitted (call fit first)")

    def _vectorise(self, lengths: np.ndarray, values: dict) -> FeatureMatrix:
        n = int(lengths.sum())
        geometry, cache = self._geometry(lengths), {}
        slots = np.zeros((n, len(self._templates)), dtype=np.int32)
        if self.hashing:
            modulus = np.uint64(self.config.hashing_dim - 1)
            for j, template in enumerate(self._templates):
                h = np.full(n, _stable_hash(template.name), dtype=np.uint64)
                for source, offset in template.parts:
                    ids = self._shifted(values, source, offset, geometry, cache)
                    h = _mix(h ^ self._spaces[source].hashes()[ids])
                slots[:, j] = (h % modulus + np.uint64(1)).astype(np.int32)
        else:
            for j, (template, table) in enumerate(zip(self._templates, self._tables)):
                keys, valid = self._keys(template, values, geometry, cache, n)
                slots[:, j] = table.lookup(keys, valid)
        active = slots != PAD_ID
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(active.sum(axis=1), out=indptr[1:])
        indices = slots[active]
        dtype = np.dtype(self.config.dtype)
        rows = sp.csr_matrix(
            (np.ones(len(indices), dtype=dtype), indices, indptr), shape=(n, self._n_features)
        )
        if self.hashing:
            rows.sum_duplicates()  # collisions within a row; also sorts the indices
            if self.config.binary:
                rows.data[:] = 1
        else:
            rows.has_sorted_indices = True  # columns are assigned template by template
        if self.config.l2_normalize and rows.nnz:
            norms = np.sqrt(np.asarray(rows.multiply(rows).sum(axis=1)).ravel())
            norms[norms == 0] = 1
            rows.data /= np.repeat(norms, np.diff(rows.indptr)).astype(dtype)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return FeatureMatrix(rows, offsets)


_BLANK_VOCABS: dict = {}


def _blank_vocab(lang: str):
    """The Vocab of `spacy.blank(lang)`, shared by all featurizers (lexical attributes only)."""
    if lang not in _BLANK_VOCABS:
        import spacy

        try:
            _BLANK_VOCABS[lang] = spacy.blank(lang).vocab
        except Exception as err:  # spaCy raises ImportError/KeyError-like errors for unknown codes
            raise ConfigError(f"features.lang {lang!r}: no spaCy language ({err})") from None
    return _BLANK_VOCABS[lang]


def _token_strings(tokens: list, attribute: str) -> list[str]:
    """String value of a spaCy Token attribute (or `_.extension`) for each token."""
    if attribute.startswith("_."):
        name = attribute[2:]
        return [str(t._.get(name)) for t in tokens]
    return [str(getattr(t, attribute)) for t in tokens]


def _missing_column(sentences: list, column: int) -> InputFormatError:
    for s in sentences:
        for t, row in enumerate(s.columns):
            if len(row) <= column:
                line = None if s.line is None else s.line + t
                return InputFormatError(
                    s.source or "<sentences>", line,
                    f"token {row[0] if row else ''!r} has {len(row)} columns; feature column {column} needed",
                )
    return InputFormatError("<sentences>", None, f"feature column {column} missing")
