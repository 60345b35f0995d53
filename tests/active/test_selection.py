"""Selection with a trained tagger (`Tagger.select`, `gpseq.active.selection`): deterministic under a
seed, scores that are the strategy's, duplicates skipped, bad options refused, Monte Carlo scores
that do not depend on the batch or the chunk size, and a scored model freed with its tagger."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from helpers.active import saved, trained  # noqa: F401


def test_select_is_deterministic_under_a_seed_and_scores_are_the_strategy(trained):
    from gpseq.active.selection import score_sentences

    tagger, train = trained
    pool = [s for s in train[120:220]]
    first = tagger.select(pool, 10, "bald", seed=3)
    again = tagger.select(pool, 10, "bald", seed=3, chunk_size=2048)
    assert [(s.index, s.score) for s in first] == [(s.index, s.score) for s in again]
    assert [s.score for s in first] == sorted((s.score for s in first), reverse=True)
    # entropy under the deterministic predictive: the token entropies of Tagger.tag's marginals
    picked = tagger.select(pool, 5, "entropy", max_similarity=1.0)
    for item in picked:
        p = item.tagged.probabilities
        assert item.score == pytest.approx(float(-(p * np.log(np.maximum(p, 1e-300))).sum()), rel=1e-4, abs=1e-6)
        assert pool[item.index] is item.sentence
    # least-confidence: 1 − P(Viterbi path) of the deterministic predictive, as Tagger.tag scores the path
    scores = score_sentences(tagger, pool[:20], "least-confidence")
    tagged = tagger.tag(pool[:20], decode="viterbi")  # the best path, whichever decoder the model keeps
    np.testing.assert_allclose(scores, [1 - np.exp(t.sequence_log_prob) for t in tagged], atol=2e-3)
    # random: a permutation that depends on the seed only
    a, b = (tagger.select(pool, 100, "random", seed=s, max_similarity=1.0, tag=False) for s in (1, 2))
    assert sorted(x.index for x in a) == sorted(x.index for x in b) == list(range(100))
    assert [x.index for x in a] != [x.index for x in b]


def test_select_skips_duplicates_and_near_duplicates(trained):
    from gpseq.corpora.types import Sentence

    tagger, train = trained
    base = train[130]
    near = Sentence(tokens=list(base.tokens[:-1]) + ["zzz"], columns=[list(c) for c in base.columns[:-1]]
                    + [["zzz", "NN"]])
    pool = [base, Sentence(tokens=list(base.tokens), columns=[list(c) for c in base.columns]), near, train[140]]
    jaccard = len(set(t.lower() for t in base.tokens) & set(t.lower() for t in near.tokens)) / len(
        set(t.lower() for t in base.tokens) | set(t.lower() for t in near.tokens))
    other = len(set(t.lower() for t in base.tokens) & set(t.lower() for t in train[140].tokens)) / len(
        set(t.lower() for t in base.tokens) | set(t.lower() for t in train[140].tokens))
    assert other < jaccard - 0.01
    picked = tagger.select(pool, 4, "least-confidence", max_similarity=jaccard - 0.01, tag=False)
    tokens = [tuple(p.sentence.tokens) for p in picked]
    assert len(set(tokens)) == len(tokens) == 2  # never the same sentence twice, nor base with near
    assert tuple(train[140].tokens) in tokens
    assert len(tagger.select(pool, 4, "least-confidence", max_similarity=1.0, tag=False)) == 3


def test_select_rejects_bad_options(trained):
    from gpseq.errors import ConfigError

    tagger, train = trained
    for options in ({"strategy": "nope"}, {"level": "word"}, {"strategy": "bald", "samples": 1}, {"max_similarity": 0.0},
                    {"variance_scale": -1.0}):
        with pytest.raises(ConfigError):
            tagger.select(train[:5], 2, **options)


def test_a_pool_of_repeated_sentences_still_gives_n_distinct_ones(trained):
    tagger, train = trained
    pool = [s for _ in range(5) for s in train[120:170]]  # every sentence five times
    picked = tagger.select(pool, 30, "entropy", max_similarity=1.0, candidates=1, chunk_size=60, tag=False)
    assert len(picked) == 30 and len({tuple(p.sentence.tokens) for p in picked}) == 30
    assert all(p.index < 50 for p in picked)  # the first copy read stays


def test_monte_carlo_scores_and_marginals_do_not_depend_on_the_batch(trained):
    """One seed is one set of posterior draws for the whole pool: a sentence's BALD score and its
    Monte Carlo marginals are the same scored alone, in a batch of others or in chunks of any size.
    Before, the weights' noise was drawn per batch (for the batch's own features, from a seed with the
    batch's number), so a sentence's score changed with the sentences batched with it."""
    from gpseq.active.selection import score_sentences

    tagger, train = trained
    pool = train[120:160]
    together = score_sentences(tagger, pool, "bald", seed=4)
    alone = np.array([score_sentences(tagger, [s], "bald", seed=4)[0] for s in pool[:6]])
    np.testing.assert_allclose(alone, together[:6], rtol=2e-4, atol=1e-6)
    reversed_ = score_sentences(tagger, pool[::-1], "bald", seed=4)[::-1]
    np.testing.assert_allclose(reversed_, together, rtol=2e-4, atol=1e-6)
    by_chunk = {size: sorted((p.index, p.score) for p in tagger.select(pool, 10, "bald", seed=4, chunk_size=size,
                                                                        max_similarity=1.0, tag=False))
                for size in (3, 2048)}
    assert [i for i, _ in by_chunk[3]] == [i for i, _ in by_chunk[2048]]
    np.testing.assert_allclose([s for _, s in by_chunk[3]], [s for _, s in by_chunk[2048]], rtol=2e-4)
    # another seed is another draw
    assert not np.allclose(score_sentences(tagger, pool, "bald", seed=5), together, rtol=1e-3)
    # sequence level: the sampled paths are keyed by the sentence too
    sequence = score_sentences(tagger, pool[:12], "bald", level="sequence", seed=4)
    single = [score_sentences(tagger, [s], "bald", level="sequence", seed=4)[0] for s in pool[:3]]
    np.testing.assert_allclose(single, sequence[:3], rtol=2e-4, atol=1e-6)
    # Monte Carlo tagging (samples=S): the same marginals for a sentence whatever it is tagged with
    batch = tagger.tag(pool, samples=8)
    for i in (0, 7, 23):
        single = tagger.tag([pool[i]], samples=8)[0]
        np.testing.assert_allclose(single.probabilities, batch[i].probabilities, rtol=1e-4, atol=1e-6)
        assert single.sequence_log_prob == pytest.approx(batch[i].sequence_log_prob, rel=1e-4, abs=1e-6)


def test_a_scored_model_is_freed_with_its_tagger(saved):
    """The compiled chain functions were cached under the model (a weak key) but closed over it: the
    cache kept every model a select had scored with alive for the life of the process (a loop of
    active-learning rounds grew by a model per round)."""
    from gpseq.active.selection import score_sentences
    from gpseq.tagger import Tagger

    directory, pool = saved
    for strategy in ("entropy", "bald"):
        tagger = Tagger.load(directory)
        score_sentences(tagger, pool[:10], strategy)
        model = weakref.ref(tagger.model)
        del tagger
        gc.collect()
        assert model() is None, strategy


def test_random_order_does_not_depend_on_the_chunk_size(saved):
    """--chunk-size only bounds memory (its help says so), but the random strategy drew each chunk's
    order from a stream seeded by the chunk's number: the same seed picked other sentences at
    --chunk-size 7 than at the default. One stream over the pool now draws a key per sentence."""
    from gpseq.tagger import Tagger

    directory, pool = saved
    tagger = Tagger.load(directory)
    picks = {size: [p.index for p in tagger.select(pool, 20, "random", seed=5, chunk_size=size, tag=False)]
             for size in (7, 64, 2048)}
    assert len(set(picks[2048])) == 20
    assert picks[7] == picks[64] == picks[2048]
