"""The default model's deterministic predictive in NumPy (`gpseq.predict.linear`) against the
TensorFlow model's (`structured/predict.py`, an independent implementation: padded gathers, TF
chain), on a model trained with the default command, and its Viterbi against brute force."""

import itertools
import subprocess
import sys

import numpy as np
import pytest

from gpseq.corpora import read_conll
from gpseq.predict.linear import LinearPredictive
from gpseq.structured.numpy_chain import viterbi
from gpseq.tagger import Tagger


@pytest.fixture(scope="module")
def default_model(sample_dir, tmp_path_factory):
    train = read_conll(sample_dir / "train.conll")
    directory = tmp_path_factory.mktemp("linear") / "model"
    Tagger.train(train).save(directory)
    return directory


def _both(directory, overlap=None):
    """The same saved model twice: predicting in NumPy, and through the TensorFlow model."""
    numpy_tagger, tf_tagger = Tagger.load(directory), Tagger.load(directory)
    for tagger in (numpy_tagger, tf_tagger):
        tagger.config.predict_overlap = overlap or tagger.config.predict_overlap
    assert numpy_tagger.predictor.linear is not None
    tf_tagger.predictor.linear = None
    return numpy_tagger, tf_tagger


def test_numpy_and_tensorflow_predictives_agree(default_model, sample_dir):
    numpy_tagger, tf_tagger = _both(default_model)
    test = read_conll(sample_dir / "test.conll")
    ours, theirs = numpy_tagger.tag(test, nbest=3), tf_tagger.tag(test, nbest=3)
    assert [s.labels for s in ours] == [s.labels for s in theirs]
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.probabilities, b.probabilities, atol=2e-5)
        assert a.sequence_log_prob == pytest.approx(b.sequence_log_prob, abs=2e-4)
        assert [s[:3] for s in a.spans] == [s[:3] for s in b.spans]
        np.testing.assert_allclose([s[3] for s in a.spans], [s[3] for s in b.spans], atol=2e-5)
        assert [labels for labels, _ in a.nbest] == [labels for labels, _ in b.nbest]
    gold_ours, gold_theirs = numpy_tagger.gold_log_probs(test, mean=True), tf_tagger.gold_log_probs(test, mean=True)
    np.testing.assert_allclose(gold_ours, gold_theirs, atol=2e-4)
    assert numpy_tagger.evaluate(test).to_dict()["token_nll"] == pytest.approx(
        tf_tagger.evaluate(test).to_dict()["token_nll"], abs=1e-5)


def test_long_sentences_are_stitched_from_windows_alike(default_model, sample_dir):
    """A sentence longer than max_tokens: windows, stitched marginals, the path's windowed score."""
    numpy_tagger, tf_tagger = _both(default_model, overlap=2)
    test = read_conll(sample_dir / "test.conll")
    long = max(test, key=len)
    ours, theirs = numpy_tagger.tag([long], max_tokens=8), tf_tagger.tag([long], max_tokens=8)
    assert len(long) > 8 and ours[0].labels == theirs[0].labels
    np.testing.assert_allclose(ours[0].probabilities, theirs[0].probabilities, atol=2e-5)
    assert ours[0].sequence_log_prob == pytest.approx(theirs[0].sequence_log_prob, abs=2e-4)


def test_monte_carlo_and_other_models_take_the_tensorflow_path(default_model, sample_dir):
    from gpseq.structured.config import ModelConfig

    tagger = Tagger.load(default_model)
    arrays = tagger._state
    assert LinearPredictive.from_state(ModelConfig(kernel="linear+rbf"), arrays) is None
    assert LinearPredictive.from_state(ModelConfig(num_components=2), arrays) is None
    assert LinearPredictive.from_state(ModelConfig(), {**arrays, "var:linear/q_factor": np.zeros(1)}) is None
    test = read_conll(sample_dir / "test.conll")[:5]
    sampled = tagger.tag(test, samples=4)  # Monte Carlo: the TensorFlow model, built now
    assert tagger._model is not None and all(len(s.labels) == len(x) for s, x in zip(sampled, test))


def test_viterbi_is_the_best_path_by_enumeration():
    rng = np.random.default_rng(0)
    B, T, V = 6, 5, 3
    unary, pairwise = rng.normal(size=(B, T, V)) * 2, rng.normal(size=(V, V))
    lengths = np.array([5, 1, 3, 4, 2, 5])
    paths = viterbi(unary, pairwise, lengths)
    for b, length in enumerate(lengths):
        best = max(itertools.product(range(V), repeat=int(length)),
                   key=lambda y: sum(unary[b, t, y[t]] for t in range(length))
                   + sum(pairwise[y[t], y[t + 1]] for t in range(length - 1)))
        assert list(paths[b, :length]) == list(best)
        assert not paths[b, length:].any()


def test_tagging_with_a_default_model_never_imports_tensorflow(default_model, sample_dir):
    code = ("import sys; from gpseq.tagger import Tagger; from gpseq.corpora import read_conll; "
            f"t = Tagger.load({str(default_model)!r}); test = read_conll({str(sample_dir / 'test.conll')!r}); "
            "t.tag(test, nbest=2); t.evaluate(test); print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
