"""Problems of the default training's tests (MAP + Laplace + calibration): random sparse sequences,
and 48 sentences of the bundled sample with a `pos` featurizer fitted on them."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from helpers import SAMPLE

from gpseq.training.batching import SequenceData


def synthetic_sequences(rng, n_seq=12, V=3, D=9, max_len=5):
    """Sequences whose tokens have 2-3 distinct active features each (binary) and random labels."""
    lengths = rng.integers(1, max_len + 1, size=n_seq)
    rows, labels = [], []
    for length in lengths:
        for _ in range(length):
            row = np.zeros(D)
            row[rng.choice(np.arange(1, D), size=int(rng.integers(2, 4)), replace=False)] = 1.0
            rows.append(row)
            labels.append(int(rng.integers(V)))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return SequenceData(sp.csr_matrix(np.array(rows)), offsets, np.array(labels, np.int32))


def sample_problem():
    """48 sentences of the sample corpus, a `pos` featurizer fitted on them, their labels and a
    function from sentences to `SequenceData`."""
    from gpseq.corpora import read_conll
    from gpseq.features import Featurizer, get_preset

    sentences = read_conll(SAMPLE / "train.conll")[:48]
    featurizer = Featurizer(get_preset("pos")).fit(sentences)
    labels = sorted({label for s in sentences for label in s.labels})
    index = {label: i for i, label in enumerate(labels)}

    def data_of(part):
        matrix = featurizer.transform(part)
        ids = np.array([index[label] for s in part for label in s.labels], np.int64)
        return SequenceData(matrix.rows.tocsr(), np.asarray(matrix.offsets, np.int64), ids)

    return sentences, featurizer, labels, data_of


def scaled_unary_variance(fit, rows, alpha, beta):
    """α v + β k² σ₀² `[N, V]` by hand over dense rows: k counts column 0 (x₀ = k) and one per
    feature the fit never saw (no pair of it on the support), v sums the other features' x² s."""
    dense = rows.toarray()
    variance = fit.variance()
    seen = np.zeros(fit.num_features, bool)
    seen[np.unique(fit.support // fit.num_labels)] = True
    seen[0] = False
    out = np.zeros((dense.shape[0], fit.num_labels))
    for n, row in enumerate(dense):
        k = sum(x for d, x in enumerate(row) if x and not seen[d])
        v = sum(x ** 2 * variance[d] for d, x in enumerate(row) if x and seen[d])
        out[n] = alpha * v + (beta if beta is not None else alpha) * k ** 2 * fit.prior_variance[0]
    return out
