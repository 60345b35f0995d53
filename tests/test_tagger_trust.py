"""Acting on probabilities with a trained tagger (issue 19): the predictive's chains, exact span
probabilities and n-best lists against enumeration of every label path, abstention."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpseq.corpora import read_conll, spans
from gpseq.structured.spans import ChainPosterior
from gpseq.tagger import Tagger, TaggerConfig
from gpseq.features import get_preset


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
    np.testing.assert_allclose(posterior.path_log_probs(path.numpy()), logp.numpy(), atol=2e-3, rtol=1e-4)
