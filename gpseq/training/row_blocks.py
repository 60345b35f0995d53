"""Threaded sparse × dense products for the corpus objective (`gpseq.training.chain_objective`): CSR
rows (`CsrRows`) cut into row blocks of about equal nonzeros (views on their arrays, no copy), whose
product with a dense matrix, or its in-place sum into one (`accumulate`), runs one block per thread
of a shared pool, on SciPy's compiled loops (`gpseq.features.rows.sparsetools`)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from gpseq.features.rows import CsrRows

PARALLEL_NONZEROS = 1_000_000  # below this a product runs on one thread (a hand-off costs more)
_POOL: list = []
_ONES: dict = {}  # dtype -> the largest array of ones `ones` has made of it


def _threads() -> ThreadPoolExecutor:
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="gpseq-spmm"))
    return _POOL[0]


class RowBlocks:
    """CSR rows (`CsrRows`, or a SciPy matrix) cut into row blocks of about equal nonzeros, whose
    product with a dense matrix runs one block per thread: SciPy's compiled loops release the GIL,
    and they are most of a large corpus's evaluation (the forward–backward is the rest). One block
    below `PARALLEL_NONZEROS` or on one core."""

    def __init__(self, matrix):
        matrix = CsrRows.of(matrix)
        self.matrix, self.shape, self.dtype = matrix, matrix.shape, matrix.dtype
        blocks = min(os.cpu_count() or 1, 4) if matrix.nnz >= PARALLEL_NONZEROS else 1
        cuts = np.searchsorted(matrix.indptr, np.linspace(0, matrix.nnz, blocks + 1)[1:-1]).tolist()
        bounds = sorted({0, *cuts, matrix.shape[0]})
        self.blocks = [(low, high, matrix[low:high]) for low, high in zip(bounds[:-1], bounds[1:])] \
            if blocks > 1 else [(0, matrix.shape[0], matrix)]

    def __matmul__(self, dense: np.ndarray) -> np.ndarray:
        out = np.empty((self.shape[0], dense.shape[1]), np.result_type(self.dtype, dense.dtype))

        def run(block):
            low, high, rows = block
            out[low:high] = rows.dot(dense)

        self._map(run)
        return out

    def accumulate(self, dense: np.ndarray, out: np.ndarray) -> None:
        """out += self @ dense, in place, block by block (`CsrRows.dot`'s `add_to`). `out`:
        C-contiguous, [rows, k]."""
        dense = np.ascontiguousarray(dense, out.dtype)  # once, not per block

        def run(block):
            low, high, rows = block
            rows.dot(dense, add_to=out[low:high])

        self._map(run)

    def _map(self, run) -> None:
        if len(self.blocks) == 1:
            run(self.blocks[0])
        else:
            list(_threads().map(run, self.blocks))


class Transposed:
    """Aᵀ of a CSR matrix A `[n, D]`, for `accumulate` only, on A's own arrays: Aᵀ's CSR would hold
    A's indices a second time. out[f] gathers A's rows in increasing order, as a product by Aᵀ's
    sorted CSR does, so the sums are the same to the last bit; it runs on one thread."""

    def __init__(self, matrix):
        self.matrix = CsrRows.of(matrix)

    def accumulate(self, dense: np.ndarray, out: np.ndarray) -> None:
        """out += Aᵀ @ dense, in place (`CsrRows.dot_transposed`). `out`: C-contiguous, [D, k]."""
        self.matrix.dot_transposed(dense, add_to=out)


def csr_on(data, indices, indptr, shape) -> CsrRows:
    """CSR rows on these arrays as they are (memory-mapped ones stay mapped, nothing is re-typed)."""
    return CsrRows(data, indices, indptr, tuple(int(size) for size in shape))


def ones(size: int, dtype) -> np.ndarray:
    """A read-only view of `size` ones of `dtype`, on an array shared by every caller: the values
    of an indicator matrix (the presets' X) are all 1, and one array of the largest chunk's size
    serves every chunk's instead of one of its own each."""
    dtype = np.dtype(dtype)
    shared = _ONES.get(dtype)
    if shared is None or len(shared) < size:
        shared = _ONES[dtype] = np.ones(max(size, 2 * len(shared) if shared is not None else size), dtype)
        shared.flags.writeable = False
    return shared[:size]
