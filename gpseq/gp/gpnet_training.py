"""How a `GPNet` is trained: the closed-form weight step, exact-GP pre-training, `GPNetTrainer` and
`fit_gpnet` (`GPNet.fit`). The model is in `gpseq.gp.gpnet`, its target q̂_{t+1} and its loss in
`gpseq.gp.gpnet_objective`.

**Closed-form step** (`project`; Gaussian likelihood, full V). GPNet's Algorithm 1 steps γ by
one gradient step on KL[q_γ(f_M) ‖ q̂_{t+1}(f_M)] (as the shared `Trainer` does with Adam). For the
weight posterior the step can be taken exactly: q̂_{t+1}(f_M) = N(μ̂, Σ̂) and q_γ(f_M) = N(Φm + ξ, C),
C = ΦVΦᵀ, so the KL is 0 for every N(m, V) with those moments at X_M, and of these `project` takes
the one nearest the current network — it keeps q_{γ_t}(w | f_M):

    m' = m + V Φᵀ C⁻¹ (μ̂ − Φm − ξ),   V' = V + V Φᵀ C⁻¹ (Σ̂ − C) C⁻¹ Φ V,

which is the natural-gradient step of size 1 on that KL (precision Λ' = Λ − ΦᵀC⁻¹Φ + ΦᵀΣ̂⁻¹Φ).
Where the features barely span a direction at X_M (C nearly singular) but the prior K puts
variance there, the exact match needs huge weights; `projection_ridge` ρ conditions on f_M + ε,
ε ~ N(0, δI), δ = ρ · mean diag C, instead (C → C + δI above; ρ = 0 is the exact step). The
feature map's hyperparameters, the residual network and the prior hyperparameters still take
one Adam step each on the model's loss.

**Pre-training** (`pretrain`, the first part of `fit_gpnet`; as the reference code does): the
kernel's and the noise's hyperparameters are fitted by the exact GP's marginal likelihood on 1,000
random training points (L-BFGS), and the feature map starts from the fitted kernel.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from gpseq._tfp import tfp

from gpseq.errors import ConfigError, NumericalError
from gpseq.gp.likelihoods import Gaussian
from gpseq.gp.linalg import safe_cholesky
from gpseq.gp.random_features import RandomFeatures

UPDATES = ("auto", "closed_form", "gradient")
PRETRAIN_NOISE_FLOOR = 1e-3  # × the targets' variance: a fitted noise below it has interpolated the subset


# ---- the closed-form step on the weight posterior -------------------------------------------------
def project(model, X_M, target_mean, target_cov):
    """The weight posterior N(m, V) that minimises KL[q_γ(f_M) ‖ q̂(f_M)] (it is 0 there:
    q_{t+1}(f_M) = q̂(f_M)) and, of all such, is closest to the current one — it keeps the
    network's conditional q_{γ_t}(w | f_M) (module docstring) → (m `[F, P]`, V^{1/2} `[P, F, F]`, ok),
    not assigned. Full weight covariance only; `target_*` as `GPNet.gaussian_target` returns them
    at `X_M [M, D]` (M ≤ F). A lower-triangular factor is re-factorised (an F × F Cholesky and an
    F × F product, O(F³)); a dense one (`weight_factor="dense"`) takes the same V' as a low-rank
    update of the factor, O(F²M) (`_low_rank_factor`)."""
    dtype = model.dtype
    phi = model.features(X_M)  # [M, F]
    L = model.q_sqrt()  # [P, F, F]
    r = tf.transpose(tf.convert_to_tensor(target_mean, dtype)
                     - tf.linalg.matmul(phi, model.q_mu) - model.residual_mean(X_M))[..., None]  # [P, M, 1]
    A = tf.einsum("mf,pfg->pmg", phi, L)  # Φ L  [P, M, F]
    F = tf.shape(A)[2]
    C = tf.linalg.matmul(A, A, transpose_b=True)  # Φ V Φᵀ  [P, M, M]
    ridge = model.projection_ridge * tf.reduce_mean(tf.linalg.diag_part(C), -1)[:, None, None]
    C_chol = safe_cholesky(C + ridge * tf.eye(tf.shape(C)[-1], dtype=dtype), jitter=model.jitter)
    A_bar = tf.linalg.cholesky_solve(C_chol, A)  # C⁻¹ Φ L  [P, M, F]
    # m' = m + V Φᵀ C⁻¹ r;  V' = L (I − Aᵀ C⁻¹ A + Āᵀ Σ̂ Ā) Lᵀ
    m_new = model.q_mu + tf.transpose(tf.linalg.matmul(L, tf.linalg.matmul(A_bar, r, transpose_a=True))[..., 0])
    difference = tf.convert_to_tensor(target_cov, dtype) - C  # Σ̂ − Φ V Φᵀ
    if model.weight_factor == "dense":
        return m_new, *_low_rank_factor(model, L, A, C_chol, difference)
    inner = tf.eye(F, dtype=dtype) + tf.linalg.matmul(A_bar, tf.linalg.matmul(difference, A_bar), transpose_a=True)
    inner = 0.5 * (inner + tf.linalg.matrix_transpose(inner))
    L_new = tf.linalg.matmul(L, safe_cholesky(inner, jitter=model.jitter))  # lower × lower = lower
    ok = tf.reduce_all(tf.math.is_finite(L_new)) & tf.reduce_all(tf.math.is_finite(m_new)) \
        & tf.reduce_all(tf.linalg.diag_part(L_new) > 0.0)
    return m_new, L_new, ok


def _low_rank_factor(model, L, A, C_chol, difference):
    """V'^{1/2} = L T with T Tᵀ = I + Āᵀ (Σ̂ − C) Ā, in O(F²M): from the thin QR Aᵀ = Q R
    (A = Φ L `[P, M, F]`), Āᵀ W Ā = Q W' Qᵀ with W' = R C⁻¹ W C⁻¹ Rᵀ `[P, M, M]`, so with
    K K ᵀ = I + W' (Cholesky), T = I + Q (K − I) Qᵀ (QᵀQ = I) and L T = L + (L Q)(K − I) Qᵀ — a dense
    (not triangular) square root. → (V'^{1/2} `[P, F, F]`, ok)."""
    Q, R = tf.linalg.qr(tf.linalg.matrix_transpose(A))  # [P, F, k], [P, k, M], k = min(F, M)
    G = tf.linalg.matrix_transpose(tf.linalg.cholesky_solve(C_chol, tf.linalg.matrix_transpose(R)))  # R C⁻¹
    W = tf.linalg.matmul(G, tf.linalg.matmul(difference, G, transpose_b=True))
    W = 0.5 * (W + tf.linalg.matrix_transpose(W))
    k = tf.shape(W)[-1]
    K = safe_cholesky(tf.eye(k, dtype=model.dtype) + W, jitter=model.jitter) - tf.eye(k, dtype=model.dtype)
    L_new = L + tf.linalg.matmul(tf.linalg.matmul(tf.linalg.matmul(L, Q), K), Q, transpose_b=True)
    return L_new, tf.reduce_all(tf.math.is_finite(L_new))


# ---- exact-GP pre-training of the prior hyperparameters -------------------------------------------
def log_marginal_likelihood(model, X, Y):
    """log N(Y | 0, K + σ² I) summed over the P columns of `Y [N, P]`: the exact GP's evidence under
    `model`'s kernel and Gaussian likelihood → scalar."""
    X = tf.convert_to_tensor(X, model.dtype)
    Y = tf.reshape(tf.convert_to_tensor(Y, model.dtype), [tf.shape(X)[0], -1])
    n = tf.shape(X)[0]
    K = model.kernel.K(X) + tf.convert_to_tensor(model.likelihood.variance) * tf.eye(n, dtype=model.dtype)
    return tf.reduce_sum(tfp.distributions.MultivariateNormalTriL(
        scale_tril=safe_cholesky(K, jitter=model.jitter)).log_prob(tf.transpose(Y)))


def pretrain(model, X, Y, num_points: int = 1000, max_iterations: int = 200, seed: int = 0):
    """Fits `model`'s prior hyperparameters (kernel, noise variance) by the exact GP's marginal
    likelihood on `num_points` training points drawn at random (L-BFGS), then sets the feature
    map's hyperparameters to the kernel's — the reference code's pre-training. Gaussian likelihood
    only (otherwise, or with `num_points` 0 or `learn_hyperparameters` off, nothing changes). A fit
    whose noise variance falls below `PRETRAIN_NOISE_FLOOR` × the targets' variance has
    interpolated the subset (e.g. repeated rows) and is discarded (the starting values kept).
    Returns the subset's log marginal likelihood per point after fitting (or None)."""
    if not isinstance(model.likelihood, Gaussian) or num_points <= 0 or not model.learn_hyperparameters:
        return None
    import scipy.optimize

    X = np.asarray(X, np.float64)
    Y = np.asarray(Y, np.float64).reshape(len(X), -1)
    if len(X) > num_points:
        index = np.random.default_rng(seed).choice(len(X), num_points, replace=False)
        X, Y = X[index], Y[index]
    target_variance = float(np.var(Y))
    X, Y = tf.constant(X, model.dtype), tf.constant(Y, model.dtype)
    variables = [v for part in (model.kernel, model.likelihood) for v in part.trainable_variables]
    shapes = [tuple(v.shape) for v in variables]
    sizes = [int(np.prod(s)) for s in shapes]

    def assign(x):
        for v, part, shape in zip(variables, np.split(x, np.cumsum(sizes)[:-1]), shapes):
            v.assign(part.reshape(shape))

    @tf.function
    def value_and_gradient():
        with tf.GradientTape() as tape:
            value = -log_marginal_likelihood(model, X, Y) / tf.cast(tf.shape(X)[0], model.dtype)
        return value, tape.gradient(value, variables)

    def fun(x):
        assign(x)
        value, grads = value_and_gradient()
        value = float(value)
        if not np.isfinite(value):
            return np.inf, np.zeros_like(x)
        return value, np.concatenate([g.numpy().ravel() for g in grads])

    x0 = np.concatenate([v.numpy().ravel() for v in variables])
    result = scipy.optimize.minimize(fun, x0, jac=True, method="L-BFGS-B", options={"maxiter": max_iterations})
    assign(result.x if np.isfinite(result.fun) else x0)
    noise = float(tf.reduce_min(tf.convert_to_tensor(model.likelihood.variance)))
    if noise < PRETRAIN_NOISE_FLOOR * target_variance:
        # the subset was interpolated (e.g. repeated rows): such hyperparameters would make the
        # model overconfident off the training inputs — keep the starting ones
        assign(x0)
        return None
    copy_kernel_to_features(model)
    return -float(value_and_gradient()[0])


def copy_kernel_to_features(model) -> None:
    """Sets `model`'s feature-map variance (and RBF lengthscales) to its prior kernel's."""
    feats = model.features
    if not isinstance(feats, RandomFeatures) or not hasattr(model.kernel, "variance"):
        return
    feats.variance.assign(tf.convert_to_tensor(model.kernel.variance))
    if feats.kind == "rbf" and getattr(model.kernel, "lengthscales", None) is not None:
        ls = tf.convert_to_tensor(model.kernel.lengthscales)
        if ls.shape.rank <= len(feats.lengthscales.shape):  # an ARD kernel's vector needs ARD features
            feats.lengthscales.assign(tf.broadcast_to(ls, feats.lengthscales.shape))


# ---- the trainer --------------------------------------------------------------------------------
class GPNetTrainer:
    """Trains a `GPNet` one minibatch at a time (`step`, `fit`), the step t of the β schedule and the
    measurement points seeded by (`seed`, t) as in the shared `Trainer`:

    - the weight posterior N(m, V) takes the **closed-form** mirror-descent step (`project`:
      q_{t+1}(f_M) = q̂_{t+1}(f_M), the network's conditional given f_M kept) when the likelihood
      is Gaussian and V is full (`update="auto"` or `"closed_form"`); otherwise (`"gradient"`, or a
      non-conjugate likelihood, or a diagonal V) one Adam step on GPNet's objective, as the
      shared `Trainer` takes it;
    - every other variable (feature-map hyperparameters, residual network, kernel, noise) takes one
      Adam step (`learning_rate`) on the same loss — the feature map's only with `learn_features`
      (off after pre-training has set it from the fitted kernel, `pretrained`: its Adam step needs
      the loss's gradient through the network's covariance at the B + M points, most of a step's cost).

    A non-finite loss or update raises `NumericalError` with no variable changed.
    """

    @classmethod
    def pretrained(cls, model, X, Y, *, pretrain_points: int = 1000, seed: int = 0, **settings) -> "GPNetTrainer":
        """Exact-GP pre-training on `pretrain_points` points of (X `[N, D]`, Y) (`pretrain`), then the
        trainer that continues from it: the feature map is held where pre-training put it, and learned
        when there was none (non-Gaussian likelihood, or a discarded fit). `settings` as `__init__`."""
        fitted = pretrain(model, X, Y, num_points=pretrain_points, seed=seed)
        return cls(model, learn_features=fitted is None, seed=seed, **settings)

    def __init__(self, model, *, learning_rate: float = 0.01, update: str = "auto", learn_features: bool = True,
                 seed: int = 0):
        if update not in UPDATES:
            raise ConfigError(f"update must be one of {', '.join(UPDATES)}, got {update!r}")
        conjugate = isinstance(model.likelihood, Gaussian) and model.full_cov
        if update == "closed_form" and not conjugate:
            raise ConfigError("the closed-form step needs a Gaussian likelihood and a full weight covariance")
        self.model, self.seed, self.step_count = model, int(seed), 0
        self.closed_form = conjugate and update != "gradient"
        held = {model.q_mu.ref(), model.q_sqrt_raw.ref()} if self.closed_form else set()
        if not learn_features:
            held |= {v.ref() for v in model.features.trainable_variables}
        self.variables = [v for v in model.trainable_variables if v.ref() not in held]
        self.optimizer = tf.keras.optimizers.Adam(learning_rate=learning_rate)
        if self.variables:
            self.optimizer.build(self.variables)
        self._compiled = None

    def _step_fn(self):
        model, variables, optimizer, closed_form = self.model, self.variables, self.optimizer, self.closed_form

        @tf.function
        def step(X, Y, seed):
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(variables)
                loss, X_M, target_mean, target_cov = model._objective((X, Y), seed)
            grads = tape.gradient(loss, variables)
            finite = tf.math.is_finite(loss) & tf.reduce_all(
                [tf.reduce_all(tf.math.is_finite(g)) for g in grads if g is not None])

            def apply():
                pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
                if pairs:
                    optimizer.apply_gradients(pairs)
                if not closed_form:
                    return tf.constant(True)
                m_new, L_new, ok = project(model, X_M, target_mean, target_cov)
                model.assign_weights(tf.where(ok, m_new, model.q_mu), tf.where(ok, L_new, model.q_sqrt()))
                return ok

            return loss, tf.cond(finite, apply, lambda: tf.constant(False))

        return step

    def step(self, batch) -> float:
        """One step on `batch = (X [B, D], Y [B, P])`; returns the loss before the update."""
        if self._compiled is None:
            self._compiled = self._step_fn()
        X, Y = batch
        loss, applied = self._compiled(tf.convert_to_tensor(X, self.model.dtype), tf.convert_to_tensor(Y),
                                       tf.constant([self.seed, self.step_count], tf.int32))
        if not bool(applied):
            raise NumericalError(f"non-finite loss or update at GPNet step {self.step_count}")
        self.step_count += 1
        return float(loss)

    def fit(self, batches, max_steps: int) -> "GPNetTrainer":
        """`max_steps` steps over an iterable of batches (re-read from its start as often as needed)."""
        while self.step_count < max_steps:
            before = self.step_count
            for batch in batches:
                if self.step_count >= max_steps:
                    break
                self.step(batch)
            if self.step_count == before:
                raise ConfigError("the batches are empty")
        return self


def fit_gpnet(model, X, Y, max_steps: int = 2000, *, batch_size: int = 256, learning_rate: float = 0.01,
              update: str = "auto", pretrain_points: int = 1000, seed: int = 0) -> GPNetTrainer:
    """`GPNet.fit`: exact-GP pre-training of the hyperparameters on `pretrain_points` points (Gaussian
    likelihood), then `max_steps` steps of `GPNetTrainer.pretrained` on minibatches of `batch_size`
    drawn at random (seeded) from (X, Y)."""
    X = np.asarray(X, np.float64)
    Y = np.asarray(Y)
    trainer = GPNetTrainer.pretrained(model, X, Y, pretrain_points=pretrain_points, seed=seed,
                                      learning_rate=learning_rate, update=update)
    rng = np.random.default_rng([seed, 2])

    def batches():
        for _ in range(max_steps):
            index = rng.integers(0, len(X), min(batch_size, len(X)))
            yield X[index], Y[index]

    return trainer.fit(batches(), max_steps)
