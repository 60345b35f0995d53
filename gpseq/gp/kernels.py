"""Kernels on dense inputs and on padded sparse rows (gather-and-sum, XLA-compilable).

Inputs are either dense tensors `[..., N, D]` or `gpseq.features.padded.PaddedRows`
(`indices [..., N, F]` int32, `values [..., N, F]`, padding slots index 0 / value 0). Inducing
inputs Z are always dense `[M, D]` (K-means centroids). Sparse inner products:

    x · z = Σ_k v_k z[i_k]                      (gather of Zᵀ [D, M] → [..., N, F, M], weighted sum)
    x · x' = Σ_{k,l} v_k v'_l [i_k == i'_l]     (index matching, never densified)

Stationary kernels are isotropic on sparse inputs (‖x − z‖² = ‖x‖² + ‖z‖² − 2 x·z) and may be
ARD on dense ones. Hyperparameters are `tfp.util.TransformedVariable`s (Softplus).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from gpseq._tfp import tfp

from gpseq.errors import ConfigError
from gpseq.features.padded import PaddedRows


def positive(value, dtype, name: str, trainable: bool = True):
    """A positive learnable hyperparameter: `TransformedVariable` with a Softplus bijector."""
    return tfp.util.TransformedVariable(
        tf.constant(value, dtype), tfp.bijectors.Softplus(), name=name, trainable=trainable
    )


def _as_rows(X, dtype):
    return PaddedRows(tf.convert_to_tensor(X.indices, tf.int32), tf.convert_to_tensor(X.values, dtype))


# ---- sparse inner products ------------------------------------------------------------------------
def sparse_dense_inner(rows: PaddedRows, Z):
    """x · z for padded rows `[..., N, F]` and dense `Z [M, D]` → `[..., N, M]` (gather of Zᵀ)."""
    table = tf.transpose(Z)  # [D, M]
    return tf.einsum("...f,...fm->...m", rows.values, tf.gather(table, rows.indices))


def sparse_sq_norm(rows: PaddedRows):
    """‖x‖² of padded rows `[..., N, F]` → `[..., N]`, exact even with repeated indices in a row."""
    match = tf.cast(tf.equal(rows.indices[..., :, None], rows.indices[..., None, :]), rows.values.dtype)
    return tf.einsum("...k,...kl,...l->...", rows.values, match, rows.values)


def sparse_sparse_inner(X: PaddedRows, Y: PaddedRows):
    """x · y for padded rows `X [N, F]`, `Y [M, G]` → `[N, M]` by index matching (O(N M F G) memory)."""
    match = tf.cast(tf.equal(X.indices[:, None, :, None], Y.indices[None, :, None, :]), X.values.dtype)
    return tf.einsum("nk,nmkl,ml->nm", X.values, match, Y.values)


def _index_runs(rows: PaddedRows):
    """The columns of each block's X_bᵀ and the column of each slot, for padded rows `[B, T, F]`.

    Within each block the T·F (index, token, value) triples are sorted by index (XLA sorts) and
    runs of equal index are summed into one column (`unsorted_segment_sum`). Returns columns
    `[B·T·F, T]` (row r: the values of run r's index at the block's T tokens; unused runs zero)
    and the run of each slot `[B, T, F]` (a row of the columns). O(B·T·F·T) memory.
    """
    indices, values = rows.indices, rows.values
    shape = tf.shape(indices)
    B, T, F = shape[0], shape[1], shape[2]
    n = T * F
    flat_idx = tf.reshape(indices, [B, n])  # [B, T·F]
    flat_val = tf.reshape(values, [B, n])
    token = tf.reshape(tf.tile(tf.range(T)[:, None], [1, F]), [n])  # [T·F]
    order = tf.argsort(flat_idx, axis=-1, stable=True)  # [B, T·F]
    idx_sorted = tf.gather(flat_idx, order, batch_dims=1)
    val_sorted = tf.gather(flat_val, order, batch_dims=1)
    tok_sorted = tf.gather(token, order)  # [B, T·F]
    starts = tf.concat([tf.ones([B, 1], tf.int32), tf.cast(idx_sorted[:, 1:] != idx_sorted[:, :-1], tf.int32)], 1)
    segment = tf.cumsum(starts, axis=1) - 1 + tf.range(B)[:, None] * n  # [B, T·F] global run id
    contrib = val_sorted[..., None] * tf.one_hot(tok_sorted, T, dtype=values.dtype)  # [B, T·F, T]
    columns = tf.math.unsorted_segment_sum(tf.reshape(contrib, [B * n, T]), tf.reshape(segment, [-1]), B * n)
    slot_run = tf.gather(segment, tf.argsort(order, axis=-1), batch_dims=1)  # back to slot order
    return columns, tf.reshape(slot_run, [B, T, F])


def sparse_gram_blocks(rows: PaddedRows):
    """Per-block Gram matrices X_b X_bᵀ of padded rows `[B, T, F]` → `[B, T, T]`.

    The product of each block's columns of X_bᵀ (`_index_runs`): O(B·T·F·T) memory instead of the
    O(B·T²·F²) of pairwise index matching. Padding (value 0) contributes nothing.
    """
    B, T = tf.shape(rows.indices)[0], tf.shape(rows.indices)[1]
    columns = tf.reshape(_index_runs(rows)[0], [B, T * tf.shape(rows.indices)[2], T])  # [B, runs, T]
    return tf.einsum("brt,brs->bts", columns, columns)


def sparse_weighted_gram_blocks(rows: PaddedRows, weights):
    """Per-block X_b diag(w_p) X_bᵀ for P weightings of the features → `[B, P, T, T]`.

    `rows [B, T, F]` padded; `weights [B, T, F, P]` the weight of each slot's index (equal for
    equal indices, e.g. gathered from a `[D, P]` table), so that entry (t, s) is
    Σ_f x_tf w_{tf,p} x_s[i_tf], the values of slot (t, f)'s index at token s read off its run.
    """
    columns, slot_run = _index_runs(rows)
    at_tokens = tf.gather(columns, slot_run)  # [B, T, F, T]: x_s[i_tf]
    return tf.einsum("btf,btfp,btfs->bpts", rows.values, weights, at_tokens)


def _flatten_blocks(rows: PaddedRows):
    """`[..., T, F]` rows → `[B, T, F]` and the leading shape to restore."""
    shape = tf.shape(rows.indices)
    lead = shape[:-2]
    T, F = shape[-2], shape[-1]
    flat = PaddedRows(tf.reshape(rows.indices, [-1, T, F]), tf.reshape(rows.values, [-1, T, F]))
    return flat, lead, T


# ---- kernels --------------------------------------------------------------------------------------
class Kernel(tf.Module):
    """Base class: `K(X, Z=None) [..., N, M]`, `K_diag(X) [..., N]`, `K_sparse_block(rows) [..., T, T]`."""

    def __init__(self, dtype=tf.float64, name=None):
        super().__init__(name=name)
        self.dtype = dtype

    def K(self, X, Z=None):
        raise NotImplementedError

    def K_diag(self, X):
        raise NotImplementedError

    def K_sparse_block(self, rows: PaddedRows):
        """κ(X_b, X_b) for each block of padded rows `[..., T, F]` → `[..., T, T]`
        (graybox-structured-gp eq. 18)."""
        rows = _as_rows(rows, self.dtype)
        flat, lead, T = _flatten_blocks(rows)
        out = self._from_gram_blocks(sparse_gram_blocks(flat))
        return tf.reshape(out, tf.concat([lead, [T, T]], 0))

    def _from_gram_blocks(self, gram):
        raise NotImplementedError

    def __add__(self, other):
        return Sum([self, other])

    def __mul__(self, other):
        return Product([self, other])


class Linear(Kernel):
    """κ(x, z) = σ² x·z (dense or sparse inputs)."""

    def __init__(self, variance=1.0, dtype=tf.float64, name="linear"):
        super().__init__(dtype, name)
        self.variance = positive(variance, dtype, "variance")

    def _inner(self, X, Z):
        if isinstance(X, PaddedRows):
            X = _as_rows(X, self.dtype)
            if Z is None:
                return sparse_sparse_inner(X, X)
            if isinstance(Z, PaddedRows):
                return sparse_sparse_inner(X, _as_rows(Z, self.dtype))
            return sparse_dense_inner(X, tf.convert_to_tensor(Z, self.dtype))
        X = tf.convert_to_tensor(X, self.dtype)
        Z = X if Z is None else tf.convert_to_tensor(Z, self.dtype)
        return tf.linalg.matmul(X, Z, transpose_b=True)

    def K(self, X, Z=None):  # [..., N, M]
        return tf.convert_to_tensor(self.variance) * self._inner(X, Z)

    def K_diag(self, X):  # [..., N]
        if isinstance(X, PaddedRows):
            norm = sparse_sq_norm(_as_rows(X, self.dtype))
        else:
            norm = tf.reduce_sum(tf.convert_to_tensor(X, self.dtype) ** 2, -1)
        return tf.convert_to_tensor(self.variance) * norm

    def _from_gram_blocks(self, gram):
        return tf.convert_to_tensor(self.variance) * gram


class Stationary(Kernel):
    """σ² k(r), r = ‖x − z‖ / ℓ; ARD lengthscales on dense inputs only."""

    def __init__(self, variance=1.0, lengthscales=1.0, ard: bool = False, dtype=tf.float64, name=None):
        super().__init__(dtype, name)
        self.variance = positive(variance, dtype, "variance")
        lengthscales = np.asarray(lengthscales, dtype=np.float64)
        if lengthscales.ndim > 0 and not ard:
            raise ConfigError("vector lengthscales need ard=True")
        self.ard = ard
        self.lengthscales = positive(lengthscales, dtype, "lengthscales")

    def _sq_dist_and_scale(self, X, Z):
        """(d, c) with ‖x − z‖² / ℓ² = c · d `[..., N, M]`, d clipped at 0. Isotropic: d is the squared
        distance of the unscaled inputs and c = 1/ℓ² a scalar, so the lengthscale's gradient is one
        reduction over the matrix, not a pass back through the inner products, norms and clip (which
        are differentiated only when the inputs are, e.g. trained inducing inputs). ARD: the inputs
        are scaled and c is None."""
        if isinstance(X, PaddedRows):
            if self.ard:
                raise ConfigError("ARD lengthscales are not available on sparse inputs (use ard=False)")
            X = _as_rows(X, self.dtype)
            x_norm = sparse_sq_norm(X)
            if Z is None or isinstance(Z, PaddedRows):
                Y = X if Z is None else _as_rows(Z, self.dtype)
                cross = sparse_sparse_inner(X, Y)
                z_norm = sparse_sq_norm(Y)
            else:
                Z = tf.convert_to_tensor(Z, self.dtype)
                cross = sparse_dense_inner(X, Z)
                z_norm = tf.reduce_sum(Z**2, -1)
            sq = x_norm[..., :, None] + z_norm - 2.0 * cross
            return tf.nn.relu(sq), 1.0 / tf.convert_to_tensor(self.lengthscales) ** 2
        ls = tf.convert_to_tensor(self.lengthscales)
        X = tf.convert_to_tensor(X, self.dtype)
        Z = X if Z is None else tf.convert_to_tensor(Z, self.dtype)
        if self.ard:
            X, Z = X / ls, Z / ls
        sq = (
            tf.reduce_sum(X**2, -1)[..., :, None]
            + tf.reduce_sum(Z**2, -1)[..., None, :]
            + tf.linalg.matmul(-2.0 * X, Z, transpose_b=True)  # the −2 on [N, D], not [N, M] (exact either way)
        )
        # max(sq, 0), whose gradient is one op (tf.maximum's is a compare and a select)
        return tf.nn.relu(sq), None if self.ard else 1.0 / ls**2

    def K(self, X, Z=None):  # [..., N, M]
        return tf.convert_to_tensor(self.variance) * self._profile_scaled(*self._sq_dist_and_scale(X, Z))

    def _profile_scaled(self, sq, scale):
        """The profile at r² = scale · sq (scale None: r² = sq)."""
        return self._profile(sq if scale is None else sq * scale)

    def K_diag(self, X):  # [..., N]
        lead = tf.shape(X.indices)[:-1] if isinstance(X, PaddedRows) else tf.shape(X)[:-1]
        return tf.fill(lead, tf.convert_to_tensor(self.variance))

    def _from_gram_blocks(self, gram):
        norm = tf.linalg.diag_part(gram)
        sq = tf.nn.relu(norm[..., :, None] + norm[..., None, :] - 2.0 * gram)
        return tf.convert_to_tensor(self.variance) * self._profile(sq / tf.convert_to_tensor(self.lengthscales) ** 2)

    def _profile(self, r2):
        raise NotImplementedError


def _distance(r2):
    # sqrt has an infinite derivative at 0: floor r² (as GPflow does) so K(X, X) stays differentiable.
    return tf.sqrt(tf.maximum(r2, tf.cast(1e-36, r2.dtype)))


class RBF(Stationary):
    """Squared exponential σ² exp(−r²/2)."""

    def __init__(self, variance=1.0, lengthscales=1.0, ard: bool = False, dtype=tf.float64, name="rbf"):
        super().__init__(variance, lengthscales, ard, dtype, name)

    def _profile(self, r2):
        return tf.exp(-0.5 * r2)

    def _profile_scaled(self, sq, scale):  # exp(−½ · scale · sq): one product over the matrix
        return tf.exp(sq * (-0.5 * scale)) if scale is not None else self._profile(sq)


class Matern32(Stationary):
    """Matérn 3/2: σ² (1 + √3 r) exp(−√3 r)."""

    def __init__(self, variance=1.0, lengthscales=1.0, ard: bool = False, dtype=tf.float64, name="matern32"):
        super().__init__(variance, lengthscales, ard, dtype, name)

    def _profile(self, r2):
        r = np.sqrt(3.0) * _distance(r2)
        return (1.0 + r) * tf.exp(-r)


class Matern52(Stationary):
    """Matérn 5/2: σ² (1 + √5 r + 5 r²/3) exp(−√5 r)."""

    def __init__(self, variance=1.0, lengthscales=1.0, ard: bool = False, dtype=tf.float64, name="matern52"):
        super().__init__(variance, lengthscales, ard, dtype, name)

    def _profile(self, r2):
        r = np.sqrt(5.0) * _distance(r2)
        return (1.0 + r + r**2 / 3.0) * tf.exp(-r)


class _Combination(Kernel):
    def __init__(self, kernels, reduce, name):
        kernels = list(kernels)
        if not kernels:
            raise ConfigError("a kernel combination needs at least one kernel")
        super().__init__(kernels[0].dtype, name)
        self.kernels = kernels
        self._reduce = reduce

    def K(self, X, Z=None):  # [..., N, M]
        return self._reduce([k.K(X, Z) for k in self.kernels])

    def K_diag(self, X):  # [..., N]
        return self._reduce([k.K_diag(X) for k in self.kernels])

    def K_sparse_block(self, rows):  # [..., T, T]
        return self._reduce([k.K_sparse_block(rows) for k in self.kernels])


class Sum(_Combination):
    """κ = Σ_i κ_i."""

    def __init__(self, kernels, name="sum"):
        super().__init__(kernels, tf.math.add_n, name)


class Product(_Combination):
    """κ = Π_i κ_i (elementwise)."""

    def __init__(self, kernels, name="product"):
        super().__init__(kernels, lambda parts: tf.math.reduce_prod(tf.stack(parts), axis=0), name)
