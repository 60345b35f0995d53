"""Extractor + vectoriser: sentences (or spaCy Docs) → sparse feature rows X `[N_tokens, D]`.

How it is fast: every token value (a lexical attribute of its word, a corpus column, a pipeline
attribute) becomes an integer value id, lexical ones once per word type (cached). A template's
feature for every token of a batch is then a vectorised mixed-radix key over the value ids of
its parts (shifted by their offsets, boundary ids outside the sentence), looked up in the
template's vocabulary table (or hashed). Python touches each token only for dictionary lookups.

In vocabulary mode columns are assigned by descending training count, so the weights that most
tokens read lie together (the corpus products' gathers stay in cache); a row's columns are sorted
once per batch. Column PAD_ID = 0 holds no feature of the vocabulary: with
`unseen_column` it carries k for a token that has k template features the vocabulary lacks (a word
form, affix or conjunction never seen in fit). Its weight never meets data in training, so it keeps
its prior N(0, σ²) and adds x₀² σ² to every label's potential variance and nothing to its mean. The
k features of one token all derive from the same new word form, so the default (`unseen_shared`)
treats their weights as one shared unknown: x₀ = k, variance k² σ². Independent weights (x₀ = √k,
variance k σ², exactly what their own absent weights would add) are the other choice, and what a
featurizer saved without `unseen_shared` uses. In hashing mode, or with L2-normalised rows, column
0 is never emitted.
"""

from __future__ import annotations

import numpy as np

from gpseq.errors import ConfigError, ModelFormatError
from gpseq.features.config import FeatureConfig
from gpseq.features.matrix import FeatureMatrix
from gpseq.features.padded import PAD_ID
from gpseq.features.rows import CsrRows
from gpseq.features.saved import (FORMAT_NAME, FORMAT_VERSION, read_featurizer_json, read_vocabulary,
                                  write_featurizer)
from gpseq.features.templates import FeatureTemplate
from gpseq.features.values import TokenValues, ValueSpace, stable_hash
from gpseq.features.vocabulary import KEY_LIMIT, FeatureCounts, VocabularyTable

__all__ = ["FORMAT_VERSION", "FeatureMatrix", "Featurizer"]



_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    h = h ^ (h >> np.uint64(30))
    h = h * _M1
    h = h ^ (h >> np.uint64(27))
    h = h * _M2
    return h ^ (h >> np.uint64(31))


FIT_BLOCK = 4096  # sentences whose values `Featurizer.fit` extracts at once


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
        self._values = TokenValues(config, self._sources, 2 * self._max_offset, nlp)
        self._tables: list[VocabularyTable] | None = None
        self._n_features: int | None = config.hashing_dim

    @property
    def _spaces(self) -> dict:
        """source → ValueSpace (owned by the token values)."""
        return self._values.spaces

    # ------------------------------------------------------------------ public API
    @property
    def hashing(self) -> bool:
        return self.config.hashing_dim is not None

    @property
    def counts_unseen(self) -> bool:
        """Whether column 0 carries the count of each token's features the vocabulary lacks."""
        return self.config.unseen_column and not self.hashing and not self.config.l2_normalize

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

    def fit(self, sentences, *, block_size: int = FIT_BLOCK) -> "Featurizer":
        """Build the vocabulary on training `sentences` (min_count, max_features); returns self.
        `sentences` (any iterable) is read once, `block_size` sentences at a time: the counts kept
        between blocks are those of the distinct features, so a stream of any length fits in the
        memory of its vocabulary."""
        if self.hashing:
            return self
        self._values.reset(frozen=False)
        counts = FeatureCounts(self)
        block: list = []
        for sentence in sentences:
            block.append(sentence)
            if len(block) == block_size:
                counts.add(*self._values.of_sentences(block))
                block = []
        if block:
            counts.add(*self._values.of_sentences(block))
        return self._build_vocabulary(*counts.totals())

    def fit_docs(self, docs) -> "Featurizer":
        """`fit` for spaCy Docs (attributes read from the Docs, as `transform_docs`)."""
        if self.hashing:
            return self
        self._values.reset(frozen=False)
        counts = FeatureCounts(self)
        counts.add(*self._values.of_docs(list(docs)))
        return self._build_vocabulary(*counts.totals())

    def transform(self, sentences) -> FeatureMatrix:
        """Feature rows of `sentences` (`Sentence` objects) → FeatureMatrix `[N_tokens, D]`."""
        self._check_fitted()
        self._values.bound_caches(self.hashing)
        lengths, values = self._values.of_sentences(list(sentences))
        return self._vectorise(lengths, values)

    def fit_transform(self, sentences) -> FeatureMatrix:
        sentences = list(sentences)
        return self.fit(sentences).transform(sentences)

    def transform_docs(self, docs) -> FeatureMatrix:
        """Feature rows of spaCy Docs: pipeline attributes and mapped columns read from the tokens."""
        self._check_fitted()
        self._values.bound_caches(self.hashing)
        lengths, values = self._values.of_docs(list(docs))
        return self._vectorise(lengths, values)

    def feature_names(self) -> list[str]:
        """Name of every column `[D]`: "<unseen>" (or "<pad>") for column 0, else the feature string."""
        self._check_fitted()
        if self.hashing:
            return ["<pad>"] + [f"hash[{i}]" for i in range(1, self.n_features)]
        names = [""] * self.n_features
        names[PAD_ID] = "<unseen>" if self.counts_unseen else "<pad>"
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
        arrays = None
        if not self.hashing:
            arrays = {}
            for i, table in enumerate(self._tables):
                arrays[f"keys_{i}"] = table.keys
                arrays[f"columns_{i}"] = table.columns
        write_featurizer(directory, self.to_dict(), arrays)

    @classmethod
    def load(cls, directory, nlp=None) -> "Featurizer":
        """Read a featurizer written by `save`; a missing, corrupt or newer one → ModelFormatError."""
        meta_path, data = read_featurizer_json(directory)
        try:
            # a featurizer saved without `unseen_column` keeps tagging without it, one saved without
            # `unseen_shared` with √k
            config = FeatureConfig.from_dict({"unseen_column": False, "unseen_shared": False, **data["config"]})
        except (ConfigError, KeyError, TypeError) as err:
            raise ModelFormatError(f"{meta_path}: bad feature configuration: {err}") from None
        featurizer = cls(config, nlp=nlp)
        names = [t.name for t in featurizer._templates]
        if names != data.get("templates") or featurizer._sources != data.get("sources"):
            raise ModelFormatError(f"{meta_path}: templates do not match the configuration")
        if data.get("max_offset") != featurizer._max_offset:
            raise ModelFormatError(f"{meta_path}: max_offset does not match the configuration")
        if featurizer.hashing:
            return featurizer
        arrays = read_vocabulary(directory, data)
        values = data.get("values")
        if not isinstance(values, list) or len(values) != len(featurizer._sources):
            raise ModelFormatError(f"{meta_path}: bad value lists")
        n_boundary = 2 * featurizer._max_offset
        featurizer._values.use_spaces({source: ValueSpace(n_boundary, strings, frozen=True)
                                       for source, strings in zip(featurizer._sources, values)})
        tables = []
        for i, template in enumerate(featurizer._templates):
            keys, columns = arrays.get(f"keys_{i}"), arrays.get(f"columns_{i}")
            if keys is None or columns is None:
                raise ModelFormatError(f"{meta_path}: vocabulary.npz lacks the table of template {template.name!r}")
            tables.append(VocabularyTable(keys, columns, featurizer._key_space(template)))
        featurizer._tables = tables
        featurizer._n_features = int(data["n_features"])
        return featurizer

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
        if self._key_space(template) >= KEY_LIMIT:
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

    def _build_vocabulary(self, uniques: list, counts: list) -> "Featurizer":
        """The columns of the kept features from the distinct keys of every template (under the
        final value spaces) and their counts."""
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
            spaces[source] = ValueSpace(n_boundary, [old.strings[i - n_boundary] for i in real], frozen=True)
        self._values.use_spaces(spaces)  # lexical value ids change with the new spaces
        kept_counts = [all_counts[bounds[i] : bounds[i + 1]][keep[bounds[i] : bounds[i + 1]]]
                       for i in range(len(uniques))]
        keys = []
        for template, parts, count in zip(self._templates, kept_parts, kept_counts):
            key = np.zeros(len(count), dtype=np.int64)
            for (source, _), ids in zip(template.parts, parts):
                key = key * spaces[source].radix + remap[source][ids]
            keys.append(key)
        # columns by descending training count (ties: template, then key order): the weights most
        # tokens read sit together at the top of W, where the corpus products' gathers stay in cache
        counts_all = np.concatenate(kept_counts) if kept_counts else np.zeros(0, np.int64)
        columns_all = np.empty(len(counts_all), dtype=np.int32)
        columns_all[np.argsort(-counts_all, kind="stable")] = PAD_ID + 1 + np.arange(len(counts_all), dtype=np.int32)
        starts = np.cumsum([0] + [len(kept) for kept in kept_keys])
        tables = []
        for template, key, low, high in zip(self._templates, keys, starts[:-1], starts[1:]):
            order = np.argsort(key, kind="stable")
            tables.append(VocabularyTable(key[order], columns_all[low:high][order], self._key_space(template)))
        self._tables = tables
        self._n_features = PAD_ID + 1 + len(counts_all)
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
                h = np.full(n, stable_hash(template.name), dtype=np.uint64)
                for source, offset in template.parts:
                    ids = self._shifted(values, source, offset, geometry, cache)
                    h = _mix(h ^ self._spaces[source].hashes()[ids])
                slots[:, j] = (h % modulus + np.uint64(1)).astype(np.int32)
        else:
            for j, (template, table) in enumerate(zip(self._templates, self._tables)):
                keys, valid = self._keys(template, values, geometry, cache, n)
                slots[:, j] = table.lookup(keys, valid)
        if not self.hashing:
            slots.sort(axis=1)  # each row's columns in order (columns go by frequency, not by template)
        active = slots != PAD_ID
        dtype = np.dtype(self.config.dtype)
        values = None
        if self.counts_unseen:  # column 0 first in each row: k (or √k) for k templates without a feature
            unseen = len(self._templates) - active.sum(axis=1)
            active = np.concatenate([(unseen > 0)[:, None], active], axis=1)
            slots = np.concatenate([np.full((n, 1), PAD_ID, dtype=slots.dtype), slots], axis=1)
            values = np.ones(active.shape, dtype=dtype)
            values[:, 0] = unseen if self.config.unseen_shared else np.sqrt(unseen)
            values = values[active]
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(active.sum(axis=1), out=indptr[1:])
        indices = slots[active]
        rows = CsrRows(np.ones(len(indices), dtype=dtype) if values is None else values, indices, indptr,
                       (n, self._n_features))
        if self.hashing:
            rows = rows.merged_duplicates(binary=self.config.binary)
        if self.config.l2_normalize:
            rows = rows.l2_normalised()
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return FeatureMatrix(rows, offsets)
