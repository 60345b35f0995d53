"""The default training's objective (gpseq/training/chain_objective.py): its value and gradient
against autodiff of the TensorFlow chain, its Fisher diagonal against enumeration of the label
paths, the threaded row-block products, chunks evaluated two at a time, an extended objective, and
the observed (feature, label) pairs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

from helpers.laplace import sample_problem, synthetic_sequences

from gpseq.structured import chain
from gpseq.training.batching import SequenceData, make_batch
from gpseq.training.chain_objective import NumpyChainObjective, observed_pairs


def test_objective_value_and_gradient_equal_autodiff_of_the_chain_likelihood():
    rng = np.random.default_rng(1)
    data = synthetic_sequences(rng)
    D, V = data.rows.shape[1], 3
    objective = NumpyChainObjective(data, V, dtype="float64")
    support = objective.support
    b, w, p = rng.normal(size=V), np.zeros((D, V)), rng.normal(size=(V, V))
    w.ravel()[support] = rng.normal(size=len(support))  # weights off the support are structurally 0
    nll, g_b, g_w, g_p = objective.value_and_grad(b, w.ravel()[support], p)
    batch = {k: tf.constant(v) for k, v in make_batch(data, np.arange(len(data)), dtype=np.float64).items()}
    variables = [tf.Variable(b), tf.Variable(w), tf.Variable(p)]
    with tf.GradientTape() as tape:
        table = tf.gather(variables[1], batch["feature_ids"])
        unary = variables[0] + tf.einsum("btf,btfv->btv", batch["values"], tf.gather(table, batch["indices"]))
        reference = -tf.reduce_sum(chain.log_likelihood(batch["labels"], unary, variables[2], batch["lengths"]))
    grads = tape.gradient(reference, variables)
    np.testing.assert_allclose(nll, reference.numpy(), rtol=1e-10)
    theirs = [tf.convert_to_tensor(g).numpy() for g in grads]
    theirs[1] = theirs[1].ravel()[support]
    for mine, reference in zip((g_b, g_w, g_p), theirs):
        np.testing.assert_allclose(mine, reference, atol=1e-9)


def _path_enumeration(unary, pairwise):
    """All label paths of one sequence with their probabilities (brute force)."""
    T, V = unary.shape
    paths = np.array(list(itertools.product(range(V), repeat=T)))
    scores = unary[np.arange(T), paths].sum(1) + pairwise[paths[:, :-1], paths[:, 1:]].sum(1)
    probs = np.exp(scores - scores.max())
    return paths, probs / probs.sum()


@pytest.mark.parametrize("value", [1.0, 0.5])  # indicator features (X∘X = X) and real values
def test_fisher_diagonal_equals_the_variance_of_the_sufficient_statistics_by_enumeration(value):
    """F[f, v] = Var_p(Σ_t x_tf [y_t = v]) summed over sequences, exact when f fires once per sequence."""
    rng = np.random.default_rng(2)
    V, D, T = 3, 10, 4
    sequences = []
    for _ in range(3):
        rows = np.zeros((T, D))
        for t, features in enumerate(rng.permutation(np.arange(1, D))[: 2 * T].reshape(T, 2)):
            rows[t, features] = value  # every feature fires at most once in the sequence
        sequences.append(rows)
    data = SequenceData(sp.csr_matrix(np.vstack(sequences)), np.arange(0, 3 * T + 1, T, dtype=np.int64),
                        rng.integers(V, size=3 * T).astype(np.int32))
    objective = NumpyChainObjective(data, V, dtype="float64")
    support = objective.support
    b, w, p = rng.normal(size=V), np.zeros((D, V)), rng.normal(size=(V, V))
    w.ravel()[support] = rng.normal(size=len(support))
    f_b, f_w, f_p = objective.fisher(b, w.ravel()[support], p)
    expected = np.zeros((D, V))
    for rows in sequences:
        paths, probs = _path_enumeration(b + rows @ w, p)
        onehot = np.eye(V)[paths]  # [P, T, V]
        stats = np.einsum("td,ptv->pdv", rows, onehot)  # sufficient statistics per path
        mean = np.einsum("p,pdv->dv", probs, stats)
        expected += np.einsum("p,pdv->dv", probs, (stats - mean) ** 2)
    np.testing.assert_allclose(f_w, expected.ravel()[support], atol=1e-9)
    assert len(support) > 10


@pytest.mark.parametrize("cpus", [1, 2, 3, 8])
def test_row_blocks_product_equals_scipy_product(monkeypatch, cpus):
    """The threaded row-block product is SciPy's product: blocks of any count (forced below the
    size threshold), rows with no nonzeros, a 1-column dense factor."""
    import gpseq.training.row_blocks as chain_objective  # RowBlocks

    monkeypatch.setattr(chain_objective, "PARALLEL_NONZEROS", 0)
    monkeypatch.setattr(chain_objective.os, "cpu_count", lambda: cpus)
    rng = np.random.default_rng(cpus)
    matrix = sp.random(57, 40, density=0.1, format="csr", random_state=cpus, dtype=np.float32).tolil()
    matrix[5:9] = 0.0
    matrix = matrix.tocsr()
    blocks = chain_objective.RowBlocks(matrix)
    assert len(blocks.blocks) == min(cpus, 4)
    for _, _, block in blocks.blocks:  # views: no second copy of the corpus
        assert np.shares_memory(block.data, matrix.data) or block.nnz == 0
    for width in (1, 7):
        dense = rng.normal(size=(40, width)).astype(np.float32)
        np.testing.assert_array_equal(blocks @ dense, matrix @ dense)
        # out += X·dense in place, twice: SciPy's product added to what `out` held
        start = rng.normal(size=(57, width)).astype(np.float32)
        out = start.copy()
        blocks.accumulate(dense, out)
        blocks.accumulate(dense.astype(np.float64), out)  # another dtype: converted to out's
        np.testing.assert_allclose(out, start + 2 * (matrix @ dense), rtol=1e-6, atol=1e-6)


def test_row_blocks_accumulate_without_scipys_kernel(monkeypatch):
    """`RowBlocks.accumulate` adds SciPy's product when its in-place kernel is missing (another
    SciPy) or the matrix's indices are 64-bit."""
    import gpseq.features.rows as rows_module  # the compiled loops
    import gpseq.training.row_blocks as chain_objective  # RowBlocks

    matrix = sp.random(30, 20, density=0.2, format="csr", random_state=1, dtype=np.float32)
    dense = np.random.default_rng(1).normal(size=(20, 3)).astype(np.float32)
    wide = matrix.copy()
    wide.indices, wide.indptr = wide.indices.astype(np.int64), wide.indptr.astype(np.int32)
    for name, kernels, rows in (("no kernel", None, matrix), ("64-bit indices", rows_module.sparsetools(), wide)):
        monkeypatch.setattr(rows_module, "sparsetools", lambda kernels=kernels: kernels)
        out = np.ones((30, 3), np.float32)
        chain_objective.RowBlocks(rows).accumulate(dense, out)
        np.testing.assert_allclose(out, 1 + matrix @ dense, rtol=1e-6, err_msg=name)


def test_transposed_accumulate_is_the_transposed_csr_product_to_the_bit(monkeypatch):
    """`Transposed.accumulate` adds Aᵀ·dense from A's own arrays: bit for bit what the product by
    Aᵀ's sorted CSR gives (each output row sums A's rows in the same order), into what `out`
    held; without the kernel or with 64-bit indices SciPy's product is added instead."""
    import gpseq.features.rows as rows_module
    import gpseq.training.row_blocks as row_blocks

    matrix = sp.random(300, 50, density=0.2, format="csr", random_state=2, dtype=np.float32)
    rng = np.random.default_rng(2)
    dense = rng.normal(size=(300, 9)).astype(np.float32)
    start = rng.normal(size=(50, 9)).astype(np.float32)
    out = start.copy()
    row_blocks.Transposed(matrix).accumulate(dense, out)
    reference = start.copy()
    row_blocks.RowBlocks(matrix.T.tocsr()).accumulate(dense, reference)
    np.testing.assert_array_equal(out, reference)
    np.testing.assert_allclose(out, start + matrix.toarray().T @ dense, rtol=1e-5, atol=1e-5)
    wide = matrix.copy()
    wide.indices = wide.indices.astype(np.int64)
    for name, kernels, rows in (("no kernel", None, matrix), ("64-bit indices", rows_module.sparsetools(), wide)):
        monkeypatch.setattr(rows_module, "sparsetools", lambda kernels=kernels: kernels)
        out = start.copy()
        row_blocks.Transposed(rows).accumulate(dense.astype(np.float64), out)
        np.testing.assert_allclose(out, start + matrix.toarray().T @ dense, rtol=1e-5, atol=1e-5, err_msg=name)


def test_chunks_evaluated_two_at_a_time_give_the_serial_sums_exactly(monkeypatch):
    """`NumpyChainObjective` evaluates two chunks at once (`CHUNK_THREADS`) and adds their W parts
    in chunk order: the value, gradient and Fisher are bit for bit those of one chunk at a time
    (float32, where a different order of the sums would show), which match the one-chunk
    objective in float64; a chunk that fails raises instead of leaving the next one waiting."""
    import gpseq.training.chain_objective as chain_objective

    sentences, _, labels, data_of = sample_problem()
    data, V = data_of(sentences), len(labels)
    rng = np.random.default_rng(3)
    many = NumpyChainObjective(data, V, chunk_tokens=60)
    assert len(many.chunks) >= 8
    b, p = rng.normal(size=V), rng.normal(size=(V, V))
    w = rng.normal(size=len(many.support)).astype(np.float32)
    results = {}
    for threads in (1, 2):
        monkeypatch.setattr(chain_objective, "CHUNK_THREADS", threads)
        results[threads] = many.value_and_grad(b, w, p) + many.fisher(b, w, p)
    for serial, threaded in zip(results[1], results[2]):
        np.testing.assert_array_equal(serial, threaded)
    whole = NumpyChainObjective(data, V, dtype="float64")
    for mine, reference in zip(results[2], whole.value_and_grad(b, w, p) + whole.fisher(b, w, p)):
        np.testing.assert_allclose(mine, reference, rtol=1e-4, atol=1e-3)

    def broken(*args):
        raise RuntimeError("chunk failed")

    monkeypatch.setattr(many.chunks[3], "value_and_grad", broken)
    with pytest.raises(RuntimeError, match="chunk failed"):
        many.value_and_grad(b, w, p)


def test_an_objective_evaluates_the_same_after_its_extended_objective_was_evaluated():
    # the extended objective shares the original's chunks and cuts them by its wider support: the
    # original, evaluated after it, must cut them by its own again and not see the other's weights
    rng = np.random.default_rng(1)
    original = synthetic_sequences(rng, n_seq=4, V=3, D=6, max_len=3)
    D, V = original.rows.shape[1], 3
    extra = SequenceData(sp.csr_matrix(np.eye(D)[1:]), np.arange(D, dtype=np.int64), np.arange(D - 1, dtype=np.int32) % V)
    objective = NumpyChainObjective(original, V, dtype="float64")
    extended = objective.extended(extra)
    assert len(np.setdiff1d(extended.support, objective.support)) > 0  # pairs outside the original's support
    b, p = rng.normal(size=V), rng.normal(size=(V, V))
    w = np.zeros(D * V)
    w[objective.support] = rng.normal(size=len(objective.support))
    expected = 0.0  # −log p(y | x) by enumerating the label paths of each sentence
    for n in range(len(original)):
        low, high = original.offsets[n], original.offsets[n + 1]
        paths, probs = _path_enumeration(b + original.rows[low:high].toarray() @ w.reshape(D, V), p)
        expected -= np.log(probs[np.all(paths == original.label_ids[low:high], axis=1)][0])
    first = objective.value_and_grad(b, w[objective.support], p)[0]
    extended.value_and_grad(b, np.full(len(extended.support), 5.0), p)
    again = objective.value_and_grad(b, w[objective.support], p)[0]
    assert first == pytest.approx(expected, rel=1e-10)
    assert again == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("mask_size", [0, 1 << 26])  # sorted (np.unique) and marked in a mask
def test_observed_pairs_are_the_feature_label_pairs_of_labelled_tokens(monkeypatch, mask_size):
    import gpseq.training.chain_objective as objective_module

    monkeypatch.setattr(objective_module, "PAIR_MASK_SIZE", mask_size)
    rng = np.random.default_rng(7)
    data = synthetic_sequences(rng, n_seq=15, D=25, max_len=4)
    data.label_ids[::5] = -1  # unlabelled tokens add no pair
    V = 3
    expected = sorted({f * V + int(label) for row, label in zip(data.rows.toarray(), data.label_ids) if label >= 0
                       for f in np.flatnonzero(row)})
    np.testing.assert_array_equal(observed_pairs(data, V), expected)


@pytest.mark.parametrize("mask_size", [0, 1 << 26])  # sorted (np.unique) and marked in a mask
def test_the_support_of_many_chunks_and_of_an_extended_corpus_is_the_union_of_their_pairs(monkeypatch, mask_size):
    """Chunks of a few tokens (more than 16 of them: the union is merged as it goes) and a corpus
    extended by a second part: the support is the pairs of all their labelled tokens (brute force)."""
    import gpseq.training.chain_objective as objective_module

    monkeypatch.setattr(objective_module, "PAIR_MASK_SIZE", mask_size)
    rng = np.random.default_rng(11)
    V = 3
    first, second = (synthetic_sequences(rng, n_seq=40, D=60, max_len=4) for _ in range(2))

    def pairs(data):
        return {f * V + int(label) for row, label in zip(data.rows.toarray(), data.label_ids) for f in np.flatnonzero(row)}

    objective = NumpyChainObjective(first, V, chunk_tokens=4)
    assert len(objective.chunks) > 16
    np.testing.assert_array_equal(objective.support, sorted(p for p in pairs(first) if p >= V))
    both = objective.extended(second)
    np.testing.assert_array_equal(both.support, sorted(p for p in pairs(first) | pairs(second) if p >= V))
