"""Deep Gaussian processes: L layers of sparse GPs built from the GP core (kernels, `VariationalGaussian`
q(u), `conditional_marginals`), trained by doubly-stochastic variational inference (default) or by the
nested variational compression bound (`gpseq.gp.nested`, Hensman & Lawrence eq. 19;
design notes `nested-variational-compression-deep-gp.md`).

Model (their eq. 11): h_0 = X, h_i = f_i(h_{i−1}) + m_i(h_{i−1}) (+ ε_i, ε_i ~ N(0, σ_i²) when the layer
has a noise variance), y ~ p(y | f_L(h_{L−1})). Each layer i has its own kernel, inducing inputs
Z_i `[M_i, D_{i−1}]`, q(u_i) over D_i independent output GPs, and optionally a linear mean function
m_i(h) = h W_i (`W_i [D_{i−1}, D_i]`, for hidden layers).

DSVI (Salimbeni & Deisenroth 2017): S samples are propagated layer by layer with the
reparameterisation trick, h_i^s = μ_i(h_{i−1}^s) + √v_i(h_{i−1}^s) ε (marginals only: q(f_i | u_i)
factorises over points given the layer's input samples). The last layer's marginals enter the
likelihood's closed-form / quadrature expectation:
    ELBO = N/B Σ_{n ∈ batch} 1/S Σ_s E_{q(f_L | h_{L−1}^s)}[log p(y_n | f)] − Σ_i KL(q(u_i) ‖ p(u_i)).
Predictions are the mixture of S Gaussians given by the propagated samples.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from gpseq._tfp import tfp

from gpseq.errors import ConfigError
from gpseq.gp.conditionals import marginals_from_kzx
from gpseq.gp.inducing import kmeans_inducing
from gpseq.gp.kernels import RBF, Linear
from gpseq.gp.linalg import safe_cholesky
from gpseq.gp.variational import VariationalGaussian

INFERENCE = ("dsvi", "nested")


class GPLayer(tf.Module):
    """One sparse-GP layer: `kernel`, inducing inputs `Z [M, D_in]`, q(u) over `output_dims` GPs.

    `mean_weights [D_in, D_out]` (or None) gives the linear mean function h W; `noise_variance`
    (or None) adds N(0, σ²) noise to the layer's output (required by the nested bound for hidden layers).
    """

    def __init__(self, kernel, inducing_inputs, output_dims: int, *, mean_weights=None,
                 train_mean: bool = False, noise_variance: float | None = None, whiten: bool = True,
                 full_cov: bool = True, initial_scale: float = 1.0, train_inducing: bool = True,
                 jitter: float = 1e-6, dtype=tf.float64, name: str = "gp_layer"):
        super().__init__(name=name)
        Z = np.asarray(inducing_inputs, dtype=np.float64)
        if Z.ndim != 2:
            raise ConfigError(f"inducing inputs must be [M, D], got shape {Z.shape}")
        self.kernel, self.whiten, self.jitter, self.dtype = kernel, whiten, jitter, dtype
        self.input_dims, self.output_dims = Z.shape[1], int(output_dims)
        self.inducing_inputs = tf.Variable(tf.constant(Z, dtype), name="inducing_inputs", trainable=train_inducing)
        self.q = VariationalGaussian(Z.shape[0], self.output_dims, full_cov=full_cov, whiten=whiten,
                                     initial_scale=initial_scale, dtype=dtype, name=f"{name}_q")
        if mean_weights is None:
            self.mean_weights = None
        else:
            W = np.asarray(mean_weights, dtype=np.float64)
            if W.shape != (self.input_dims, self.output_dims):
                raise ConfigError(f"mean weights must be [{self.input_dims}, {self.output_dims}], got {W.shape}")
            self.mean_weights = tf.Variable(tf.constant(W, dtype), name="mean_weights", trainable=train_mean)
        self.noise_variance = None if noise_variance is None else tfp.util.TransformedVariable(
            tf.constant(noise_variance, dtype), tfp.bijectors.Softplus(), name="noise_variance")

    def kzz_cholesky(self):
        """chol(K_zz + jitter I) `[M, M]`."""
        return safe_cholesky(self.kernel.K(self.inducing_inputs), jitter=self.jitter)

    def kl(self):
        """KL(q(u) ‖ p(u)) summed over the layer's output GPs → scalar."""
        return self.q.kl(None if self.whiten else self.kzz_cholesky())

    def mean_function(self, H):
        """h W `[..., D_out]` (zeros without a mean function)."""
        if self.mean_weights is None:
            return tf.zeros(tf.concat([tf.shape(H)[:-1], [self.output_dims]], 0), self.dtype)
        return tf.linalg.matmul(H, self.mean_weights)

    def marginals(self, H):
        """Mean and variance of q(f_i(h)) + m_i(h) at inputs `H [..., N, D_in]` → (`[..., N, D_out]`, same).

        The layer's noise is not included (see `output_variance`).
        """
        H = tf.convert_to_tensor(H, self.dtype)
        shape = tf.shape(H)
        flat = tf.reshape(H, [-1, self.input_dims])  # [N', D_in]
        Z = self.inducing_inputs
        mean, var = marginals_from_kzx(self.kernel.K(Z, flat), self.kzz_cholesky(), self.kernel.K_diag(flat),
                                       self.q.q_mu[0], tf.convert_to_tensor(self.q.q_sqrt)[0], self.whiten)
        mean = mean + self.mean_function(flat)
        out = tf.concat([shape[:-1], [self.output_dims]], 0)
        return tf.reshape(mean, out), tf.reshape(var, out)

    def output_variance(self, var):
        """Adds the layer's noise variance (if any) to marginal variances `var [...]`."""
        if self.noise_variance is None:
            return var
        return var + tf.convert_to_tensor(self.noise_variance)


class DeepGP(tf.Module):
    """Deep GP of `layers` (list of `GPLayer`) and an output `likelihood` (Gaussian, Bernoulli, Softmax).

    `inference`: "dsvi" (doubly stochastic, default) or "nested" (Hensman & Lawrence eq. 19,
    Gaussian likelihood, RBF/Linear kernels). `num_samples` S: samples propagated per training step
    (DSVI). `num_data` N rescales minibatch likelihood terms by N / B.
    """

    def __init__(self, layers, likelihood, *, num_data: int | None = None, inference: str = "dsvi",
                 num_samples: int = 1, seed: int = 0, name: str = "deep_gp"):
        super().__init__(name=name)
        if inference not in INFERENCE:
            raise ConfigError(f"inference must be one of {INFERENCE}, got {inference!r}")
        layers = list(layers)
        if not layers:
            raise ConfigError("a deep GP needs at least one layer")
        for a, b in zip(layers[:-1], layers[1:]):
            if a.output_dims != b.input_dims:
                raise ConfigError(f"layer output dims {a.output_dims} != next layer input dims {b.input_dims}")
        self.layers, self.likelihood = layers, likelihood
        self.num_data, self.inference, self.num_samples = num_data, inference, int(num_samples)
        self.dtype = layers[0].dtype
        self._rng = tf.random.Generator.from_seed(seed)
        if inference == "nested":
            from gpseq.gp.nested import check_nested

            check_nested(self)

    # ---- sampling ------------------------------------------------------------------------------
    def _normal(self, shape, seed):
        if seed is None:
            return self._rng.normal(shape, dtype=self.dtype)
        return tf.random.stateless_normal(shape, seed, dtype=self.dtype)

    def propagate(self, X, num_samples: int, seed=None):
        """Propagates S samples through the hidden layers; returns the last layer's marginals
        (mean `[S, N, P]`, variance `[S, N, P]`, noise not included) and the hidden samples (list of `[S, N, D_i]`)."""
        X = tf.convert_to_tensor(X, self.dtype)
        H = tf.broadcast_to(X[None], tf.concat([[num_samples], tf.shape(X)], 0))  # [S, N, D]
        hidden = []
        for i, layer in enumerate(self.layers[:-1]):
            mean, var = layer.marginals(H)
            var = layer.output_variance(var)
            layer_seed = None if seed is None else tf.stack([tf.cast(seed[0], tf.int64), tf.cast(seed[1], tf.int64) + i])
            H = mean + tf.sqrt(var) * self._normal(tf.shape(mean), layer_seed)
            hidden.append(H)
        mean, var = self.layers[-1].marginals(H)
        return mean, var, hidden

    # ---- objective -------------------------------------------------------------------------------
    def _scale(self, batch_size):
        if self.num_data is None:
            return tf.ones([], self.dtype)
        return tf.cast(self.num_data, self.dtype) / tf.cast(batch_size, self.dtype)

    def kl(self):
        """Σ_i KL(q(u_i) ‖ p(u_i)) → scalar."""
        return tf.add_n([layer.kl() for layer in self.layers])

    def expected_log_likelihood(self, batch, num_samples: int | None = None, seed=None):
        """DSVI estimate of Σ_{n ∈ batch} E_q[log p(y_n | f_n)] (unscaled) → scalar."""
        X, Y = batch
        S = self.num_samples if num_samples is None else num_samples
        mean, var, _ = self.propagate(X, S, seed)  # [S, B, P]
        var = self.layers[-1].output_variance(var)
        P = tf.shape(mean)[-1]
        Y = tf.convert_to_tensor(Y)
        Y_rep = tf.reshape(tf.broadcast_to(Y[None], tf.concat([[S], tf.shape(Y)], 0)), tf.concat([[-1], tf.shape(Y)[1:]], 0))
        ve = self.likelihood.variational_expectations(tf.reshape(mean, [-1, P]), tf.reshape(var, [-1, P]), Y_rep)
        return tf.reduce_sum(ve) / tf.cast(S, self.dtype)

    def elbo(self, batch, num_samples: int | None = None, seed=None):
        """Minibatch ELBO → scalar: DSVI (Monte Carlo over S samples) or the nested bound (closed form)."""
        if self.inference == "nested":
            from gpseq.gp.nested import nested_elbo

            return nested_elbo(self, batch)
        X = batch[0]
        return self._scale(tf.shape(X)[0]) * self.expected_log_likelihood(batch, num_samples, seed) - self.kl()

    def loss(self, batch, seed=None):
        """−ELBO (what `gpseq.training.Trainer` minimises); `seed` (int32 `[2]`) fixes the DSVI draws.

        Deep GPs offer no `variational_parameters`: natural gradients are for single-layer models."""
        return -self.elbo(batch, seed=seed)

    # ---- prediction -----------------------------------------------------------------------------
    def predict_f(self, X, num_samples: int = 100, seed=(0, 0)):
        """The S-component Gaussian mixture of f_L at `X [N, D]` → (mean `[S, N, P]`, var `[S, N, P]`)."""
        mean, var, _ = self.propagate(X, num_samples, seed)
        return mean, self.layers[-1].output_variance(var)

    def predict_y(self, X, num_samples: int = 100, seed=(0, 0)):
        """Per-component predictive mean and variance of y → (`[S, N, P]`, `[S, N, P]`) (equal weights 1/S)."""
        mean, var = self.predict_f(X, num_samples, seed)
        P = tf.shape(mean)[-1]
        m, v = self.likelihood.predict_y(tf.reshape(mean, [-1, P]), tf.reshape(var, [-1, P]))
        return tf.reshape(m, tf.shape(mean)), tf.reshape(v, tf.shape(mean))

    def predict_log_density(self, batch, num_samples: int = 100, seed=(0, 0)):
        """log p(y* | X*) per point under the S-component mixture → `[N]`: log (1/S) Σ_s p_s(y*)."""
        X, Y = batch
        mean, var = self.predict_f(X, num_samples, seed)
        S, P = tf.shape(mean)[0], tf.shape(mean)[-1]
        Y = tf.convert_to_tensor(Y)
        Y_rep = tf.reshape(tf.broadcast_to(Y[None], tf.concat([[S], tf.shape(Y)], 0)), tf.concat([[-1], tf.shape(Y)[1:]], 0))
        logs = self.likelihood.predict_log_density(tf.reshape(mean, [-1, P]), tf.reshape(var, [-1, P]), Y_rep)
        logs = tf.reshape(logs, [S, -1])
        return tf.reduce_logsumexp(logs, 0) - tf.math.log(tf.cast(S, self.dtype))


def _pca_weights(H, out_dims):
    """Salimbeni & Deisenroth's linear mean: identity (D_in = D_out), top principal directions
    (D_in > D_out) or identity padded with zeros (D_in < D_out) → `[D_in, D_out]`."""
    d_in = H.shape[1]
    if d_in == out_dims:
        return np.eye(d_in)
    if d_in > out_dims:
        _, _, Vt = np.linalg.svd(H - H.mean(0), full_matrices=False)
        return Vt[:out_dims].T
    return np.concatenate([np.eye(d_in), np.zeros((d_in, out_dims - d_in))], 1)


def build_deep_gp(X, output_dims: int, likelihood, *, num_layers: int = 2, hidden_dims: int | None = None,
                  num_inducing: int = 50, kernel: str = "rbf", inference: str = "dsvi",
                  mean_function: str = "linear", hidden_noise: float | None = None, num_samples: int = 1,
                  num_data: int | None = None, whiten: bool = True, inner_scale: float = 1e-5,
                  lengthscale: float = 1.0, seed: int = 0, dtype=tf.float64) -> DeepGP:
    """A deep GP for data `X [N, D]`: `num_layers` layers, hidden width `hidden_dims` (default D),
    K-means inducing inputs Z_1 = kmeans(X), Z_{i+1} = Z_i W_i and hidden inputs initialised through
    the linear mean functions (`mean_function="linear"`, PCA/identity W, Salimbeni & Deisenroth) or
    zero mean (`"zero"`); inner q(u) start at scale `inner_scale`. Hidden layers get noise
    `hidden_noise` (default None for DSVI, 1e-2 for the nested bound, which needs it).
    `kernel`: "rbf" (ARD) or "linear"."""
    X = np.asarray(X, dtype=np.float64)
    if num_layers < 1:
        raise ConfigError(f"num_layers must be >= 1, got {num_layers}")
    if mean_function not in ("linear", "zero"):
        raise ConfigError(f"mean_function must be 'linear' or 'zero', got {mean_function!r}")
    if kernel not in ("rbf", "linear"):
        raise ConfigError(f"kernel must be 'rbf' or 'linear', got {kernel!r}")
    if hidden_noise is None and inference == "nested":
        hidden_noise = 1e-2
    hidden_dims = X.shape[1] if hidden_dims is None else int(hidden_dims)
    M = min(num_inducing, X.shape[0])
    Z = kmeans_inducing(X, M, seed=seed)
    H = X
    layers = []
    for i in range(num_layers):
        d_in = H.shape[1]
        last = i == num_layers - 1
        d_out = output_dims if last else hidden_dims
        if kernel == "rbf":
            k = RBF(1.0, np.full(d_in, lengthscale), ard=True, dtype=dtype, name=f"rbf_{i}")
        else:
            k = Linear(1.0, dtype=dtype, name=f"linear_{i}")
        W = None
        if not last and mean_function == "linear":
            W = _pca_weights(H, d_out)
        layers.append(GPLayer(k, Z, d_out, mean_weights=W, noise_variance=None if last else hidden_noise,
                              whiten=whiten, initial_scale=1.0 if last else inner_scale, dtype=dtype,
                              name=f"layer_{i}"))
        if not last:
            W_prop = W if W is not None else _pca_weights(H, d_out)
            H, Z = H @ W_prop, Z @ W_prop
    return DeepGP(layers, likelihood, num_data=X.shape[0] if num_data is None else num_data,
                  inference=inference, num_samples=num_samples, seed=seed)


__all__ = ["DeepGP", "GPLayer", "build_deep_gp"]
