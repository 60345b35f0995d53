"""The one NumPy linear chain (`gpseq.structured.numpy_chain`) against brute-force enumeration of
every label path of tiny random chains: the forward–backward's marginals, pair sums and log Z,
the scaled messages of several chains at once (log α, log β), and the k-best Viterbi's paths and
scores, in time-major order and through a padded batch with an empty sentence; and against the
TensorFlow log-space chain."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf
from scipy.special import logsumexp

from gpseq.structured import chain
from gpseq.structured.numpy_chain import TimeMajor, nbest_viterbi, padded_layout, viterbi


def _enumerated(unary, pairwise):
    """Every path `[V^L, L]` of one sentence's chain `unary [L, V]`, `pairwise [V, V]` and its score."""
    L, V = unary.shape
    paths = np.array(list(itertools.product(range(V), repeat=L))).reshape(-1, L)
    return paths, unary[np.arange(L), paths].sum(1) + pairwise[paths[:, :-1], paths[:, 1:]].sum(1)


def _corpus(rng, lengths, V, scale):
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return offsets, rng.normal(size=(offsets[-1], V)) * scale, rng.normal(size=(V, V)) * scale / 2


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_forward_backward_equals_enumeration(scale):
    rng = np.random.default_rng(1)
    V, lengths = 3, np.array([4, 1, 3, 2, 4])
    offsets, unary, pairwise = _corpus(rng, lengths, V, scale)
    layout = TimeMajor(offsets)
    marg, pair_sum, log_z = layout.forward_backward(unary[layout.order], pairwise)
    mine = np.empty_like(marg)
    mine[layout.order] = marg
    expected_pairs = np.zeros((V, V))
    for s, (low, high) in enumerate(zip(offsets[:-1], offsets[1:])):
        paths, score = _enumerated(unary[low:high], pairwise)
        expected_log_z = logsumexp(score)
        p = np.exp(score - expected_log_z)
        assert log_z[list(layout.sentences).index(s)] == pytest.approx(expected_log_z, rel=1e-12)
        for t in range(high - low):
            np.testing.assert_allclose(mine[low + t], np.bincount(paths[:, t], weights=p, minlength=V), atol=1e-12)
        for t in range(high - low - 1):
            np.add.at(expected_pairs, (paths[:, t], paths[:, t + 1]), p)
    np.testing.assert_allclose(pair_sum, expected_pairs, atol=1e-11)


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_scaled_messages_of_several_chains_equal_enumeration(scale):
    """log α_t(v) = log Σ over path prefixes ending in v at t, log β_t(v) = log Σ over the suffixes
    after it, log Z, and α̂ β̂ the marginal, for R chains with their own pairwise at once."""
    rng = np.random.default_rng(2)
    R, V, lengths = 3, 3, np.array([3, 1, 4, 2])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    unary = rng.normal(size=(R, offsets[-1], V)) * scale
    pairwise = rng.normal(size=(R, V, V)) * scale / 2
    layout = TimeMajor(offsets)
    alpha, beta, log_c, log_z = layout.scaled_messages(unary[:, layout.order], pairwise)
    row = np.empty(len(layout.order), np.int64)
    row[layout.order] = np.arange(len(layout.order))  # corpus token → time-major row
    for r in range(R):
        for s, (low, high) in enumerate(zip(offsets[:-1], offsets[1:])):
            u, L = unary[r, low:high], high - low
            paths, score = _enumerated(u, pairwise[r])
            assert log_z[r, list(layout.sentences).index(s)] == pytest.approx(logsumexp(score), rel=1e-12)
            for t in range(L):
                prefix = u[np.arange(t + 1), paths[:, : t + 1]].sum(1) \
                    + pairwise[r][paths[:, :t], paths[:, 1 : t + 1]].sum(1)  # score of y_0 … y_t
                at = row[low + t]
                for v in range(V):
                    ending = paths[:, t] == v  # each prefix appears V^(L − 1 − t) times, each suffix V^t
                    log_alpha = logsumexp(prefix[ending]) - (L - 1 - t) * np.log(V)
                    log_beta = logsumexp(score[ending] - prefix[ending]) - t * np.log(V)
                    assert np.log(alpha[r, at, v]) + log_c[r, at] == pytest.approx(log_alpha, abs=1e-9 * scale)
                    assert np.log(beta[r, at, v]) + log_z[r, list(layout.sentences).index(s)] - log_c[r, at] \
                        == pytest.approx(log_beta, abs=1e-9 * scale)
                    assert alpha[r, at, v] * beta[r, at, v] == pytest.approx(
                        np.exp(logsumexp(score[ending]) - logsumexp(score)), abs=1e-12)


def test_k_best_viterbi_equals_enumeration():
    """The k best paths in order with their scores; −inf and label 0 past the number of paths."""
    rng = np.random.default_rng(3)
    V, k, lengths = 3, 5, np.array([4, 1, 3, 2])
    offsets, unary, pairwise = _corpus(rng, lengths, V, 2.0)
    layout = TimeMajor(offsets)
    labels, scores = layout.viterbi(unary[layout.order], pairwise, k)
    mine = np.empty_like(labels)
    mine[layout.order] = labels
    for s, (low, high) in enumerate(zip(offsets[:-1], offsets[1:])):
        paths, score = _enumerated(unary[low:high], pairwise)
        order = np.argsort(-score, kind="stable")[:k]
        n = len(order)
        at = list(layout.sentences).index(s)
        np.testing.assert_allclose(scores[at, :n], score[order], rtol=1e-12)
        np.testing.assert_array_equal(mine[low:high, :n].T, paths[order])
        assert np.all(np.isneginf(scores[at, n:])) and not mine[low:high, n:].any()
    best, best_scores = layout.viterbi(unary[layout.order], pairwise)
    np.testing.assert_array_equal(best[:, 0], labels[:, 0])
    np.testing.assert_array_equal(best_scores[:, 0], scores[:, 0])


def test_ties_go_to_the_lower_label():
    layout = TimeMajor(np.array([0, 3, 5]))
    labels, scores = layout.viterbi(np.zeros((5, 4)), np.zeros((4, 4)), 3)
    assert not labels[:, 0].any() and np.all(scores == 0.0)


def test_a_padded_batch_with_an_empty_sentence():
    """The padded entry points: an empty sentence has one path (score 0) and no tokens; the others
    are what their time-major layout gives."""
    rng = np.random.default_rng(4)
    lengths = np.array([3, 0, 4, 1])
    unary, pairwise = rng.normal(size=(4, 4, 3)), rng.normal(size=(3, 3))
    paths, scores = nbest_viterbi(unary, pairwise, lengths, 2)
    assert scores[1, 0] == 0.0 and np.isneginf(scores[1, 1]) and not paths[1].any()
    for b, L in enumerate(lengths):
        if L:
            all_paths, score = _enumerated(unary[b, :L], pairwise)
            order = np.argsort(-score, kind="stable")[:2]
            np.testing.assert_array_equal(paths[b, :, :L], all_paths[order])
            np.testing.assert_allclose(scores[b], score[order], rtol=1e-12)
            assert not paths[b, :, L:].any()
    np.testing.assert_array_equal(viterbi(unary, pairwise, lengths), paths[:, 0])
    layout, batch_sentence, (sentence, position) = padded_layout(lengths)
    assert sorted(batch_sentence) == [0, 2, 3] and len(sentence) == lengths.sum()
    assert set(zip(sentence, position)) == {(b, t) for b, L in enumerate(lengths) for t in range(L)}
    assert padded_layout(np.zeros(2, np.int64))[0] is None


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_time_major_numpy_chain_equals_the_log_space_chain(scale):
    rng = np.random.default_rng(6)
    lengths = np.array([7, 1, 3, 2, 6, 3])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    V = 4
    unary = rng.normal(size=(offsets[-1], V)) * scale
    pairwise = rng.normal(size=(V, V)) * scale / 3
    layout = TimeMajor(offsets)
    marg, pair_sum, log_z = layout.forward_backward(unary[layout.order], pairwise)
    padded = np.zeros((len(lengths), lengths.max(), V))
    for b, length in enumerate(lengths):
        padded[b, :length] = unary[offsets[b]:offsets[b + 1]]
    ref_marg, ref_pair = chain.marginals(tf.constant(padded), tf.constant(pairwise), tf.constant(lengths, tf.int32))
    ref_z = chain.log_partition(tf.constant(padded), tf.constant(pairwise), tf.constant(lengths, tf.int32)).numpy()
    mine = np.zeros_like(padded)
    corpus_token = layout.order  # time-major row → corpus token
    sentence = np.repeat(np.arange(len(lengths)), lengths)[corpus_token]
    mine[sentence, corpus_token - offsets[sentence]] = marg
    np.testing.assert_allclose(mine, ref_marg.numpy(), atol=1e-10)
    np.testing.assert_allclose(pair_sum, tf.reduce_sum(ref_pair, [0, 1]).numpy(), atol=1e-9)
    np.testing.assert_allclose(log_z, ref_z[layout.sentences], rtol=1e-12)


@pytest.mark.parametrize("V", [1, 3])
def test_forward_backward_in_the_unaries_own_array_gives_the_same_bits(V):
    """`consume=True` (the training objective's): the recursions work in unary's array, which the
    result must not notice: every output equal to the last bit to the copying run's (which equals
    enumeration, above), with one label too (its row maximum is unary itself); and the marginals,
    made with one step's β̂ at a time, equal to the bit α̂ β̂ of the pass that keeps every β̂."""
    rng = np.random.default_rng(4)
    offsets, unary, pairwise = _corpus(rng, np.array([4, 1, 3, 2, 4]), V, 3.0)
    layout = TimeMajor(offsets)
    kept = unary[layout.order].astype(np.float32)
    given = kept.copy()
    expected = layout.forward_backward(kept, pairwise.astype(np.float32))
    got = layout.forward_backward(given, pairwise.astype(np.float32), consume=True)
    for a, b in zip(expected, got):
        assert a.tobytes() == b.tobytes()
    mixed = layout.forward_backward(kept, pairwise)  # float64 pairwise with float32 unaries: float32 products
    for a, b in zip(expected, mixed):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not np.array_equal(given, kept)  # the unaries' array was worked in
    # the marginals of the backward pass that keeps one step's β̂: those of the one that keeps all of β̂
    alpha, beta, _, _ = layout.scaled_messages(kept, pairwise.astype(np.float32))
    assert (alpha * beta).tobytes() == expected[0].tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("span", [0.5, 6.0, 12.0, 24.0, 45.0, np.inf])
def test_forward_backward_over_long_sentences_with_wide_pairwise_spans(dtype, span):
    """Over sentences of up to 120 tokens whose potentials drive the messages' mass down as fast as
    the pairwise span allows (the best unary label never the one the pairwise favours: every step's
    best path pays the whole span), and with a forbidden transition (−inf), `forward_backward`'s
    marginals, pair sums and log Z equal the float64 `scaled_messages` (against enumeration above),
    in float32 too."""
    rng = np.random.default_rng(8)
    V, lengths = 5, np.array([120, 1, 37, 64, 2, 119, 8])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    finite = 6.0 if np.isinf(span) else span
    pairwise = np.where(np.eye(V, dtype=bool), 0.0, -finite) + rng.uniform(0, 0.1, (V, V))
    if np.isinf(span):
        pairwise[0, 1] = -np.inf  # a forbidden transition: weight exp(−inf) = 0
    best = np.arange(offsets[-1]) % V  # a different label at each token: every step leaves the diagonal
    unary = rng.normal(size=(offsets[-1], V)) + np.where(np.arange(V) == best[:, None], 3.0 * min(finite, 30.0), 0.0)
    layout = TimeMajor(offsets)
    marg, pair_sum, log_z = layout.forward_backward(unary[layout.order].astype(dtype), pairwise.astype(dtype))
    alpha, beta, _, ref_log_z = layout.scaled_messages(unary[layout.order], np.where(np.isinf(pairwise), -1e300,
                                                                                        pairwise))
    tolerance = 1e-10 if dtype == np.float64 else 2e-5
    assert np.isfinite(marg).all() and np.isfinite(log_z).all()
    np.testing.assert_allclose(marg, alpha * beta, atol=tolerance)
    np.testing.assert_allclose(log_z, ref_log_z, rtol=tolerance)
    ref_pairs = (alpha[layout.left, :, None] * np.exp(pairwise - pairwise.max())[None]
                 * (beta[layout.right] * np.exp(unary[layout.order][layout.right]
                                                - unary[layout.order][layout.right].max(1, keepdims=True)))[:, None])
    ref_pairs /= ref_pairs.sum((1, 2), keepdims=True)
    np.testing.assert_allclose(pair_sum, ref_pairs.sum(0), atol=tolerance * len(layout.left))


@pytest.mark.parametrize("lengths", [[1], [3], [2, 5, 1, 5, 3], [1, 1, 1], [7, 2, 2, 6]])
def test_time_major_layout_by_hand(lengths):
    """The layout's arrays against their definitions, token by token in plain Python: step t holds
    position t of every sentence longer than t, longest sentences first (ties in corpus order);
    `left`/`right` are exactly the adjacent token pairs of each sentence; offsets need not start at 0."""
    offsets = 4 + np.concatenate([[0], np.cumsum(lengths)])
    layout = TimeMajor(offsets)
    by_length = sorted(range(len(lengths)), key=lambda s: -lengths[s])  # stable: ties in corpus order
    rows = [(t, rank, s) for t in range(max(lengths)) for rank, s in enumerate(by_length) if lengths[s] > t]
    assert layout.sentences.tolist() == by_length
    assert layout.order.tolist() == [int(offsets[s]) + t for t, _, s in rows]
    assert layout.sentence_of.tolist() == [rank for _, rank, _ in rows]
    pairs = {(int(layout.order[a]), int(layout.order[b])) for a, b in zip(layout.left, layout.right)}
    assert len(pairs) == len(layout.left) == sum(lengths) - len(lengths)
    assert pairs == {(int(offsets[s]) + t, int(offsets[s]) + t + 1) for s in range(len(lengths))
                     for t in range(lengths[s] - 1)}
    assert all(int(layout.order[b]) == int(layout.order[a]) + 1 for a, b in zip(layout.left, layout.right))
