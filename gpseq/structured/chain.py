"""Linear-chain CRF algorithms in log space: the structured softmax of the paper's eq. 1
(design notes `graybox-structured-gp.md`).

For one sequence of length L with unary potentials u_t(j) and pairwise potentials W(i, j),

    log p(y) = Σ_{t<L} u_t(y_t) + Σ_{t<L-1} W(y_t, y_{t+1}) − log Z,

log Z by the forward algorithm. Every public function works on padded batches:

- ``unary``    `[..., B, T, V]`: leading sample dimensions allowed (e.g. `[K, S, B, T, V]`);
- ``pairwise`` broadcastable to `[..., B, V, V]` by NumPy rules: `[V, V]` shared by everything,
  `[B, V, V]` one matrix per sequence, `[S, 1, V, V]` one per sample (note the explicit 1 for
  the batch axis: `[S, V, V]` would be read as `[B, V, V]`);
- ``lengths``  `[B]` int32, 0 ≤ L ≤ T; ``labels`` `[B, T]` int32, padded entries ignored (any value).

Results are `[..., B]` with ``...`` the broadcast of the leading dimensions of ``unary`` and
``pairwise``. Padding never reaches a result or a gradient: padded unaries are replaced by zeros
before use (gradients to them are exactly zero), and no −inf is ever formed.

The forward recursion α_t = u_t + log(exp(α_{t-1}) · exp(W)) runs as a max-shifted matrix
product (one GEMM per step for the whole batch); a step whose sum underflows (potential gaps of
≳ 680 nats in float64, ≳ 68 in float32) is recomputed by a broadcast log-sum-exp
(`log_semiring.py`), so potentials of ±1e3 stay exact. ``method="parallel"`` computes the same
forward messages by a parallel prefix (`tfp.math.scan_associative`) over log-semiring matrix
products, O(log T) depth.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from gpseq._tfp import tfp

from gpseq.errors import ConfigError
from gpseq.structured.log_semiring import fast_log_matmul_exp, forward_scan, log_matmul_exp, underflow_bound

METHODS = ("scan", "parallel")
PSEUDO_FORMS = ("pwpl", "piecewise")

__all__ = [
    "METHODS",
    "PSEUDO_FORMS",
    "log_partition",
    "log_likelihood",
    "sequence_score",
    "marginals",
    "unary_marginals",
    "viterbi",
    "pseudo_log_likelihood",
]


# ---- canonical grouped layout -----------------------------------------------------------------
class _Layout:
    """Batch bookkeeping: public `[..., B, ...]` tensors ↔ core `[G, M, ...]` tensors.

    The core algorithms see unary `[G, M, T, V]`, pairwise `[G, V, V]`, lengths `[G, M]`: G
    groups that share one pairwise matrix, M sequences per group. A fully shared pairwise gives
    G = 1 (one GEMM per step for all sequences and samples); per-sample pairwise `[S, 1, V, V]`
    gives G = S, M = B; per-sequence pairwise gives G = S·B, M = 1.
    """

    def __init__(self, unary, pairwise, lengths):
        unary = tf.convert_to_tensor(unary)
        pairwise = tf.convert_to_tensor(pairwise, dtype=unary.dtype)
        if unary.shape.rank is None or unary.shape.rank < 3:
            raise ConfigError(f"unary potentials must be [..., B, T, V], got shape {unary.shape}")
        if pairwise.shape.rank is None or pairwise.shape.rank < 2:
            raise ConfigError(f"pairwise potentials must be [..., V, V], got shape {pairwise.shape}")
        num_labels = unary.shape[-1]
        if num_labels is not None and pairwise.shape[-1] is not None and (
            pairwise.shape[-1] != num_labels or pairwise.shape[-2] != num_labels
        ):
            raise ConfigError(f"pairwise {pairwise.shape} does not match {num_labels} labels")
        rank = max(unary.shape.rank, pairwise.shape.rank)
        unary = tf.reshape(unary, [1] * (rank - unary.shape.rank) + _dims(unary))
        pairwise = tf.reshape(pairwise, [1] * (rank - pairwise.shape.rank) + _dims(pairwise))
        self.dtype = unary.dtype
        self.num_labels = tf.shape(unary)[-1]
        # at least two time steps (padding, masked by the lengths): every algorithm has a first
        # message, and the scans over steps 1..T-1 are never empty (an empty tf.scan with a
        # dynamic element shape fails at run time inside a tf.function)
        self.given_steps = tf.shape(unary)[-2]
        extra = tf.maximum(2 - self.given_steps, 0)
        unary = tf.pad(unary, tf.concat([tf.zeros([rank - 2, 2], tf.int32), [[0, extra], [0, 0]]], 0))
        self.num_steps = tf.shape(unary)[-2]
        lead_unary, lead_pair = tf.shape(unary)[:-3], tf.shape(pairwise)[:-3]
        self.lead_shape = tf.broadcast_dynamic_shape(lead_unary, lead_pair)  # [...]
        self.batch_size = tf.shape(unary)[-3]
        self.batch_shape = tf.concat([self.lead_shape, [self.batch_size]], 0)  # [..., B]
        self.pairwise_per_sequence = pairwise.shape[-3] != 1
        self.pairwise_shared = (not self.pairwise_per_sequence) and all(
            d == 1 for d in pairwise.shape[:-3]
        )
        if self.pairwise_shared:
            groups, per_group = 1, -1
        elif self.pairwise_per_sequence:
            groups, per_group = -1, 1
        else:
            groups, per_group = tf.reduce_prod(self.lead_shape), self.batch_size
        self.groups, self.per_group = groups, per_group
        full_unary = tf.broadcast_to(
            unary, tf.concat([self.batch_shape, tf.shape(unary)[-2:]], 0)
        )
        self.unary = tf.reshape(full_unary, [groups, per_group, self.num_steps, self.num_labels])
        if self.pairwise_shared:
            self.pairwise = tf.reshape(pairwise, [1, self.num_labels, self.num_labels])
        elif self.pairwise_per_sequence:
            full = tf.broadcast_to(pairwise, tf.concat([self.batch_shape, tf.shape(pairwise)[-2:]], 0))
            self.pairwise = tf.reshape(full, [-1, self.num_labels, self.num_labels])
        else:
            full = tf.broadcast_to(
                pairwise[..., 0, :, :], tf.concat([self.lead_shape, tf.shape(pairwise)[-2:]], 0)
            )
            self.pairwise = tf.reshape(full, [-1, self.num_labels, self.num_labels])
        lengths = tf.convert_to_tensor(lengths, dtype=tf.int32)
        self.lengths = tf.reshape(tf.broadcast_to(lengths, self.batch_shape), [groups, per_group])
        self.mask = tf.sequence_mask(self.lengths, self.num_steps)  # [G, M, T]
        # padded unaries become finite zeros: nothing downstream can see (or send gradient to) them
        self.unary = tf.where(self.mask[..., None], self.unary, tf.zeros_like(self.unary))

    def labels(self, labels):
        """`[B, T]` (or broadcastable to `[..., B, T]`) → `[G, M, T]`, padded entries set to 0."""
        labels = tf.convert_to_tensor(labels, dtype=tf.int32)
        extra = self.num_steps - tf.shape(labels)[-1]
        labels = tf.pad(labels, tf.concat([tf.zeros([labels.shape.rank - 1, 2], tf.int32), [[0, extra]]], 0))
        full = tf.broadcast_to(labels, tf.concat([self.batch_shape, [self.num_steps]], 0))
        labels = tf.reshape(full, [self.groups, self.per_group, self.num_steps])
        return tf.where(self.mask, labels, tf.zeros_like(labels))

    def out(self, core, event_rank: int = 0, time_offset: int = 0):
        """`[G, M, *event]` → `[..., B, *event]`; a time axis (the first event axis) is cut back to
        the given T − time_offset entries."""
        if event_rank:
            core = core[:, :, : tf.maximum(self.given_steps - time_offset, 0)]
            event = tf.shape(core)[2:]
        else:
            event = tf.zeros([0], tf.int32)
        return tf.reshape(core, tf.concat([self.batch_shape, event], 0))


def _dims(tensor):
    return [d if d is not None else tf.shape(tensor)[i] for i, d in enumerate(tensor.shape)]


# ---- forward messages (core layout) -----------------------------------------------------------
def _forward_messages(unary, pairwise, method: str):
    """Forward messages α `[T, G, M, V]` (time-major) of unary `[G, M, T, V]`, pairwise `[G, V, V]`.

    α_0 = u_0, α_t = u_t + log Σ_i exp(α_{t-1}(i) + W(i, ·)). Positions past a sequence's end hold
    values that callers never read (they gather at L − 1 or mask). The whole pass first runs with
    plain max-shifted matmuls (autodiff through them is cheap); only if some product underflowed
    anywhere is it redone with the exact-for-any-input `log_matmul_exp`.
    """
    if method not in METHODS:
        raise ConfigError(f"unknown chain method {method!r}; expected one of {METHODS}")
    unary_tm = tf.transpose(unary, [2, 0, 1, 3])  # [T, G, M, V]
    bound = underflow_bound(unary.dtype, unary.shape[-1] or 1)
    big = tf.constant(np.finfo(unary.dtype.as_numpy_dtype).max, unary.dtype)
    if method == "scan":
        return forward_scan(unary_tm, pairwise)
    # parallel prefix: element t is the matrix W(i, j) + u_t(j) (for t = 0 every row is u_0, so
    # every row of the prefix product is α_t)
    first = tf.broadcast_to(
        unary_tm[0][..., None, :], tf.concat([tf.shape(unary_tm)[1:], tf.shape(unary_tm)[-1:]], 0)
    )
    rest = pairwise[None, :, None] + unary_tm[1:, ..., None, :]  # [T-1, G, M, V, V]
    elements = tf.concat([first[None], rest], axis=0)  # [T, G, M, V, V]

    def fast_combine(x, y):
        (left, left_least), (right, right_least) = x, y
        product, least = fast_log_matmul_exp(left, right)
        # per-element running minimum keeps the combine associative and batch-shaped
        least = tf.minimum(tf.minimum(left_least, right_least), least)
        return product, least

    least0 = tf.fill(tf.shape(elements)[:1], big)
    fast, least = tfp.math.scan_associative(fast_combine, (elements, least0))
    prefix = tf.cond(
        tf.reduce_min(least) >= bound,
        lambda: fast,
        lambda: tfp.math.scan_associative(log_matmul_exp, elements),
    )
    return prefix[..., 0, :]


def _at_last(messages, lengths):
    """Messages `[T, G, M, V]` at position L − 1 of each sequence → `[G, M, V]` (zeros when L = 0)."""
    num_steps = tf.shape(messages)[0]
    pick = tf.one_hot(lengths - 1, num_steps, dtype=messages.dtype)  # [G, M, T]; all 0 when L = 0
    return tf.einsum("gmt,tgmv->gmv", pick, messages)


def _log_partition_core(layout, method):
    alphas = _forward_messages(layout.unary, layout.pairwise, method)
    log_z = tf.reduce_logsumexp(_at_last(alphas, layout.lengths), axis=-1)  # [G, M]
    return tf.where(layout.lengths > 0, log_z, tf.zeros_like(log_z)), alphas


def _reverse(tensor, lengths, seq_axis: int):
    """Reverse the first L entries of each sequence along seq_axis; tensor is `[G, M, ...]`-batched
    (time-major `[T, G, M, ...]` when seq_axis is 0)."""
    shape = tf.shape(tensor)
    if seq_axis == 0:
        flat = tf.reshape(tensor, tf.concat([shape[:1], [-1], shape[3:]], 0))
        out = tf.reverse_sequence(flat, tf.reshape(lengths, [-1]), seq_axis=0, batch_axis=1)
    else:
        flat = tf.reshape(tensor, tf.concat([[-1], shape[2:]], 0))
        out = tf.reverse_sequence(flat, tf.reshape(lengths, [-1]), seq_axis=seq_axis - 1, batch_axis=0)
    return tf.reshape(out, shape)


def _messages_both_ways(layout, method):
    """log Z `[G, M]`, α `[T, G, M, V]` and γ = u + β `[T, G, M, V]` (β the backward messages).

    γ is the forward message of the reversed chain (transposed W), reversed back per sequence.
    """
    log_z, alphas = _log_partition_core(layout, method)
    reversed_unary = _reverse(layout.unary, layout.lengths, seq_axis=2)
    transposed = tf.linalg.matrix_transpose(layout.pairwise)
    gammas = _reverse(_forward_messages(reversed_unary, transposed, method), layout.lengths, 0)
    return log_z, alphas, gammas


# ---- public API -------------------------------------------------------------------------------
def log_partition(unary, pairwise, lengths, *, method: str = "scan"):
    """log Z of each sequence by the forward algorithm (the paper's eq. 1 denominator).

    unary `[..., B, T, V]`, pairwise broadcastable to `[..., B, V, V]`, lengths `[B]` → `[..., B]`.
    method "scan" (sequential) or "parallel" (parallel prefix); both give the same values.
    """
    layout = _Layout(unary, pairwise, lengths)
    return layout.out(_log_partition_core(layout, method)[0])


def _score_core(layout, labels):
    """Gold path score `[G, M]`: Σ_t u_t(y_t) + Σ_t W(y_t, y_{t+1}) over the valid positions."""
    num_labels = layout.num_labels
    picked = tf.one_hot(labels, num_labels, dtype=layout.dtype)  # [G, M, T, V]
    unary_score = tf.reduce_sum(picked * layout.unary, axis=[-2, -1])
    return unary_score + tf.reduce_sum(_transition_counts(layout, labels) * _flat(layout.pairwise)[:, None], -1)


def _transition_counts(layout, labels):
    """How often each (y_t, y_{t+1}) occurs in the valid part of each sequence: `[G, M, V·V]`."""
    num_labels = layout.num_labels
    pair_ids = labels[..., :-1] * num_labels + labels[..., 1:]  # [G, M, T-1]
    edge_mask = tf.cast(layout.mask[..., 1:], layout.dtype)
    return tf.einsum("gmt,gmtk->gmk", edge_mask, tf.one_hot(pair_ids, num_labels * num_labels, dtype=layout.dtype))


def _flat(matrices):
    """`[G, V, V]` → `[G, V·V]` (row-major, matching pair id i·V + j)."""
    return tf.reshape(matrices, [tf.shape(matrices)[0], -1])


def sequence_score(labels, unary, pairwise, lengths):
    """Unnormalised log-score of the labelled paths (the paper's eq. 1 numerator), `[..., B]`.

    labels `[B, T]`, unary `[..., B, T, V]`, pairwise broadcastable to `[..., B, V, V]`, lengths `[B]`.
    """
    layout = _Layout(unary, pairwise, lengths)
    return layout.out(_score_core(layout, layout.labels(labels)))


def log_likelihood(labels, unary, pairwise, lengths, *, method: str = "scan"):
    """log p(y | f) = score(y) − log Z (the paper's eq. 1), `[..., B]`.

    labels `[B, T]`, unary `[..., B, T, V]`, pairwise broadcastable to `[..., B, V, V]`, lengths `[B]`.
    """
    layout = _Layout(unary, pairwise, lengths)
    log_z = _log_partition_core(layout, method)[0]
    return layout.out(_score_core(layout, layout.labels(labels)) - log_z)


def _token_marginals(layout, log_z, alphas, gammas):
    """p(y_t = j | f) `[G, M, T, V]` (0 at padding) from log Z `[G, M]` and the forward and
    backward messages α, γ `[T, G, M, V]` (each including u_t)."""
    unary_tm = tf.transpose(layout.unary, [2, 0, 1, 3])
    log_marg = alphas + gammas - unary_tm - log_z[None, ..., None]  # [T, G, M, V]
    marg = tf.transpose(tf.exp(tf.minimum(log_marg, 0.0)), [1, 2, 0, 3])
    return tf.where(layout.mask[..., None], marg, tf.zeros_like(marg))


def unary_marginals(unary, pairwise, lengths, *, method: str = "scan", return_log_partition: bool = False):
    """Per-token posteriors p(y_t = j | f) `[..., B, T, V]` by forward–backward; padding is 0.

    unary `[..., B, T, V]`, pairwise broadcastable to `[..., B, V, V]`, lengths `[B]`. With
    `return_log_partition` also returns log Z `[..., B]` from the same forward pass.
    """
    layout = _Layout(unary, pairwise, lengths)
    log_z, alphas, gammas = _messages_both_ways(layout, method)
    marg = _token_marginals(layout, log_z, alphas, gammas)
    marg = layout.out(marg, event_rank=2)
    if return_log_partition:
        return marg, layout.out(tf.where(layout.lengths > 0, log_z, tf.zeros_like(log_z)))
    return marg


def marginals(unary, pairwise, lengths, *, method: str = "scan"):
    """Per-token `[..., B, T, V]` and adjacent-pair `[..., B, T-1, V, V]` posteriors (forward–backward).

    Pair marginal t is p(y_t = i, y_{t+1} = j | f); entries past a sequence's end are 0.
    unary `[..., B, T, V]`, pairwise broadcastable to `[..., B, V, V]`, lengths `[B]`.
    """
    layout = _Layout(unary, pairwise, lengths)
    log_z, alphas, gammas = _messages_both_ways(layout, method)
    marg = _token_marginals(layout, log_z, alphas, gammas)
    # ξ_t(i, j) = α_t(i) + W(i, j) + γ_{t+1}(j) − log Z
    alphas_bm = tf.transpose(alphas, [1, 2, 0, 3])[:, :, :-1]  # [G, M, T-1, V]
    gammas_bm = tf.transpose(gammas, [1, 2, 0, 3])[:, :, 1:]
    log_pair = (
        alphas_bm[..., :, None]
        + layout.pairwise[:, None, None]
        + gammas_bm[..., None, :]
        - log_z[..., None, None, None]
    )
    pair = tf.exp(tf.minimum(log_pair, 0.0))
    pair = tf.where(layout.mask[..., 1:, None, None], pair, tf.zeros_like(pair))
    return layout.out(marg, event_rank=2), layout.out(pair, event_rank=3, time_offset=1)


def viterbi(unary, pairwise, lengths):
    """Highest-scoring path `[..., B, T]` int32 (padding 0) and its score `[..., B]` (max-product).

    unary `[..., B, T, V]`, pairwise broadcastable to `[..., B, V, V]`, lengths `[B]`.
    """
    layout = _Layout(unary, pairwise, lengths)
    unary_tm = tf.transpose(layout.unary, [2, 0, 1, 3])  # [T, G, M, V]
    steps = tf.range(1, layout.num_steps)
    num_labels = layout.num_labels
    identity = tf.broadcast_to(tf.range(num_labels), tf.shape(unary_tm)[1:])

    def step(carry, inputs):
        delta, _ = carry
        unary_t, t = inputs
        scores = delta[..., :, None] + layout.pairwise[:, None]  # [G, M, V(prev), V(next)]
        best = tf.reduce_max(scores, axis=-2) + unary_t
        back = tf.argmax(scores, axis=-2, output_type=tf.int32)
        valid = (t < layout.lengths)[..., None]
        # past the end δ stays and the back-pointer is the identity, so the backtrack passes through
        return tf.where(valid, best, delta), tf.where(valid, back, identity)

    deltas, backs = tf.scan(step, (unary_tm[1:], steps), initializer=(unary_tm[0], identity))
    last_delta = tf.concat([unary_tm[:1], deltas], 0)[-1]  # [G, M, V]
    best_last = tf.argmax(last_delta, axis=-1, output_type=tf.int32)  # label at L − 1
    best_score = tf.reduce_max(last_delta, axis=-1)

    def backtrack(label, back_t):
        return tf.gather(back_t, label[..., None], batch_dims=2)[..., 0]

    # labels at positions T-1 … 1 are the carries before each back-pointer step; position 0 last
    earlier = tf.scan(backtrack, backs, initializer=best_last, reverse=True)  # [T-1]: y_0 … y_{T-2}
    path_tm = tf.concat([earlier, best_last[None]], axis=0)  # [T, G, M]
    path = tf.transpose(path_tm, [1, 2, 0])
    path = tf.where(layout.mask, path, tf.zeros_like(path))
    best_score = tf.where(layout.lengths > 0, best_score, tf.zeros_like(best_score))
    return layout.out(path, event_rank=1), layout.out(best_score)


def pseudo_log_likelihood(labels, unary, pairwise, lengths, *, form: str = "pwpl"):
    """Piecewise pseudo-log-likelihood (Sutton & McCallum 2007), the GP-VAR-P likelihood, `[..., B]`.

    The factor graph of the paper's eq. 1 has one unary factor per token and one pairwise factor per
    adjacent pair; each factor is its own piece, normalised locally using only its own potential:

    - unary piece t:        log softmax_j(u_t)(y_t)                        (both forms)
    - pair piece (t, t+1), ``form="pwpl"`` (piecewise pseudo-likelihood, the 2007 paper):
      log p(y_t | y_{t+1}) + log p(y_{t+1} | y_t), each conditional normalised over one variable
      of that factor only: W(y_t, y_{t+1}) − logsumexp_i W(i, y_{t+1}) and
      W(y_t, y_{t+1}) − logsumexp_j W(y_t, j);
    - ``form="piecewise"`` (piecewise training, Sutton & McCallum 2005): the pair is normalised
      jointly, W(y_t, y_{t+1}) − logsumexp_{i,j} W(i, j).

    A length-1 sequence gives the local softmax of its unary, a length-0 sequence 0.
    labels `[B, T]`, unary `[..., B, T, V]`, pairwise broadcastable to `[..., B, V, V]`, lengths `[B]`.
    """
    if form not in PSEUDO_FORMS:
        raise ConfigError(f"unknown pseudo-likelihood form {form!r}; expected one of {PSEUDO_FORMS}")
    layout = _Layout(unary, pairwise, lengths)
    labels = layout.labels(labels)
    local = tf.nn.log_softmax(layout.unary, axis=-1)  # [G, M, T, V]
    picked = tf.one_hot(labels, layout.num_labels, dtype=layout.dtype)
    token_mask = tf.cast(layout.mask, layout.dtype)[..., None]
    unary_terms = tf.reduce_sum(picked * local * token_mask, axis=[-2, -1])  # [G, M]
    pw = layout.pairwise  # [G, V, V]
    if form == "pwpl":
        edge = (pw - tf.reduce_logsumexp(pw, axis=-1, keepdims=True)) + (
            pw - tf.reduce_logsumexp(pw, axis=-2, keepdims=True)
        )
    else:
        edge = pw - tf.reduce_logsumexp(pw, axis=[-2, -1], keepdims=True)
    edge_terms = tf.reduce_sum(_transition_counts(layout, labels) * _flat(edge)[:, None], -1)
    return layout.out(unary_terms + edge_terms)
