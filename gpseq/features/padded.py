"""The in-graph form of sparse feature rows: padded index and value tensors (XLA-compilable).

`tf.sparse` kernels do not compile under XLA, so a batch of CSR rows becomes `indices [N, F]`
and `values [N, F]`, where F is the largest number of active features in a row. Column
`PAD_ID = 0` of every feature space is reserved for padding: the vectoriser never emits it, so a
gather at a padded slot reads a real (always-zero-weighted) column and its value is 0.
`x · W` is then `reduce_sum(values[..., None] * gather(W, indices), axis=-2)`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from gpseq.features.rows import CsrRows

PAD_ID = 0


class PaddedRows(NamedTuple):
    """Sparse rows as padded tensors: `indices [..., F]` (int32, PAD_ID at padding), `values [..., F]`."""

    indices: object  # [..., F] int32 (np.ndarray or tf.Tensor)
    values: object  # [..., F] float (np.ndarray or tf.Tensor), 0 at padding


def padded_from_csr(rows, width: int | None = None, dtype=np.float64) -> PaddedRows:
    """CSR rows `[N, D]` → `PaddedRows(indices [N, F], values [N, F])`, vectorised (no loop over rows).

    `width` fixes F (must be ≥ the largest row nnz); by default F = max(1, largest row nnz).
    """
    if not isinstance(rows, CsrRows):  # CsrRows has the CSR arrays read below; anything else becomes CSR
        import scipy.sparse as sp

        rows = sp.csr_matrix(rows)
    counts = np.diff(rows.indptr)
    needed = int(counts.max()) if counts.size else 0
    if width is None:
        width = max(1, needed)
    elif width < needed:
        raise ValueError(f"width {width} < largest row nnz {needed}")
    n_rows = rows.shape[0]
    indices = np.full((n_rows, width), PAD_ID, dtype=np.int32)
    values = np.zeros((n_rows, width), dtype=dtype)
    row_of = np.repeat(np.arange(n_rows), counts)
    slot = np.arange(rows.nnz) - np.repeat(rows.indptr[:-1], counts)
    indices[row_of, slot] = rows.indices
    values[row_of, slot] = rows.data
    return PaddedRows(indices, values)


def csr_from_padded(padded: PaddedRows, n_features: int):
    """Inverse of `padded_from_csr` (padding dropped): `[N, F]` pair → CSR `[N, n_features]`."""
    import scipy.sparse as sp

    indices = np.asarray(padded.indices)
    values = np.asarray(padded.values)
    keep = values != 0
    row_of = np.nonzero(keep)[0]
    return sp.csr_matrix((values[keep], (row_of, indices[keep])), shape=(indices.shape[0], n_features))
