"""One step of GPNet's functional mirror descent (`gpseq.gp.gpnet.GPNet`): the β schedule, the
step's measurement points, the target q̂_{t+1} and the loss the shared `Trainer` (or
`GPNetTrainer`) takes a step on. Each function takes the `GPNet` as `model`; the model's methods
(`measurement_points`, `gaussian_target`, `loss`) call them.

Step t (GPNet's Algorithm 1) samples a minibatch (X_b, y_b) of B points and M measurement points X_M
from c(x) = a training input plus a spread (`spread`: gaussian / uniform / none, scaled by
`spread_scale` × the prior kernel's lengthscales; the reference code uses N(0, ℓ²/2)), with

    β_t = β₀ / (1 + decay · (t − 1)^power)        (power ½: the reference's schedule, the default)

and the target of the functional mirror-descent step,

    q̂_{t+1}(f) ∝ p(y_b | f_b)^{Nβ_t/B} p(f)^{β_t} q_{γ_t}(f)^{1−β_t}.

(With β₀ = decay = power = 1, β_t = 1/t and exact steps make q the posterior of every batch seen,
each weighted equally and tempered to N; power ½, the default, fits better (benchmarks/RESULTS.md,
"GPNet vs SVGP").)

- **Gaussian likelihood** (GPNet's eq. 10): on X = [X_b; X_M], p(f_X)^β q_t(f_X)^{1−β} = N(m̃, K̃) with
  K̃⁻¹ = β K⁻¹ + (1 − β) Σ_t⁻¹ and K̃⁻¹ m̃ = (1 − β) Σ_t⁻¹ μ_t, computed without inverting the
  (low-rank) Σ_t: with S = β Σ_t + (1 − β) K,
      m̃ = (1 − β) K S⁻¹ μ_t,   K̃ = (K − (1 − β) K S⁻¹ K) / β = (Σ_t − β Σ_t S⁻¹ Σ_t) / (1 − β)
  (the first form for β ≥ ½, the second below: the divisor stays ≥ ½; at β = 1, K̃ = K exactly).
  Then GP regression of y_b with noise σ² B / (N β) gives q̂_{t+1}(f_M) in closed form, and γ takes
  one optimiser step on KL[q_γ(f_M) ‖ q̂_{t+1}(f_M)]. With β = 1 and the whole data as the batch,
  q̂_{t+1}(f_M) is the exact GP posterior at X_M.
- **Other likelihoods** (Bernoulli, Softmax): GPNet's surrogate over X = [X_b; X_M],
      L_t = E_{q_γ}[N β/B Σ_b log p(y_b | f_b) + β log p(f_X) + (1 − β) log q_{γ_t}(f_X) − log q_γ(f_X)]
          = β (N/B Σ_b E_{q_γ}[log p(y_b | f_b)] − KL[q_γ(f_X) ‖ p(f_X)]) − (1 − β) KL[q_γ(f_X) ‖ q_{γ_t}(f_X)],
  maximised; the expectations are over the network's marginals at X_b by the likelihood's own
  estimator (Gauss–Hermite for Bernoulli, Monte Carlo for Softmax, seeded by the step's seed).
  (With one step per t, the proximity term has zero gradient at γ = γ_t; it matters for the value.)

Prior hyperparameters (kernel, Gaussian noise) are learned as in the reference code, by ascending
the minibatch bound log p(y_b) ≥ Σ_b E_{q_{γ_t}}[log p(y_b | f_b)] − KL[q_{γ_t}(f_b) ‖ p(f_b)]
(q_{γ_t} held fixed). Both objectives are one scalar: the network's loss is computed with the
hyperparameters held fixed and the hyperparameters' loss with the network held fixed, so
`loss(batch, seed)` fits the shared `Trainer` (one Adam step on each per call) unchanged. The step
t is the second element of the Trainer's stateless seed `(seed, step)`, so a resumed run continues
the β schedule where it stopped.
"""

from __future__ import annotations

import tensorflow as tf
from gpseq._tfp import tfp

from gpseq.gp.likelihoods import Gaussian, Softmax
from gpseq.gp.linalg import safe_cholesky

tfd = tfp.distributions


def beta_schedule(step, beta0: float = 1.0, decay: float = 1.0, power: float = 0.5):
    """β_t = β₀ / (1 + decay · step^power) for the 0-based step (Algorithm 1's t − 1) → scalar."""
    step = tf.cast(step, tf.float64)
    return beta0 / (1.0 + decay * step**power)


def _spread_lengthscales(model):
    ls = getattr(model.kernel, "lengthscales", None)
    return tf.ones([], model.dtype) if ls is None else tf.stop_gradient(tf.convert_to_tensor(ls))


def measurement_points(model, seed, X_batch=None):
    """M points from c(x): training inputs (or the batch's when the model has none) plus the
    spread → `[M, D]`; stateless in `seed` (int32 `[2]`)."""
    index_seed, noise_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    pool = model.inputs if model.inputs is not None else tf.convert_to_tensor(X_batch, model.dtype)
    index = tf.random.stateless_uniform([model.num_measurement], index_seed, 0, tf.shape(pool)[0], tf.int32)
    points = tf.gather(pool, index)
    if model.spread == "none":
        return points
    scale = model.spread_scale * _spread_lengthscales(model)
    if model.spread == "gaussian":
        noise = tf.random.stateless_normal(tf.shape(points), noise_seed, dtype=model.dtype)
    else:
        noise = tf.random.stateless_uniform(tf.shape(points), noise_seed, -1.0, 1.0, dtype=model.dtype)
    return points + scale * noise


def gaussian_target(model, X, Y, X_M, beta, q_mean=None, q_cov=None, prior_cov=None):
    """q̂_{t+1}(f_M) of a Gaussian likelihood (module docstring, GPNet's eq. 10) → mean `[M, P]`,
    covariance `[P, M, M]`, from the minibatch `X [B, D]`, `Y [B, P]` (treated as the fraction
    B / num_data of the data), measurement points `X_M [M, D]` and `beta`; q_{γ_t} is the network
    as it is (or `q_mean [B+M, P]`, `q_cov [P, B+M, B+M]` on [X; X_M]), the prior its kernel's
    (or `prior_cov [B+M, B+M]`); jitter is added only inside the Cholesky factorisations."""
    Z = tf.concat([tf.convert_to_tensor(X, model.dtype), tf.convert_to_tensor(X_M, model.dtype)], 0)
    B = tf.shape(X)[0]
    if q_mean is None:
        q_mean, q_cov = model.predict_f_full(Z)
    if prior_cov is None:
        prior_cov = model.kernel.K(Z)
    beta = tf.cast(beta, model.dtype)
    K = tf.broadcast_to(prior_cov, tf.shape(q_cov))  # [P, n, n]
    S_chol = safe_cholesky(beta * q_cov + (1.0 - beta) * K, jitter=model.jitter)
    mu = tf.transpose(q_mean)[..., None]  # [P, n, 1]
    m_tilde = (1.0 - beta) * tf.linalg.matmul(K, tf.linalg.cholesky_solve(S_chol, mu))  # [P, n, 1]

    def from_prior():  # (K − (1 − β) K S⁻¹ K) / β
        return (K - (1.0 - beta) * tf.linalg.matmul(K, tf.linalg.cholesky_solve(S_chol, K))) / beta

    def from_network():  # (Σ − β Σ S⁻¹ Σ) / (1 − β)
        return (q_cov - beta * tf.linalg.matmul(q_cov, tf.linalg.cholesky_solve(S_chol, q_cov))) / (1.0 - beta)

    K_tilde = tf.cond(beta >= 0.5, from_prior, from_network)
    K_tilde = 0.5 * (K_tilde + tf.linalg.matrix_transpose(K_tilde))
    noise = tf.convert_to_tensor(model.likelihood.variance) * tf.cast(B, model.dtype) / (model.num_data * beta)
    K_bb, K_Mb, K_MM = K_tilde[:, :B, :B], K_tilde[:, B:, :B], K_tilde[:, B:, B:]
    L_y = safe_cholesky(K_bb + noise * tf.eye(B, dtype=model.dtype), jitter=model.jitter)
    residual = tf.transpose(tf.convert_to_tensor(Y, model.dtype))[..., None] - m_tilde[:, :B]  # [P, B, 1]
    mean = m_tilde[:, B:] + tf.linalg.matmul(K_Mb, tf.linalg.cholesky_solve(L_y, residual))
    cov = K_MM - tf.linalg.matmul(K_Mb, tf.linalg.cholesky_solve(L_y, tf.linalg.matrix_transpose(K_Mb)))
    cov = 0.5 * (cov + tf.linalg.matrix_transpose(cov))
    return tf.transpose(mean[..., 0]), cov


def _mvn(model, mean, cov):
    """P Gaussians from mean `[N, P]`, covariance `[P, N, N]` (jitter escalated if needed)."""
    return tfd.MultivariateNormalTriL(tf.transpose(mean), safe_cholesky(cov, jitter=model.jitter))


def _variational_expectations(model, mean, var, Y, seed):
    if isinstance(model.likelihood, Softmax):
        return model.likelihood.variational_expectations(mean, var, Y, seed=seed)
    return model.likelihood.variational_expectations(mean, var, Y)


def objective(model, batch, seed=None):
    """(loss, X_M, target mean, target covariance) of `model` (a `GPNet`) for `batch = (X [B, D],
    Y [B, P])` at step `seed[1]`: the network's mirror-descent loss plus the hyperparameters' negative
    minibatch bound (module docstring) and, for a Gaussian likelihood, the step's measurement points
    and q̂_{t+1}(f_M) (gradient-free; None otherwise)."""
    X, Y = batch
    X = tf.convert_to_tensor(X, model.dtype)
    seed = tf.constant([0, 0], tf.int32) if seed is None else tf.cast(seed, tf.int32)
    beta = model.beta(seed[1])
    point_seed, mc_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    X_M = measurement_points(model, point_seed, X)
    Z = tf.concat([X, X_M], 0)  # [B + M, D]
    B = tf.shape(X)[0]
    scale = tf.cast(model.num_data, model.dtype) / tf.cast(B, model.dtype)
    mean, cov = model.predict_f_full(Z)
    prior_cov = model.kernel.K(Z)
    mean_t, cov_t, prior_t = tf.stop_gradient(mean), tf.stop_gradient(cov), tf.stop_gradient(prior_cov)
    target_mean = target_cov = None

    if isinstance(model.likelihood, Gaussian):
        target_mean, target_cov = tf.nest.map_structure(tf.stop_gradient, gaussian_target(
            model, X, tf.convert_to_tensor(Y, model.dtype), X_M, beta, q_mean=mean_t, q_cov=cov_t, prior_cov=prior_t))
        q_M = _mvn(model, mean[B:], cov[:, B:, B:])
        target = _mvn(model, target_mean, target_cov)
        network_loss = tf.reduce_sum(tfd.kl_divergence(q_M, target))
    else:
        q_chol = safe_cholesky(cov, jitter=model.jitter)
        q = tfd.MultivariateNormalTriL(tf.transpose(mean), q_chol)
        q_t = tfd.MultivariateNormalTriL(tf.transpose(mean_t), tf.stop_gradient(q_chol))
        prior_chol = tf.broadcast_to(safe_cholesky(prior_t, jitter=model.jitter), tf.shape(cov))
        prior = tfd.MultivariateNormalTriL(tf.zeros_like(tf.transpose(mean_t)), prior_chol)
        var_b = tf.transpose(tf.linalg.diag_part(cov[:, :B, :B]))
        expected = tf.reduce_sum(_variational_expectations(model, mean[:B], var_b, Y, mc_seed))
        surrogate = beta * (scale * expected - tf.reduce_sum(tfd.kl_divergence(q, prior))) \
            - (1.0 - beta) * tf.reduce_sum(tfd.kl_divergence(q, q_t))
        network_loss = -surrogate

    if not model.learn_hyperparameters:
        return network_loss, X_M, target_mean, target_cov
    var_t = tf.transpose(tf.linalg.diag_part(cov_t[:, :B, :B]))
    q_b = _mvn(model, mean_t[:B], cov_t[:, :B, :B])
    prior_b = tfd.MultivariateNormalTriL(tf.zeros_like(tf.transpose(mean_t[:B])),
                                         tf.broadcast_to(safe_cholesky(prior_cov[:B, :B], jitter=model.jitter),
                                                         tf.shape(cov_t[:, :B, :B])))
    bound = tf.reduce_sum(_variational_expectations(model, mean_t[:B], var_t, Y, mc_seed)) \
        - tf.reduce_sum(tfd.kl_divergence(q_b, prior_b))
    return network_loss - bound, X_M, target_mean, target_cov
