"""q(f) = ∫ p(f | u) q(u) du at new inputs: marginals, and per-sequence blocks (eqs. 15–18 of
the paper, design notes `graybox-structured-gp.md`: equation numbers here are its own).

With L = chol(K_zz) and A = K_xz K_zz⁻¹ (eq. 17):
    mean = A m                                       (eq. 15)
    cov  = K̃ + A S Aᵀ,  K̃ = K_xx − A K_zx            (eqs. 16, 18)
Whitened (u = L v, q(v) = N(m, S)): A m → (K_xz L⁻ᵀ) m and A S Aᵀ → (K_xz L⁻ᵀ) S (K_xz L⁻ᵀ)ᵀ.
Covariance is only ever formed per sequence block `[T, T]`, never `[N, N]`.
One mixture component at a time: `q_mu [M, P]`, `q_sqrt [P, M, M]` (full) or `[M, P]` (diagonal).
"""

from __future__ import annotations

import tensorflow as tf

from gpseq.gp.linalg import safe_cholesky


def projections(Kxz, Kzz_chol, whiten: bool):
    """A_w = K_xz L⁻ᵀ (for K̃) and the projection applied to q(u): A_w whitened, A = K_xz K_zz⁻¹
    otherwise (eq. 17). `Kxz [..., N, M]`, `Kzz_chol [M, M]` → both `[..., N, M]`.
    """
    Kxz = tf.convert_to_tensor(Kxz)
    shape = tf.shape(Kxz)
    flat = tf.reshape(Kxz, [-1, shape[-1]])  # [N', M]
    a_w_t, proj_t = projections_from_kzx(tf.transpose(flat), Kzz_chol, whiten)  # [M, N'] each
    back = lambda t: tf.reshape(tf.transpose(t), shape)  # noqa: E731
    return back(a_w_t), back(proj_t)


def whitened_projection(Kxz, Kzz_chol):
    """K_xz L⁻ᵀ `[..., N, M]` for `Kxz [..., N, M]`, `Kzz_chol [M, M]` (the whitened A of eq. 17)."""
    return projections(Kxz, Kzz_chol, whiten=True)[0]


def conditional_noise(eps, a_w, mask, jitter, *, k_diag=None, k_block=None):
    """A draw of f − A u given u per sequence, N(0, K̃) with K̃ = K_xx − A_w A_wᵀ (eq. 18).

    `eps [..., B, T, P]` standard normal, `a_w [..., B, T, M]`, `mask [B, T]` (1 at real tokens).
    With `k_diag [..., B, T]` only the diagonal of K̃ is used (independent tokens); with
    `k_block [..., B, T, T]` the joint T × T block, padded tokens given an identity block so that
    its Cholesky factor exists. Returns `[..., B, T, P]`, zero at padded tokens.
    """
    if k_block is None:
        variance = tf.nn.relu(k_diag - tf.reduce_sum(a_w**2, -1)) * mask
        return eps * tf.sqrt(variance + jitter)[..., None]
    k_tilde = k_block - tf.linalg.matmul(a_w, a_w, transpose_b=True)
    k_tilde = k_tilde * mask[:, :, None] * mask[:, None, :] + tf.linalg.diag(1.0 - mask)
    return tf.linalg.matmul(safe_cholesky(k_tilde, jitter=jitter), eps) * mask[..., None]


def projections_from_kzx(Kzx, Kzz_chol, whiten: bool):
    """`projections` transposed, from `Kzx [M, N]`: L⁻¹ K_zx and the projection applied to q(u)
    (L⁻¹ K_zx whitened, K_zz⁻¹ K_zx otherwise) → both `[M, N]`."""
    Kzx = tf.convert_to_tensor(Kzx)
    Kzz_chol = tf.convert_to_tensor(Kzz_chol, Kzx.dtype)
    a_w_t = tf.linalg.triangular_solve(Kzz_chol, Kzx, lower=True)
    return a_w_t, a_w_t if whiten else tf.linalg.triangular_solve(Kzz_chol, a_w_t, lower=True, adjoint=True)


def marginals_from_kzx(Kzx, Kzz_chol, Kxx_diag, q_mu, q_sqrt, whiten: bool):
    """Marginal mean and variance of q(f) at N points → (`[N, P]`, `[N, P]`) (eqs. 15–16, diagonal),
    from the cross-covariance in the layout the solves take: `Kzx [M, N]` (no transposes).

    `Kzz_chol [M, M]`, `Kxx_diag [N]`, `q_mu [M, P]`, `q_sqrt [P, M, M]` or `[M, P]`.
    """
    return marginals_from_projections(*projections_from_kzx(Kzx, Kzz_chol, whiten), Kxx_diag, q_mu, q_sqrt)


def marginals_from_projections(a_w_t, proj_t, Kxx_diag, q_mu, q_sqrt):
    """Marginals of q(f) → (`[N, P]`, `[N, P]`) from `a_w_t` = L⁻¹ K_zx `[M, N]` (for K̃) and `proj_t`
    `[M, N]`, the projection applied to q(u) (`a_w_t` whitened, K_zz⁻¹ K_zx otherwise; eq. 17).
    The P latents' (B L_S) products are one `[N, M] × [M, P·M]` matmul.
    """
    q_mu, q_sqrt = tf.convert_to_tensor(q_mu, a_w_t.dtype), tf.convert_to_tensor(q_sqrt, a_w_t.dtype)
    mean = tf.linalg.matmul(proj_t, q_mu, transpose_a=True)  # [N, P]
    var = (Kxx_diag - tf.reduce_sum(a_w_t**2, 0))[:, None]  # [N, 1]: diag of K̃
    if q_sqrt.shape.rank == 3:
        num_latent, num_inducing = tf.shape(q_sqrt)[0], tf.shape(q_sqrt)[1]
        if q_sqrt.shape[0] != 1:  # one latent: the reshape alone (a transpose would copy)
            q_sqrt = tf.transpose(q_sqrt, [1, 0, 2])
        scales = tf.reshape(q_sqrt, [num_inducing, -1])  # [M, P·M]: [L_S1 … L_SP]
        projected = tf.linalg.matmul(proj_t, scales, transpose_a=True)  # [N, P·M]
        projected = tf.reshape(projected, [-1, num_latent, num_inducing])  # (B L_S) per latent [N, P, M]
        return mean, var + tf.reduce_sum(projected**2, -1)
    return mean, var + tf.linalg.matmul(proj_t**2, q_sqrt**2, transpose_a=True)


def conditional_marginals(Kxz, Kzz_chol, Kxx_diag, q_mu, q_sqrt, whiten: bool):
    """Marginal mean and variance of q(f) at N points → (`[N, P]`, `[N, P]`) (eqs. 15–16, diagonal).

    `Kxz [N, M]`, `Kzz_chol [M, M]`, `Kxx_diag [N]`, `q_mu [M, P]`, `q_sqrt [P, M, M]` or `[M, P]`
    (`marginals_from_kzx` takes K_zx and saves the transpose).
    """
    return marginals_from_kzx(tf.linalg.matrix_transpose(Kxz), Kzz_chol, Kxx_diag, q_mu, q_sqrt, whiten)


def conditional_blocks(Kxz, Kzz_chol, Kxx_blocks, q_mu, q_sqrt, whiten: bool):
    """Per-sequence mean and covariance of q(f) → (`[B, T, P]`, `[B, P, T, T]`) (eqs. 15–18).

    `Kxz [B, T, M]`, `Kzz_chol [M, M]`, `Kxx_blocks [B, T, T]` (e.g. `kernel.K_sparse_block`),
    `q_mu [M, P]`, `q_sqrt [P, M, M]` or `[M, P]`.
    """
    q_mu, q_sqrt = tf.convert_to_tensor(q_mu), tf.convert_to_tensor(q_sqrt)
    a_w, proj = projections(Kxz, Kzz_chol, whiten)  # [B, T, M]
    mean = tf.einsum("btm,mp->btp", proj, q_mu)
    k_tilde = Kxx_blocks - tf.linalg.matmul(a_w, a_w, transpose_b=True)  # [B, T, T]
    if q_sqrt.shape.rank == 3:
        projected = tf.einsum("btm,pmk->bptk", proj, q_sqrt)  # [B, P, T, M]
        cov = tf.linalg.matmul(projected, projected, transpose_b=True)
    else:
        cov = tf.einsum("btm,mp,bsm->bpts", proj, q_sqrt**2, proj)
    return mean, k_tilde[:, None] + cov


def mixture_marginals(Kxz, Kzz_chol, Kxx_diag, q_mu, q_sqrt, whiten: bool):
    """`conditional_marginals` for every mixture component: `q_mu [K, M, P]`, `q_sqrt [K, ...]`
    → (`[K, N, P]`, `[K, N, P]`)."""
    a_w_t, proj_t = projections_from_kzx(tf.linalg.matrix_transpose(Kxz), Kzz_chol, whiten)
    return mixture_marginals_from_projections(a_w_t, proj_t, Kxx_diag, q_mu, q_sqrt)


def mixture_marginals_from_projections(a_w_t, proj_t, Kxx_diag, q_mu, q_sqrt):
    """`marginals_from_projections` for every mixture component → (`[K, N, P]`, `[K, N, P]`)."""
    parts = [marginals_from_projections(a_w_t, proj_t, Kxx_diag, mu, sqrt) for mu, sqrt in components(q_mu, q_sqrt)]
    return tf.stack([m for m, _ in parts]), tf.stack([v for _, v in parts])


def components(*tensors):
    """Per mixture component `[K, ...]` → K tuples of `[...]` (K = 1 squeezed: its gradient is a reshape,
    not the strided slice's scatter into zeros)."""
    if tensors[0].shape[0] == 1:
        return [tuple(tf.squeeze(t, 0) for t in tensors)]
    return list(zip(*(tf.unstack(t) for t in tensors)))


def mixture_blocks(Kxz, Kzz_chol, Kxx_blocks, q_mu, q_sqrt, whiten: bool):
    """`conditional_blocks` for every mixture component → (`[K, B, T, P]`, `[K, B, P, T, T]`)."""
    parts = [conditional_blocks(Kxz, Kzz_chol, Kxx_blocks, mu, sqrt, whiten) for mu, sqrt in components(q_mu, q_sqrt)]
    return tf.stack([m for m, _ in parts]), tf.stack([c for _, c in parts])
