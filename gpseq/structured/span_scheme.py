"""Which label pairs start, continue and end a chunk under a tag scheme (conlleval boundaries,
`gpseq.corpora.schemes`), as tables over label ids: what the span probabilities of
`gpseq.structured.spans` constrain the chain with, and what reads a batch's chunks off its label-id
paths."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from gpseq.corpora.schemes import _chunk_ends, _chunk_starts, normalise_scheme, split_label
from gpseq.errors import ConfigError

_SENTINEL = ("O", "")  # what precedes a sentence and follows it


@dataclass(frozen=True)
class SpanScheme:
    """Which label pairs start, continue and end a chunk (conlleval boundaries of a tag scheme).

    types [C] chunk types; type_of [V] type id of each label (−1 for O); starts [V+1, V] (row V:
    the sentence start) holds when a chunk starts at the second label of the pair; continues
    [V, V] when a chunk running at the first label goes on through the second; ends [V, V+1]
    (column V: the sentence end) when it ends between them."""

    labels: tuple[str, ...]
    scheme: str
    types: tuple[str, ...]
    type_of: np.ndarray
    starts: np.ndarray
    continues: np.ndarray
    ends: np.ndarray

    @classmethod
    def build(cls, labels: Sequence[str], scheme: str) -> "SpanScheme":
        scheme = normalise_scheme(scheme)
        parsed = []
        for label in labels:
            parts = split_label(label)
            if parts is None:
                raise ConfigError(f"label {label!r} is not a chunk label: span probabilities need chunk labels")
            parsed.append(parts)
        types = tuple(sorted({kind for prefix, kind in parsed if prefix != "O"}))
        type_id = {kind: c for c, kind in enumerate(types)}
        type_of = np.array([-1 if prefix == "O" else type_id[kind] for prefix, kind in parsed], dtype=np.int64)
        V = len(parsed)
        before = parsed + [_SENTINEL]
        starts = np.array([[_chunk_starts(*a, *b) for b in parsed] for a in before], dtype=bool)
        ends = np.array([[a[0] != "O" and _chunk_ends(*a, *b) for b in before] for a in parsed], dtype=bool)
        continues = np.array([[a[0] != "O" and not _chunk_ends(*a, *b) for b in parsed] for a in parsed],
                             dtype=bool)
        assert starts.shape == (V + 1, V) and ends.shape == (V, V + 1)
        return cls(tuple(labels), scheme, types, type_of, starts, continues, ends)

    @cached_property
    def _type_ids(self) -> dict:
        return {kind: c for c, kind in enumerate(self.types)}

    def type_index(self, kind: str) -> int:
        try:
            return self._type_ids[kind]
        except KeyError:
            raise ConfigError(f"no chunk type {kind!r} among the model's labels ({', '.join(self.types)})") from None

    def chunks(self, paths: Sequence) -> list[list[tuple[str, int, int]]]:
        """`gpseq.corpora.schemes.spans` of each label-id path of a batch (1-D integer arrays), read
        off the pair tables: every sentence's ids followed by the sentence end (id V), each id with
        its predecessor's (V before a sentence's first). A chunk is open after every label that is
        not O, so starts and ends alternate: the k-th end closes the k-th chunk."""
        V = len(self.labels)
        starts, ends = np.zeros((V + 1, V + 1), bool), np.zeros((V + 1, V + 1), bool)
        starts[:, :V], ends[:V, :] = self.starts, self.ends  # V: outside the sentence
        lengths = np.array([len(path) for path in paths], dtype=np.int64)
        closing = np.cumsum(lengths + 1) - 1  # each sentence's end position
        ids = np.full(int(lengths.sum()) + len(paths), V, dtype=np.int64)
        if len(ids) > len(paths):
            ids[np.arange(int(lengths.sum())) + np.repeat(np.arange(len(paths)), lengths)] = np.concatenate(
                [np.asarray(path, dtype=np.int64).ravel() for path in paths])
        before = np.full_like(ids, V)
        before[1:] = ids[:-1]
        before[closing[:-1] + 1] = V
        begin, end = np.flatnonzero(starts[before, ids]), np.flatnonzero(ends[before, ids])
        sentence = np.searchsorted(closing, begin)
        offset = closing[sentence] - lengths[sentence]  # where the sentence's first token sits
        found = list(zip([self.types[c] for c in self.type_of[ids[begin]].tolist()], (begin - offset).tolist(),
                         (end - offset).tolist()))
        bounds = np.cumsum(np.bincount(sentence, minlength=len(paths))).tolist()
        return [found[low:high] for low, high in zip([0, *bounds[:-1]], bounds)]
