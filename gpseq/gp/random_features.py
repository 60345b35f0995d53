"""Feature maps φ whose inner products give a kernel: the weight-space view of a GP
(design notes `inference-networks-gp.md`, "Gaussian Processes: weight-space view"):
f(x) = wᵀφ(x), w ~ N(0, I)  ⇔  f ~ GP(0, φ(x)ᵀφ(x')).

- `kind="rbf"`: random Fourier features of the RBF kernel σ² exp(−‖x − x'‖² / (2ℓ²)) (Rahimi &
  Recht 2007): F/2 frequencies ω_i ~ N(0, I_D) drawn once, φ(x) = σ √(2/F) [cos(Ωᵀx/ℓ), sin(Ωᵀx/ℓ)],
  so φ(x)ᵀφ(x') = σ² (2/F) Σ_i cos(ω_iᵀ(x − x')/ℓ): an unbiased estimate of the RBF kernel whose
  error falls as O(1/√F) (Bochner's theorem: the RBF kernel is σ² E_ω[cos(ωᵀ(x − x')/ℓ)]).
- `kind="linear"`: φ(x) = σ x, exactly the linear kernel σ² x·x' (F = D, nothing random).

σ² and ℓ are the map's own positive variables (`TransformedVariable`, Softplus), initialised from
a kernel by `RandomFeatures.from_kernel`; the frequencies are a fixed, saved array.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from gpseq.errors import ConfigError
from gpseq.gp.kernels import RBF, Linear, positive

FEATURE_KINDS = ("rbf", "linear")


def fourier_features(projection, amplitude):
    """φ = σ √(2/F) [cos(p), sin(p)] `[..., F]` from the projections p = Ωᵀx/ℓ `[..., F/2]` and the
    amplitude σ (the map of `RandomFeatures`, shared by the tagger's sparse-input version,
    `gpseq.structured.gpnet_unaries`)."""
    scale = amplitude * np.sqrt(2.0 / (2 * projection.shape[-1]))
    return scale * tf.concat([tf.cos(projection), tf.sin(projection)], -1)


class RandomFeatures(tf.Module):
    """φ: `[..., N, D]` → `[..., N, F]` with φ(x)ᵀφ(x') ≈ (rbf) or = (linear) the kernel."""

    def __init__(
        self,
        input_dim: int,
        num_features: int = 1000,
        kind: str = "rbf",
        *,
        variance: float = 1.0,
        lengthscales=1.0,
        ard: bool = False,
        trainable: bool = True,
        seed: int = 0,
        dtype=tf.float64,
        name: str = "random_features",
    ):
        super().__init__(name=name)
        if kind not in FEATURE_KINDS:
            raise ConfigError(f"feature kind must be one of {', '.join(FEATURE_KINDS)}, got {kind!r}")
        if kind == "rbf" and (num_features < 2 or num_features % 2):
            raise ConfigError(f"random Fourier features come in cos/sin pairs: num_features must be even, "
                              f"got {num_features}")
        self.kind, self.input_dim, self.dtype, self.ard = kind, int(input_dim), dtype, ard
        self.num_features = int(input_dim) if kind == "linear" else int(num_features)
        self.variance = positive(variance, dtype, "variance", trainable=trainable)
        self.lengthscales = None
        self.frequencies = None
        if kind == "rbf":
            lengthscales = np.asarray(lengthscales, dtype=np.float64)
            if ard and lengthscales.ndim == 0:
                lengthscales = np.full(input_dim, float(lengthscales))
            if lengthscales.ndim > 0 and not ard:
                raise ConfigError("vector lengthscales need ard=True")
            self.lengthscales = positive(lengthscales, dtype, "lengthscales", trainable=trainable)
            omega = np.random.default_rng(seed).standard_normal((input_dim, self.num_features // 2))
            self.frequencies = tf.Variable(tf.constant(omega, dtype), trainable=False, name="frequencies")  # [D, F/2]

    @classmethod
    def from_kernel(cls, kernel, input_dim: int, num_features: int = 1000, *, trainable: bool = True, seed: int = 0,
                    name: str = "random_features"):
        """The feature map of an `RBF` (random Fourier) or `Linear` (exact) kernel, at its current
        hyperparameter values."""
        variance = float(tf.convert_to_tensor(kernel.variance))
        if isinstance(kernel, RBF):
            lengthscales = tf.convert_to_tensor(kernel.lengthscales).numpy()
            return cls(input_dim, num_features, "rbf", variance=variance, lengthscales=lengthscales, ard=kernel.ard,
                       trainable=trainable, seed=seed, dtype=kernel.dtype, name=name)
        if isinstance(kernel, Linear):
            return cls(input_dim, input_dim, "linear", variance=variance, trainable=trainable, dtype=kernel.dtype,
                       name=name)
        raise ConfigError(f"random features exist for the RBF and linear kernels, not {type(kernel).__name__}")

    def __call__(self, X):  # [..., N, D] → [..., N, F]
        X = tf.convert_to_tensor(X, self.dtype)
        amplitude = tf.sqrt(tf.convert_to_tensor(self.variance))
        if self.kind == "linear":
            return amplitude * X
        projection = tf.linalg.matmul(X / tf.convert_to_tensor(self.lengthscales), self.frequencies)  # [..., N, F/2]
        return fourier_features(projection, amplitude)

    def K(self, X, Y=None):
        """The kernel the features define, φ(X) φ(Y)ᵀ → `[..., N, M]`."""
        phi_x = self(X)
        phi_y = phi_x if Y is None else self(Y)
        return tf.linalg.matmul(phi_x, phi_y, transpose_b=True)

    def K_diag(self, X):  # [..., N]
        return tf.reduce_sum(self(X) ** 2, -1)
