"""Acquisition scores (`gpseq.active.acquisition`): every score against its definition by
brute-force enumeration of the label paths of tiny chains, and the memory of sequence-level scores
growing linearly with the draws."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpseq.active.acquisition import (chain_entropies, chain_scores, chain_token_marginals, combine,
                                      mixture_path_log_probs, sample_paths)
from gpseq.structured.spans import ChainPosterior


def random_chains(R=4, B=3, T=4, V=3, seed=0, lengths=None, spread=1.5):
    rng = np.random.default_rng(seed)
    base_u, base_w = rng.normal(size=(B, T, V)), rng.normal(size=(V, V))
    unary = base_u[None] + spread * rng.normal(size=(R, B, T, V))
    pairwise = base_w[None] + spread * rng.normal(size=(R, V, V))
    weights = rng.dirichlet(np.ones(R)) if R > 1 else None
    lengths = np.array(lengths if lengths is not None else [T, T - 1, 1][:B])
    return ChainPosterior(unary, pairwise, lengths, weights), unary, pairwise, lengths


def enumerate_chain(unary, pairwise, L):
    """{path: p(path)} of one chain over its first L tokens, by enumeration."""
    V = unary.shape[-1]
    paths = list(itertools.product(range(V), repeat=L))
    scores = np.array([sum(unary[t, y[t]] for t in range(L)) + sum(pairwise[y[t], y[t + 1]] for t in range(L - 1))
                       for y in paths])
    probs = np.exp(scores - scores.max())
    return dict(zip(paths, probs / probs.sum()))


def entropy(p):
    p = np.asarray(p, dtype=np.float64)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def brute_force(posterior, unary, pairwise, lengths):
    """Per sentence: (per-chain path distributions, the mixture's path distribution, per-chain
    token marginals [R, L, V], mixture token marginals [L, V])."""
    R, B, T, V = unary.shape
    out = []
    for b in range(B):
        L = lengths[b]
        chains = [enumerate_chain(unary[r, b], pairwise[r], L) for r in range(R)]
        mixture = {y: sum(posterior.weights[r] * chains[r][y] for r in range(R)) for y in chains[0]}
        marg = np.zeros((R, L, V))
        for r in range(R):
            for y, p in chains[r].items():
                marg[r, np.arange(L), list(y)] += p
        out.append((chains, mixture, marg, np.einsum("r,rtv->tv", posterior.weights, marg)))
    return out


def test_token_marginals_and_chain_entropies_match_enumeration():
    posterior, unary, pairwise, lengths = random_chains()
    marg = chain_token_marginals(posterior)
    entropies = chain_entropies(posterior)
    for b, (chains, _, brute_marg, _) in enumerate(brute_force(posterior, unary, pairwise, lengths)):
        L = lengths[b]
        np.testing.assert_allclose(marg[:, b, :L], brute_marg, atol=1e-12)
        assert np.all(marg[:, b, L:] == 0)
        np.testing.assert_allclose(entropies[:, b], [entropy(list(c.values())) for c in chains], atol=1e-10)


def test_token_bald_and_entropy_are_their_definitions():
    posterior, unary, pairwise, lengths = random_chains(seed=1)
    bald = chain_scores(posterior, "bald", level="token")["sum"]
    token_entropy = chain_scores(posterior, "entropy", level="token")["sum"]
    for b, (_, _, marg, mean) in enumerate(brute_force(posterior, unary, pairwise, lengths)):
        expected_entropy = sum(entropy(mean[t]) for t in range(lengths[b]))
        expected_bald = expected_entropy - sum(posterior.weights[r] * entropy(marg[r, t])
                                               for r in range(len(marg)) for t in range(lengths[b]))
        assert token_entropy[b] == pytest.approx(expected_entropy, abs=1e-10)
        assert bald[b] == pytest.approx(expected_bald, abs=1e-10)
        assert bald[b] >= -1e-12


def test_sequence_bald_estimates_the_mutual_information_by_enumeration():
    """I(y; f) = H[p̄] − Σ_r w_r H[p_r] over all V^T label paths, against the path-sampling estimate."""
    posterior, unary, pairwise, lengths = random_chains(seed=2)
    estimate = chain_scores(posterior, "bald", level="sequence", paths=4000, rng=np.random.default_rng(0))["sum"]
    entropy_estimate = chain_scores(posterior, "entropy", level="sequence", paths=4000,
                                    rng=np.random.default_rng(1))["sum"]
    for b, (chains, mixture, _, _) in enumerate(brute_force(posterior, unary, pairwise, lengths)):
        mixture_entropy = entropy(list(mixture.values()))
        exact = mixture_entropy - sum(w * entropy(list(c.values())) for w, c in zip(posterior.weights, chains))
        assert exact > 0.05  # the draws disagree: a real test
        assert estimate[b] == pytest.approx(exact, abs=0.03 * max(1.0, exact))
        assert entropy_estimate[b] == pytest.approx(mixture_entropy, abs=0.03 * max(1.0, mixture_entropy))


def test_sequence_entropy_of_one_chain_is_exact():
    posterior, unary, pairwise, lengths = random_chains(R=1, seed=3)
    found = chain_scores(posterior, "entropy", level="sequence")["sum"]
    for b in range(len(lengths)):
        exact = entropy(list(enumerate_chain(unary[0, b], pairwise[0], lengths[b]).values()))
        assert found[b] == pytest.approx(exact, abs=1e-10)


@pytest.mark.parametrize("keyed", [False, True])
def test_sampled_paths_follow_the_chain(keyed):
    """Forward filtering, backward sampling against enumeration, with the Gumbel noise from a
    generator or keyed by the sentence (`sentence_keys`: the hash-based noise must be Gumbel too)."""
    posterior, unary, pairwise, lengths = random_chains(R=2, B=1, T=3, seed=4, lengths=[3])
    keys = np.array([12345], dtype=np.uint32) if keyed else None
    paths = sample_paths(posterior, 20000, np.random.default_rng(5), keys)  # [R, n, B, T]
    for r in range(2):
        exact = enumerate_chain(unary[r, 0], pairwise[r], 3)
        counts = {}
        for y in map(tuple, paths[r, :, 0]):
            counts[y] = counts.get(y, 0) + 1
        for y, p in exact.items():
            assert counts.get(y, 0) / 20000 == pytest.approx(p, abs=0.015)
    log_p = mixture_path_log_probs(posterior, paths[:, :5])  # [Q, R, 5, B]
    for q in range(2):
        exact = enumerate_chain(unary[q, 0], pairwise[q], 3)
        for r in range(2):
            for n in range(5):
                assert np.exp(log_p[q, r, n, 0]) == pytest.approx(exact[tuple(paths[r, n, 0])], rel=1e-9)


def test_least_confidence_and_margin_against_enumeration():
    posterior, unary, pairwise, lengths = random_chains(R=1, seed=6)
    lc = chain_scores(posterior, "least-confidence")
    margin = chain_scores(posterior, "margin")
    owners = np.arange(len(lengths))
    lc_score = combine(lc, owners, lengths, "least-confidence", normalise=False)
    margin_score = combine(margin, owners, lengths, "margin", normalise=False)
    lc_normalised = combine(lc, owners, lengths, "least-confidence", normalise=True)
    for b in range(len(lengths)):
        probs = sorted(enumerate_chain(unary[0, b], pairwise[0], lengths[b]).values(), reverse=True)
        assert lc_score[b] == pytest.approx(1 - probs[0], abs=1e-10)
        assert margin_score[b] == pytest.approx(1 - (probs[0] - probs[1]), abs=1e-10)
        assert lc_normalised[b] == pytest.approx(1 - probs[0] ** (1 / lengths[b]), abs=1e-10)


def test_margin_of_a_mixture_of_chains_is_between_its_two_paths_under_the_mixture():
    # the two paths come from the mean potentials; under the mixture (Monte Carlo draws) the
    # second can be the more probable: the margin is their probability gap, never above 1
    posterior, unary, pairwise, lengths = random_chains(R=3, seed=0)
    paths, _ = posterior.nbest(2)
    margin = combine(chain_scores(posterior, "margin"), np.arange(len(lengths)), lengths, "margin", normalise=False)
    swapped = 0
    for b, (_, mixture, _, _) in enumerate(brute_force(posterior, unary, pairwise, lengths)):
        first, second = (mixture[tuple(paths[b, k, : lengths[b]])] for k in range(2))
        swapped += second > first
        assert margin[b] == pytest.approx(1 - abs(first - second), abs=1e-10)
        assert margin[b] <= 1
    assert swapped  # the case this pins happens here


def test_pieces_combine_as_documented():
    parts = {"sum": np.array([1.0, 2.0, 4.0])}
    assert combine(parts, np.array([0, 0, 1]), np.array([10, 4]), "bald", False).tolist() == [3.0, 4.0]
    assert combine(parts, np.array([0, 0, 1]), np.array([10, 4]), "bald", True).tolist() == [0.3, 1.0]
    # two pieces: P1 multiplies; the second best path is the best with one piece's second best
    logs = {"log_p1": np.log([0.5, 0.8]), "log_p2": np.log([0.2, 0.1])}
    score = combine(logs, np.array([0, 0]), np.array([6]), "margin", False)[0]
    assert score == pytest.approx(1 - (0.4 - 0.16))


def test_sequence_level_memory_grows_linearly_with_the_draws():
    """Sequence BALD / entropy scored every sampled path (R · paths of them) under every chain (R)
    at once, an array of R² · paths · B · T: --samples 128 --level sequence held ~3.5 GB more than
    --level token for a batch. Its peak now grows with R as the chains themselves do; the scores
    are the same (the same paths, each under every chain)."""
    import tracemalloc

    from gpseq.active.acquisition import chain_scores
    from gpseq.structured.spans import ChainPosterior

    def peak(R):
        rng = np.random.default_rng(0)
        B, T, V = 4, 60, 3
        posterior = ChainPosterior(rng.normal(size=(R, B, T, V)), rng.normal(size=(R, V, V)), np.full(B, T),
                                   np.full(R, 1.0 / R))
        posterior.log_z  # the forward-backward tables are the chains' own memory, not the score's
        tracemalloc.start()
        scores = chain_scores(posterior, "bald", level="sequence", paths=8, rng=np.random.default_rng(1))["sum"]
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top, scores

    small, _ = peak(32)
    large, scores = peak(64)
    assert np.all(np.isfinite(scores))
    assert large / small < 2.5  # linear in R: 2 (quadratic: 4)
