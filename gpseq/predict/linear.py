"""The default model's deterministic predictive in NumPy: no TensorFlow to import, trace or call.

For the weight-space linear-chain GP (`kernel="linear"`, one mixture component, no low-rank part:
what `gpseq train` builds by default) the deterministic calibrated predictive is closed form:
unary potentials with mean m = b + X μ and variance v = X² s (`[N, V]`, sparse products over
the features), replaced by m / √(1 + π α v / 8) / T (`training.calibration.calibrated_potentials`),
then one forward–backward; labels are the Viterbi path of the posterior-mean potentials (b + X μ,
the pairwise mean), both by the NumPy chain (`structured/numpy_chain.py`). `structured/predict.py`
computes the same in TensorFlow for every model; this is that function for the default one, with
no per-call compilation or dispatch cost (a compiled call's fixed CPU cost, which a service
answering small requests pays per batch) and no TensorFlow import for tagging.

Shapes: `data` a `SequenceData` (CSR rows `[N, D]`); padded outputs `[B, T, V]`, paths `[B, T]`.
"""

from __future__ import annotations

import numpy as np

from gpseq.features.rows import CsrRows, ranges
from gpseq.structured.numpy_chain import viterbi
from gpseq.structured.spans import ChainPosterior
from gpseq.training.calibration import calibrated_potentials

# the arrays of a model this predictive serves, exactly (`StructuredGP.get_state` names)
STATE_KEYS = frozenset({
    "var:label_bias", "var:pairwise_mean", "var:temperature", "var:variance_scale", "var:linear/q_mu",
    "var:linear/prior_variance/_pretransformed_input", "var:linear/q_variance/_pretransformed_input",
    "var:pairwise_variance/_pretransformed_input",
})


def _softplus(x, dtype=np.float64):
    """log(1 + eˣ) in `dtype`: a model's weight variances in the predictive's dtype directly (a
    model load computes it over every (feature, label) pair)."""
    x = np.asarray(x, dtype=dtype)
    return np.logaddexp(dtype(0), x)


class LinearPredictive:
    """q(b, W, P) of a weight-space linear-chain model and its calibration, as NumPy arrays."""

    def __init__(self, bias, weights, weight_variance, pairwise, pairwise_variance, alpha: float,
                 temperature: float, dtype=np.float32, raw_weight_variance=None):
        """`weight_variance` `[D, V]`, or None with `raw_weight_variance`, its softplus parameter (as a
        model stores it): then a product over a few rows takes the softplus of those rows only, and the
        whole matrix is computed on first need (a third of a one-sentence model load otherwise)."""
        self.bias, self.weights, self._weight_variance = bias, weights, weight_variance
        self._raw_weight_variance = raw_weight_variance
        self.pairwise, self.pairwise_variance = pairwise, pairwise_variance
        self.alpha, self.temperature, self.dtype = float(alpha), float(temperature), dtype
        _, self.calibrated_pairwise = calibrated_potentials(np.zeros((0, len(bias))), np.zeros((0, len(bias))),
                                                            pairwise, pairwise_variance, self.alpha, self.temperature)

    @property
    def weight_variance(self) -> np.ndarray:
        if self._weight_variance is None:
            self._weight_variance = _softplus(self._raw_weight_variance, np.dtype(self.dtype).type)
        return self._weight_variance

    def _weight_variance_rows(self, columns: np.ndarray) -> np.ndarray:
        """`weight_variance[columns]`, without computing the rest while it is not computed."""
        if self._weight_variance is not None:
            return self._weight_variance[columns]
        return _softplus(self._raw_weight_variance[columns], np.dtype(self.dtype).type)

    @classmethod
    def from_state(cls, model_config, arrays: dict, dtype=np.float32) -> "LinearPredictive | None":
        """The predictive of a model's arrays, or None when the model is not the plain
        weight-space linear chain (another kernel, a mixture, deep unaries, a low-rank q(w))."""
        if (model_config.kernel != "linear" or model_config.unary != "shallow" or model_config.num_components != 1
                or set(arrays) != STATE_KEYS):
            return None
        get = lambda name: np.asarray(arrays[name], dtype=np.float64)  # noqa: E731
        return cls(get("var:label_bias"), np.asarray(arrays["var:linear/q_mu"], dtype=dtype), None,
                   get("var:pairwise_mean"), _softplus(arrays["var:pairwise_variance/_pretransformed_input"]),
                   float(arrays["var:variance_scale"]), float(arrays["var:temperature"]), dtype,
                   raw_weight_variance=np.asarray(arrays["var:linear/q_variance/_pretransformed_input"]))

    def _padded(self, data, ids):
        """Posterior-mean and calibrated unaries `[B, T, V]` (float64, 0 past a length), lengths `[B]`
        and where each token of the sentences `ids` sits in the padded batch, (sentence, position) `[n]`."""
        lengths = data.lengths[ids]
        tokens = ranges(data.offsets[ids], data.offsets[ids + 1])
        rows = data.rows[tokens].astype(self.dtype)
        mean = rows @ self.weights + self.bias  # [n, V]
        squared = rows.power(2)
        if isinstance(squared, CsrRows):  # tagging: a small product reads (and transforms) its rows' variances only
            variance = squared.product(self._weight_variance_rows, lambda: self.weight_variance)
        else:
            variance = squared @ self.weight_variance
        calibrated, _ = calibrated_potentials(mean, variance, self.pairwise, self.pairwise_variance, self.alpha,
                                              self.temperature)
        B, T, V = len(ids), int(lengths.max()) if len(ids) else 0, len(self.bias)
        sentence = np.repeat(np.arange(B), lengths)
        position = np.arange(len(tokens)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        out = np.zeros((2, B, T, V))
        out[0, sentence, position] = mean
        out[1, sentence, position] = calibrated
        return out[0], out[1], lengths, (sentence, position)

    def batch(self, data, ids, chains: bool = False):
        """(marginals `[B, T, V]`, Viterbi paths `[B, T]`, log p(path | X) `[B]`) of the sentences
        `ids` of `data`, and the predictive's `ChainPosterior` (R = 1) with `chains`, else None —
        what `structured.predict.predict_deterministic` / `predict_with_chains` compute."""
        mean, calibrated, lengths, _ = self._padded(data, np.asarray(ids))
        posterior = ChainPosterior(calibrated[None], self.calibrated_pairwise[None], lengths, np.ones(1))
        path = viterbi(mean, self.pairwise, lengths)
        logp = posterior.path_log_probs(path)
        marg = posterior.token_marginals().astype(self.dtype)
        return marg, path, logp, posterior if chains else None

    def log_probs(self, data, ids) -> np.ndarray:
        """log p(labels | X) `[B]` of the labelled sentences `ids` (label ids ≥ 0) under the predictive."""
        ids = np.asarray(ids)
        _, calibrated, lengths, where = self._padded(data, ids)
        labels = np.zeros(calibrated.shape[:2], np.int64)
        labels[where] = data.label_ids[ranges(data.offsets[ids], data.offsets[ids + 1])]
        posterior = ChainPosterior(calibrated[None], self.calibrated_pairwise[None], lengths, np.ones(1))
        return posterior.path_log_probs(labels)

