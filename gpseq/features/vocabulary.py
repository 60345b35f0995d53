"""A featurizer's vocabulary: the per-template tables from feature keys to columns, and the
counts of distinct features a fit gathers block by block (`Featurizer.fit`)."""

from __future__ import annotations

import numpy as np

from typing import TYPE_CHECKING

from gpseq.errors import ConfigError

if TYPE_CHECKING:
    from gpseq.features.featurizer import Featurizer

DENSE_TABLE_MAX = 1 << 20  # templates whose key space is at most this use a direct lookup table
KEY_LIMIT = 1 << 62


class VocabularyTable:
    """A template's vocabulary: sorted keys → columns, with a direct table for small key spaces."""

    def __init__(self, keys: np.ndarray, columns: np.ndarray, key_space: int):
        self.keys = np.asarray(keys, dtype=np.int64)
        self.columns = np.asarray(columns, dtype=np.int32)
        self.dense = None
        if key_space <= DENSE_TABLE_MAX:
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


def distinct_features(featurizer: "Featurizer", lengths: np.ndarray, values: dict) -> tuple[list, list]:
    """Per template of `featurizer`: the distinct mixed-radix keys of these tokens' features (under
    the value spaces as they are now) and their counts."""
    n = int(lengths.sum())
    geometry, cache = featurizer._geometry(lengths), {}
    uniques, counts = [], []
    for template in featurizer._templates:
        keys, _ = featurizer._keys(template, values, geometry, cache, n)
        key_space = featurizer._key_space(template)
        if key_space <= min(DENSE_TABLE_MAX * 4, 8 * n + 1024):  # counting beats sorting
            count = np.bincount(keys, minlength=key_space)
            unique = np.flatnonzero(count)
            count = count[unique]
        else:
            unique, count = np.unique(keys, return_counts=True)
        uniques.append(unique)
        counts.append(count)
    return uniques, counts


class FeatureCounts:
    """The feature counts of a fit so far, per template as (value ids of each part, count) of its
    distinct features — ids, unlike mixed-radix keys, stay valid as the value spaces grow — merged
    once `MERGE` blocks have been added."""

    MERGE = 8

    def __init__(self, featurizer: "Featurizer"):
        self.featurizer = featurizer
        self.pending: list[list] = [[] for _ in featurizer._templates]

    def add(self, lengths: np.ndarray, values: dict) -> None:
        featurizer = self.featurizer
        for j, (template, unique, count) in enumerate(zip(featurizer._templates, *distinct_features(featurizer, lengths, values))):
            self.pending[j].append((featurizer._decode(template, unique), count))
            if len(self.pending[j]) >= self.MERGE:
                self.pending[j] = [self._merged(j)]

    def _merged(self, j: int) -> tuple[list, np.ndarray]:
        unique, count = self._keyed(j)
        return self.featurizer._decode(self.featurizer._templates[j], unique), count

    def _keyed(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """Template j's distinct keys under the current value spaces (sorted) and their counts."""
        featurizer, template = self.featurizer, self.featurizer._templates[j]
        if featurizer._key_space(template) >= KEY_LIMIT:
            raise ConfigError(f"feature template {template.name!r}: conjunction key space too large")
        keys, counts = [], []
        for parts, count in self.pending[j]:
            key = np.zeros(len(count), dtype=np.int64)
            for (source, _), ids in zip(template.parts, parts):
                key = key * featurizer._spaces[source].radix + ids
            keys.append(key)
            counts.append(count)
        if len(keys) == 1:
            return keys[0], counts[0]
        unique, inverse = np.unique(np.concatenate(keys), return_inverse=True)
        return unique, np.bincount(inverse, weights=np.concatenate(counts), minlength=len(unique)).astype(np.int64)

    def totals(self) -> tuple[list, list]:
        """(distinct keys, counts) of every template under the final value spaces."""
        keyed = [self._keyed(j) if self.pending[j] else (np.zeros(0, np.int64), np.zeros(0, np.int64))
                 for j in range(len(self.pending))]
        return [unique for unique, _ in keyed], [count for _, count in keyed]
