"""`CsrRows`: sparse feature rows `[N, D]` as the three CSR arrays, for the tagging path.

Tagging reads rows by token, multiplies them by a dense weight matrix and squares their values;
nothing else. SciPy's sparse package does that in compiled loops, but importing it costs a third
of a second (its array-API layer loads parts of NumPy a tagger never uses), which is most of what
`gpseq tag` of one sentence waits for. So the rows stay plain NumPy arrays; a product with fewer
than `SCIPY_NNZ` stored values is a NumPy gather and segment sum, a larger one goes through
`scipy.sparse` (imported then, once), whose loop is several times faster on a corpus. Both sum
each row's products in its stored order; SciPy's compiled loop may fuse each multiply-add, so the
two agree to a few units in the last place, not bit for bit.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

SCIPY_NNZ = 50_000  # stored values from which a product with dense weights goes through scipy.sparse


class CsrRows(NamedTuple):
    """Rows `[N, D]` in CSR arrays: row i holds `data[indptr[i]:indptr[i+1]]` at columns
    `indices[indptr[i]:indptr[i+1]]` (sorted within the row)."""

    data: np.ndarray  # [nnz] values
    indices: np.ndarray  # [nnz] int32 columns
    indptr: np.ndarray  # [N + 1] row starts (int64, or int32 as SciPy narrows them)
    shape: tuple[int, int]

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1] - self.indptr[0])

    def __getitem__(self, rows) -> "CsrRows":
        """The rows `rows` (a slice of step 1 or an integer array), in that order."""
        if isinstance(rows, slice):
            start, stop, step = rows.indices(self.shape[0])
            if step != 1:
                raise ValueError("CsrRows takes slices of step 1 only")
            stop = max(start, stop)
            low, high = self.indptr[start], self.indptr[stop]
            return CsrRows(self.data[low:high], self.indices[low:high], self.indptr[start:stop + 1] - low,
                           (stop - start, self.shape[1]))
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        starts, stops = self.indptr[rows], self.indptr[rows + 1]
        element = ranges(starts, stops)
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(stops - starts, out=indptr[1:])
        return CsrRows(self.data[element], self.indices[element], indptr, (len(rows), self.shape[1]))

    def astype(self, dtype) -> "CsrRows":
        return self if self.data.dtype == dtype else self._replace(data=self.data.astype(dtype))

    def power(self, exponent) -> "CsrRows":
        """Every stored value to `exponent` (as `scipy.sparse.csr_matrix.power`)."""
        return self._replace(data=np.power(self.data, exponent))

    def to_scipy(self, sorted_indices: bool = True):
        """The same rows as a `scipy.sparse.csr_matrix` (sharing the arrays); `sorted_indices=False`
        for rows whose columns may be out of order or repeated (hashed features before merging)."""
        import scipy.sparse as sp

        matrix = sp.csr_matrix((self.data, self.indices, self.indptr), shape=self.shape, copy=False)
        if sorted_indices:
            matrix.has_sorted_indices = True
        return matrix

    def merged_duplicates(self, binary: bool = False) -> "CsrRows":
        """Each row's repeated columns (hash collisions) summed into one, columns sorted; with `binary`
        every stored value set to 1 (SciPy's `sum_duplicates`, on copies: it sorts in place)."""
        matrix = self._replace(data=self.data.copy(), indices=self.indices.copy()).to_scipy(sorted_indices=False)
        matrix.sum_duplicates()
        if binary:
            matrix.data[:] = 1
        return CsrRows(matrix.data, matrix.indices, matrix.indptr, matrix.shape)

    def l2_normalised(self) -> "CsrRows":
        """Every row with stored values scaled to unit Euclidean norm (a row of zeros kept)."""
        if not self.nnz:
            return self
        matrix = self.to_scipy()
        norms = np.sqrt(np.asarray(matrix.multiply(matrix).sum(axis=1)).ravel())
        norms[norms == 0] = 1
        return self._replace(data=self.data / np.repeat(norms, np.diff(self.indptr)).astype(self.dtype))

    def __matmul__(self, dense: np.ndarray) -> np.ndarray:
        """`rows @ dense` `[N, V]` for a dense `[D, V]`, in the result type of both dtypes."""
        return self.product(dense.__getitem__, lambda: dense)

    def product(self, rows_of: Callable[[np.ndarray], np.ndarray],
                whole: Callable[[], np.ndarray] | None = None) -> np.ndarray:
        """`rows @ M` `[N, V]` for the dense `M` whose rows at columns `c` are `rows_of(c)` (`M.__getitem__`,
        or a function computing only those rows) and which `whole()` gives entire: from `SCIPY_NNZ` stored
        values on through `scipy.sparse` with `whole()`, below (or without `whole`) by NumPy with `rows_of`."""
        if whole is not None and self.nnz >= SCIPY_NNZ:
            return self.to_scipy() @ whole()
        low, high = self.indptr[0], self.indptr[-1]
        products = rows_of(self.indices[low:high])
        dtype = np.result_type(self.data, products)
        products = products.astype(dtype, copy=False) * self.data[low:high, None]
        out = np.zeros((self.shape[0], products.shape[1]), dtype=products.dtype)
        filled = self.indptr[1:] > self.indptr[:-1]
        if filled.any():
            out[filled] = np.add.reduceat(products, self.indptr[:-1][filled] - low, axis=0)
        return out

def ranges(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """Concatenation of arange(start, stop) for each pair, vectorised (int64)."""
    counts = np.asarray(stops) - np.asarray(starts)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    return np.arange(total, dtype=np.int64) + shift
