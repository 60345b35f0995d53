"""The paper's score-function estimator of the expected log-likelihood, with control variates
(design notes `graybox-structured-gp.md` §5.2; equation numbers are the paper's).

It only ever *evaluates* log p(y_n | f_n): no gradient flows through the likelihood, so a
likelihood given as a plain Python/NumPy function (`BlackBoxLikelihood`) trains the model
unchanged. Per sequence n and mixture component k the unaries are Gaussian,
q_k(f_n) = N(b_kn, Σ_kn) with one T_n × T_n block per label (the paper's Theorem 3, eqs. 15–18;
`Unaries.gaussian_blocks`), and f_bin ~ q(f_bin) = N(m, diag s). Their score functions

    ∂ log N(f; b, Σ) / ∂b = Σ⁻¹(f − b) = α,     ∂ log N(f; b, Σ) / ∂Σ = ½(α αᵀ − Σ⁻¹)

give ∇ E_{q_k}[log p(y_n | f_n)] = E[log p(y_n | f_n) ∇ log q_k(f_n)] (eqs. 9–10) in
(b_kn, Σ_kn) and (m, s); automatic differentiation of b and Σ chains them to every parameter
they are built from, and π gets the gradient of Σ_k π_k Ê_k. Each sequence's score is weighted
by its own log-likelihood only (f_bin, shared by the batch, by the batch's sum).

Control variates (§5.2): for each dimension d of (b, Σ, m, s), g_d = L h_d with h_d the score
(E[h_d] = 0), and g̃_d = g_d − â_d h_d with â_d = Cov[g_d, h_d] / Var[h_d] = E[L h_d²] / E[h_d²].
â_d is estimated from
draws other than the one it multiplies, so the estimate stays unbiased: leave-one-out for b, m
and s; cross-fitted between the two halves of the draws for Σ (`covariance_score_gradient`, which
never forms the T × T scores per draw). They act from S = 2 on (at S = 1 there is none).

`DEFAULT_SAMPLES["score"]` = 128 draws per sequence: fewer leave more gradient variance and train
to a lower F1 (benchmarks/RESULTS.md, "The score-function estimator's sample count").
"""

from __future__ import annotations

import tensorflow as tf
from gpseq._tfp import tfp

from gpseq.gp.linalg import safe_cholesky

DEFAULT_SAMPLES = {"pathwise": 1, "score": 128}  # Monte Carlo draws per sequence when none is given


def control_variate_coefficient(values, scores):
    """Leave-one-out â per element and sample: Σ_{s'≠s} L_s' h_s'² / Σ_{s'≠s} h_s'² (E[L h²] / E[h²]).

    values `[..., S]` (broadcastable to scores), scores `[..., S]` → `[..., S]`; 0 where no other
    sample exists (S = 1).
    """
    squared = scores * scores
    weighted = values * squared
    numerator = tf.reduce_sum(weighted, -1, keepdims=True) - weighted
    denominator = tf.reduce_sum(squared, -1, keepdims=True) - squared
    return tf.math.divide_no_nan(numerator, denominator)


def score_gradient(values, scores, use_control_variates: bool = True):
    """(1/S) Σ_s (L_s − â_s) h_s: the estimate of E[L h] per element, values `[..., S]`, scores `[..., S]`."""
    weights = values
    if use_control_variates:
        weights = values - control_variate_coefficient(values, scores)
    return tf.reduce_mean(weights * scores, -1)


def covariance_score_gradient(values, alpha, precision, use_control_variates: bool = True):
    """(1/S) Σ_s (L_s − â_s) h_s for the covariance scores h_s = ½(α_s α_sᵀ − Σ⁻¹) without forming
    them per sample: values `[K, B, S]`, alpha `[K, B, V, T, S]`, precision Σ⁻¹ `[K, B, V, T, T]` →
    `[K, B, V, T, T]`.

    â per element is cross-fitted between the two halves of the draws (each half's â, from its own
    Σ L h² / Σ h², multiplies the other half's scores: unbiased, like leave-one-out); every sum over
    draws is then a contraction (Σ_s w_s α_s α_sᵀ, Σ_s w_s α_s² α_s²ᵀ), so memory stays
    O(K·B·V·T²) instead of O(K·B·V·T²·S). At S = 2 this is leave-one-out; at S = 1 there is no â.
    """
    S = tf.shape(values)[-1]
    dtype = values.dtype
    first = tf.cast(tf.range(S) < S // 2, dtype)  # [S]

    def sums(weights):  # Σ_s w_s h_s and Σ_s w_s h_s² for weights [K, B, S]
        w = weights[:, :, None, None, :]
        outer = tf.linalg.matmul(alpha * w, alpha, transpose_b=True)  # Σ_s w_s α_s α_sᵀ
        outer_sq = tf.linalg.matmul(alpha**2 * w, alpha**2, transpose_b=True)
        total = tf.reduce_sum(weights, -1)[:, :, None, None, None]
        by_h = 0.5 * (outer - total * precision)
        by_h_sq = 0.25 * (outer_sq - 2.0 * precision * outer + precision**2 * total)
        return by_h, by_h_sq

    halves = []
    for half in (first, 1.0 - first):
        (lh, lh_sq), (h, h_sq) = sums(values * half), sums(tf.ones_like(values) * half)
        halves.append((lh, h, tf.math.divide_no_nan(lh_sq, h_sq)))
    (lh1, h1, a1), (lh2, h2, a2) = halves
    S = tf.cast(S, dtype)
    if not use_control_variates:
        return (lh1 + lh2) / S
    return ((lh2 - a1 * h2) + (lh1 - a2 * h1)) / S


def score_function_ell(model, batch, num_samples: int, seed, use_control_variates: bool = True):
    """Σ_n Σ_k π_k E_{q_k}[log p(y_n|f_n)] of the batch (value: the Monte Carlo estimate of the
    paper's eq. 19) whose gradient is the score-function estimate (module docstring)."""
    seeds = tfp.random.split_seed(seed, 2)
    mean, cov = model.unaries.gaussian_blocks(batch)  # [K, B, T, V], [K, B, V, T, T]
    jitter = model.unaries.sparse.jitter if model.unaries.sparse is not None else 1e-6
    chol = safe_cholesky(tf.stop_gradient(cov), jitter=jitter)  # draws from N(b, Σ + jitter I), scored as such
    shape = tf.concat([tf.shape(cov)[:-1], [num_samples]], 0)  # [K, B, V, T, S]
    eps = tf.random.stateless_normal(shape, seeds[0], dtype=cov.dtype)
    draws = tf.linalg.matmul(chol, eps)  # f − b per label, [K, B, V, T, S]
    unary = tf.stop_gradient(tf.transpose(draws, [0, 4, 1, 3, 2]) + mean[:, None])  # [K, S, B, T, V]
    pair_mean = tf.convert_to_tensor(model.pairwise.mean)
    pair_variance = tf.convert_to_tensor(model.pairwise.variance)
    pair_eps = tf.random.stateless_normal(tf.concat([[num_samples], tf.shape(pair_mean)], 0), seeds[1],
                                          dtype=cov.dtype)  # [S, V, V]
    pairwise = tf.stop_gradient(pair_mean + tf.sqrt(pair_variance) * pair_eps)
    ll = tf.stop_gradient(model.likelihood.log_prob(batch["labels"], unary, pairwise[:, None],
                                                    batch["lengths"]))  # [K, S, B]
    weights = model.unaries.mixture_weights()  # [K]
    value = tf.reduce_sum(weights * tf.reduce_mean(tf.reduce_sum(ll, -1), 1))

    # unaries, per sequence: scores in b and Σ at each draw, weighted by that sequence's L
    mask = tf.sequence_mask(batch["lengths"], tf.shape(mean)[2], dtype=cov.dtype)[None, :, None, :, None]
    alpha = tf.linalg.triangular_solve(chol, eps, adjoint=True) * mask  # Σ⁻¹(f − b) [K, B, V, T, S]
    identity = tf.eye(tf.shape(cov)[-1], batch_shape=tf.shape(cov)[:-2], dtype=cov.dtype)
    precision = tf.linalg.cholesky_solve(chol, identity) * mask * tf.linalg.matrix_transpose(mask)
    seq_ll = tf.transpose(ll, [0, 2, 1])  # [K, B, S]
    grad_mean = score_gradient(seq_ll[:, :, None, None, :], alpha, use_control_variates)  # [K, B, V, T]
    grad_cov = covariance_score_gradient(seq_ll, alpha, precision, use_control_variates)  # [K, B, V, T, T]
    pi = tf.stop_gradient(weights)
    surrogate = tf.einsum("k,kbvt,kbtv->", pi, tf.stop_gradient(grad_mean), mean)
    surrogate += tf.einsum("k,kbvts,kbvts->", pi, tf.stop_gradient(grad_cov), cov)

    # f_bin, shared by the batch and the components: scored by Σ_k π_k Σ_n L
    batch_ll = tf.einsum("k,ksb->s", pi, ll)  # [S]
    pair_eps = tf.transpose(pair_eps, [1, 2, 0])  # [V, V, S]
    mean_score = pair_eps / tf.sqrt(pair_variance)[..., None]
    variance_score = 0.5 * (pair_eps**2 - 1.0) / pair_variance[..., None]
    surrogate += tf.reduce_sum(tf.stop_gradient(score_gradient(batch_ll, mean_score, use_control_variates))
                               * pair_mean)
    surrogate += tf.reduce_sum(tf.stop_gradient(score_gradient(batch_ll, variance_score, use_control_variates))
                               * pair_variance)
    return value + surrogate - tf.stop_gradient(surrogate)
