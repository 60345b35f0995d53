"""Cross-check with CRFsuite: its trained state/transition weights give our potentials, and our
marginals, sequence probabilities and Viterbi paths must equal CRFsuite's own."""

from __future__ import annotations

import numpy as np
import pytest

from gpseq.structured import chain

pycrfsuite = pytest.importorskip("pycrfsuite")

LABELS = ["A", "B", "C", "D"]


def synthetic_corpus(rng, num_sequences=60):
    """Markov label sequences with noisy word and suffix attributes (some with value 0.5)."""
    transition = rng.dirichlet(np.ones(len(LABELS)) * 0.5, size=len(LABELS))
    corpus = []
    for _ in range(num_sequences):
        length = int(rng.integers(1, 9))
        labels = [int(rng.integers(len(LABELS)))]
        for _ in range(length - 1):
            labels.append(int(rng.choice(len(LABELS), p=transition[labels[-1]])))
        tokens = []
        for t, y in enumerate(labels):
            word = y if rng.random() < 0.7 else int(rng.integers(len(LABELS)))
            attrs = {f"w={word}": 1.0, f"s={(word + t) % 3}": 1.0, "bias": 1.0}
            if t > 0:
                attrs[f"w-1={labels[t - 1] if rng.random() < 0.5 else 0}"] = 0.5
            tokens.append(attrs)
        corpus.append((tokens, [LABELS[y] for y in labels]))
    return corpus


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    corpus = synthetic_corpus(np.random.default_rng(0))
    trainer = pycrfsuite.Trainer(verbose=False)
    for tokens, labels in corpus:
        trainer.append(pycrfsuite.ItemSequence(tokens), labels)
    trainer.set_params({"c1": 0.0, "c2": 0.1, "max_iterations": 50, "feature.possible_transitions": True})
    path = str(tmp_path_factory.mktemp("crfsuite") / "model.crfsuite")
    trainer.train(path)
    tagger = pycrfsuite.Tagger()
    tagger.open(path)
    return tagger, synthetic_corpus(np.random.default_rng(1), num_sequences=12)


def potentials(tagger, sequences):
    """Unary [B, T, V] = Σ active state-feature weight × attribute value; pairwise [V, V]."""
    info = tagger.info()
    labels = tagger.labels()
    index = {label: i for i, label in enumerate(labels)}
    V = len(labels)
    pairwise = np.zeros((V, V))
    for (src, dst), weight in info.transitions.items():
        pairwise[index[src], index[dst]] = weight
    T = max(len(tokens) for tokens, _ in sequences)
    unary = np.zeros((len(sequences), T, V))
    for b, (tokens, _) in enumerate(sequences):
        for t, attrs in enumerate(tokens):
            for attr, value in attrs.items():
                for label in labels:
                    unary[b, t, index[label]] += info.state_features.get((attr, label), 0.0) * value
    lengths = np.array([len(tokens) for tokens, _ in sequences], np.int32)
    return labels, unary, pairwise, lengths


def test_marginals_probabilities_and_paths_match_crfsuite(trained):
    tagger, test = trained
    labels, unary, pairwise, lengths = potentials(tagger, test)
    assert np.abs(pairwise).max() > 0.1  # the model did learn transitions
    index = {label: i for i, label in enumerate(labels)}
    marg = chain.unary_marginals(unary, pairwise, lengths).numpy()
    gold = np.full(unary.shape[:2], -1, np.int32)
    known = [all(y in index for y in seq_labels) for _, seq_labels in test]
    for b, (_, seq_labels) in enumerate(test):
        if known[b]:
            gold[b, : len(seq_labels)] = [index[y] for y in seq_labels]
    prob = np.exp(chain.log_likelihood(gold, unary, pairwise, lengths).numpy())
    path = chain.viterbi(unary, pairwise, lengths)[0].numpy()
    for b, (tokens, seq_labels) in enumerate(test):
        tagger.set(pycrfsuite.ItemSequence(tokens))
        # CRFsuite's model dump (which info() parses) rounds weights to 6 decimals
        ours = marg[b, : len(tokens)]
        theirs = np.array([[tagger.marginal(label, t) for label in labels] for t in range(len(tokens))])
        np.testing.assert_allclose(ours, theirs, atol=2e-5)
        if known[b]:  # probability() of a label unseen in training is undefined
            assert prob[b] == pytest.approx(tagger.probability(seq_labels), rel=1e-4, abs=1e-7)
        assert [labels[i] for i in path[b, : len(tokens)]] == tagger.tag()
    assert sum(known) >= 10
