"""The corpus objective's weights W `[D, V]` in the two shapes its support takes, so that an
evaluation never touches a dense `[D, V]` array.

The support (the (feature, label) pairs seen in training, `chain_objective.observed_pairs`) is a
few percent of W: most features occur with one label only (a rare word, affix or conjunction),
and they carry a small share of a corpus's non-zeros; the features seen with two labels or more
are few and carry most of them. So W is held as

- the **head**: a dense block `[D_h, V]` over the features seen with ≥ 2 labels (small enough to
  stay in cache while a chunk's rows gather from it; 0 off the support), read by the head columns
  of X as a sparse × dense product, and
- the **tail**: one weight per feature seen with exactly one label, read by the tail non-zeros of X
  as a scatter into `u[token, label]`, its gradient a gather and a `bincount`.

Features with no pair on the support (a dev-only feature in the vocabulary, column 0) are in
neither: their weights are structural zeros of the fit. `SupportSplit` maps the support's flat
weights to and from the two parts; `SplitRows` is one chunk's X cut the same way.
"""

from __future__ import annotations

import numpy as np

from gpseq.features.rows import CsrRows
from gpseq.training.row_blocks import RowBlocks, Transposed, csr_on


class SupportSplit:
    """The head/tail split of a support `[P]` (flat f · V + v, sorted) over `num_features` columns
    and `num_labels` labels, with the weights of both parts in `dtype` (`write` fills them)."""

    def __init__(self, support: np.ndarray, num_features: int, num_labels: int, dtype):
        V = self.num_labels = int(num_labels)
        feature, label = support // V, support % V
        head = np.bincount(feature, minlength=num_features) >= 2
        self.head_ids = np.flatnonzero(head)
        # the index maps in int32 where they fit (they are over D and P: half the memory of int64)
        index = _index_dtype(max(num_features, len(support), len(self.head_ids) * V))
        self.head_column = np.full(num_features, -1, index)  # each feature's row of the head block
        self.head_column[self.head_ids] = np.arange(len(self.head_ids))
        on_head = head[feature]  # [P]
        # the support's positions of each part (index arrays: taking by them beats a boolean mask)
        self.head_positions = np.flatnonzero(on_head).astype(index)
        self.tail_positions = np.flatnonzero(~on_head).astype(index)
        self.head_flat = (self.head_column[feature[on_head]].astype(np.int64) * V + label[on_head]).astype(index)
        # each tail weight's feature (each once: one label each)
        self.tail_features = tail_features = feature[~on_head].astype(index)
        self.tail_index = np.full(num_features, -1, index)  # each feature's tail weight
        self.tail_index[tail_features] = np.arange(len(tail_features))
        self.tail_label = np.full(num_features, -1, index)
        self.tail_label[tail_features] = label[~on_head]
        self.weights = np.zeros((len(self.head_ids), V), dtype)  # the head block: 0 off the support
        self.tail_weights = np.zeros(len(tail_features), dtype)

    def write(self, w_support: np.ndarray) -> None:
        """The support's weights `[P]` into the head block and the tail."""
        self.weights.reshape(-1)[self.head_flat] = w_support[self.head_positions]
        self.tail_weights[:] = w_support[self.tail_positions]

    def gather(self, head_sums: np.ndarray, tail_sums: np.ndarray) -> np.ndarray:
        """A per-weight quantity (gradient, Fisher diagonal) on the support `[P]`, float64, from its
        head block `[D_h, V]` and tail `[D_t]`."""
        out = np.empty(len(self.head_positions) + len(self.tail_positions))
        out[self.head_positions] = head_sums.reshape(-1)[self.head_flat]
        out[self.tail_positions] = tail_sums
        return out


class SplitRows:
    """A chunk's rows X `[n, D]` (CSR) cut by a `SupportSplit`: the head columns as CSR (`head`, row
    blocks for the threaded product X W; `head_t` its transpose on the same arrays for Xᵀ R, and
    `head_squared_t` (X∘X)ᵀ's, sharing its indices), and the tail non-zeros as
    (tail weight, flat position row · V + label, value) triples; non-zeros of features off the
    support are dropped."""

    def __init__(self, rows, split: SupportSplit):
        self.split = split
        rows = CsrRows.of(rows)
        n, V = rows.shape[0], split.num_labels
        row_of = np.repeat(np.arange(n, dtype=np.int64), np.diff(rows.indptr))
        column = split.head_column[rows.indices]
        keep = column >= 0
        index_dtype = rows.indices.dtype
        indptr = np.concatenate([[0], np.cumsum(np.bincount(row_of[keep], minlength=n))]).astype(index_dtype)
        ones = bool(np.all(rows.data == 1))
        # indicator features (the presets): the head's values are a view of X's ones (`head_t` reads the same arrays)
        data = rows.data[: int(keep.sum())] if ones else rows.data[keep]
        head = csr_on(data, column[keep].astype(index_dtype), indptr, (n, len(split.head_ids)))
        self.head, self.head_t = RowBlocks(head), Transposed(head)
        self.head_squared_t = self.head_t if ones else Transposed(csr_on(data * data, head.indices, indptr, head.shape))
        on_head = int(np.count_nonzero(keep))
        position = split.tail_index[rows.indices]
        keep = position >= 0
        self.tail_weight = position[keep].astype(_index_dtype(len(split.tail_weights)))
        self.tail_flat = (row_of[keep] * V + split.tail_label[rows.indices[keep]]).astype(_index_dtype(n * V))
        self.tail_value = None if ones else rows.data[keep].astype(np.float64)
        self.num_tail = len(split.tail_weights)
        # every non-zero is in the cut, of an indicator X whose rows list their columns in order (a
        # featurizer's): X is the cut's to give back (`rows`), and its holder may let go of it
        self.whole = ones and on_head + int(np.count_nonzero(keep)) == rows.nnz and _columns_in_order(rows)

    def arrays(self) -> dict:
        """The split's arrays by name (`from_arrays` restores it: a spilled chunk keeps them on disk)."""
        out = {"tail_weight": self.tail_weight, "tail_flat": self.tail_flat, "num_tail": np.array([self.num_tail])}
        head = self.head.matrix
        out.update(head_data=head.data, head_indices=head.indices, head_indptr=head.indptr,
                   head_shape=np.array(head.shape))
        if self.tail_value is not None:
            out.update(tail_value=self.tail_value, head_squared_data=self.head_squared_t.matrix.data)
        return out

    @classmethod
    def from_arrays(cls, arrays: dict, split: SupportSplit) -> "SplitRows":
        rows = cls.__new__(cls)
        rows.split, rows.num_tail = split, int(arrays["num_tail"][0])
        rows.tail_weight, rows.tail_flat = arrays["tail_weight"], arrays["tail_flat"]
        rows.tail_value = arrays.get("tail_value")
        structure = [arrays[f"head_{part}"] for part in ("indices", "indptr", "shape")]
        head = csr_on(arrays["head_data"], *structure)
        rows.head, rows.head_t = RowBlocks(head), Transposed(head)
        rows.head_squared_t = rows.head_t if rows.tail_value is None else \
            Transposed(csr_on(arrays["head_squared_data"], *structure))
        return rows

    def rows(self):
        """X `[n, D]` (CSR, its dtype's ones) again, from a `whole` cut: the head's columns mapped back
        to their features, the tail's from their weights, each row's columns in order."""
        from gpseq.training.row_blocks import ones

        split, head = self.split, self.head.matrix
        n, V, D = head.shape[0], split.num_labels, len(split.tail_index)
        row = np.concatenate([np.repeat(np.arange(n, dtype=np.int64), np.diff(head.indptr)),
                              self.tail_flat.astype(np.int64) // V])
        column = np.concatenate([split.head_ids[head.indices], split.tail_features[self.tail_weight]])
        # (row, column) order: the head's and the tail's non-zeros are each in it already (X's CSR
        # order, columns mapped monotonically), so a stable sort of row · D + column merges two runs
        order = np.argsort(row * D + column, kind="stable")
        index_dtype = head.indices.dtype
        indptr = np.concatenate([[0], np.cumsum(np.bincount(row, minlength=n))]).astype(index_dtype)
        return csr_on(ones(len(order), head.dtype), column[order].astype(index_dtype), indptr, (n, D))

    def unary(self, bias) -> np.ndarray:
        """X W + b `[n, V]` at the split's weights, in their dtype."""
        split = self.split
        out = self.head @ split.weights
        values = split.tail_weights[self.tail_weight]
        if self.tail_value is not None:
            values = values * self.tail_value
        np.add.at(out.reshape(-1), self.tail_flat, values.astype(out.dtype, copy=False))
        out += bias.astype(out.dtype)
        return out

    def tail_terms(self, dense: np.ndarray, squared: bool = False) -> np.ndarray:
        """The terms of Xᵀ R on the tail weights, one per tail non-zero (float64; `tail_weight`
        says whose), of `dense` R `[n, V]` ((X∘X)ᵀ R with `squared`)."""
        values = dense.reshape(-1)[self.tail_flat].astype(np.float64)
        if self.tail_value is not None:
            values *= self.tail_value ** 2 if squared else self.tail_value
        return values


def _columns_in_order(matrix) -> bool:
    """Whether every row of a CSR matrix lists its columns in increasing order (computed, not
    SciPy's cached flag: the chunks' matrices are assembled from their arrays)."""
    step = np.diff(matrix.indices.astype(np.int64))
    starts = matrix.indptr[1:-1].astype(np.int64)
    starts = starts[(starts > 0) & (starts < matrix.nnz)]
    increasing = step > 0
    increasing[starts - 1] = True  # a row's first column follows the previous row's last
    return bool(np.all(increasing))


def _index_dtype(size: int):
    """int32 for indices below `size` where they fit (half the memory of int64), else int64."""
    return np.int32 if size < 2**31 else np.int64
