"""The linear chain over a whole corpus in NumPy: scaled forward–backward in time-major order.

The default training (MAP + Laplace, `gpseq.training.laplace`) evaluates the chain at point
potentials hundreds of times over the same corpus; it needs neither sampling nor autodiff, so it
runs without TensorFlow (no import, no tracing: a small corpus trains in seconds).

`TimeMajor` lays the tokens of a corpus out step by step: the sentences sorted by decreasing
length, then all first tokens, all second tokens, … At step t the sentences still running are a
prefix of that order, so step t is one contiguous slice of n_t rows and a step of the recursion
is one `[n_t, V] @ [V, V]` product with no padding and no masks. Messages are renormalised at
every step (CRFsuite's scaled formulation): exact up to float rounding. A step's mass z_t is at
least min exp(P − max P) (the unaries are shifted so that their best label has weight 1), so it
cannot underflow while the pairwise potentials span less than ≈ 80 nats (float32; 700 in float64).

Shapes: unary `[N, V]` in time-major token order (`layout.order` maps it from corpus order),
pairwise `[V, V]`, log Z `[B]` in the layout's sentence order.

`constrained_forward_backward` is the same chain restricted to the label paths an allowed-label
mask `[N, V]` admits (one label at an annotated token, all of them at an unannotated one): the
partial-annotation likelihood log p(observed labels | x) = log Z_constrained − log Z.
"""

from __future__ import annotations

import numpy as np


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
        starts = offsets[self.sentences]
        self.order = np.concatenate([starts[: n] + t for t, n in enumerate(self.running)]) if steps else \
            np.zeros(0, np.int64)  # time-major row → corpus token
        # each token with a successor (left) and that successor (right), both time-major
        self.left = np.concatenate([self.starts[t] + np.arange(self.running[t + 1]) for t in range(steps - 1)]) \
            if steps > 1 else np.zeros(0, np.int64)
        self.right = np.concatenate([self.starts[t + 1] + np.arange(self.running[t + 1]) for t in range(steps - 1)]) \
            if steps > 1 else np.zeros(0, np.int64)
        # the sentence (layout order) of each time-major row
        self.sentence_of = np.concatenate([np.arange(n) for n in self.running]) if steps else np.zeros(0, np.int64)
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
        # step t ≥ 1 as plain ints: (first row of step t − 1, rows of step t): the recursions' loops
        # run once per step and position, and NumPy scalars or slice objects there cost more than the products
        starts = np.asarray(self.starts).tolist()
        self._steps = [(starts[t - 1], starts[t], starts[t + 1]) for t in range(1, len(starts) - 1)]

    def slice(self, t: int) -> slice:
        return slice(int(self.starts[t]), int(self.starts[t + 1]))

    def forward_backward(self, unary: np.ndarray, pairwise: np.ndarray, *, pairs: bool = True):
        """Token marginals `[N, V]`, Σ over adjacent pairs of ξ_t(i, j) `[V, V]` (None unless
        `pairs`) and log Z per sentence `[B]` (layout order) of the chain at `unary [N, V]`
        (time-major) and `pairwise [V, V]`."""
        shift = unary.max(1, keepdims=True)
        emit = np.exp(unary - shift)
        p_max = pairwise.max()
        trans = np.exp(pairwise - p_max)
        trans_t = np.ascontiguousarray(trans.T)
        alpha = np.empty_like(emit)
        z = np.empty(len(emit), dtype=unary.dtype)
        first = self.slice(0)
        z[first] = emit[first].sum(1)
        alpha[first] = emit[first] / z[first, None]
        for prev, start, stop in self._steps:
            new = alpha[prev : prev + stop - start] @ trans
            new *= emit[start:stop]
            z_t = np.add.reduce(new, 1)
            z[start:stop] = z_t
            np.divide(new, z_t[:, None], out=alpha[start:stop])
        beta = np.ones_like(emit)
        scaled = emit / z[:, None]  # e_t / z_t, then × β̂_t: the right factor of ξ_{t−1} and of β̂_{t−1}
        for prev, start, stop in reversed(self._steps):
            here = scaled[start:stop]
            here *= beta[start:stop]
            np.matmul(here, trans_t, out=beta[prev : prev + stop - start])
        marg = alpha * beta
        log_z = np.bincount(self.sentence_of, weights=np.log(z) + shift[:, 0], minlength=len(self.lengths))  # f64
        log_z = log_z + (self.lengths - 1) * float(p_max)
        pair_sum = None
        if pairs:
            pair_sum = trans * (alpha[self.left].T @ scaled[self.right]) if len(self.left) else np.zeros_like(trans)
        return marg, pair_sum, log_z

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
        return self.forward_backward(np.where(allowed, unary, -np.inf), pairwise, pairs=pairs)

    def transition_counts(self, labels: np.ndarray, num_labels: int, where: np.ndarray | None = None) -> np.ndarray:
        """Σ over adjacent gold pairs of 1[y_t = i, y_{t+1} = j] `[V, V]` (labels time-major); only
        the pairs whose left token has `where [N]` true, given it."""
        left, right = (self.left, self.right) if where is None else \
            (self.left[where[self.left]], self.right[where[self.left]])
        flat = labels[left] * num_labels + labels[right]
        return np.bincount(flat, minlength=num_labels * num_labels).reshape(num_labels, num_labels).astype(float)
