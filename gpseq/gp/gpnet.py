"""GPNet: an inference network for a GP posterior, trained by stochastic functional mirror descent
(Shi, Khan & Zhu, design notes `inference-networks-gp.md`).

The posterior process is a network, not a sparse inducing-point posterior (ibid., "Examples of
inference networks"):

    q_γ(f):  f_p(x) = w_pᵀφ(x) + ξ_θ(x)_p,   w_p ~ N(m_p, V_p),   p = 1..P latent functions,

φ a `RandomFeatures` map (random Fourier features of the RBF kernel, or the exact linear one),
V_p full (`q_sqrt [P, F, F]`, the default: the exact weight-space posterior of Bayesian linear
regression, (ΦᵀΦ/σ² + I)⁻¹, is a full matrix; V = q_sqrt q_sqrtᵀ with q_sqrt lower triangular, or
any square root — `weight_factor="dense"`, the default for a Gaussian likelihood, so that the
closed-form step is a low-rank update, O(F²M) instead of O(F³)) or diagonal (`full_cov=False`,
O(F) per point instead of O(F²), for many features), and ξ_θ an optional one-hidden-layer tanh MLP
(`residual_hidden` units) that adds to the mean only. At any inputs X, q_γ(f_X) is Gaussian:
mean Φ m + ξ(X), covariance Φ V Φᵀ (+ jitter).

Step t (GPNet's Algorithm 1) samples a minibatch and M measurement points, builds the target
q̂_{t+1} of the functional mirror-descent step and takes the network's loss towards it, with the
prior hyperparameters' own bound (`gpseq.gp.gpnet_objective`, where the step is written out).

**Training** (`gpseq.gp.gpnet_training`): `GPNet.fit` pre-trains the prior hyperparameters by the
exact GP's marginal likelihood on a random subset, then runs `GPNetTrainer`, whose weight step for a
Gaussian likelihood and full V is the closed-form minimiser of KL[q_γ(f_M) ‖ q̂_{t+1}(f_M)] nearest
the current network (`project`); the shared `Trainer` takes Algorithm 1 literally (Adam on all).
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf
from gpseq._tfp import tfp

from gpseq.errors import ConfigError, ModelFormatError
from gpseq.gp.gpnet_objective import beta_schedule, gaussian_target, measurement_points, objective
from gpseq.gp.gpnet_saved import gpnet_config, load_gpnet, save_gpnet
from gpseq.gp.gpnet_training import GPNetTrainer, fit_gpnet, pretrain
from gpseq.gp.likelihoods import Gaussian, Softmax
from gpseq.gp.random_features import RandomFeatures

__all__ = ["GPNet", "GPNetTrainer", "beta_schedule"]

SPREADS = ("gaussian", "uniform", "none")
WEIGHT_FACTORS = ("auto", "lower", "dense")


def _softplus_inverse(x: float) -> float:
    return float(np.log(np.expm1(x)))


class GPNet(tf.Module):
    """GPNet with P latent functions over dense inputs `[N, D]` (module docstring).

    `inputs [N, D]`: the training inputs from which measurement points are drawn (None: from each
    minibatch's inputs). `features`: a `RandomFeatures` map (default: random Fourier features of
    `kernel` with `num_features` features, or the exact map of a `Linear` kernel).
    """

    def __init__(
        self,
        kernel,
        likelihood,
        inputs=None,
        *,
        num_data: int,
        features: RandomFeatures | None = None,
        input_dim: int | None = None,
        num_features: int = 400,
        num_latent: int = 1,
        num_measurement: int = 100,
        spread: str = "gaussian",
        spread_scale: float = float(1.0 / np.sqrt(2.0)),
        full_cov: bool = True,
        weight_factor: str = "auto",
        residual_hidden: int = 0,
        beta0: float = 1.0,
        beta_decay: float = 1.0,
        beta_power: float = 0.5,
        learn_hyperparameters: bool = True,
        projection_ridge: float = 1e-2,
        jitter: float = 1e-6,
        seed: int = 0,
        name: str = "gpnet",
    ):
        super().__init__(name=name)
        if spread not in SPREADS:
            raise ConfigError(f"spread must be one of {', '.join(SPREADS)}, got {spread!r}")
        if weight_factor not in WEIGHT_FACTORS:
            raise ConfigError(f"weight_factor must be one of {', '.join(WEIGHT_FACTORS)}, got {weight_factor!r}")
        if weight_factor == "dense" and not full_cov:
            raise ConfigError("weight_factor 'dense' needs full_cov=True (a diagonal covariance has no factor)")
        if projection_ridge < 0.0:
            raise ConfigError(f"projection_ridge must be >= 0, got {projection_ridge}")
        if not 0.0 < beta0 <= 1.0 or beta_decay < 0.0 or not 0.0 < beta_power <= 1.0:
            raise ConfigError(f"need 0 < beta0 <= 1, beta_decay >= 0 and 0 < beta_power <= 1, "
                              f"got {beta0}, {beta_decay}, {beta_power}")
        if isinstance(likelihood, Softmax) and num_latent != likelihood.num_classes:
            raise ConfigError(f"a softmax over {likelihood.num_classes} classes needs num_latent = "
                              f"{likelihood.num_classes}, got {num_latent}")
        self.kernel, self.likelihood = kernel, likelihood
        self.dtype = kernel.dtype
        if inputs is not None:
            inputs = np.asarray(inputs, dtype=np.float64)
            input_dim = inputs.shape[1]
            self.inputs = tf.convert_to_tensor(inputs, self.dtype)  # a captured tensor, not a saved variable
        else:
            self.inputs = None
        if features is not None:
            input_dim = features.input_dim
        if input_dim is None:
            raise ConfigError("GPNet needs the training inputs, a feature map or input_dim")
        self.input_dim = int(input_dim)
        self.features = features or RandomFeatures.from_kernel(kernel, self.input_dim, num_features, seed=seed)
        F, P = self.features.num_features, num_latent
        self.num_data, self.num_latent, self.num_measurement = int(num_data), P, int(num_measurement)
        self.spread, self.spread_scale = spread, float(spread_scale)
        self.full_cov, self.residual_hidden = full_cov, int(residual_hidden)
        if weight_factor == "auto":  # dense where the closed-form step will update it (gpnet_training.project)
            weight_factor = "dense" if full_cov and isinstance(likelihood, Gaussian) else "lower"
        self.weight_factor = weight_factor if full_cov else "lower"  # (diagonal: its standard deviations)
        self.beta0, self.beta_decay, self.beta_power = float(beta0), float(beta_decay), float(beta_power)
        self.learn_hyperparameters, self.jitter = learn_hyperparameters, float(jitter)
        self.projection_ridge = float(projection_ridge)

        # w ~ N(m, V) starts at the prior N(0, I): q_γ₀ is the features' approximation of p(f).
        self.q_mu = tf.Variable(tf.zeros([F, P], self.dtype), name="q_mu")
        if full_cov:
            # lower: strict lower part as stored, Softplus of the stored diagonal; dense: as stored
            start = 1.0 if self.weight_factor == "dense" else _softplus_inverse(1.0)
            raw = np.broadcast_to(np.eye(F) * start, (P, F, F)).copy()
            self.q_sqrt_raw = tf.Variable(tf.constant(raw, self.dtype), name="q_sqrt_raw")
        else:
            self.q_sqrt_raw = tf.Variable(tf.fill([F, P], tf.constant(_softplus_inverse(1.0), self.dtype)),
                                          name="q_sqrt_raw")
        self.residual = None
        if self.residual_hidden > 0:
            rng = np.random.default_rng([seed, 1])
            H, D = self.residual_hidden, self.input_dim
            self.residual = [
                tf.Variable(tf.constant(rng.standard_normal((D, H)) / np.sqrt(D), self.dtype), name="residual_w1"),
                tf.Variable(tf.zeros([H], self.dtype), name="residual_b1"),
                tf.Variable(tf.zeros([H, P], self.dtype), name="residual_w2"),  # ξ = 0 at the start
                tf.Variable(tf.zeros([P], self.dtype), name="residual_b2"),
            ]

    @property
    def trainable_variables(self):
        """The network's variables, and the kernel's and likelihood's when `learn_hyperparameters`
        (the trainer refuses a variable the loss does not reach)."""
        variables = super().trainable_variables
        if self.learn_hyperparameters:
            return variables
        fixed = {v.ref() for part in (self.kernel, self.likelihood) for v in part.trainable_variables}
        return tuple(v for v in variables if v.ref() not in fixed)

    # ---- the network q_γ -----------------------------------------------------------------------
    def q_sqrt(self):
        """V^{1/2}: `[P, F, F]` (full: lower triangular, or any square root with `weight_factor`
        "dense") or `[F, P]` standard deviations (diagonal)."""
        raw = tf.convert_to_tensor(self.q_sqrt_raw)
        if not self.full_cov:
            return tf.math.softplus(raw)
        if self.weight_factor == "dense":
            return raw
        return tf.linalg.band_part(raw, -1, 0) - tf.linalg.diag(tf.linalg.diag_part(raw)) \
            + tf.linalg.diag(tf.math.softplus(tf.linalg.diag_part(raw)))

    def residual_mean(self, X):
        """ξ_θ(X) `[N, P]` (zeros without a residual network)."""
        X = tf.convert_to_tensor(X, self.dtype)
        if self.residual is None:
            return tf.zeros([tf.shape(X)[0], self.num_latent], self.dtype)
        w1, b1, w2, b2 = self.residual
        return tf.linalg.matmul(tf.tanh(tf.linalg.matmul(X, w1) + b1), w2) + b2

    def predict_f_full(self, X):
        """Mean `[N, P]` and covariance `[P, N, N]` of q_γ(f_X) (no jitter)."""
        phi = self.features(X)  # [N, F]
        mean = tf.linalg.matmul(phi, self.q_mu) + self.residual_mean(X)
        if self.full_cov:
            A = tf.einsum("nf,pfg->png", phi, self.q_sqrt())  # [P, N, F]
            return mean, tf.linalg.matmul(A, A, transpose_b=True)
        return mean, tf.einsum("nf,fp,mf->pnm", phi, self.q_sqrt() ** 2, phi)

    def predict_f(self, X):
        """Marginal mean and variance of q_γ(f) at `X [N, D]` → (`[N, P]`, `[N, P]`)."""
        phi = self.features(X)
        mean = tf.linalg.matmul(phi, self.q_mu) + self.residual_mean(X)
        if self.full_cov:
            var = tf.transpose(tf.reduce_sum(tf.einsum("nf,pfg->png", phi, self.q_sqrt()) ** 2, -1))
        else:
            var = tf.linalg.matmul(phi**2, self.q_sqrt() ** 2)
        return mean, var

    def predict_y(self, X):
        """Predictive mean and variance of y at `X` (the likelihood's `predict_y` of the marginals)."""
        return self.likelihood.predict_y(*self.predict_f(X))

    def predict_log_density(self, batch):
        """log p(y* | x*) per point `[N]` for `batch = (X [N, D], Y)`."""
        X, Y = batch
        return self.likelihood.predict_log_density(*self.predict_f(X), Y)

    # ---- the step's measurement points and target (`gpseq.gp.gpnet_objective`) -------------------
    def beta(self, step):
        """β_t at the 0-based `step` → scalar."""
        return tf.cast(beta_schedule(step, self.beta0, self.beta_decay, self.beta_power), self.dtype)

    def measurement_points(self, seed, X_batch=None):
        """M points from c(x): training inputs (or the batch's when the model has none) plus the
        spread → `[M, D]`; stateless in `seed` (int32 `[2]`) (`gpnet_objective.measurement_points`)."""
        return measurement_points(self, seed, X_batch)

    def gaussian_target(self, X, Y, X_M, beta, q_mean=None, q_cov=None, prior_cov=None):
        """q̂_{t+1}(f_M) of a Gaussian likelihood → mean `[M, P]`, covariance `[P, M, M]`
        (`gpnet_objective.gaussian_target`, where the arguments are described)."""
        return gaussian_target(self, X, Y, X_M, beta, q_mean=q_mean, q_cov=q_cov, prior_cov=prior_cov)

    # ---- the training objective (`gpseq.gp.gpnet_objective`) -------------------------------------
    def loss(self, batch, seed=None):
        """The network's mirror-descent loss plus the hyperparameters' negative minibatch bound
        (`gpseq.gp.gpnet_objective`) for `batch = (X [B, D], Y [B, P])` at step `seed[1]` → scalar."""
        return objective(self, batch, seed)[0]

    def _objective(self, batch, seed=None):
        """(loss, X_M, target mean, target covariance) (`gpnet_objective.objective`)."""
        return objective(self, batch, seed)

    # ---- the weight posterior set by the closed-form step ----------------------------------------
    def assign_weights(self, q_mu, q_sqrt):
        """Sets N(m, V) from m `[F, P]` and V^{1/2} `[P, F, F]` (full covariance; lower triangular
        unless `weight_factor` is "dense")."""
        q_sqrt = tf.convert_to_tensor(q_sqrt, self.dtype)
        if self.weight_factor == "dense":
            self.q_mu.assign(q_mu)
            self.q_sqrt_raw.assign(q_sqrt)
            return
        diag = tf.linalg.diag_part(q_sqrt)
        raw = tf.linalg.set_diag(tf.linalg.band_part(q_sqrt, -1, 0), tfp.math.softplus_inverse(diag))
        self.q_mu.assign(q_mu)
        self.q_sqrt_raw.assign(raw)

    # ---- training (`gpseq.gp.gpnet_training`) -----------------------------------------------------
    def pretrain(self, X, Y, num_points: int = 1000, max_iterations: int = 200, seed: int = 0):
        """Exact-GP pre-training of the prior hyperparameters on `num_points` random points of
        (X `[N, D]`, Y `[N, P]`) (`gpnet_training.pretrain`) → the subset's log evidence per point or None."""
        return pretrain(self, X, Y, num_points=num_points, max_iterations=max_iterations, seed=seed)

    def fit(self, X, Y, max_steps: int = 2000, **settings) -> "GPNetTrainer":
        """Trains on (X `[N, D]`, Y): exact-GP pre-training of the hyperparameters, then `max_steps`
        minibatch steps of `GPNetTrainer` (closed-form weight step for a Gaussian likelihood);
        `settings`: batch_size (256), learning_rate (0.01), update ("auto"), pretrain_points (1000),
        seed (0). The feature map stays where pre-training set it (`GPNetTrainer.pretrained`).
        Returns the trainer (to continue with `trainer.step`)."""
        return fit_gpnet(self, X, Y, max_steps, **settings)

    # ---- persistence as plain arrays (`gpseq.gp.gpnet_saved`) ------------------------------------
    def config(self) -> dict:
        """What rebuilds the model's structure (its values are in `get_state`)."""
        return gpnet_config(self)

    def _variables_by_name(self) -> dict[str, tf.Variable]:
        found = self._flatten(predicate=lambda v: isinstance(v, tf.Variable), with_path=True)
        return {"/".join(str(part) for part in path): variable for path, variable in found}

    def get_state(self) -> dict[str, np.ndarray]:
        """Every variable (unconstrained values, frequencies included) as a named array."""
        return {name: variable.numpy() for name, variable in self._variables_by_name().items()}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Assign the arrays of `get_state`; a missing or mis-shaped one is a `ModelFormatError`."""
        for name, variable in self._variables_by_name().items():
            if name not in state:
                raise ModelFormatError(f"GPNet state has no array {name!r}")
            value = np.asarray(state[name])
            if tuple(value.shape) != tuple(variable.shape):
                raise ModelFormatError(f"GPNet array {name!r} has shape {value.shape}, "
                                       f"expected {tuple(variable.shape)}")
            variable.assign(value)

    def save(self, path: str | os.PathLike) -> None:
        """One `.npz` of plain arrays (no pickle), written atomically: the state and the config as JSON."""
        save_gpnet(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike, inputs=None) -> "GPNet":
        """The model `save` wrote (pass the training `inputs` to train it further)."""
        return load_gpnet(cls, path, inputs)
