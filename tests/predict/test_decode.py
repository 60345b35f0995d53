"""Acting on probabilities with a trained tagger: the predictive's chains, exact span
probabilities and n-best lists against enumeration of every label path, abstention."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpseq.corpora import Sentence, read_conll, spans
from gpseq.features import get_preset
from gpseq.structured.spans import ChainPosterior
from gpseq.tagger import Tagger, TaggerConfig


@pytest.fixture(scope="module")
def chunker(sample_dir):
    train = read_conll(sample_dir / "train.conll")
    return Tagger.train(train, TaggerConfig(features=get_preset("chunking"))), read_conll(sample_dir / "test.conll")


def _batch(tagger, sentences):
    import tensorflow as tf

    from gpseq.training.batching import SequenceData, make_batch

    matrix = tagger.featurizer.transform(sentences)
    import scipy.sparse as sp

    data = SequenceData(sp.csr_matrix(matrix.rows), np.asarray(matrix.offsets, dtype=np.int64), None)
    raw = make_batch(data, np.arange(len(sentences)), dtype=np.float32)
    return {k: tf.convert_to_tensor(v) for k, v in raw.items()}


@pytest.mark.parametrize("deterministic", [True, False])
def test_predictive_chains_reproduce_the_compiled_marginals_and_path_probabilities(chunker, deterministic):
    """NumPy forward–backward over the chains `predict_with_chains` returns gives TensorFlow's marginals
    and log p(path) (deterministic: one chain; Monte Carlo: S = 4 weighted draws)."""
    import tensorflow as tf

    from gpseq.structured.predict import predict_with_chains

    tagger, test = chunker
    batch = _batch(tagger, test[:12])
    marg, path, logp, unary, pairwise, weights = predict_with_chains(
        tagger.model, batch, 4, tf.constant([3, 4], tf.int32), deterministic)
    posterior = ChainPosterior(unary.numpy(), pairwise.numpy(), batch["lengths"].numpy(), weights.numpy())
    assert unary.shape[0] == (1 if deterministic else 4)
    np.testing.assert_allclose(posterior.token_marginals(), marg.numpy(), atol=1e-4)  # TensorFlow runs in float32
    # TensorFlow's log p(path) of the Monte Carlo mixture carries the delta-method correction of the
    # log of an average (`mc_log_prob`'s default): compare it with the NumPy one that does too
    np.testing.assert_allclose(posterior.path_log_probs(path.numpy(), bias_corrected=not deterministic),
                               logp.numpy(), atol=2e-3, rtol=1e-4)


def _short(test, max_len=3, count=4):
    """The first `max_len` tokens (and their columns) of `count` test sentences."""
    return [Sentence(tokens=s.tokens[:max_len], labels=s.labels[:max_len], columns=s.columns[:max_len])
            for s in test[:count]]


def _enumerate(posterior, row):
    """Every path of sentence `row` of a ChainPosterior with its probability (weighted over the chains)."""
    T, V = int(posterior.lengths[row]), posterior.unary.shape[-1]
    paths = np.array(list(itertools.product(range(V), repeat=T)), dtype=np.int64)
    total = np.zeros(len(paths))
    for r, weight in enumerate(posterior.weights):
        unary, pairwise = posterior.unary[r, row, :T], posterior.pairwise[r]
        score = unary[np.arange(T), paths].sum(1) + pairwise[paths[:, :-1], paths[:, 1:]].sum(1)
        p = np.exp(score - score.max())
        total += weight * p / p.sum()
    return paths, total


@pytest.mark.parametrize("samples", [None, 3])
def test_tagged_spans_and_nbest_equal_enumeration(chunker, samples):
    """`tag`'s span probabilities, n-best lists, sequence_log_prob and user-given span probabilities
    equal enumeration of every label path of the predictive's chains (deterministic; S = 3 draws)."""
    tagger, test = chunker
    short = _short(test, max_len=3)
    assert short
    # tag (its own seed 0) and posteriors (seed 0) see the same draws
    tagged = tagger.tag(short, samples=samples, nbest=5)
    (ids, posterior), = list(tagger.posteriors(short, samples=samples))
    for row, index in enumerate(ids):
        result = tagged[index]
        paths, p = _enumerate(posterior, row)
        labels = [[tagger.labels[v] for v in path] for path in paths]
        for kind, start, end, prob in result.spans:
            expected = sum(q for path, q in zip(labels, p) if (kind, start, end) in spans(path, "iob2"))
            assert prob == pytest.approx(expected, abs=1e-6)
        ours = [tagger.label_index[label] for label in result.labels]
        truth = p[np.all(paths == ours, axis=1)][0]
        if samples is None:
            assert result.sequence_log_prob == pytest.approx(np.log(truth), abs=2e-3)
        order = np.argsort(-p, kind="stable")
        assert [prob for _, prob in result.nbest] == pytest.approx(p[order[:5]], abs=1e-9) if samples is None else \
            [prob for _, prob in result.nbest] == pytest.approx(
                [p[np.all(paths == [tagger.label_index[l] for l in nb], axis=1)][0] for nb, _ in result.nbest], abs=1e-9)
    given = [[("NP", 0, 1), ("NP", 0, min(2, len(s)))] for s in short]
    probs = tagger.span_probabilities(short, given, samples=samples)
    for (ids_row, index) in enumerate(ids):
        paths, p = _enumerate(posterior, ids_row)
        labels = [[tagger.labels[v] for v in path] for path in paths]
        for span, prob in zip(given[index], probs[index]):
            assert prob == pytest.approx(sum(q for path, q in zip(labels, p) if span in spans(path, "iob2")), abs=1e-6)


def test_span_probabilities_are_bounded_by_type_marginals_on_real_sentences(chunker):
    """On real sentences: an exact span probability is at most the smallest marginal of its type over
    its tokens (not of the returned labels: `I-NP` after `O` starts a chunk as `B-NP` does)."""
    tagger, test = chunker
    for result in tagger.tag(test[:40]):
        for kind, start, end, prob in result.spans:
            columns = [v for v, label in enumerate(result.label_set) if label.endswith("-" + kind)]
            type_marg = result.probabilities[start:end][:, columns].sum(1)
            assert 0.0 <= prob <= type_marg.min() + 1e-6


def test_abstention_never_changes_a_label(chunker):
    tagger, test = chunker
    plain = tagger.tag(test[:30])
    for threshold in (0.0, 0.5, 0.9, 1.0):
        flagged = tagger.tag(test[:30], abstain_below=threshold)
        for a, b in zip(plain, flagged):
            assert a.labels == b.labels
            assert b.abstained == [p < threshold for p in a.confidences]
            assert b.span_abstained == [p < threshold for *_, p in a.spans]
            assert [s[:3] for s in a.spans] == [s[:3] for s in b.spans]
    assert all(not any(r.abstained) for r in plain)


def test_span_f1_decoding_returns_consistent_chunks(chunker):
    tagger, test = chunker
    decoded = tagger.tag(test[:30], decode="span-f1")
    for sentence, result in zip(test[:30], decoded):
        assert [s[:3] for s in result.spans] == spans(result.labels, "iob2")
        exact = tagger.span_probabilities([sentence], [[s[:3] for s in result.spans]])[0]
        assert [s[3] for s in result.spans] == pytest.approx(exact, abs=1e-6)  # float32 potentials, other batch


def test_span_f1_decoding_without_an_outside_label_is_a_clear_error():
    """A segmentation model (B and I only, every token in a chunk) has no label for a token the
    expected-F1 chunks leave out: span-f1 decoding is refused by name (it was a KeyError 'O')."""
    from gpseq.errors import ConfigError

    words = ["ab", "c", "de", "f", "gh", "i"]
    train = [Sentence(words[i:] + words[:i], ["B", "I"] * 3) for i in range(6)]
    tagger = Tagger.train(train, TaggerConfig(features=get_preset("segmentation")))
    assert tagger.labels == ["B", "I"] and tagger.span_scheme is not None
    assert len(tagger.tag(train[:2], decode="max-marginal")) == 2
    with pytest.raises(ConfigError, match="outside label O"):
        tagger.tag(train[:2], decode="span-f1")


@pytest.mark.parametrize("K", [1, 2])
def test_compiled_monte_carlo_path_probability_equals_the_numpy_estimator(K):
    """`predict.mc_log_prob` (TensorFlow) and `ChainPosterior.path_log_probs` give the same
    bias-corrected log-mean-exp over K·S weighted draws, and the plain one without the correction."""
    import tensorflow as tf

    from gpseq.structured.predict import mc_log_prob

    rng = np.random.default_rng(1)
    S, B, T, V = 5, 3, 4, 3
    unary = rng.normal(0, 1, (K, S, B, T, V))
    pairwise = rng.normal(0, 1, (S, 1, V, V))
    lengths = np.array([4, 2, 3], np.int32)
    labels = rng.integers(0, V, (B, T)).astype(np.int32)
    weights = np.array([1.0]) if K == 1 else np.array([0.3, 0.7])
    flat_unary = unary.reshape(K * S, B, T, V)
    flat_pairwise = np.tile(pairwise[:, 0], (K, 1, 1))
    flat_weights = np.repeat(weights, S) / S
    posterior = ChainPosterior(flat_unary, flat_pairwise, lengths, flat_weights)
    for corrected in (True, False):
        ours = mc_log_prob(labels, tf.constant(unary), tf.constant(pairwise), lengths, tf.constant(weights),
                           bias_corrected=corrected).numpy()
        np.testing.assert_allclose(ours, posterior.path_log_probs(labels, bias_corrected=corrected), atol=1e-10)
    plain = posterior.path_log_probs(labels)
    assert np.all(posterior.path_log_probs(labels, bias_corrected=True) >= plain)


def test_choose_decoder_scores_each_decoder_by_hand():
    """Hand-computed cases: chunk F1 decides for chunk labels (max-marginal recovers the one gold
    chunk Viterbi misses: F1 1 vs 2/3), token accuracy for other labels, Viterbi on a tie, and a
    sentence with an unknown gold label is left out."""
    from gpseq.predict.decode import choose_decoder

    labels = ["B-NP", "I-NP", "O"]
    gold = np.array([0, 1, 2, 0, 2, 0, -1])
    viterbi = np.array([0, 1, 2, 2, 2, 2, 2])
    argmax = np.array([0, 1, 2, 0, 2, 1, 1])  # the unknown-gold sentence [5, 7) differs but is left out
    offsets = np.array([0, 3, 5, 7])
    chosen, scores = choose_decoder([(gold, argmax, viterbi, offsets)], labels, "iob2")
    assert chosen == "max-marginal" and scores["sentences"] == 2 and scores["metric"] == "chunk_f1"
    assert scores["viterbi"] == pytest.approx(2 / 3) and scores["max-marginal"] == pytest.approx(1.0)
    tags = ["DT", "NN", "VB"]
    chosen, scores = choose_decoder([(gold, argmax, viterbi, offsets)], tags, "iob2")
    assert chosen == "max-marginal" and scores["metric"] == "token_accuracy"
    assert scores["viterbi"] == pytest.approx(4 / 5) and scores["max-marginal"] == pytest.approx(1.0)
    chosen, scores = choose_decoder([(gold, viterbi, viterbi, offsets)], tags, "iob2")
    assert chosen == "viterbi" and scores["viterbi"] == scores["max-marginal"]
    assert choose_decoder([(np.array([-1]), np.array([0]), np.array([0]), np.array([0, 1]))], tags, "iob2") == \
        ("viterbi", {})


def test_training_resolves_decode_auto_by_its_held_out_choice_and_keeps_an_explicit_one(sample_dir, tmp_path):
    """The default config's decode "auto" becomes the decoder the training chose (saved, reloaded,
    and what tagging uses); an explicit decoder is kept and nothing is chosen."""
    train = read_conll(sample_dir / "train.conll")[:60]
    tagger = Tagger.train(train, TaggerConfig(features=get_preset("chunking")))
    assert tagger.config.decode == tagger.scores["decode"] in ("viterbi", "max-marginal")
    assert set(tagger.scores["decode_scores"]) == {"metric", "sentences", "viterbi", "max-marginal"}
    tagger.save(tmp_path / "m")
    loaded = Tagger.load(tmp_path / "m")
    assert loaded.config.decode == tagger.config.decode
    sentences = read_conll(sample_dir / "test.conll")[:5]
    expected = tagger.tag(sentences, decode=tagger.config.decode)
    assert [t.labels for t in loaded.tag(sentences)] == [t.labels for t in expected]
    fixed = Tagger.train(train, TaggerConfig(features=get_preset("chunking"), decode="max-marginal"))
    assert fixed.config.decode == "max-marginal" and "decode" not in fixed.scores
    # without cross-fitting the choice is made on the carved dev split (6 of these 60 sentences)
    from gpseq.training.config import TrainingConfig

    on_dev = Tagger.train(train, TaggerConfig(features=get_preset("chunking"),
                                              training=TrainingConfig(cross_fit_tokens=0)))
    assert "cross_fit_folds" not in on_dev.scores and on_dev.scores["dev_sentences"] == 6
    assert on_dev.scores["decode_scores"]["sentences"] == 6
    assert on_dev.config.decode == on_dev.scores["decode"] in ("viterbi", "max-marginal")
