"""Psi statistics: kernel expectations under a factorised Gaussian input q(x) = N(μ, diag s).

For inputs `mu [N, D]`, `var [N, D]` (s ≥ 0; s = 0 gives plain kernel evaluations) and inducing
inputs `Z [M, D]` (design notes `nested-variational-compression-deep-gp.md` §4.2, the quantities after
eq. 17, per data point n):

    ψ0_n        = E[k(x_n, x_n)]                         → `[N]`
    ψ1_nm       = E[k(x_n, z_m)]                          → `[N, M]`   (a row of Ψ)
    Φ_n,mm'     = E[k(z_m, x_n) k(x_n, z_m')]             → `[N, M, M]`
    Ξ_n,m,:     = E[k(x_n, z_m) x_n]                      → `[N, M, D]` (for linear mean functions)

in closed form for `gpseq.gp.kernels.RBF` (ARD or isotropic, dense inputs) and `Linear`.
"""

from __future__ import annotations

import tensorflow as tf

from gpseq.errors import ConfigError
from gpseq.gp.kernels import RBF, Linear


def supports_psi(kernel) -> bool:
    """Whether `psi_statistics` has a closed form for this kernel."""
    return isinstance(kernel, (RBF, Linear))


def psi_statistics(kernel, mu, var, Z):
    """(ψ0 `[N]`, Ψ `[N, M]`, Φ `[N, M, M]`, Ξ `[N, M, D]`) under q(x_n) = N(mu_n, diag var_n)."""
    mu = tf.convert_to_tensor(mu, kernel.dtype)
    var = tf.convert_to_tensor(var, kernel.dtype)
    Z = tf.convert_to_tensor(Z, kernel.dtype)
    if isinstance(kernel, RBF):
        return _rbf_psi(kernel, mu, var, Z)
    if isinstance(kernel, Linear):
        return _linear_psi(kernel, mu, var, Z)
    raise ConfigError(f"psi statistics are available for RBF and Linear kernels, not {type(kernel).__name__}")


def _rbf_psi(kernel, mu, var, Z):
    alpha = tf.convert_to_tensor(kernel.variance)
    l2 = tf.convert_to_tensor(kernel.lengthscales) ** 2 * tf.ones([tf.shape(mu)[-1]], mu.dtype)  # [D]
    N = tf.shape(mu)[0]
    psi0 = tf.fill([N], alpha)
    # ψ1: α Π_d (1 + s/ℓ²)^(-1/2) exp(−(μ − z)² / (2(ℓ² + s)))
    denom1 = l2 + var  # [N, D]
    diff = mu[:, None, :] - Z[None, :, :]  # [N, M, D]
    log_psi1 = -0.5 * tf.reduce_sum(tf.math.log(denom1 / l2), -1)[:, None] - 0.5 * tf.reduce_sum(
        diff**2 / denom1[:, None, :], -1)
    psi1 = alpha * tf.exp(log_psi1)  # [N, M]
    # Φ: α² Π_d (1 + 2s/ℓ²)^(-1/2) exp(−(z − z')²/(4ℓ²) − (μ − z̄)²/(ℓ² + 2s))
    denom2 = l2 + 2.0 * var  # [N, D]
    zdiff = Z[:, None, :] - Z[None, :, :]  # [M, M, D]
    zbar = 0.5 * (Z[:, None, :] + Z[None, :, :])  # [M, M, D]
    term_z = -0.25 * tf.reduce_sum(zdiff**2 / l2, -1)  # [M, M]
    dev = mu[:, None, None, :] - zbar[None]  # [N, M, M, D]
    term_x = -tf.reduce_sum(dev**2 / denom2[:, None, None, :], -1)  # [N, M, M]
    log_norm = -0.5 * tf.reduce_sum(tf.math.log(denom2 / l2), -1)  # [N]
    phi = alpha**2 * tf.exp(log_norm[:, None, None] + term_z[None] + term_x)
    # Ξ: ψ1 · posterior mean of x under N(x; μ, s) N(x; z, ℓ²): (z s + μ ℓ²) / (ℓ² + s)
    post = (Z[None, :, :] * var[:, None, :] + mu[:, None, :] * l2) / denom1[:, None, :]  # [N, M, D]
    xi = psi1[..., None] * post
    return psi0, psi1, phi, xi


def _linear_psi(kernel, mu, var, Z):
    sigma2 = tf.convert_to_tensor(kernel.variance)
    psi0 = sigma2 * (tf.reduce_sum(mu**2, -1) + tf.reduce_sum(var, -1))  # [N]
    psi1 = sigma2 * tf.linalg.matmul(mu, Z, transpose_b=True)  # [N, M]
    # Φ_n = σ⁴ Z (μμᵀ + diag s) Zᵀ
    phi = psi1[:, :, None] * psi1[:, None, :] + sigma2**2 * tf.einsum("md,nd,kd->nmk", Z, var, Z)
    # Ξ_n,m = σ² (μμᵀ + diag s) z_m
    xi = psi1[..., None] * mu[:, None, :] + sigma2 * Z[None, :, :] * var[:, None, :]
    return psi0, psi1, phi, xi
