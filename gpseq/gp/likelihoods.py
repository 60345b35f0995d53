"""Likelihoods for the SVGP: E_q[log p(y | f)] under q(f) = N(F_mean, F_var), and predictions.

`variational_expectations(F_mean [N, P], F_var [N, P], Y) → [N]` (summed over latent columns),
`predict_y(F_mean, F_var) → (mean, var)`, `predict_log_density(F_mean, F_var, Y) → [N]`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from gpseq._tfp import tfp

from gpseq.errors import ConfigError

tfd = tfp.distributions


_LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)
_LOG_2PI = np.log(2.0 * np.pi)
_TAIL = -20.0  # below this, log Φ by its asymptotic series (erfc underflows below about −37)


def _log_normal_cdf_and_ratio(x):
    """(log Φ(x), φ(x)/Φ(x)) elementwise, accurate over the whole real line, with one erfc, one log
    and one exp per element (log1p has no vectorised kernel: it cost more than the rest together).

    Φ(−|x|) = erfc(|x|/√2)/2 = t is accurate relative to itself, so log Φ(x) = log t for x < 0 and
    log1p(−t) for x ≥ 0, here log(1 − t) · t / (1 − (1 − t)) (Goldberg's log1p from log; −t when 1 − t
    rounds to 1); φ/Φ = exp(log φ − log Φ). Below x = −20 (erfc underflows below about −37) the
    asymptotic series Φ(x) = φ(x)/(−x) · (1 − x⁻² + 3x⁻⁴ − 15x⁻⁶ + …) replaces both, under one
    tf.cond that runs only when some element is there.
    """
    tail_mass = 0.5 * tf.math.erfc(tf.abs(x) * np.sqrt(0.5))  # t = Φ(−|x|)
    below = x < 0.0
    upper_mass = 1.0 - tail_mass
    logs = tf.math.log(tf.where(below, tail_mass, upper_mass))
    rounding = 1.0 - upper_mass  # t as 1 − t rounded it; 0 when 1 − t == 1
    log_cdf = tf.where(below, logs, tf.where(rounding > 0.0, logs * (tail_mass / rounding), -tail_mass))
    ratio = tf.exp(-0.5 * x * x - _LOG_SQRT_2PI - log_cdf)
    in_tail = x < _TAIL

    def tail():
        clipped = tf.minimum(x, _TAIL)
        inv_sq = 1.0 / (clipped * clipped)
        tail_ratio = -clipped / (1.0 - inv_sq * (1.0 - inv_sq * (3.0 - 15.0 * inv_sq)))  # −x / series
        return (tf.where(in_tail, -0.5 * clipped * clipped - _LOG_SQRT_2PI - tf.math.log(tail_ratio), log_cdf),
                tf.where(in_tail, tail_ratio, ratio))

    return tf.cond(tf.reduce_any(in_tail), tail, lambda: (log_cdf, ratio))


@tf.custom_gradient
def log_normal_cdf(x):
    """log Φ(x) elementwise (`_log_normal_cdf_and_ratio`); the gradient is φ(x)/Φ(x), no autodiff
    through the branches."""
    log_cdf, ratio = _log_normal_cdf_and_ratio(x)
    return log_cdf, lambda upstream: upstream * ratio


def _probit_expectations(nodes, weights):
    """`(F_mean [N, P], F_var [N, P], sign [N, P]) → [N]`: Σ_p ∫ N(f; μ, v) log Φ(sign · f) df by
    Gauss–Hermite (`nodes`, `weights` for ∫ N(x; 0, 1) g(x) dx), with its gradient in closed form:
    ∂/∂μ = sign · E[φ/Φ], ∂/∂v = sign · E[φ/Φ · x] / (2√v) at the nodes (x the standard node)."""

    @tf.custom_gradient
    def expectations(F_mean, F_var, sign):
        std = tf.sqrt(F_var)
        z = sign[..., None] * (F_mean[..., None] + std[..., None] * nodes)  # [N, P, Q]
        log_cdf, ratio = _log_normal_cdf_and_ratio(z)

        def grad(upstream):
            weighted = ratio * weights  # [N, P, Q]
            scaled = upstream[:, None] * sign
            return (scaled * tf.reduce_sum(weighted, -1),
                    scaled * tf.reduce_sum(weighted * nodes, -1) * (0.5 / std), None)

        return tf.reduce_sum(tf.reduce_sum(log_cdf * weights, -1), -1), grad

    return expectations


class Gaussian(tf.Module):
    """y = f + ε, ε ~ N(0, σ²) (closed-form expectations); σ² learnable, σ² = `variance_floor` +
    softplus(stored value), so no step can drive it to 0 (where the expectations are NaN)."""

    VARIANCE_FLOOR = 1e-6

    def __init__(self, variance: float = 1.0, dtype=tf.float64, name: str = "gaussian",
                 variance_floor: float = VARIANCE_FLOOR):
        super().__init__(name=name)
        if not variance > variance_floor >= 0.0:
            raise ConfigError(f"the Gaussian noise variance must exceed its floor {variance_floor:g}, got {variance}")
        self.variance_floor = float(variance_floor)
        # a checkpoint saved without a floor holds the same variable (softplus⁻¹ of σ²): it
        # loads as σ² + floor
        self.variance = tfp.util.TransformedVariable(
            tf.constant(variance, dtype), tfp.bijectors.Softplus(low=tf.constant(variance_floor, dtype)),
            name="variance")

    def variational_expectations(self, F_mean, F_var, Y):  # [N, P] ×3 → [N]
        """E_{N(f; m, v)}[log N(y; f, σ²)] = log N(y; m, σ²) − v / (2σ²)
        = −½ (log 2π + log σ² + ((y − m)² + v) / σ²), in that one expression (TFP's Normal takes a
        square root, two divisions and its own log)."""
        noise = tf.convert_to_tensor(self.variance)
        Y = tf.cast(Y, noise.dtype)
        per = -0.5 * (_LOG_2PI + tf.math.log(noise) + (tf.math.squared_difference(Y, F_mean) + F_var) / noise)
        return tf.reduce_sum(per, -1)

    def predict_y(self, F_mean, F_var):
        return F_mean, F_var + tf.convert_to_tensor(self.variance)

    def predict_log_density(self, F_mean, F_var, Y):  # → [N]
        _, var = self.predict_y(F_mean, F_var)
        return tf.reduce_sum(tfd.Normal(F_mean, tf.sqrt(var)).log_prob(Y), -1)


class Bernoulli(tf.Module):
    """y ∈ {0, 1}, p(y = 1 | f) = Φ(f) (probit) or σ(f) (logit); Gauss–Hermite expectations."""

    def __init__(self, link: str = "probit", num_gauss_hermite: int = 20, dtype=tf.float64, name="bernoulli"):
        super().__init__(name=name)
        if link not in ("probit", "logit"):
            raise ConfigError(f"Bernoulli link must be 'probit' or 'logit', got {link!r}")
        self.link, self.dtype = link, dtype
        nodes, weights = np.polynomial.hermite.hermgauss(num_gauss_hermite)
        self._nodes = tf.constant(np.sqrt(2.0) * nodes, dtype)  # for ∫ N(x; 0, 1) g(x) dx
        self._weights = tf.constant(weights / np.sqrt(np.pi), dtype)
        self._probit_expectations = _probit_expectations(self._nodes, self._weights)

    def log_prob(self, F, Y):
        """log p(y | f) elementwise (stable: `log_normal_cdf`, log σ via softplus)."""
        sign = 2.0 * tf.cast(Y, F.dtype) - 1.0
        if self.link == "probit":
            return log_normal_cdf(sign * F)
        return -tf.math.softplus(-sign * F)

    def _quadrature(self, fn, F_mean, F_var):
        """∫ N(f; μ, v) fn(f) df by Gauss–Hermite, elementwise over `[N, P]`."""
        f = F_mean[..., None] + tf.sqrt(F_var)[..., None] * self._nodes  # [N, P, Q]
        return tf.reduce_sum(fn(f) * self._weights, -1)

    def variational_expectations(self, F_mean, F_var, Y):  # → [N]
        Y = tf.cast(Y, F_mean.dtype)
        if self.link == "probit":  # one function with a closed-form gradient (the step's hot path)
            F_mean, F_var = tf.convert_to_tensor(F_mean), tf.convert_to_tensor(F_var)
            sign = 2.0 * Y - 1.0
            if sign.shape != F_mean.shape:
                sign = tf.broadcast_to(sign, tf.shape(F_mean))
            return self._probit_expectations(F_mean, F_var, sign)
        return tf.reduce_sum(self._quadrature(lambda f: self.log_prob(f, Y[..., None]), F_mean, F_var), -1)

    def predict_y(self, F_mean, F_var):
        """p(y = 1) (closed form for probit: Φ(μ / √(1 + v))) and its Bernoulli variance."""
        if self.link == "probit":
            p = tfd.Normal(tf.zeros([], F_mean.dtype), 1.0).cdf(F_mean / tf.sqrt(1.0 + F_var))
        else:
            p = self._quadrature(tf.math.sigmoid, F_mean, F_var)
        return p, p - p**2

    def predict_log_density(self, F_mean, F_var, Y):  # → [N]
        p, _ = self.predict_y(F_mean, F_var)
        Y = tf.cast(Y, p.dtype)
        return tf.reduce_sum(Y * tf.math.log(p) + (1.0 - Y) * tf.math.log1p(-p), -1)


class Softmax(tf.Module):
    """Multiclass y ∈ {0..C−1}, p(y | f) = softmax(f)_y over C latent columns; Monte Carlo expectations.

    Draws are stateless from `seed` (fixed by default), so the estimate is a deterministic function
    of its inputs and differentiable by the reparameterisation trick.
    """

    def __init__(self, num_classes: int, num_samples: int = 100, seed=(0, 0), dtype=tf.float64, name="softmax"):
        super().__init__(name=name)
        self.num_classes, self.num_samples, self.seed, self.dtype = num_classes, num_samples, seed, dtype

    def _samples(self, F_mean, F_var, seed):
        eps = tf.random.stateless_normal(tf.concat([[self.num_samples], tf.shape(F_mean)], 0),
                                         self.seed if seed is None else seed, dtype=F_mean.dtype)
        return F_mean + tf.sqrt(F_var) * eps  # [S, N, C]

    def variational_expectations(self, F_mean, F_var, Y, seed=None):  # F [N, C], Y [N] or [N, 1] → [N]
        labels = tf.reshape(tf.cast(Y, tf.int32), [-1])
        log_p = tf.nn.log_softmax(self._samples(F_mean, F_var, seed), -1)  # [S, N, C]
        picked = tf.reduce_sum(log_p * tf.one_hot(labels, self.num_classes, dtype=F_mean.dtype), -1)  # [S, N]
        return tf.reduce_mean(picked, 0)

    def predict_y(self, F_mean, F_var, seed=None):
        """Class probabilities `[N, C]` (Monte Carlo) and their Bernoulli variances."""
        p = tf.reduce_mean(tf.nn.softmax(self._samples(F_mean, F_var, seed), -1), 0)
        return p, p - p**2

    def predict_log_density(self, F_mean, F_var, Y, seed=None):  # → [N]
        p, _ = self.predict_y(F_mean, F_var, seed)
        labels = tf.reshape(tf.cast(Y, tf.int32), [-1])
        return tf.math.log(tf.reduce_sum(p * tf.one_hot(labels, self.num_classes, dtype=p.dtype), -1))
