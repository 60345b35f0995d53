"""The head/tail split of W against the dense products it replaces: X W, Xᵀ R and (X∘X)ᵀ R on the
support, with features seen with no label, one label and several, indicator and real values."""

import numpy as np
import pytest
import scipy.sparse as sp

from gpseq.training.support_split import SplitRows, SupportSplit


def _problem(seed: int, ones: bool):
    rng = np.random.default_rng(seed)
    n, D, V = 40, 30, 5
    X = sp.random(n, D, density=0.2, random_state=seed, format="csr", dtype=np.float64)
    if ones:
        X.data[:] = 1.0
    labels = rng.integers(0, V, D)  # one label for the tail features
    flat = []
    for f in range(D):
        kind = f % 3  # 0: no label (off the support), 1: one label, 2: several
        if kind == 1:
            flat.append(f * V + labels[f])
        elif kind == 2:
            flat.extend(f * V + rng.choice(V, size=rng.integers(2, V + 1), replace=False))
    support = np.array(sorted(flat))
    return X, support, D, V, rng


@pytest.mark.parametrize("ones", [True, False])
def test_products_match_dense_weights(ones):
    X, support, D, V, rng = _problem(3, ones)
    split = SupportSplit(support, D, V, np.float64)
    assert len(split.head_ids) == 10 and len(split.tail_weights) == 10
    w = rng.normal(size=len(support))
    split.write(w)
    dense = np.zeros(D * V)
    dense[support] = w
    dense = dense.reshape(D, V)
    rows = SplitRows(X, split)
    b = rng.normal(size=V)
    np.testing.assert_allclose(rows.unary(b), X @ dense + b, rtol=1e-12, atol=1e-12)

    R = rng.normal(size=(X.shape[0], V))
    for squared in (False, True):
        matrix = X.multiply(X).tocsr() if squared else X
        expected = (matrix.T @ R).reshape(-1)[support]
        head = np.zeros_like(split.weights)
        (rows.head_squared_t if squared else rows.head_t).accumulate(R, head)
        tail = np.zeros(len(split.tail_weights))
        np.add.at(tail, rows.tail_weight, rows.tail_terms(R, squared=squared))
        np.testing.assert_allclose(split.gather(head, tail), expected, rtol=1e-12, atol=1e-12)


def test_arrays_round_trip():
    X, support, D, V, rng = _problem(5, False)
    split = SupportSplit(support, D, V, np.float64)
    split.write(rng.normal(size=len(support)))
    rows = SplitRows(X, split)
    again = SplitRows.from_arrays(rows.arrays(), split)
    b = np.zeros(V)
    np.testing.assert_array_equal(again.unary(b), rows.unary(b))
    R = rng.normal(size=(X.shape[0], V))
    for a in (rows, again):
        a.total = np.zeros_like(split.weights)
        a.head_squared_t.accumulate(R, a.total)
    np.testing.assert_array_equal(again.total, rows.total)


def _sequences(rng, lengths, V=4, D=12):
    from gpseq.training.batching import SequenceData

    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    rows = np.zeros((offsets[-1], D))
    for t in range(offsets[-1]):
        rows[t, rng.choice(np.arange(1, D), size=3, replace=False)] = rng.choice([1.0, 0.5, 2.0])
    return SequenceData(sp.csr_matrix(rows), offsets, rng.integers(V, size=offsets[-1]).astype(np.int32))


def test_spilled_chunks_and_an_extended_objective_evaluate_as_in_memory(tmp_path):
    """Chunks on disk keep their cut of X after the first evaluation; an objective extended with
    more sentences (a wider support: some tail features become head ones) cuts the shared chunks
    again. Every evaluation equals the in-memory objective's with its own support."""
    from gpseq.training.chain_objective import NumpyChainObjective

    rng = np.random.default_rng(0)
    V = 4
    train, more = _sequences(rng, [5, 3, 4, 2, 6, 3]), _sequences(rng, [4, 5, 3])
    spilled = NumpyChainObjective(train, V, dtype="float64", chunk_tokens=6, memory_tokens=0, spill_dir=tmp_path)
    in_memory = NumpyChainObjective(train, V, dtype="float64", chunk_tokens=6)
    assert spilled.spilled == len(spilled.chunks) > 2
    both = spilled.extended(more)
    reference = NumpyChainObjective([train, more], V, dtype="float64")
    assert len(both.support) > len(spilled.support)
    for objective, expected in ((spilled, in_memory), (both, reference), (spilled, in_memory)):
        for _ in range(2):  # the second time from the cut saved on disk
            b, p = rng.normal(size=V), rng.normal(size=(V, V))
            w = rng.normal(size=len(objective.support))
            for method in ("value_and_grad", "fisher"):
                got, want = getattr(objective, method)(b, w, p), getattr(expected, method)(b, w, p)
                for a, c in zip(got, want):
                    np.testing.assert_allclose(a, c, rtol=1e-10, atol=1e-10)


def test_a_whole_cut_gives_x_back():
    """An indicator X (rows' columns in order) whose every non-zero is on the support: the cut is
    `whole` and gives back the same CSR arrays; a feature off the support, real values or a row
    listing its columns out of order keep X (the cut is not whole)."""
    X, support, D, V, _ = _problem(5, ones=True)
    X.sort_indices()
    on = np.unique(support // V)
    X_on = X[:, on] @ sp.csr_matrix((np.ones(len(on)), (np.arange(len(on)), on)), shape=(len(on), D))
    X_on = sp.csr_matrix(X_on)
    X_on.sort_indices()
    X_on.data[:] = 1.0
    split = SupportSplit(support, D, V, np.float64)
    cut = SplitRows(X_on, split)
    assert cut.whole
    back = cut.rows()
    np.testing.assert_array_equal(back.indptr, X_on.indptr)
    np.testing.assert_array_equal(back.indices, X_on.indices)
    np.testing.assert_array_equal(back.data, X_on.data)
    assert back.shape == X_on.shape and back.indices.dtype == X_on.indices.dtype
    assert not SplitRows(X, split).whole  # features with no pair on the support
    real = X_on.copy()
    real.data[0] = 2.0
    assert not SplitRows(real, split).whole
    shuffled = X_on.copy()
    row = int(np.argmax(np.diff(shuffled.indptr)))  # a row with two columns or more
    low, high = shuffled.indptr[row], shuffled.indptr[row + 1]
    shuffled.indices[low:high] = shuffled.indices[low:high][::-1]
    assert not SplitRows(shuffled, split).whole


def test_an_objective_holds_x_once_after_its_cut(tmp_path):
    """After an evaluation the in-memory chunks hold X's cut, not X too; extended and evaluated,
    then evaluated again on its own support, the objective still equals a fresh one's."""
    from gpseq.training.chain_objective import NumpyChainObjective

    rng = np.random.default_rng(2)
    V = 4
    train, more = _sequences(rng, [5, 3, 4, 2, 6, 3]), _sequences(rng, [4, 5, 3])
    for data in (train, more):  # indicator features, as the presets'
        data.rows.data[:] = 1.0
    objective = NumpyChainObjective(train, V, dtype="float64", chunk_tokens=6)
    fresh = NumpyChainObjective(train, V, dtype="float64", chunk_tokens=6)
    b, p = rng.normal(size=V), rng.normal(size=(V, V))
    w = rng.normal(size=len(objective.support))
    objective.value_and_grad(b, w, p)
    assert all(chunk._rows is None and "rows_indices" not in chunk.arrays_ for chunk in objective.chunks)
    both = objective.extended(more)
    reference = NumpyChainObjective([train, more], V, dtype="float64", chunk_tokens=6)
    w_both = rng.normal(size=len(both.support))
    for got, want in zip(both.value_and_grad(b, w_both, p), reference.value_and_grad(b, w_both, p)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    for got, want in zip(objective.fisher(b, w, p), fresh.fisher(b, w, p)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
