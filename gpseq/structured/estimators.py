"""Score-function estimator of the expected log-likelihood with control variates (seed §5.2).

It only ever *evaluates* log p(y | f): no gradient flows through the likelihood, so a likelihood
given as a plain Python/NumPy function (wrapped in `tf.numpy_function`) trains the model
unchanged. The gradient of E_q[log p(y|f)] with respect to the variational parameters λ is

    ∇λ E_q[L] = E_q[L(f) ∇λ log q_λ(z)]                                   (seed eqs. 9–10)

where z are the Gaussian draws f is built from (the batch's weights w, the inducing values u
(whitened: v) per mixture component, f_bin), and f is a deterministic function of z and of noise
that does not depend on λ. The control variate h = ∇λ log q (zero mean) with the per-element
coefficient â = Cov[L h, h] / Var[h] (estimated leave-one-out from the other S − 1 samples, so
the estimate stays unbiased) reduces the variance.
Kernel hyperparameters are not learned by this estimator (their gradient would need ∂L/∂f);
they keep their initial values when `estimator = "score"`.
"""

from __future__ import annotations

import tensorflow as tf


def _control_coefficient(values, scores, reduce_leading: bool = False):
    """Leave-one-out â per sample and element: Cov[L h, h] / Var[h] from the *other* S − 1 draws.

    values `[S]`, scores `[S, ...]` → `[S, ...]`. Leaving sample s out of its own coefficient
    keeps the estimator unbiased (â is then independent of the draw it multiplies).
    """
    S = tf.cast(tf.shape(values)[0], values.dtype)
    values = tf.reshape(values, [-1] + [1] * (len(scores.shape) - 1))
    g = values * scores
    n = S - 1.0
    sum_g, sum_h = tf.reduce_sum(g, 0), tf.reduce_sum(scores, 0)
    sum_gh, sum_hh = tf.reduce_sum(g * scores, 0), tf.reduce_sum(scores * scores, 0)
    safe_n = tf.maximum(n, 1.0)
    mean_g, mean_h = (sum_g - g) / safe_n, (sum_h - scores) / safe_n  # [S, ...] without sample s
    cov = (sum_gh - g * scores) - n * mean_g * mean_h
    var = (sum_hh - scores * scores) - n * mean_h * mean_h
    if reduce_leading:
        # one coefficient per block (e.g. per label of a multivariate q(v_j)): pool its elements
        cov, var = tf.reduce_sum(cov, 1), tf.reduce_sum(var, 1)
    # with a single sample there is no "other" sample: no control variate (â = 0), not 0/0
    return tf.where(n > 0.0, tf.math.divide_no_nan(cov, var), tf.zeros_like(cov))


def score_function_surrogate(values, log_densities, scores, use_control_variates: bool = True):
    """A scalar whose value is mean(values) and whose gradient is the score-function estimate.

    values `[S]` (log-likelihoods, treated as constants), log_densities `[S, ...]` per-element
    log q of the draws (differentiable in λ), scores `[S, ...]` ∂ log q / ∂(mean) per element
    (constants, used only for the control-variate coefficient; with one extra axis after S,
    `[S, M, ...]`, a block of M elements shares one coefficient).
    """
    values = tf.stop_gradient(values)
    S = tf.cast(tf.shape(values)[0], values.dtype)
    if use_control_variates:
        pooled = len(scores.shape) > len(log_densities.shape)
        baseline = tf.stop_gradient(_control_coefficient(values, tf.stop_gradient(scores), pooled))
    else:
        baseline = tf.zeros_like(log_densities)
    weight = tf.reshape(values, [-1] + [1] * (len(log_densities.shape) - 1)) - baseline
    surrogate = tf.reduce_sum(weight * log_densities) / S
    return surrogate - tf.stop_gradient(surrogate)


def score_function_ell(model, batch, num_samples: int, seed, use_control_variates: bool = True):
    """Σ_n Σ_k π_k E_{q_k}[log p(y_n|f_n)] with score-function gradients (value: the MC estimate)."""
    from gpseq._tfp import tfp

    seeds = tfp.random.split_seed(seed, 2)
    unaries = model.unaries
    unary, draws = unaries.sample(batch, num_samples, seeds[0], return_draws=True)  # [K, S, B, T, V]
    pair_draw = tf.stop_gradient(model.pairwise.sample(num_samples, seeds[1]))  # [S, V, V]
    unary = tf.stop_gradient(unary)
    ll = tf.stop_gradient(model.likelihood.log_prob(batch["labels"], unary, pair_draw[:, None],
                                                    batch["lengths"]))  # [K, S, B]
    per_sample = tf.reduce_sum(ll, -1)  # [K, S]
    weights = unaries.mixture_weights()  # [K]
    value = tf.reduce_sum(weights * tf.reduce_mean(per_sample, 1))
    # every sample of every component sees the same w and f_bin draws: use the π-weighted values
    mixed = tf.einsum("k,ks->s", weights, per_sample)
    shared = [model.pairwise.log_density(pair_draw)]
    if "w" in draws:
        shared.append(unaries.weight_log_density(batch, draws["w"]))
    surrogate = tf.zeros([], value.dtype)
    for log_density, score in shared:
        surrogate += score_function_surrogate(mixed, log_density, score, use_control_variates)
    if "u" in draws:
        # per component k: inducing draws u_k only enter component k's likelihood
        for k, (log_density, score) in enumerate(unaries.sparse.log_densities(draws["u"])):
            surrogate += weights[k] * score_function_surrogate(per_sample[k], log_density, score,
                                                               use_control_variates)
    return value + surrogate
