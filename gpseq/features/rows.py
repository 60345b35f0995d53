"""`CsrRows`: sparse feature rows `[N, D]` as the three CSR arrays, and the products training and
tagging take of them.

Tagging reads rows by token, multiplies them by a dense weight matrix and squares their values;
training also stacks, selects and transposes them. SciPy's sparse package does that in compiled
loops, but importing it costs a third of a second and ~24 MB (its array-API layer loads parts of
NumPy neither uses), which is most of what `gpseq tag` of one sentence waits for and a tenth of a
small corpus's training. So the rows stay plain NumPy arrays, and the products run SciPy's compiled
loops (`sparsetools`) loaded from their file without the package: the same loops, the same bits as
`scipy.sparse`'s products. A tagging product with fewer than `SCIPY_NNZ` stored values is a NumPy
gather and segment sum instead, which skips the compiled loop's call overhead; both sum each row's
products in its stored order, but the compiled loop may fuse each multiply-add, so the two agree to
a few units in the last place, not bit for bit.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

SCIPY_NNZ = 50_000  # stored values from which a tagging product runs the compiled loop
_SPARSETOOLS: list = []


def sparsetools():
    """SciPy's compiled sparse loops (the module `scipy.sparse._sparsetools`), or None for a SciPy
    without them: SciPy's own module where `scipy.sparse` is imported, else the extension loaded from
    its file and kept here (not in `sys.modules`, so a later `import scipy.sparse` runs as ever)."""
    if not _SPARSETOOLS:
        _SPARSETOOLS.append(_load_sparsetools())
    return _SPARSETOOLS[0]


def _load_sparsetools():
    name = "scipy.sparse._sparsetools"
    if name in sys.modules:
        return sys.modules[name]
    try:
        folder = Path(next(iter(importlib.util.find_spec("scipy").submodule_search_locations))) / "sparse"
        path = next(folder / f"_sparsetools{suffix}" for suffix in importlib.machinery.EXTENSION_SUFFIXES
                    if (folder / f"_sparsetools{suffix}").is_file())
        loader = importlib.machinery.ExtensionFileLoader(name, str(path))
        module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, path, loader=loader))
        loader.exec_module(module)
        return module
    except Exception:  # another layout: through the package, or without the loops
        try:
            import scipy.sparse._sparsetools as module
        except ImportError:
            return None
        return module


def index_dtype(*bounds: int):
    """The index type SciPy gives CSR arrays whose values reach `bounds`: int32 where they fit."""
    return np.int32 if max(bounds, default=0) <= np.iinfo(np.int32).max else np.int64


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
        # the indices' type where the count fits it, as SciPy's row selection gives
        indptr = np.zeros(len(rows) + 1, dtype=np.promote_types(self.indices.dtype, index_dtype(len(element))))
        np.cumsum(stops - starts, out=indptr[1:])
        return CsrRows(self.data[element], self.indices[element], indptr, (len(rows), self.shape[1]))

    @classmethod
    def of(cls, matrix) -> "CsrRows":
        """`matrix` as CsrRows: itself, or a SciPy sparse matrix's CSR arrays (shared)."""
        if isinstance(matrix, CsrRows):
            return matrix
        matrix = matrix.tocsr()
        return cls(matrix.data, matrix.indices, matrix.indptr, matrix.shape)

    @classmethod
    def stacked(cls, parts) -> "CsrRows":
        """The rows of `parts` (CsrRows of one width) one after another, as SciPy's `vstack` makes them."""
        parts = [part.narrowed() for part in parts]
        counts = np.concatenate([[0]] + [np.diff(part.indptr) for part in parts])
        dtype = index_dtype(int(counts.sum()), parts[0].shape[1] if parts else 0)
        return cls(np.concatenate([part.data for part in parts]),
                   np.concatenate([part.indices for part in parts]).astype(dtype, copy=False),
                   np.cumsum(counts, dtype=np.int64).astype(dtype),
                   (sum(part.shape[0] for part in parts), parts[0].shape[1] if parts else 0))

    def narrowed(self) -> "CsrRows":
        """The same rows with `indptr` from 0 and both index arrays of one type, int32 where the
        values fit (as SciPy's constructor makes them; its compiled loops take one index type). The
        arrays themselves where they already are so."""
        low, high = int(self.indptr[0]), int(self.indptr[-1])
        rows = self if low == 0 else CsrRows(self.data[low:high], self.indices[low:high], self.indptr - low, self.shape)
        dtype = index_dtype(high - low, *self.shape)
        if rows.indices.dtype == dtype and rows.indptr.dtype == dtype:
            return rows
        return rows._replace(indices=rows.indices.astype(dtype), indptr=rows.indptr.astype(dtype))

    def dot(self, dense: np.ndarray, add_to: np.ndarray | None = None) -> np.ndarray:
        """`rows @ dense` for a dense `[D, k]` or `[D]`, in the result type of both: SciPy's compiled
        loop (`csr_matvecs`, `csr_matvec`) into zeros, which is what `scipy.sparse`'s product runs,
        so the same bits. With `add_to` `[n, k]`: add_to += rows @ dense (`_added`), returned."""
        if add_to is not None:
            return self._added("csr_matvecs", self.shape, dense, add_to, self.dot)
        dtype = np.result_type(self.data, dense)
        rows, dense = self.narrowed().astype(dtype), np.ascontiguousarray(dense, dtype)
        kernels = sparsetools()
        if kernels is None:
            return rows.to_scipy() @ dense
        n, D = rows.shape
        if dense.ndim == 1:
            out = np.zeros(n, dtype)
            kernels.csr_matvec(n, D, rows.indptr, rows.indices, rows.data, dense, out)
        else:
            out = np.zeros((n, dense.shape[1]), dtype)
            kernels.csr_matvecs(n, D, dense.shape[1], rows.indptr, rows.indices, rows.data, dense.reshape(-1),
                                out.reshape(-1))
        return out

    def dot_transposed(self, dense: np.ndarray, add_to: np.ndarray | None = None) -> np.ndarray:
        """`rows.T @ dense` for a dense `[n, k]`, in the result type of both: SciPy's compiled loop
        for a CSC matrix (`csc_matvecs`: these CSR arrays are the transpose's CSC) into zeros, which
        is what `scipy.sparse`'s product by `A.T` runs, so the same bits. With `add_to` `[D, k]`:
        add_to += rows.T @ dense (`_added`), returned."""
        if add_to is not None:
            return self._added("csc_matvecs", self.shape[::-1], dense, add_to, self.dot_transposed)
        dtype = np.result_type(self.data, dense)
        rows, dense = self.narrowed().astype(dtype), np.ascontiguousarray(dense, dtype)
        kernels = sparsetools()
        if kernels is None:
            return rows.to_scipy().T @ dense
        n, D = rows.shape
        out = np.zeros((D, dense.shape[1]), dtype)
        kernels.csc_matvecs(D, n, dense.shape[1], rows.indptr, rows.indices, rows.data, dense.reshape(-1),
                            out.reshape(-1))
        return out

    def _added(self, loop: str, shape, dense: np.ndarray, out: np.ndarray, product) -> np.ndarray:
        """out += the `shape`d product of these arrays (by the compiled `loop`, which adds into its
        output) with `dense`, in place: no product-sized array (a gradient's is [D, V], which the
        allocator would otherwise map and fault in afresh at each call). The loop reads the arrays as
        they are (a slice's `indptr` need not start at 0); where it cannot take them (out not
        C-contiguous or of another dtype than the values, index arrays of two dtypes, no loop), by
        adding `product(dense)`."""
        kernel = getattr(sparsetools(), loop, None)
        dense = np.ascontiguousarray(dense, out.dtype)
        if kernel is not None and out.flags.c_contiguous and out.dtype == self.data.dtype \
                and self.indices.dtype == self.indptr.dtype:
            kernel(shape[0], shape[1], dense.shape[1], self.indptr, self.indices, self.data, dense.reshape(-1),
                   out.reshape(-1))
        else:
            out += product(dense)
        return out

    def times(self, other: "CsrRows") -> np.ndarray:
        """`rows @ other` for sparse `other [D, k]`, dense `[N, k]` float64: SciPy's sparse × sparse
        loops (`csr_matmat` into CSR, `csr_todense` into zeros), which are what `(A @ B).toarray()`
        runs, so the same bits; the product's CSR holds at most N · k values."""
        rows, other = self.narrowed().astype(np.float64), other.narrowed().astype(np.float64)
        n, k = rows.shape[0], other.shape[1]
        kernels = sparsetools()
        if kernels is None:
            return (rows.to_scipy() @ other.to_scipy()).toarray()
        dtype = np.promote_types(rows.indices.dtype, other.indices.dtype)
        a_ptr, a_idx, b_ptr, b_idx = (array.astype(dtype, copy=False) for array in
                                      (rows.indptr, rows.indices, other.indptr, other.indices))
        nnz = kernels.csr_matmat_maxnnz(n, k, a_ptr, a_idx, b_ptr, b_idx)
        wide = np.promote_types(dtype, index_dtype(nnz))
        a_ptr, a_idx, b_ptr, b_idx = (array.astype(wide, copy=False) for array in (a_ptr, a_idx, b_ptr, b_idx))
        indptr, indices, data = np.empty(n + 1, wide), np.empty(nnz, wide), np.empty(nnz)
        kernels.csr_matmat(n, k, a_ptr, a_idx, rows.data, b_ptr, b_idx, other.data, indptr, indices, data)
        out = np.zeros((n, k))
        kernels.csr_todense(n, k, indptr, indices, data, out)
        return out

    def astype(self, dtype) -> "CsrRows":
        return self if self.data.dtype == dtype else self._replace(data=self.data.astype(dtype))

    def power(self, exponent) -> "CsrRows":
        """Every stored value to `exponent` (as `scipy.sparse.csr_matrix.power`)."""
        return self._replace(data=np.power(self.data, exponent))

    def toarray(self) -> np.ndarray:
        """The rows as a dense `[N, D]` array (repeated columns summed, as SciPy's `toarray`)."""
        rows = self.narrowed()
        out = np.zeros(rows.shape, rows.dtype)
        np.add.at(out, (np.repeat(np.arange(rows.shape[0]), np.diff(rows.indptr)), rows.indices), rows.data)
        return out

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
        values on by the compiled loop with `whole()` (`dot`), below (or without `whole`) by NumPy with `rows_of`."""
        if whole is not None and self.nnz >= SCIPY_NNZ:
            return self.dot(whole())
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
