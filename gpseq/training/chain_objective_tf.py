"""The corpus objective of the MAP fit in compiled TensorFlow (see `gpseq.training.chain_objective`
for the maths and the NumPy twin): unaries by one sparse product X W over all tokens, the chain by
the scaled forward–backward over length-sorted padded batches, ∂/∂W = Xᵀ (p − y) by one more
product, gradients and Fisher gathered on the support in the graph."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from gpseq.structured.scaled_chain import forward_backward
from gpseq.training.batching import SequenceData, token_batches
from gpseq.training.chain_objective import observed_pairs


class TensorFlowChainObjective:
    """Negative log-likelihood of a corpus under point potentials (b, W, P), its gradient and the
    Fisher diagonal: unaries by one sparse product X W over all tokens, the chain by scaled
    forward–backward over length-sorted padded batches, ∂/∂W = Xᵀ (p − y) by one more product."""

    def __init__(self, data: SequenceData, num_labels: int, *, dtype="float32", max_tokens: int = 16384):
        self.num_labels, self.num_features = int(num_labels), int(data.rows.shape[1])
        self.dtype = dtype = tf.as_dtype(dtype)
        rows = data.rows.tocoo()
        n_tokens = rows.shape[0]
        order = np.lexsort((rows.col, rows.row))
        indices = np.stack([rows.row[order], rows.col[order]], 1).astype(np.int64)
        self.features = tf.sparse.SparseTensor(indices, tf.constant(rows.data[order], dtype), rows.shape)
        self.features_squared = tf.sparse.map_values(tf.square, self.features)
        self.n_tokens = n_tokens
        self.batches = []
        for ids in token_batches(data.lengths, max_tokens):
            lengths = data.lengths[ids].astype(np.int32)
            T = int(lengths.max())
            position = np.full((len(ids), T), n_tokens, dtype=np.int32)  # n_tokens = a zero row
            steps = np.arange(T)[None, :]
            valid = steps < lengths[:, None]
            position[valid] = (data.offsets[ids][:, None] + steps)[valid]
            labels = np.zeros((len(ids), T), dtype=np.int32)
            labels[valid] = data.label_ids[position[valid]]
            self.batches.append(tuple(tf.constant(a) for a in (position, labels, lengths)))
        self._support = tf.constant(observed_pairs(data, num_labels))  # [P] flat ids into [D, V]

        def value_and_grad_support(b, w_support, p):
            nll, g_b, g_w, g_p = self._corpus_value_and_grad(b, self._dense(w_support), p)
            return nll, g_b, self._on_support(g_w), g_p

        def fisher_support(b, w_support, p):
            f_b, f_w, f_p = self._corpus_fisher(b, self._dense(w_support), p)
            return f_b, self._on_support(f_w), f_p

        self._value_and_grad_support = tf.function(value_and_grad_support, autograph=False)
        self._fisher_support = tf.function(fisher_support, autograph=False)

    @property
    def support(self) -> np.ndarray:
        return self._support.numpy()

    def _per_batch(self, bias, weights, pairwise):
        """Yields (position [B, T], labels, lengths, marginals [B, T, V], Σξ [V, V], log Z [B], unary)."""
        V = self.num_labels
        unary_flat = tf.sparse.sparse_dense_matmul(self.features, weights) + bias  # [N, V]
        unary_flat = tf.concat([unary_flat, tf.zeros([1, V], unary_flat.dtype)], 0)
        for position, labels, lengths in self.batches:
            unary = tf.gather(unary_flat, position)  # [B, T, V]
            marg, pair_sum, log_z = forward_backward(unary, pairwise, lengths)
            yield position, labels, lengths, marg, pair_sum, log_z, unary

    def _corpus_value_and_grad(self, bias, weights, pairwise):
        V = self.num_labels
        nll = tf.zeros([], tf.float64)
        g_pair = tf.zeros_like(pairwise)
        resid_parts, position_parts = [], []
        for position, labels, lengths, marg, pair_sum, log_z, unary in self._per_batch(bias, weights, pairwise):
            mask = tf.cast(tf.sequence_mask(lengths, tf.shape(labels)[1]), weights.dtype)
            onehot = tf.one_hot(labels, V, dtype=weights.dtype) * mask[..., None]
            transitions = tf.einsum("bti,btj->ij", onehot[:, :-1], onehot[:, 1:])
            score = tf.reduce_sum(unary * onehot) + tf.reduce_sum(transitions * pairwise)
            nll += tf.reduce_sum(tf.cast(log_z, tf.float64)) - tf.cast(score, tf.float64)
            g_pair += pair_sum - transitions
            resid_parts.append(tf.reshape(marg - onehot, [-1, V]))
            position_parts.append(tf.reshape(position, [-1]))
        resid = tf.math.unsorted_segment_sum(tf.concat(resid_parts, 0), tf.concat(position_parts, 0),
                                             self.n_tokens + 1)[:-1]  # [N, V]
        g_w = tf.sparse.sparse_dense_matmul(self.features, resid, adjoint_a=True)  # [D, V]
        return nll, tf.reduce_sum(resid, 0), g_w, g_pair

    def _corpus_fisher(self, bias, weights, pairwise):
        V = self.num_labels
        f_pair = tf.zeros_like(pairwise)
        parts, position_parts = [], []
        for position, labels, lengths, marg, pair_sum, log_z, unary in self._per_batch(bias, weights, pairwise):
            parts.append(tf.reshape(marg * (1.0 - marg), [-1, V]))
            position_parts.append(tf.reshape(position, [-1]))
            f_pair += pair_sum  # Σ_t ξ_t ≥ Σ_t ξ_t (1 − ξ_t): transitions are seen thousands of times
        curvature = tf.math.unsorted_segment_sum(tf.concat(parts, 0), tf.concat(position_parts, 0),
                                                 self.n_tokens + 1)[:-1]
        f_w = tf.sparse.sparse_dense_matmul(self.features_squared, curvature, adjoint_a=True)
        return tf.reduce_sum(curvature, 0), f_w, f_pair

    def _dense(self, w_support):
        """The weights `[D, V]` from their values on the support (0 elsewhere), in the graph."""
        D, V = self.num_features, self.num_labels
        return tf.reshape(tf.scatter_nd(self._support[:, None], w_support, [D * V]), [D, V])

    def _on_support(self, matrix):
        return tf.gather(tf.reshape(matrix, [-1]), self._support)

    def _arguments(self, b, w_support, p):
        dtype = self.dtype.as_numpy_dtype
        return tuple(tf.constant(np.asarray(a, dtype)) for a in (b, w_support, p))

    def value_and_grad(self, b, w_support, p):
        """(−log-likelihood, ∂/∂b [V], ∂/∂w on the support [P], ∂/∂P [V, V]) at the given potentials."""
        nll, g_b, g_w, g_p = self._value_and_grad_support(*self._arguments(b, w_support, p))
        return float(nll), *(t.numpy().astype(np.float64) for t in (g_b, g_w, g_p))

    def fisher(self, b, w_support, p):
        """Fisher diagonals of (b [V], w on the support [P], P [V, V]) at the given potentials."""
        return tuple(t.numpy().astype(np.float64) for t in self._fisher_support(*self._arguments(b, w_support, p)))
