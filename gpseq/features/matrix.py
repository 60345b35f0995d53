"""`FeatureMatrix`: the feature rows of a batch of sentences, CSR `[N_tokens, D]` + sentence offsets."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from gpseq.features.padded import PAD_ID
from gpseq.features.rows import CsrRows, ranges


@dataclass
class FeatureMatrix:
    """Feature rows of a batch of sentences: `csr [N_tokens, D]` (NumPy CSR arrays), `offsets [B+1]`
    (int64). Sentence b is rows `offsets[b]:offsets[b+1]`.

    `rows` is the same matrix as a `scipy.sparse.csr_matrix` (sharing the arrays), for training and
    every other consumer of SciPy's operations; tagging reads `csr` and never imports SciPy.
    """

    csr: CsrRows
    offsets: np.ndarray

    @cached_property
    def rows(self):
        """The rows as a `scipy.sparse.csr_matrix` `[N_tokens, D]`. SciPy may narrow the index arrays
        (a copy): `csr` then reads its arrays, so one copy of each is held."""
        matrix = self.csr.to_scipy()
        self.csr = CsrRows(matrix.data, matrix.indices, matrix.indptr, matrix.shape)
        return matrix

    @property
    def lengths(self) -> np.ndarray:
        """Sentence lengths `[B]` (int64)."""
        return np.diff(self.offsets)

    @property
    def n_features(self) -> int:
        return self.csr.shape[1]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def sentence(self, b: int):
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
        indptr = self.csr.indptr
        row_nnz = (indptr[token_ids + 1] - indptr[token_ids]).astype(np.int64)
        needed = int(row_nnz.max()) if row_nnz.size else 0
        if width is None:
            width = max(1, needed)
        elif width < needed:
            raise ValueError(f"width {width} < largest row nnz {needed}")
        indices = np.full((n_seq, time, width), PAD_ID, dtype=np.int32)
        values = np.zeros((n_seq, time, width), dtype=self.csr.dtype)
        seq_of = np.repeat(np.arange(n_seq), lengths)
        pos = np.arange(len(token_ids)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        element = ranges(indptr[token_ids], indptr[token_ids + 1])
        element_token = np.repeat(np.arange(len(token_ids)), row_nnz)
        slot = np.arange(len(element)) - np.repeat(np.cumsum(row_nnz) - row_nnz, row_nnz)
        indices[seq_of[element_token], pos[element_token], slot] = self.csr.indices[element]
        values[seq_of[element_token], pos[element_token], slot] = self.csr.data[element]
        return indices, values, lengths
