"""Exact span probabilities, n-best paths and path probabilities of `ChainPosterior` against
brute-force enumeration of every label path (float64), per chain and averaged over chains."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpseq.corpora.schemes import spans
from gpseq.errors import ConfigError
from gpseq.structured.numpy_chain import TimeMajor, top_k
from gpseq.structured.spans import ChainPosterior, SpanScheme, max_expected_f1_spans, span_queries

LABELSETS = {
    "iob2": ["B-A", "I-A", "B-B", "I-B", "O"],
    "iob1": ["B-A", "I-A", "I-B", "O"],
    "bioes": ["B-A", "I-A", "E-A", "S-A", "S-B", "O"],
}


def enumerate_paths(unary, pairwise, length):
    """Every path of one chain with its probability: (paths [N, L], p [N])."""
    V = unary.shape[-1]
    paths = np.array(list(itertools.product(range(V), repeat=length)), dtype=np.int64).reshape(-1, length)
    score = unary[np.arange(length), paths].sum(1) + pairwise[paths[:, :-1], paths[:, 1:]].sum(1)
    p = np.exp(score - score.max())
    return paths, p / p.sum()


def brute_span_probs(unary, pairwise, length, labels, scheme):
    """{(type, start, end): P(span in spans(path))} of one chain."""
    paths, p = enumerate_paths(unary, pairwise, length)
    out = {}
    for path, prob in zip(paths, p):
        for span in spans([labels[v] for v in path], scheme):
            out[span] = out.get(span, 0.0) + prob
    return out


def random_posterior(rng, R, B, T, V, lengths=None, scale=1.5):
    unary = rng.normal(0, scale, (R, B, T, V))
    pairwise = rng.normal(0, scale, (R, V, V))
    lengths = rng.integers(1, T + 1, B) if lengths is None else np.asarray(lengths)
    weights = rng.dirichlet(np.ones(R))
    return ChainPosterior(unary, pairwise, lengths, weights), unary, pairwise, lengths, weights


def all_spans(scheme, length):
    return [(kind, i, j) for kind in scheme.types for i in range(length) for j in range(i + 1, length + 1)]


@pytest.mark.parametrize("tag_scheme", sorted(LABELSETS))
def test_span_probabilities_equal_enumeration_per_chain_and_averaged(tag_scheme):
    labels = LABELSETS[tag_scheme]
    rng = np.random.default_rng(3)
    scheme = SpanScheme.build(labels, tag_scheme)
    posterior, unary, pairwise, lengths, weights = random_posterior(rng, 3, 4, 5, len(labels), lengths=[5, 1, 3, 4])
    found = [all_spans(scheme, int(L)) for L in lengths]
    queries = span_queries(scheme, found)
    per_chain = np.exp(posterior.span_log_probs(scheme, queries, per_chain=True))  # [R, Q]
    averaged = posterior.span_probs(scheme, queries)
    for r in range(3):
        for b, L in enumerate(lengths):
            brute = brute_span_probs(unary[r, b], pairwise[r], int(L), labels, tag_scheme)
            rows = np.flatnonzero(queries[:, 0] == b)
            for q in rows:
                kind = scheme.types[queries[q, 1]]
                expected = brute.get((kind, int(queries[q, 2]), int(queries[q, 3])), 0.0)
                assert per_chain[r, q] == pytest.approx(expected, abs=1e-12)
    expected_avg = np.zeros(len(queries))
    for r in range(3):
        for q, (b, c, i, j) in enumerate(queries):
            brute = brute_span_probs(unary[r, b], pairwise[r], int(lengths[b]), labels, tag_scheme)
            expected_avg[q] += weights[r] * brute.get((scheme.types[c], i, j), 0.0)
    np.testing.assert_allclose(averaged, expected_avg, atol=1e-12)


@pytest.mark.parametrize("tag_scheme", sorted(LABELSETS))
def test_spans_partition_the_probability_mass(tag_scheme):
    """Σ_{type, end} P(span starting at i) = P(a chunk starts at i) (by enumeration); each span's
    probability is at most the smallest token marginal of its type; spans_from equals span_probs."""
    labels = LABELSETS[tag_scheme]
    rng = np.random.default_rng(7)
    scheme = SpanScheme.build(labels, tag_scheme)
    posterior, unary, pairwise, lengths, weights = random_posterior(rng, 2, 3, 5, len(labels), lengths=[5, 4, 2])
    starts = np.array([(b, c, i) for b, L in enumerate(lengths) for c in range(len(scheme.types))
                       for i in range(L)])
    queries, probs = posterior.spans_from(scheme, starts)
    np.testing.assert_allclose(probs, posterior.span_probs(scheme, queries), atol=1e-13)
    marg = posterior.token_marginals()
    for b, L in enumerate(lengths):
        start_prob = np.zeros(L)
        for r in range(2):
            paths, p = enumerate_paths(unary[r, b], pairwise[r], int(L))
            for path, prob in zip(paths, p):
                for _, i, _ in spans([labels[v] for v in path], tag_scheme):
                    start_prob[i] += weights[r] * prob
        for i in range(L):
            rows = (queries[:, 0] == b) & (queries[:, 2] == i)
            assert probs[rows].sum() == pytest.approx(start_prob[i], abs=1e-12)
        for (qb, c, i, j), p in zip(queries, probs):
            if qb == b:
                of_type = scheme.type_of == c
                assert p <= marg[b, i:j][:, of_type].sum(-1).min() + 1e-12


def test_pruned_spans_keep_every_span_above_the_floor():
    labels = LABELSETS["iob2"]
    rng = np.random.default_rng(11)
    scheme = SpanScheme.build(labels, "iob2")
    posterior, *_ = random_posterior(rng, 2, 3, 8, len(labels), lengths=[8, 6, 3])
    starts = np.array([(b, c, i) for b, L in enumerate(posterior.lengths) for c in range(2) for i in range(L)])
    full_q, full_p = posterior.spans_from(scheme, starts)
    pruned_q, pruned_p = posterior.spans_from(scheme, starts, min_prob=0.05)
    expected = {tuple(q): p for q, p in zip(full_q, full_p) if p >= 0.05}
    assert {tuple(q): p for q, p in zip(pruned_q, pruned_p)} == pytest.approx(expected, abs=1e-13)
    capped_q, _ = posterior.spans_from(scheme, starts, max_length=2)
    assert (capped_q[:, 3] - capped_q[:, 2]).max() == 2


def test_token_marginals_and_path_probabilities_equal_enumeration():
    rng = np.random.default_rng(5)
    posterior, unary, pairwise, lengths, weights = random_posterior(rng, 3, 3, 4, 3, lengths=[4, 2, 3])
    marg = posterior.token_marginals()
    paths = rng.integers(0, 3, (3, 4))
    log_p = posterior.path_log_probs(paths)
    for b, L in enumerate(lengths):
        expected_marg = np.zeros((L, 3))
        expected_p = 0.0
        for r in range(3):
            all_paths, p = enumerate_paths(unary[r, b], pairwise[r], int(L))
            for t in range(L):
                expected_marg[t] += weights[r] * np.bincount(all_paths[:, t], weights=p, minlength=3)
            expected_p += weights[r] * p[np.all(all_paths == paths[b, :L], axis=1)][0]
        np.testing.assert_allclose(marg[b, :L], expected_marg, atol=1e-12)
        assert np.all(marg[b, L:] == 0)
        assert log_p[b] == pytest.approx(np.log(expected_p), abs=1e-10)


def test_top_k_equals_a_stable_full_sort():
    """`top_k` picks what a stable descending argsort puts first, ties (−inf among them) by index."""
    rng = np.random.default_rng(5)
    for shape in [(3, 7), (4, 5, 12), (2, 3, 1), (5, 2, 30)]:
        for values in (rng.normal(size=shape), rng.integers(0, 3, size=shape).astype(float)):
            values = np.where(rng.random(shape) < 0.3, -np.inf, values)  # ties at −inf too
            for k in range(1, shape[-1] + 2):
                expected = np.argsort(-values, axis=-1, kind="stable")[..., :k]
                np.testing.assert_array_equal(top_k(values, k), expected)


def test_nbest_equals_enumeration():
    """The k best paths of one chain are the k most probable by enumeration, with their
    probabilities; with several chains they are the best of the mean potentials and their
    probabilities the weighted average of the chains'."""
    rng = np.random.default_rng(2)
    posterior, unary, pairwise, lengths, _ = random_posterior(rng, 1, 3, 4, 3, lengths=[4, 3, 1])
    paths, log_probs = posterior.nbest(5)
    for b, L in enumerate(lengths):
        all_paths, p = enumerate_paths(unary[0, b], pairwise[0], int(L))
        order = np.argsort(-p, kind="stable")
        n = min(5, len(p))
        np.testing.assert_allclose(np.exp(log_probs[b, :n]), p[order[:n]], atol=1e-12)
        for rank in range(n):
            match = np.flatnonzero(np.all(all_paths == paths[b, rank, :L], axis=1))
            assert p[match[0]] == pytest.approx(p[order[rank]], abs=1e-12)
        assert len({tuple(x) for x in paths[b, :n, :L]}) == n
        assert np.all(np.isneginf(log_probs[b, n:]))
    mixed, unary, pairwise, lengths, weights = random_posterior(rng, 3, 2, 4, 3, lengths=[4, 3])
    paths, log_probs = mixed.nbest(4)
    mean_u = np.einsum("r,rbtv->btv", weights, unary)
    mean_w = np.einsum("r,rij->ij", weights, pairwise)
    for b, L in enumerate(lengths):
        all_paths, p_mean = enumerate_paths(mean_u[b], mean_w, int(L))
        top = all_paths[np.argsort(-p_mean, kind="stable")[:4]]
        np.testing.assert_array_equal(paths[b, :, :L], top)
        expected = sum(weights[r] * enumerate_paths(unary[r, b], pairwise[r], int(L))[1] for r in range(3))
        np.testing.assert_allclose(np.exp(log_probs[b]), expected[np.argsort(-p_mean, kind="stable")[:4]],
                                   atol=1e-12)


def test_bias_corrected_path_probability_is_closer_to_the_truth():
    """Monte Carlo log-mean-exp is low by ≈ Var/(2 S p²); the delta-method correction removes more than
    half of it even with these heavy-tailed (log-normal, σ ≈ 2.4 nats) path probabilities."""
    rng = np.random.default_rng(0)
    T, V, S, trials = 6, 3, 8, 400
    base_u, base_w = rng.normal(0, 1, (1, 1, T, V)), rng.normal(0, 1, (V, V))
    path = np.zeros((1, T), dtype=np.int64)
    reference = ChainPosterior(base_u + rng.normal(0, 0.7, (20000, 1, T, V)), np.broadcast_to(base_w, (20000, V, V)),
                               [T]).path_log_probs(path)[0]
    plain, corrected = [], []
    for _ in range(trials):
        draws = ChainPosterior(base_u + rng.normal(0, 0.7, (S, 1, T, V)), np.broadcast_to(base_w, (S, V, V)), [T])
        plain.append(draws.path_log_probs(path)[0])
        corrected.append(draws.path_log_probs(path, bias_corrected=True)[0])
    plain_bias = np.mean(plain) - reference
    corrected_bias = np.mean(corrected) - reference
    assert plain_bias < -0.02
    assert abs(corrected_bias) < abs(plain_bias) / 2


def test_span_scheme_masks_follow_conlleval():
    scheme = SpanScheme.build(["B-NP", "I-NP", "I-VP", "O"], "iob2")
    index = {label: v for v, label in enumerate(scheme.labels)}
    assert scheme.starts[4, index["I-NP"]]  # an I- at the sentence start starts a chunk
    assert scheme.starts[index["O"], index["I-VP"]]
    assert not scheme.starts[index["B-NP"], index["I-NP"]]
    assert scheme.continues[index["B-NP"], index["I-NP"]]
    assert not scheme.continues[index["I-NP"], index["I-VP"]]
    assert scheme.ends[index["I-NP"], 4] and not scheme.ends[index["O"], 4]
    with pytest.raises(ConfigError, match="not a chunk label"):
        SpanScheme.build(["NN", "VB"], "iob2")


def test_span_queries_are_checked():
    scheme = SpanScheme.build(LABELSETS["iob2"], "iob2")
    posterior, *_ = random_posterior(np.random.default_rng(0), 1, 1, 3, 5, lengths=[2])
    with pytest.raises(ConfigError, match="start < end"):
        posterior.span_probs(scheme, [[0, 0, 1, 3]])
    with pytest.raises(ConfigError, match="no chunk type"):
        span_queries(scheme, [[("C", 0, 1)]])


def test_max_expected_f1_decoding_against_enumeration_of_span_sets():
    """The chosen set maximises Σ P / (n + G) over every non-overlapping subset of the candidates."""
    rng = np.random.default_rng(4)
    for _ in range(30):
        spans_drawn = {}
        for _ in range(7):
            start = int(rng.integers(0, 6))
            spans_drawn[(int(rng.integers(0, 2)), start, start + int(rng.integers(1, 4)))] = float(rng.uniform())
        candidates = [(*span, p) for span, p in spans_drawn.items()]
        G = float(rng.uniform(0.5, 4))

        def objective(chosen):
            return 2 * sum(p for *_, p in chosen) / (len(chosen) + G)

        best = 0.0
        for mask in itertools.product([0, 1], repeat=len(candidates)):
            chosen = sorted((c for c, m in zip(candidates, mask) if m), key=lambda x: x[1])
            if all(a[2] <= b[1] for a, b in zip(chosen, chosen[1:])):
                best = max(best, objective(chosen))
        picked = max_expected_f1_spans(candidates, G)
        lookup = {(c, s, e): p for c, s, e, p in candidates}
        assert objective([(*x, lookup[x]) for x in picked]) == pytest.approx(best, abs=1e-12)


def test_span_probabilities_of_long_sentences_equal_masked_partition_functions():
    """Long sentences with large potentials (messages far outside float64's range unscaled), IOB2:
    the span [i, j) of type τ, exactly, is the set of paths with I-τ at i+1 … j−1, anything but
    I-τ at j, and at i either B-τ or (conlleval) I-τ after a label not of type τ: two sets of paths
    each fixed by a mask per token, so P = (Z(first) + Z(second)) / Z, each Z by the masked
    forward–backward of `numpy_chain` (an independent recursion); relative agreement of the
    log-probabilities, tiny spans included."""
    labels = ["O", "B-X", "I-X", "B-Y", "I-Y"]
    scheme = SpanScheme.build(labels, "iob2")
    rng = np.random.default_rng(7)
    lengths = np.array([400, 250])
    posterior, unary, pairwise, _, _ = random_posterior(rng, 1, 2, 400, len(labels), lengths=lengths, scale=12.0)
    rows = []
    for b, L in enumerate(lengths):
        for _ in range(40):
            i = int(rng.integers(0, L))
            rows.append((b, int(rng.integers(0, 2)), i, int(min(L, i + rng.integers(1, 6)))))
    queries = np.array(rows)
    got = posterior.span_log_probs(scheme, queries)
    expected = []
    for b, c, i, j in queries:
        L = int(lengths[b])
        kind = scheme.types[c]
        layout = TimeMajor(np.array([0, L]))
        _, _, log_z = layout.forward_backward(unary[0, b, :L].copy(), pairwise[0], pairs=False)
        log_z_span = []
        for first in ("B", "I"):
            allowed = np.ones((L, len(labels)), dtype=bool)
            allowed[i] = [label == f"{first}-{kind}" for label in labels]
            if first == "I" and i > 0:
                allowed[i - 1] = [not label.endswith(f"-{kind}") for label in labels]
            allowed[i + 1 : j] = [label == f"I-{kind}" for label in labels]
            if j < L:
                allowed[j] = [label != f"I-{kind}" for label in labels]
            log_z_span.append(layout.constrained_forward_backward(unary[0, b, :L], pairwise[0], allowed,
                                                                  pairs=False)[2][0])
        expected.append(np.logaddexp(*log_z_span) - log_z[0])
    assert np.min(expected) < -50.0  # tiny spans are among them
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("scheme, labels", [
    ("iob2", ["O", "B-NP", "I-NP", "B-VP", "I-VP"]),
    ("iob1", ["I-VP", "O", "B-NP", "I-NP"]),
    ("bioes", ["O", "B-A", "I-A", "E-A", "S-A", "B-B", "E-B", "S-B", "I-B"]),
    ("iob2", ["B", "I", "O"]),
])
def test_chunks_of_id_paths_equal_spans_of_each_sentence(scheme, labels):
    """`SpanScheme.chunks`, the batched chunk reader, against `spans` (tested on conlleval's cases and
    seqeval in tests/corpora) sentence by sentence: every id sequence up to length 4 as one batch (an empty sentence first), then
    batches in which one sentence's end meets the next's start."""
    reader = SpanScheme.build(labels, scheme)
    every = [np.array(path, dtype=np.int64) for n in range(5)
             for path in itertools.product(range(len(labels)), repeat=n)]
    assert reader.chunks(every) == [spans([labels[i] for i in path], scheme) for path in every]
    rng = np.random.default_rng(0)
    for _ in range(200):
        batch = [rng.integers(0, len(labels), size=rng.integers(0, 7)) for _ in range(rng.integers(1, 6))]
        assert reader.chunks(batch) == [spans([labels[i] for i in path], scheme) for path in batch]
    assert reader.chunks([]) == []


def test_a_span_scheme_refuses_labels_that_are_not_chunk_tags():
    with pytest.raises(ConfigError, match="NN"):
        SpanScheme.build(["NN", "O"], "iob2")
