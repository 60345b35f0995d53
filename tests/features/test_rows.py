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
