"""The linear chain in NumPy: the one forward–backward and the one (k-best) Viterbi that training,
prediction and the span probabilities run, in time-major order.

The default training (MAP + Laplace, `gpseq.training.laplace`) evaluates the chain at point
potentials hundreds of times over the same corpus, and tagging with the default model runs it on
every batch; neither needs sampling or autodiff, so both run without TensorFlow (no import, no
tracing). The TensorFlow chain (`chain.py`) serves SVI.

`TimeMajor` lays the tokens of a corpus out step by step: the sentences sorted by decreasing
length, then all first tokens, all second tokens, … At step t the sentences still running are a
prefix of that order, so step t is one contiguous slice of n_t rows and a step of the recursion
is one `[n_t, V] @ [V, V]` product with no padding and no masks. Messages are renormalised at
every step (CRFsuite's scaled formulation): exact up to float rounding. A step's mass z_t is at
least min exp(P − max P) (the unaries are shifted so that their best label has weight 1), so it
cannot underflow while the pairwise potentials span less than ≈ 80 nats (float32; 700 in float64).

Shapes: unary `[..., N, V]` in time-major token order (`layout.order` maps it from corpus order),
pairwise `[..., V, V]` (leading axes: several chains over the same sentences, one pairwise each),
log Z `[..., B]` in the layout's sentence order. A padded batch `[B, T, V]` (sentences of length 0
allowed) reaches the layout through `padded_layout`.

`constrained_forward_backward` is the same chain restricted to the label paths an allowed-label
mask `[N, V]` admits (one label at an annotated token, all of them at an unannotated one): the
partial-annotation likelihood log p(observed labels | x) = log Z_constrained − log Z. The loops
over steps call `check_cancelled` (`gpseq.cancellation`) every CHECK_STEPS steps.
"""

from __future__ import annotations

import numpy as np

from gpseq.cancellation import CHECK_STEPS, check_cancelled

HALVING_LABELS = 8  # `_row_max` halves rows of at most this many labels (measured: faster there, slower above)


class TimeMajor:
    """Time-major layout of sentences of `lengths [B]` (all ≥ 1) whose tokens are stored
    contiguously in corpus order from `offsets [B+1]`."""

    def __init__(self, offsets: np.ndarray):
        offsets = np.asarray(offsets, dtype=np.int64)
        lengths = np.diff(offsets)
        if len(lengths) and lengths.min() < 1:
            raise ValueError("every sentence needs at least one token")
        self.sentences = np.argsort(-lengths, kind="stable")  # layout sentence order → corpus sentence id
        self.lengths = lengths[self.sentences]
        steps = int(self.lengths[0]) if len(lengths) else 0
        # n_t = sentences longer than t; they are the first n_t of the layout order
        self.running = np.searchsorted(-self.lengths, -np.arange(steps), side="left").astype(np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.running)])  # step t = rows starts[t]:starts[t+1]
        # row r holds the token at position step[r] of sentence sentence_of[r] (layout order)
        step = np.repeat(np.arange(steps, dtype=np.int64), self.running)
        self.sentence_of = np.arange(int(self.starts[-1]), dtype=np.int64) - self.starts[step]
        self.order = offsets[self.sentences][self.sentence_of] + step  # time-major row → corpus token
        # each token with a successor (left) and that successor (right), both time-major: the
        # successor of row r sits running[t] rows further, in the next step
        following = np.append(self.running[1:], 0)
        self.left = np.flatnonzero(self.sentence_of < following[step]).astype(np.int64)
        self.right = self.left + self.running[step[self.left]]
        self._set_steps()

    _ARRAYS = ("sentences", "lengths", "running", "starts", "order", "left", "right", "sentence_of")

    def arrays(self) -> dict:
        """The layout's arrays by name (`from_arrays` restores the layout from them)."""
        return {name: getattr(self, name) for name in self._ARRAYS}

    @classmethod
    def from_arrays(cls, arrays: dict) -> "TimeMajor":
        layout = cls.__new__(cls)
        for name in cls._ARRAYS:
            setattr(layout, name, arrays[name])
        layout._set_steps()
        return layout

    def _set_steps(self) -> None:
        # step t ≥ 1 as plain ints: (t, first row of step t − 1, rows of step t): the recursions' loops
        # run once per step and position, and NumPy scalars or slice objects there cost more than the products
        starts = np.asarray(self.starts).tolist()
        self._steps = [(t, starts[t - 1], starts[t], starts[t + 1]) for t in range(1, len(starts) - 1)]
        # the forward pass's (t, rows of step t − 1 with a successor, rows of step t, their z) as slices, made once
        self._step_rows = [(t, slice(prev, prev + stop - start), slice(start, stop), slice(start, stop))
                           for t, prev, start, stop in self._steps]

    def slice(self, t: int) -> slice:
        return slice(int(self.starts[t]), int(self.starts[t + 1]))

    def _recursions(self, unary: np.ndarray, pairwise: np.ndarray):
        """The scaled forward and backward passes at `unary [..., N, V]` and `pairwise [..., V, V]`,
        renormalised at every step: α̂ `[..., N, V]` (α_t including e_t, each row summing to 1),
        β̂ `[..., N, V]` (α̂_t β̂_t is the marginal), log z_t + the unary shift `[..., N]` and the
        pairwise shift `[..., 1, 1]`. Sums over labels are products with a vector of ones (BLAS)."""
        emit, shift = _emissions(unary, consume=False)
        p_max = pairwise.max((-2, -1), keepdims=True)
        trans = np.exp(pairwise - p_max)
        trans_t = np.ascontiguousarray(np.swapaxes(trans, -1, -2))
        alpha, z = self._forward(emit, trans)
        beta = np.ones_like(emit)
        scaled = emit  # e_t / z_t, then × β̂_t (in place): the right factor of β̂_{t−1}
        scaled /= z[..., None]
        for t, prev, start, stop in reversed(self._steps):
            if t % CHECK_STEPS == 0:
                check_cancelled()
            here = scaled[..., start:stop, :]
            here *= beta[..., start:stop, :]
            np.matmul(here, trans_t, out=beta[..., prev : prev + stop - start, :])
        return alpha, beta, np.log(z) + shift[..., 0], p_max

    def _forward(self, emit: np.ndarray, trans: np.ndarray):
        """The scaled forward pass, renormalised at every step, at e = exp(unary − its row maximum)
        `[..., N, V]` and exp(P − max P) `[..., V, V]`: (α̂ `[..., N, V]`, z `[..., N]`). A 2-D chain
        (the training's and calibration's) runs on `np.dot` and plain slices, half `np.matmul`'s and
        Ellipsis indexing's call overhead with the same bits: a small corpus's steps are made of that
        overhead. Sums over labels are products with a vector of ones (BLAS)."""
        if emit.ndim == 2:
            product, steps = np.dot, self._step_rows
        else:
            product, every = np.matmul, slice(None)
            steps = [(t, (..., before, every), (..., rows, every), (..., rows))
                     for t, before, rows, _ in self._step_rows]
        ones = np.ones(emit.shape[-1], emit.dtype)
        alpha, z = np.empty_like(emit), np.empty(emit.shape[:-1], emit.dtype)
        first = self.slice(0)
        z[..., first] = emit[..., first, :] @ ones
        np.divide(emit[..., first, :], z[..., first, None], out=alpha[..., first, :])
        for t, before, rows, at in steps:
            if t % CHECK_STEPS == 0:
                check_cancelled()
            new = alpha[rows]
            product(alpha[before], trans, out=new)
            new *= emit[rows]
            z_t = product(new, ones, out=z[at])
            np.divide(new, z_t[..., None], out=new)
        return alpha, z

    def forward_backward(self, unary: np.ndarray, pairwise: np.ndarray, *, pairs: bool = True,
                         consume: bool = False):
        """Token marginals `[N, V]`, Σ over adjacent pairs of ξ_t(i, j) `[V, V]` (None unless
        `pairs`) and log Z per sentence `[B]` (layout order) of the chain at `unary [N, V]`
        (time-major) and `pairwise [V, V]`. With `consume` the recursions work in unary's array
        (one token-by-label array fewer; its values are gone after).

        The scaled recursions of `_recursions` with the same forward pass (`_forward`), the backward
        made for the hot path (training evaluates it hundreds of times, where a small corpus's
        steps cost NumPy's per-call overhead, not flops): `np.dot`, plain slices, β̂ kept for the
        step at hand only (its rows are a prefix of the first step's sentences; a
        sentence that ended keeps its last value), each step's α̂ turned into the marginal α̂ β̂ once
        step t + 1 has read it."""
        emit, shift = _emissions(unary, consume)
        p_max = float(pairwise.max())
        trans = np.exp(pairwise - p_max).astype(emit.dtype, copy=False)  # `np.dot(out=)` takes one dtype
        trans_t = np.ascontiguousarray(trans.T)
        alpha, z = self._forward(emit, trans)
        first = self.slice(0)
        dot = np.dot
        beta = np.ones((first.stop - first.start, emit.shape[-1]), emit.dtype)  # the first step's rows
        scaled = emit  # e_t / z_t, then × β̂_t (in place): the right factor of ξ_{t−1} and of β̂_{t−1}
        scaled /= z[:, None]
        pair_sum = np.zeros_like(trans) if pairs else None
        for t, prev, start, stop in reversed(self._steps):
            if t % CHECK_STEPS == 0:
                check_cancelled()
            now = beta[: stop - start]
            here = scaled[start:stop]
            here *= now
            alpha[start:stop] *= now  # the marginals of step t: α̂_t was read (as `left`) at step t + 1
            if pairs:
                pair_sum += dot(alpha[prev : prev + stop - start].T, here)
            dot(here, trans_t, out=now)
        alpha[first] *= beta
        log_scale = np.log(z) + shift[:, 0]
        log_z = np.bincount(self.sentence_of, weights=log_scale, minlength=len(self.lengths))  # f64
        log_z = log_z + (self.lengths - 1) * p_max
        if pairs:
            pair_sum *= trans
        return alpha, pair_sum, log_z

    def constrained_forward_backward(self, unary: np.ndarray, pairwise: np.ndarray, allowed: np.ndarray, *,
                                     pairs: bool = True):
        """`forward_backward` of the chain restricted to the label paths with `allowed [N, V]`
        (bool, time-major) true at every token: marginals `[N, V]` (0 off the mask), pair sums
        `[V, V]` and log Z_constrained per sentence `[B]`. Every token needs an allowed label.
        A disallowed label's potential is −inf: its weight exp(−inf) = 0 drops out of every
        message, and the messages stay scaled by the best allowed label of each token."""
        if allowed.shape != unary.shape:
            raise ValueError(f"allowed-label mask of shape {allowed.shape} for unaries of shape {unary.shape}")
        if len(allowed) and not allowed.any(1).all():
            raise ValueError("every token needs at least one allowed label")
        return self.forward_backward(np.where(allowed, unary, -np.inf), pairwise, pairs=pairs, consume=True)

    def scaled_messages(self, unary: np.ndarray, pairwise: np.ndarray):
        """The forward–backward messages of one or several chains, `unary [..., N, V]` and
        `pairwise [..., V, V]`, as scaled messages and their scales: (α̂ `[..., N, V]`, β̂ `[..., N, V]`,
        log c `[..., N]`, log Z `[..., B]`) with α_t = c_t α̂_t (α_t including e^{u_t}),
        β_t = Z / c_t · β̂_t (β at a sentence's last token = 1) and the marginal α̂_t β̂_t."""
        alpha, beta, log_scale, p_max = self._recursions(unary, pairwise)
        log_c = np.empty_like(log_scale)  # Σ_{s ≤ t} (log z_s + shift_s) + t · max P along the sentence
        first = self.slice(0)
        log_c[..., first] = log_scale[..., first]
        for _, prev, start, stop in self._steps:
            log_c[..., start:stop] = log_c[..., prev : prev + stop - start] + log_scale[..., start:stop] + p_max[..., 0]
        last = self.starts[self.lengths - 1] + np.arange(len(self.lengths))  # each sentence's last row
        return alpha, beta, log_c, log_c[..., last]

    def viterbi(self, unary: np.ndarray, pairwise: np.ndarray, k: int = 1):
        """The k best label paths of every sentence (k-best max-product) at `unary [N, V]`
        (time-major) and `pairwise [V, V]`: labels `[N, k]` (time-major, column r the path of rank
        r) and path scores `[B, k]` (layout order), best first; label 0 and score −inf where a
        sentence has fewer than k paths. Ties go to the lower label id (the lower (label, rank))."""
        N, V = unary.shape
        B = len(self.lengths)
        dtype = np.result_type(unary, pairwise)
        if not B:
            return np.zeros((0, k), np.int64), np.zeros((0, k), dtype)
        into = np.repeat(np.asarray(pairwise, dtype).T, k, axis=1)  # [V, V·k]: P(i, j) at [j, i·k + r]
        back = np.empty((N, V, k), np.int32)  # (previous label · k + its rank) of each (label, rank)
        final = np.empty((B, V * k), dtype)  # scores at each sentence's last token
        delta = np.full((B, V, k), -np.inf, dtype)  # best scores of paths ending in (label, rank)
        delta[:, :, 0] = unary[self.slice(0)]
        for t, _, start, stop in self._steps:
            if t % CHECK_STEPS == 0:
                check_cancelled()
            n = stop - start
            final[n : len(delta)] = delta[n:].reshape(-1, V * k)  # sentences whose last token was t − 1
            candidates = delta[:n].reshape(n, 1, V * k) + into  # [n, V next, V·k previous]
            order = candidates.argmax(-1)[..., None] if k == 1 else top_k(candidates, k)  # [n, V, k]
            delta = np.take_along_axis(candidates, order, -1) + unary[start:stop, :, None]
            back[start:stop] = order
        final[: len(delta)] = delta.reshape(-1, V * k)
        best = final.argmax(-1)[:, None] if k == 1 else top_k(final, k)  # [B, k] (label · k + rank)
        scores = np.take_along_axis(final, best, -1)
        labels = np.empty((N, k), np.int64)
        for t in range(len(self.running) - 1, -1, -1):
            if t % CHECK_STEPS == 0:
                check_cancelled()
            rows, n = self.slice(t), int(self.running[t])
            state = best[:n]
            labels[rows] = state // k
            if t:
                best[:n] = np.take_along_axis(back[rows].reshape(n, V * k), state, -1)
        found = np.isfinite(scores)
        return np.where(found[self.sentence_of], labels, 0), np.where(found, scores, -np.inf)

    def transition_counts(self, labels: np.ndarray, num_labels: int, where: np.ndarray | None = None) -> np.ndarray:
        """Σ over adjacent gold pairs of 1[y_t = i, y_{t+1} = j] `[V, V]` (labels time-major); only
        the pairs whose left token has `where [N]` true, given it."""
        left, right = (self.left, self.right) if where is None else \
            (self.left[where[self.left]], self.right[where[self.left]])
        flat = labels[left] * num_labels + labels[right]
        return np.bincount(flat, minlength=num_labels * num_labels).reshape(num_labels, num_labels).astype(float)


def _emissions(unary: np.ndarray, consume: bool):
    """e = exp(unary − its row maximum) (in unary's array with `consume`) and that maximum
    `[..., N, 1]`: each token's best label has weight 1."""
    shift = _row_max(unary)
    if consume and shift is unary:  # one label: the row maximum is unary itself
        shift = shift.copy()
    emit = np.subtract(unary, shift, out=unary if consume else None)
    return np.exp(emit, out=emit), shift


def _row_max(values: np.ndarray) -> np.ndarray:
    """max over the last axis `[..., 1]`. Up to HALVING_LABELS labels by halving the rows (a few
    elementwise maxima over shrinking arrays), where NumPy's reduction along so short a contiguous
    axis costs several times more; above, NumPy's reduction is the faster."""
    if values.shape[-1] > HALVING_LABELS:
        return values.max(-1, keepdims=True)
    while values.shape[-1] > 1:
        half = values.shape[-1] // 2
        top = np.maximum(values[..., :half], values[..., half : 2 * half])
        values = np.concatenate([top, values[..., 2 * half :]], axis=-1) if values.shape[-1] % 2 else top
    return values


def padded_layout(lengths: np.ndarray):
    """The layout of a padded batch's sentences of `lengths [B]` (0 allowed): (the `TimeMajor` of
    its non-empty sentences, or None when there are none; the batch sentence of each layout
    sentence `[B']`; the (sentence `[N]`, position `[N]`) of each time-major row in the batch, so
    that `padded[sentence, position]` is the time-major array of `padded [B, T, ...]`)."""
    lengths = np.asarray(lengths, np.int64)
    nonempty = np.flatnonzero(lengths > 0)
    if not len(nonempty):
        return None, nonempty, (nonempty, nonempty)
    layout = TimeMajor(np.concatenate([[0], np.cumsum(lengths[nonempty])]))
    batch_sentence = nonempty[layout.sentences]
    position = np.repeat(np.arange(len(layout.running)), layout.running)
    return layout, batch_sentence, (batch_sentence[layout.sentence_of], position)


def nbest_viterbi(unary: np.ndarray, pairwise: np.ndarray, lengths: np.ndarray, k: int):
    """`TimeMajor.viterbi` of a padded batch, `unary [B, T, V]`, `pairwise [V, V]`, `lengths [B]`:
    the k best paths `[B, k, T]` (0 past a length, and where a sentence has fewer than k paths)
    and their scores `[B, k]` (−inf where it has fewer; an empty sentence has one path, score 0)."""
    B, T, _ = unary.shape
    paths, scores = np.zeros((B, k, T), np.int64), np.full((B, k), -np.inf)
    scores[np.asarray(lengths) == 0, 0] = 0.0
    layout, batch_sentence, rows = padded_layout(lengths)
    if layout is not None:
        labels, scores[batch_sentence] = layout.viterbi(unary[rows], pairwise, k)
        paths[rows[0], :, rows[1]] = labels
    return paths, scores


def viterbi(unary: np.ndarray, pairwise: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The best label path `[B, T]` (int32, 0 past a length) of the chains with `unary [B, T, V]`
    and `pairwise [V, V]`: `nbest_viterbi` with k = 1. Ties go to the lowest label id."""
    return nbest_viterbi(unary, pairwise, lengths, 1)[0][:, 0].astype(np.int32)


def top_k(values: np.ndarray, k: int) -> np.ndarray:
    """Indices `[..., k]` of the k largest of `values [..., M]` along the last axis, largest first,
    ties by lower index: `np.argsort(-values, axis=-1, kind="stable")[..., :k]` in O(M) instead
    of O(M log M) (k-best Viterbi ranks V·k candidates per label and step). No NaN in `values`.
    A partition picks k of them; only the rows where a value equal to the k-th largest was left
    out (a tie at the boundary, e.g. −inf before k paths exist) take `_tied_top_k`."""
    M = values.shape[-1]
    if k >= M:
        return np.argsort(-values, axis=-1, kind="stable")
    picked = np.argpartition(-values, k - 1, axis=-1)[..., :k]
    picked_values = np.take_along_axis(values, picked, axis=-1)
    tied = (values >= picked_values.min(axis=-1, keepdims=True)).sum(axis=-1) > k
    if tied.any():
        picked[tied] = _tied_top_k(values[tied], k)
    picked = np.sort(picked, axis=-1)  # index order, so that the stable sort below breaks ties by index
    order = np.argsort(-np.take_along_axis(values, picked, axis=-1), axis=-1, kind="stable")
    return np.take_along_axis(picked, order, axis=-1)


def _tied_top_k(values: np.ndarray, k: int) -> np.ndarray:
    """The indices `[N, k]` of the k largest of each row of `values [N, M]` (any order), ties at the
    k-th largest value taken from the lowest indices."""
    kth = -np.partition(-values, k - 1, axis=-1)[:, k - 1 : k]
    above, tied = values > kth, values == kth  # −inf == −inf: ties at −inf count too
    missing = k - above.sum(axis=-1, keepdims=True)
    chosen = above | (tied & (np.cumsum(tied, axis=-1) <= missing))  # exactly k per row
    return np.nonzero(chosen)[1].reshape(len(values), k)
