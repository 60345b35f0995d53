"""The nested variational compression bound of a deep GP (Hensman & Lawrence eq. 19, design
notes `nested-variational-compression-deep-gp.md`).

Gaussian messages q(h_i) = N(μ_i, diag s_i) are passed layer to layer (h_0 = X, s_0 = 0). With the
psi statistics of layer i under q(h_{i−1}) (`gpseq.gp.psi`: ψ0, Ψ, Φ, Ξ), a = P w the projection of
the q(u) variable (P = K_zz⁻¹, or L⁻ᵀ when whitened, w ~ N(m_d, S_d) per output d), and
G = Pᵀ Φ P, b = Pᵀ ψ, per data point n and output d:

    mean        μ_i   = bᵀ m_d + μ_{i−1} W_d                              (message mean)
    compression c     = ψ0 − tr(K_zz⁻¹ Φ)                                  (TCV, their §3.4)
    propagation p     = mᵀ G m + tr(G S) − (bᵀ m)² − bᵀ S b                (eq. 19, third line)
                        + Σ_k s_k W_kd² + 2 (P m)ᵀ (Ξ − ψ μᵀ) W_d           (linear mean function)
    hidden layer:  bound −= (p + c) / (2σ_i²);  message s_i = σ_i² + bᵀ S b
    output layer:  bound += log N(y | μ_L, σ²) − (bᵀ S b + p + c) / (2σ²)

and bound = N/B Σ_{n ∈ batch} Σ_d (…) − Σ_i KL(q(u_i) ‖ p(u_i)): closed form, a sum over data points.

Note on eq. 19 as printed: its last line log N(y | Ψ K⁻¹ m, σ²) omits the −bᵀ S b / (2σ²) of the
output layer (which eq. 10 has); with it, one layer reduces exactly to the SVGP bound (eq. 10) and,
at the optimal q(u), to SGPR (eq. 9). The same algebra is "p(h_i | u_i, h_{i−1}) averaged over q(h_{i−1})":
E_x[(h − k(x)ᵀa − xW)²] = (h − E_x[·])² + Var_x[·], with the variance split into the penalties.
"""

from __future__ import annotations

import tensorflow as tf
from gpseq._tfp import tfp

from gpseq.errors import ConfigError
from gpseq.gp.conditionals import projections
from gpseq.gp.likelihoods import Gaussian
from gpseq.gp.psi import psi_statistics, supports_psi

tfd = tfp.distributions


def check_nested(model):
    """Raises `ConfigError` unless the model fits the nested bound (Gaussian likelihood, RBF/Linear
    kernels, noisy hidden layers)."""
    if not isinstance(model.likelihood, Gaussian):
        raise ConfigError("the nested bound needs a Gaussian likelihood (use inference='dsvi' otherwise)")
    for i, layer in enumerate(model.layers):
        if not supports_psi(layer.kernel):
            raise ConfigError(f"the nested bound needs RBF or Linear kernels (layer {i}: {type(layer.kernel).__name__})")
        if i < len(model.layers) - 1 and layer.noise_variance is None:
            raise ConfigError(f"the nested bound needs a noise variance on hidden layer {i}")


def _solve_both_sides(L, A):
    """L⁻¹ A L⁻ᵀ for `A [N, M, M]`, `L [M, M]` lower → `[N, M, M]`."""
    Lb = tf.broadcast_to(L, tf.shape(A))
    left = tf.linalg.triangular_solve(Lb, A, lower=True)  # L⁻¹ A
    return tf.linalg.matrix_transpose(tf.linalg.triangular_solve(Lb, tf.linalg.matrix_transpose(left), lower=True))


def layer_terms(layer, mu, var=None):
    """One layer of the nested bound under q(h_{i−1}) = N(`mu [N, D]`, diag `var [N, D]`).

    Returns (message mean `[N, P]`, bᵀ S b `[N, P]`, propagation p `[N, P]`, compression c `[N, P]`).
    `var=None` means deterministic inputs (the first layer): Φ = ψψᵀ, so p = 0 and nothing of size
    `[N, M, M]` is formed.
    """
    mu = tf.convert_to_tensor(mu, layer.dtype)
    if var is None:
        return _deterministic_terms(layer, mu)
    var = tf.convert_to_tensor(var, layer.dtype)
    psi0, psi1, phi, xi = psi_statistics(layer.kernel, mu, var, layer.inducing_inputs)
    L = layer.kzz_cholesky()  # [M, M]
    phi_w = _solve_both_sides(L, phi)  # L⁻¹ Φ L⁻ᵀ [N, M, M]
    _, b = projections(psi1, L, layer.whiten)  # (L⁻¹ ψ)ᵀ whitened, (K⁻¹ ψ)ᵀ otherwise [N, M]
    compression = psi0 - tf.linalg.trace(phi_w)  # [N]
    if layer.whiten:
        G = phi_w
    else:  # P = K⁻¹ = L⁻ᵀ L⁻¹
        Lb = tf.broadcast_to(tf.linalg.matrix_transpose(L), tf.shape(phi_w))
        left = tf.linalg.triangular_solve(Lb, phi_w, lower=False)  # L⁻ᵀ Φ_w
        G = tf.linalg.matrix_transpose(tf.linalg.triangular_solve(Lb, tf.linalg.matrix_transpose(left), lower=False))
    q_mu = layer.q.q_mu[0]  # [M, P]
    q_sqrt = tf.convert_to_tensor(layer.q.q_sqrt)[0]  # [P, M, M] or [M, P]
    mean = tf.linalg.matmul(b, q_mu)  # [N, P]
    mGm = tf.einsum("mp,nmk,kp->np", q_mu, G, q_mu)
    if q_sqrt.shape.rank == 3:
        S = tf.linalg.matmul(q_sqrt, q_sqrt, transpose_b=True)  # [P, M, M]
        trGS = tf.einsum("nmk,pmk->np", G, S)
        bSb = tf.einsum("nm,pmk,nk->np", b, S, b)
    else:
        s2 = q_sqrt**2  # [M, P]
        trGS = tf.linalg.matmul(tf.linalg.diag_part(G), s2)
        bSb = tf.linalg.matmul(b**2, s2)
    propagation = mGm + trGS - mean**2 - bSb
    if layer.mean_weights is not None:
        W = tf.convert_to_tensor(layer.mean_weights)  # [D, P]
        mean = mean + tf.linalg.matmul(mu, W)
        propagation += tf.linalg.matmul(var, W**2)
        C = tf.einsum("nmd,dp->npm", xi - psi1[..., None] * mu[:, None, :], W)  # ((Ξ − ψ μᵀ) W)ᵀ [N, P, M]
        _, PC = projections(C, L, layer.whiten)  # (P C)ᵀ: L⁻¹ C whitened, K⁻¹ C otherwise
        propagation += 2.0 * tf.einsum("mp,npm->np", q_mu, PC)
    P = tf.shape(mean)[1]
    return mean, bSb, propagation, tf.tile(compression[:, None], [1, P])


def _deterministic_terms(layer, X):
    """`layer_terms` at known inputs `X [N, D]`: mean A m + X W, bᵀSb = A S Aᵀ, p = 0, c = diag K̃."""
    L = layer.kzz_cholesky()
    a_w, b = projections(layer.kernel.K(X, layer.inducing_inputs), L, layer.whiten)  # [N, M] each
    q_mu = layer.q.q_mu[0]
    q_sqrt = tf.convert_to_tensor(layer.q.q_sqrt)[0]
    mean = tf.linalg.matmul(b, q_mu) + layer.mean_function(X)
    if q_sqrt.shape.rank == 3:
        bSb = tf.transpose(tf.reduce_sum(tf.einsum("nm,pmk->pnk", b, q_sqrt) ** 2, -1))  # [N, P]
    else:
        bSb = tf.linalg.matmul(b**2, q_sqrt**2)
    compression = layer.kernel.K_diag(X) - tf.reduce_sum(a_w**2, -1)  # [N]
    return mean, bSb, tf.zeros_like(mean), tf.tile(compression[:, None], [1, tf.shape(mean)[1]])


def nested_terms(model, X):
    """Forward pass of Gaussian messages: per-layer (mean, bᵀSb, propagation, compression) `[N, P_i]` lists."""
    mu = tf.convert_to_tensor(X, model.dtype)
    var = None  # h_0 = X is known
    out = []
    for i, layer in enumerate(model.layers):
        mean, bSb, prop, comp = layer_terms(layer, mu, var)
        out.append((mean, bSb, prop, comp))
        if i < len(model.layers) - 1:
            mu, var = mean, tf.convert_to_tensor(layer.noise_variance) + bSb
    return out


def nested_elbo(model, batch):
    """The nested variational compression bound (Hensman & Lawrence eq. 19, corrected as in the module
    docstring) → scalar."""
    X, Y = batch
    terms = nested_terms(model, X)
    total = tf.zeros([], model.dtype)
    for layer, (_, _, prop, comp) in zip(model.layers[:-1], terms[:-1]):
        total -= tf.reduce_sum(prop + comp) / (2.0 * tf.convert_to_tensor(layer.noise_variance))
    mean, bSb, prop, comp = terms[-1]
    noise = tf.convert_to_tensor(model.likelihood.variance)
    Y = tf.convert_to_tensor(Y, model.dtype)
    fit = tfd.Normal(mean, tf.sqrt(noise)).log_prob(Y)
    total += tf.reduce_sum(fit) - tf.reduce_sum(bSb + prop + comp) / (2.0 * noise)
    return model._scale(tf.shape(X)[0]) * total - model.kl()


def nested_predict_f(model, X):
    """Moment-matched Gaussian q(f_L) at `X` from the messages → (mean `[N, P]`, var `[N, P]`):
    var = bᵀSb + propagation + compression (law of total variance under the nested approximation)."""
    mean, bSb, prop, comp = nested_terms(model, X)[-1]
    return mean, bSb + prop + comp
