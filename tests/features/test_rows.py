"""`CsrRows` against SciPy's CSR and dense arithmetic."""

import numpy as np
import pytest
import scipy.sparse as sp

from gpseq.features import rows as rows_module
from gpseq.features.rows import CsrRows


def _random_rows(seed: int, n: int = 40, d: int = 30, dtype=np.float32, empty_every: int = 7) -> CsrRows:
    rng = np.random.default_rng(seed)
    dense = (rng.random((n, d)) < 0.2) * rng.integers(1, 4, (n, d))
    dense[::empty_every] = 0  # some rows without features
    matrix = sp.csr_matrix(dense.astype(dtype))
    return CsrRows(matrix.data, matrix.indices, matrix.indptr.astype(np.int64), matrix.shape)


@pytest.mark.parametrize("threshold", [0, 10**9])  # the SciPy product and the NumPy one
def test_product_matches_dense(monkeypatch, threshold):
    monkeypatch.setattr(rows_module, "SCIPY_NNZ", threshold)
    rows = _random_rows(0)
    weights = np.random.default_rng(1).normal(size=(30, 5)).astype(np.float32)
    dense = rows.to_scipy().toarray().astype(np.float64)
    np.testing.assert_allclose(rows @ weights, dense @ weights, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rows.power(2) @ weights, (dense ** 2) @ weights, rtol=1e-5, atol=1e-5)
    assert (rows @ weights).dtype == np.float32 and (rows @ weights.astype(np.float64)).dtype == np.float64


def test_row_selection_matches_scipy():
    rows = _random_rows(2)
    matrix = rows.to_scipy()
    for key in [slice(3, 17), slice(0, 0), slice(35, 60), np.array([5, 0, 5, 39, 7]), np.array([], dtype=int)]:
        picked = rows[key]
        expected = matrix[key]
        assert picked.shape == expected.shape
        np.testing.assert_array_equal(picked.to_scipy().toarray(), expected.toarray())
    nested = rows[10:30][np.array([0, 19, 3])]  # a slice's arrays start past 0 in the parent's
    np.testing.assert_array_equal(nested.to_scipy().toarray(), matrix[[10, 29, 13]].toarray())
    weights = np.arange(60, dtype=np.float32).reshape(30, 2)
    np.testing.assert_array_equal(rows[10:30] @ weights, matrix[10:30] @ weights)
    with pytest.raises(ValueError, match="step 1"):
        rows[::2]


def test_merged_duplicates_and_l2_norm_match_dense():
    # row 0 repeats column 2 (a hash collision), row 1 is empty, row 2 has one column
    rows = CsrRows(np.array([1.0, 1.0, 2.0, 3.0], np.float32), np.array([2, 0, 2, 4], np.int32),
                   np.array([0, 3, 3, 4], np.int64), (3, 5))
    merged = rows.merged_duplicates()
    np.testing.assert_array_equal(merged.to_scipy().toarray(),
                                  [[1, 0, 3, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 3]])
    assert merged.indices.tolist() == [0, 2, 4]
    assert rows.merged_duplicates(binary=True).data.tolist() == [1, 1, 1]
    assert rows.indices.tolist() == [2, 0, 2, 4] and rows.data.tolist() == [1, 1, 2, 3]  # left as they were
    unit = merged.l2_normalised().to_scipy().toarray()
    np.testing.assert_allclose(unit, [[1 / np.sqrt(10), 0, 3 / np.sqrt(10), 0, 0], [0] * 5, [0, 0, 0, 0, 1]],
                               rtol=1e-6)


def test_product_of_computed_rows_equals_the_matrix_product():
    """`product(f)` with f computing the rows it is asked for (a softplus of a stored parameter, as the
    linear predictive's variances) equals the product with the whole transformed matrix, bit for bit."""
    rows = _random_rows(3)
    raw = np.random.default_rng(4).normal(size=(30, 4)).astype(np.float32)
    asked = []

    def softplus_rows(columns):
        asked.append(np.unique(columns))
        return np.logaddexp(np.float32(0), raw[columns])

    np.testing.assert_array_equal(rows.product(softplus_rows), rows @ np.logaddexp(np.float32(0), raw))
    assert set(asked[0]) == set(rows.indices.tolist())  # only the columns the rows hold


def _wide_rows(seed: int, n: int = 60, d: int = 45, density: float = 0.25) -> sp.csr_matrix:
    """Random rows with negative and non-integer values (sums that round), some rows empty."""
    rng = np.random.default_rng(seed)
    dense = (rng.random((n, d)) < density) * rng.normal(size=(n, d))
    dense[::9] = 0
    return sp.csr_matrix(dense)


@pytest.mark.parametrize("data_dtype, dense_dtype", [(np.float64, np.float64), (np.float32, np.float32),
                                                     (np.float32, np.float64), (np.float64, np.float32)])
def test_dot_is_scipys_product_bit_for_bit(data_dtype, dense_dtype):
    """`dot` runs SciPy's compiled loop itself: the same bits as `scipy.sparse`'s product, for a
    dense matrix and a vector, mixed dtypes, 64-bit index arrays and a slice whose arrays start past 0."""
    matrix = _wide_rows(5).astype(data_dtype)
    rng = np.random.default_rng(6)
    dense, vector = rng.normal(size=(45, 7)).astype(dense_dtype), rng.normal(size=45).astype(dense_dtype)
    wide = CsrRows(matrix.data, matrix.indices.astype(np.int64), matrix.indptr.astype(np.int64), matrix.shape)
    for rows, reference in ((CsrRows.of(matrix), matrix), (wide, matrix), (wide[7:40], matrix[7:40])):
        for other in (dense, vector):
            got, expected = rows.dot(other), reference @ other
            assert got.dtype == expected.dtype and got.shape == expected.shape
            np.testing.assert_array_equal(got, expected)
    middle = CsrRows(matrix.data, matrix.indices, matrix.indptr[10:31], (20, 45))  # indptr not from 0
    np.testing.assert_array_equal(middle.dot(dense), matrix[10:30] @ dense)


@pytest.mark.parametrize("data_dtype, dense_dtype", [(np.float32, np.float32), (np.float64, np.float32),
                                                     (np.float32, np.float64)])
def test_dot_transposed_is_scipys_product_by_the_transpose_bit_for_bit(data_dtype, dense_dtype):
    """`dot_transposed` runs SciPy's CSC loop on the CSR arrays: the same bits as `scipy.sparse`'s
    `A.T @ dense`, for mixed dtypes, 64-bit index arrays, a slice and a slice whose arrays start past 0."""
    matrix = _wide_rows(7).astype(data_dtype)
    dense = np.random.default_rng(8).normal(size=(60, 5)).astype(dense_dtype)
    wide = CsrRows(matrix.data, matrix.indices.astype(np.int64), matrix.indptr.astype(np.int64), matrix.shape)
    for rows, reference, other in ((CsrRows.of(matrix), matrix, dense), (wide, matrix, dense),
                                   (wide[7:40], matrix[7:40], dense[7:40])):
        got, expected = rows.dot_transposed(other), reference.T @ other
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
    middle = CsrRows(matrix.data, matrix.indices, matrix.indptr[10:31], (20, 45))
    np.testing.assert_array_equal(middle.dot_transposed(dense[:20]), matrix[10:30].T @ dense[:20])


def test_products_added_in_place_are_scipys():
    """`add_to` adds the product into a given array by the same loop: into zeros SciPy's product bit
    for bit (the compiled loop for matching dtypes, and the added product for a float64 array and
    float32 values), into values their sum with it; on a slice whose `indptr` does not start at 0."""
    matrix = _wide_rows(9).astype(np.float32)
    rows, rng = CsrRows.of(matrix), np.random.default_rng(10)
    dense, dense_t = rng.normal(size=(45, 4)).astype(np.float32), rng.normal(size=(60, 4)).astype(np.float32)
    for out_dtype in (np.float32, np.float64):
        got = rows.dot(dense, add_to=np.zeros((60, 4), out_dtype))
        np.testing.assert_array_equal(got, (matrix @ dense.astype(out_dtype)).astype(out_dtype))
        got = rows.dot_transposed(dense_t, add_to=np.zeros((45, 4), out_dtype))
        np.testing.assert_array_equal(got, (matrix.T @ dense_t.astype(out_dtype)).astype(out_dtype))
    start = np.ones((20, 4), np.float32)
    got = rows[10:30].dot(dense, add_to=start.copy())
    np.testing.assert_allclose(got, start + matrix[10:30] @ dense, rtol=1e-5)
    got = rows[10:30].dot_transposed(dense_t[10:30], add_to=np.ones((45, 4), np.float32))
    np.testing.assert_allclose(got, 1.0 + matrix[10:30].T @ dense_t[10:30], rtol=1e-5)


def test_sparse_times_sparse_is_scipys_product_bit_for_bit():
    """`times` runs SciPy's sparse × sparse loops itself: the dense result of SciPy's product bit for
    bit, for whole rows, a slice and rows without values."""
    left, right = _wide_rows(7), _wide_rows(8, n=45, d=6, density=0.5)
    expected = (left @ right).toarray()
    np.testing.assert_array_equal(CsrRows.of(left).times(CsrRows.of(right)), expected)
    np.testing.assert_array_equal(CsrRows.of(left)[5:50].times(CsrRows.of(right)), (left[5:50] @ right).toarray())
    empty = CsrRows.of(sp.csr_matrix((3, 45)))
    np.testing.assert_array_equal(empty.times(CsrRows.of(right)), np.zeros((3, 6)))


def test_stacked_and_selected_rows_are_scipys():
    """`stacked` is SciPy's `vstack` and a row selection SciPy's, to the index types (int32 where
    they fit: the compiled loops take one index type)."""
    parts = [_wide_rows(seed, n=n) for seed, n in ((9, 13), (10, 0), (11, 30))]
    stacked, expected = CsrRows.stacked([CsrRows.of(part) for part in parts]), sp.vstack(parts, format="csr")
    for name in ("data", "indices", "indptr"):
        np.testing.assert_array_equal(getattr(stacked, name), getattr(expected, name))
        assert getattr(stacked, name).dtype == getattr(expected, name).dtype
    assert stacked.shape == expected.shape
    picked, reference = stacked[np.array([40, 2, 2, 17])], expected[[40, 2, 2, 17]]
    assert picked.indptr.dtype == picked.indices.dtype == reference.indptr.dtype
    np.testing.assert_array_equal(picked.to_scipy().toarray(), reference.toarray())


def test_the_compiled_loops_load_without_scipys_sparse_package():
    """`sparsetools()` loads SciPy's loops without importing `scipy.sparse` (a third of a second and
    ~24 MB), and `scipy.sparse` imported afterwards runs as ever, with the same loops."""
    import subprocess
    import sys

    script = (
        "import sys, numpy as np\n"
        "from gpseq.features.rows import CsrRows, sparsetools\n"
        "rows = CsrRows(np.array([1.0, 2.0]), np.array([0, 2], np.int32), np.array([0, 1, 2], np.int32), (2, 3))\n"
        "product = rows.dot(np.arange(6.0).reshape(3, 2))\n"
        "assert 'scipy.sparse' not in sys.modules, 'scipy.sparse imported'\n"
        "import scipy.sparse as sp\n"
        "import scipy.sparse._sparsetools as tools\n"
        "assert tools.csr_matvecs.__doc__ == sparsetools().csr_matvecs.__doc__\n"
        "assert (sp.csr_matrix((rows.data, rows.indices, rows.indptr), shape=(2, 3)) @ np.arange(6.0).reshape(3, 2)"
        " == product).all()\n"
        "print(product.tolist())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[[0.0, 1.0], [8.0, 10.0]]"
