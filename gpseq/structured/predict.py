"""Prediction with a trained `StructuredGP`: per-token marginals, decoding, sequence probabilities.

Two predictives, both calibrated by the model's variance scale α and temperature T (fitted on
held-out data, `gpseq.training.calibration`):
- deterministic: each Gaussian potential N(m, α v) replaced by m / √(1 + π α v / 8) / T (MacKay's
  probit approximation of E[softmax]), then one forward–backward (DESIGN "Deterministic
  predictive marginals");
- Monte Carlo: p(y_t | X) = E_q[forward–backward marginals] over S joint draws of the potentials,
  each draw's spread around the mean scaled by √α, divided by T.
Decoding is Viterbi on the posterior-mean potentials; sequence probabilities are those of the exact
linear chain (a pseudo-likelihood is a training objective, not a distribution over paths).

Shapes: batch as in `gpseq.structured.unaries`; marginals `[B, T, V]`, paths `[B, T]`,
log-probabilities `[B]`. All functions are `tf.function`-compilable.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from gpseq.structured import chain


def probit_scaled(mean, variance, alpha, temperature):
    """E[softmax]-matching potentials of N(mean, α · variance): mean / √(1 + π α variance / 8) / T."""
    return mean / tf.sqrt(1.0 + np.pi / 8.0 * alpha * variance) / temperature


def mean_potentials(model, batch):
    """Posterior-mean unaries `[B, T, V]` and pairwise `[V, V]` (the fast prediction mode)."""
    return model.unaries.mean(batch), tf.convert_to_tensor(model.pairwise.mean)


def predictive_potentials(model, batch, moments=None):
    """The deterministic calibrated predictive's potentials: unary `[B, T, V]`, pairwise `[V, V]`;
    `moments` = `model.unaries.moments(batch)` if already known."""
    mean, variance = model.unaries.moments(batch) if moments is None else moments
    unary = probit_scaled(mean, variance, model.variance_scale, model.temperature)
    pair_variance = tf.convert_to_tensor(model.pairwise.variance)
    pairwise = probit_scaled(model.pairwise.mean, pair_variance, model.variance_scale, model.temperature)
    return unary, pairwise


def calibrated_samples(model, batch, num_samples: int, seed):
    """Draws of the calibrated predictive's potentials: unary `[K, S, B, T, V]`, pairwise `[S, 1, V, V]`
    (each draw's spread around the mean scaled by √α, then divided by T)."""
    unary, pairwise = model.sample_potentials(batch, num_samples, seed)
    root = tf.sqrt(model.variance_scale)
    mean, pair_mean = mean_potentials(model, batch)
    unary = (mean + root * (unary - mean)) / model.temperature
    pairwise = (pair_mean + root * (pairwise - pair_mean)) / model.temperature
    return unary, pairwise


def monte_carlo_marginals(model, batch, num_samples: int, seed):
    """Per-token marginals averaged over calibrated draws `[B, T, V]`, with the draws (unary
    `[K, S, B, T, V]`, pairwise `[S, 1, V, V]`) and their log Z `[K, S, B]`."""
    unary, pairwise = calibrated_samples(model, batch, num_samples, seed)
    marg, log_z = chain.unary_marginals(unary, pairwise, batch["lengths"], return_log_partition=True)
    mean = tf.einsum("k,ksbtv->btv", model.mixture_weights(), marg) / tf.cast(num_samples, marg.dtype)
    return mean, unary, pairwise, log_z


def mc_log_prob(labels, unary, pairwise, lengths, weights, log_z=None, bias_corrected: bool = True):
    """log E_q[p(y | f)] per sequence `[B]` from draws `[K, S, B, T, V]`: log-mean-exp over S, mixture
    over K with weights π `[K]`; `log_z [K, S, B]` reuses partition functions already computed.

    The log of a Monte Carlo average is biased low by ≈ Var(p̂) / (2 p̂²) (Jensen); `bias_corrected`
    adds that term estimated from the draws, Σ_r w_r² (p_r / p̂ − 1)² · R / (R − 1) / 2 over the
    R = K·S draws of weight w_r = π_k / S (for K = 1 the unbiased sample variance of p_r / p̂ over
    2S), as `gpseq.structured.spans.ChainPosterior.path_log_probs` does; the result stays ≤ 0."""
    if log_z is None:
        ll = chain.log_likelihood(labels, unary, pairwise, lengths)  # [K, S, B]
    else:
        ll = chain.sequence_score(labels, unary, pairwise, lengths) - log_z
    # log p(y | f) ≤ 0; in float32 score − log Z of a long, near-certain path can round to +1e-5
    ll = tf.minimum(ll, 0.0)
    S = tf.cast(tf.shape(ll)[1], ll.dtype)
    per_component = tf.reduce_logsumexp(ll, axis=1) - tf.math.log(S)  # [K, B]
    log_p = tf.reduce_logsumexp(per_component + tf.math.log(weights)[:, None], axis=0)  # [B]
    if not bias_corrected:
        return log_p
    R = S * tf.cast(tf.shape(ll)[0], ll.dtype)
    draw_weights = weights[:, None, None] / S  # [K, 1, 1]
    spread = tf.reduce_sum(draw_weights**2 * (tf.exp(ll - log_p) - 1.0) ** 2, axis=[0, 1])  # [B]
    correction = tf.where(R > 1, 0.5 * spread * R / tf.maximum(R - 1, 1.0), tf.zeros_like(spread))
    return tf.minimum(log_p + correction, 0.0)


def predict_deterministic(model, batch):
    """(marginals, Viterbi path, log-probability of the path) under the deterministic predictive."""
    moments = model.unaries.moments(batch)  # posterior mean and variance [B, T, V]
    unary, pairwise = predictive_potentials(model, batch, moments)
    marg, log_z = chain.unary_marginals(unary, pairwise, batch["lengths"], return_log_partition=True)
    path, _ = chain.viterbi(moments[0], model.pairwise.mean, batch["lengths"])
    logp = chain.sequence_score(path, unary, pairwise, batch["lengths"]) - log_z
    return marg, path, tf.minimum(logp, 0.0)


def predict_monte_carlo(model, batch, num_samples: int, seed):
    """(marginals, Viterbi path, log-probability of the path) under the Monte Carlo predictive."""
    marg, unary, pairwise, log_z = monte_carlo_marginals(model, batch, num_samples, seed)
    path, _ = chain.viterbi(*mean_potentials(model, batch), batch["lengths"])
    return marg, path, mc_log_prob(path, unary, pairwise, batch["lengths"], model.mixture_weights(), log_z)


def gold_log_prob(model, batch, num_samples: int, seed, deterministic):
    """log p(y | X) of the batch's labels `[B]`: under the deterministic predictive when the boolean
    tensor `deterministic` holds, else log E_q[p(y | f)] over `num_samples` calibrated draws."""

    def deterministic_mode():
        unary, pairwise = predictive_potentials(model, batch)
        ll = chain.log_likelihood(batch["labels"], unary, pairwise, batch["lengths"])
        return tf.minimum(ll, 0.0)  # float32 rounding can put a near-certain path above 0

    def monte_carlo_mode():
        unary, pairwise = calibrated_samples(model, batch, num_samples, seed)
        return mc_log_prob(batch["labels"], unary, pairwise, batch["lengths"], model.mixture_weights())

    return tf.cond(deterministic, deterministic_mode, monte_carlo_mode)


def predict_with_chains(model, batch, num_samples, seed, deterministic: bool):
    """`predict_deterministic` (or `predict_monte_carlo`) and the predictive's chains, for exact span,
    path and n-best probabilities (`gpseq.structured.spans.ChainPosterior`): (marginals `[B, T, V]`,
    path `[B, T]`, log p(path) `[B]`, unary `[R, B, T, V]`, pairwise `[R, V, V]`, weights `[R]`);
    R = 1 (the probit-scaled potentials) when `deterministic`, else R = K·S calibrated draws,
    weight π_k / S."""
    if deterministic:
        moments = model.unaries.moments(batch)
        unary, pairwise = predictive_potentials(model, batch, moments)
        marg, log_z = chain.unary_marginals(unary, pairwise, batch["lengths"], return_log_partition=True)
        path, _ = chain.viterbi(moments[0], model.pairwise.mean, batch["lengths"])
        logp = tf.minimum(chain.sequence_score(path, unary, pairwise, batch["lengths"]) - log_z, 0.0)
        return marg, path, logp, unary[None], pairwise[None], tf.ones([1], unary.dtype)
    marg, unary, pairwise, log_z = monte_carlo_marginals(model, batch, num_samples, seed)
    path, _ = chain.viterbi(*mean_potentials(model, batch), batch["lengths"])
    weights = model.mixture_weights()
    logp = mc_log_prob(path, unary, pairwise, batch["lengths"], weights, log_z)
    K, S = tf.shape(unary)[0], tf.shape(unary)[1]
    flat_unary = tf.reshape(unary, tf.concat([[K * S], tf.shape(unary)[2:]], 0))  # [K·S, B, T, V]
    flat_pairwise = tf.reshape(tf.tile(pairwise[None, :, 0], [K, 1, 1, 1]), [K * S, tf.shape(pairwise)[-2],
                                                                            tf.shape(pairwise)[-1]])
    flat_weights = tf.reshape(tf.repeat(weights[:, None], S, axis=1), [-1]) / tf.cast(S, weights.dtype)
    return marg, path, logp, flat_unary, flat_pairwise, flat_weights
