"""Calibration of the predictive on held-out data: the posterior-variance scale α and temperature T.

The deterministic predictive (`gpseq.structured.predict.predictive_potentials`) replaces each Gaussian
potential N(m, α v) by m / √(1 + π α v / 8) / T. A diagonal posterior over correlated weights
gets the variance of a potential wrong by a factor that depends on how collinear the features
are (several features of one token carry the same evidence), and the ELBO or the Laplace
evidence does not see held-out tokens at all; α and T are fitted by the token NLL of the dev
split carved from the training data (the same information a CRF user's temperature uses), by
L-BFGS on (log α, log T).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from gpseq.structured import chain
from gpseq.training.batching import SequenceData, make_batch, token_batches


def fit_calibration(model, data: SequenceData, *, max_tokens: int = 16384, bounds=((-12.0, 3.0), (-2.0, 2.0)),
                    ) -> dict[str, float]:
    """Fit `model.variance_scale` (α) and `model.temperature` (T) by the token NLL of the labelled
    `data` (held-out sentences), in place; returns α, T and the dev NLL per token before and after."""
    from scipy.optimize import minimize

    dtype = model.dtype
    np_dtype = dtype.as_numpy_dtype
    moments = []
    for ids in token_batches(data.lengths, max_tokens):
        batch = {k: tf.convert_to_tensor(v) for k, v in make_batch(data, ids, dtype=np_dtype).items()}
        mean, variance = model.unaries.moments(batch)
        moments.append((mean, variance, batch["labels"], batch["lengths"]))
    pair_mean = tf.convert_to_tensor(model.pairwise.mean)
    pair_var = tf.convert_to_tensor(model.pairwise.variance)
    n_tokens = float(data.lengths.sum())

    @tf.function
    def nll_and_grad(params):
        with tf.GradientTape() as tape:
            tape.watch(params)
            alpha, temperature = tf.exp(params[0]), tf.exp(params[1])
            total = tf.zeros([], dtype)
            for mean, variance, labels, lengths in moments:
                unary = mean / tf.sqrt(1.0 + np.pi / 8.0 * alpha * variance) / temperature
                pairwise = pair_mean / tf.sqrt(1.0 + np.pi / 8.0 * alpha * pair_var) / temperature
                marg = chain.unary_marginals(unary, pairwise, lengths)
                valid = tf.sequence_mask(lengths, tf.shape(labels)[1]) & (labels >= 0)
                p_gold = tf.gather(marg, tf.maximum(labels, 0), batch_dims=2)
                total -= tf.reduce_sum(tf.where(valid, tf.math.log(tf.maximum(p_gold, 1e-12)), 0.0))
        return total, tape.gradient(total, params)

    def fun(x):
        value, grad = nll_and_grad(tf.constant(x, dtype))
        return float(value) / n_tokens, grad.numpy().astype(np.float64) / n_tokens

    start = np.log([max(float(model.variance_scale.numpy()), 1e-5), float(model.temperature.numpy())])
    before = fun(np.zeros(2))[0]
    result = minimize(fun, start, jac=True, method="L-BFGS-B", bounds=bounds, options={"maxiter": 50})
    alpha, temperature = np.exp(result.x)
    model.variance_scale.assign(tf.cast(alpha, dtype))
    model.temperature.assign(tf.cast(temperature, dtype))
    return {"variance_scale": float(alpha), "temperature": float(temperature),
            "dev_token_nll_uncalibrated": float(before), "dev_token_nll": float(result.fun)}
