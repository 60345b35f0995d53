"""What a tagger's chain says about whole spans and whole paths: exact span probabilities,
n-best label sequences, path probabilities and span-F1-optimal decoding, in NumPy (float64).

`ChainPosterior` holds R weighted linear chains over one padded batch: R = 1 for the
deterministic predictive (probit-scaled potentials / T, one chain), R = K·S for the Monte Carlo
predictive (each calibrated draw of the potentials, weight π_k / S). Every probability it returns
is the weighted average over the R chains of that chain's exact probability:

    P(event | X) = Σ_r w_r p_r(event),   p_r by (constrained) forward–backward on chain r.

**Span probability.** P(the span [i, j) is a chunk of type τ, exactly): a chunk of type τ
(`gpseq.corpora.schemes.spans`, conlleval boundaries of the tag scheme) starts at i, does not end
at i+1 … j−1, and ends at j. With forward messages α_t (including u_t), backward messages β_t and
the pairwise exp W masked by which label pairs start (S), continue (C) and end (E) a chunk,

    p_r = [α_{i−1}ᵀ (W∘S_τ) D_i] [Π_{k=i+1}^{j−1} (W∘C) D_k] [(W∘E) D_j β_j] / Z,   D_k = diag e^{u_k},

(at i = 0 the start factor is e^{u_i} masked to type τ, at j = L the end factor is 1): one short
constrained forward pass per span (O((j − i)·V²)), all spans of a batch at once, on the messages
scaled as the chain's own forward pass scales them (a constrained message is at most the
unconstrained one, so it stays ≤ 1 with no logs in its steps).

**Paths.** `path_log_probs(paths)` = log Σ_r w_r p_r(path): exact for R = 1; for R > 1 the log of
an unbiased Monte Carlo estimate, low by ≈ Var/(2·S·p²) nats (Jensen), which `bias_corrected=True`
removes to first order (the delta method). `nbest(k)` is the k-best Viterbi on the weighted mean of
the R chains' potentials (for R = 1 exactly the k most probable paths), with each path's
probability from `path_log_probs`.

Shapes: unary `[R, B, T, V]`, pairwise `[R, V, V]`, lengths `[B]` (padding past a length is
ignored), weights `[R]` summing to 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import numpy as np

from gpseq.cancellation import check_cancelled
from gpseq.errors import ConfigError
from gpseq.structured.numpy_chain import nbest_viterbi, padded_layout
from gpseq.structured.span_scheme import SpanScheme  # noqa: F401  (spans' callers import it from here)


def _logsumexp(x, axis):
    shift = np.max(x, axis=axis, keepdims=True)
    shift = np.where(np.isfinite(shift), shift, 0.0)
    with np.errstate(divide="ignore"):
        return np.squeeze(np.log(np.sum(np.exp(x - shift), axis=axis, keepdims=True)) + shift, axis=axis)


class ChainPosterior:
    """R weighted linear chains over a padded batch, with their forward–backward messages (float64)
    from the one NumPy chain (`numpy_chain.TimeMajor.scaled_messages`, all R chains at once).

    unary `[R, B, T, V]` (or `[B, T, V]` for R = 1), pairwise `[R, V, V]` (or `[V, V]`),
    lengths `[B]` (0 allowed: an empty sentence), weights `[R]` (default uniform). Its loops over
    chain steps call `check_cancelled` (`gpseq.cancellation`): every CHECK_STEPS steps where a step
    is one token of the batch (in `numpy_chain`), every step where it is a pass over every query of
    the batch (the span passes here)."""

    def __init__(self, unary, pairwise, lengths, weights=None):
        unary = np.asarray(unary, dtype=np.float64)
        pairwise = np.asarray(pairwise, dtype=np.float64)
        if unary.ndim == 3:
            unary = unary[None]
        if pairwise.ndim == 2:
            pairwise = pairwise[None]
        R, B, T, V = unary.shape
        if pairwise.shape[-2:] != (V, V) or pairwise.shape[0] not in (1, R):
            raise ConfigError(f"pairwise of shape {pairwise.shape} does not fit unary of shape {unary.shape}")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if self.lengths.shape != (B,) or (B and (self.lengths.min() < 0 or self.lengths.max() > T)):
            raise ConfigError(f"lengths must be [B] = [{B}] values in 0..{T}")
        self.weights = np.full(R, 1.0 / R) if weights is None else np.asarray(weights, dtype=np.float64)
        if self.weights.shape != (R,):
            raise ConfigError(f"weights must have shape [R] = [{R}], got {self.weights.shape}")
        self.unary = np.where(np.arange(T)[None, None, :, None] < self.lengths[None, :, None, None], unary, 0.0)
        self.pairwise = np.broadcast_to(pairwise, (R, V, V))
        self.pair_shift = self.pairwise.max(axis=(1, 2), keepdims=True)  # [R, 1, 1]
        self.transition = np.exp(self.pairwise - self.pair_shift)  # [R, V, V] exp W, scaled
        # the batch's tokens in time-major order (`numpy_chain.padded_layout`): row n is token
        # position[n] of sentence[n]
        layout, batch_sentence, self._rows = padded_layout(self.lengths)
        self.log_z = np.zeros((R, B))  # [R, B]; 0 for an empty sentence
        if layout is None:
            self._alpha = self._beta = np.zeros((R, 0, V))
            self._log_c = np.zeros((R, 0))
        else:
            self._alpha, self._beta, self._log_c, self.log_z[:, batch_sentence] = layout.scaled_messages(
                self.unary[:, self._rows[0], self._rows[1]], self.pairwise)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.unary.shape

    def _padded(self, time_major) -> np.ndarray:
        """`[R, N, V]` in time-major order as `[R, B, T, V]` (0 past a length)."""
        out = np.zeros(self.unary.shape)
        out[:, self._rows[0], self._rows[1]] = time_major
        return out

    @cached_property
    def log_alpha(self) -> np.ndarray:
        """log α_t `[R, B, T, V]`: the forward messages including u_t (0 past a length)."""
        with np.errstate(divide="ignore"):
            return self._padded(np.log(self._alpha) + self._log_c[..., None])

    @cached_property
    def log_beta(self) -> np.ndarray:
        """log β_t `[R, B, T, V]`: the backward messages, 0 at a sentence's last token (and past it)."""
        with np.errstate(divide="ignore"):
            return self._padded(np.log(self._beta) + (self.log_z[:, self._rows[0]] - self._log_c)[..., None])

    def _mix(self, log_p):
        """log Σ_r w_r exp(log_p[r]) for log_p `[R, ...]`."""
        with np.errstate(divide="ignore"):
            return _logsumexp(log_p + np.log(self.weights).reshape((-1,) + (1,) * (log_p.ndim - 1)), axis=0)

    # ---- tokens and paths --------------------------------------------------------------------------
    def token_marginals(self) -> np.ndarray:
        """p(y_t = v | X) `[B, T, V]` (weighted over the chains; 0 past a length)."""
        marg = np.einsum("r,rnv->nv", self.weights, np.minimum(self._alpha * self._beta, 1.0))
        return self._padded(marg[None])[0]

    def path_scores(self, paths) -> np.ndarray:
        """Unnormalised log-scores `[R, B]` of label paths `[B, T]` (entries past a length ignored)."""
        paths = np.asarray(paths, dtype=np.int64)
        R, B, T, V = self.unary.shape
        valid = np.arange(T)[None, :] < self.lengths[:, None]  # [B, T]
        safe = np.where(valid, paths, 0)
        unary = np.take_along_axis(self.unary, safe[None, :, :, None], axis=-1)[..., 0]  # [R, B, T]
        pair = self.pairwise[:, safe[:, :-1], safe[:, 1:]]  # [R, B, T-1]
        return (unary * valid).sum(-1) + (pair * valid[:, 1:]).sum(-1)

    def path_log_probs(self, paths, *, per_chain: bool = False, bias_corrected: bool = False) -> np.ndarray:
        """log P(path | X) `[B]` of label paths `[B, T]`: log Σ_r w_r p_r(path) (`[R, B]` of log p_r with
        `per_chain`). `bias_corrected` adds the delta-method correction Σ_r w_r² (p_r/p̂ − 1)² / 2 ·
        R/(R − 1) for R equally weighted Monte Carlo draws (its O(1/R) Jensen bias); ≤ 0 always."""
        log_p = np.minimum(self.path_scores(paths) - self.log_z, 0.0)  # [R, B]
        if per_chain:
            return log_p
        mixed = self._mix(log_p)
        R = len(self.weights)
        if bias_corrected and R > 1:
            ratio = np.exp(log_p - mixed[None])  # p_r / p̂
            relative_variance = (self.weights[:, None] ** 2 * (ratio - 1.0) ** 2).sum(0) * R / (R - 1)
            mixed = np.minimum(mixed + 0.5 * relative_variance, 0.0)
        return mixed

    def nbest(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best paths `[B, k, T]` of the weighted mean potentials, best first (k-best Viterbi,
        `numpy_chain.nbest_viterbi`), and log P(path | X) `[B, k]` of each under the R chains (−inf
        and path 0 where a sentence has fewer than k paths)."""
        if k < 1:
            raise ConfigError(f"n-best needs k >= 1, got {k}")
        if len(self.weights) == 1:  # the predictive chain itself
            unary, pairwise = self.unary[0], self.pairwise[0]
        else:
            unary = np.einsum("r,rbtv->btv", self.weights, self.unary)
            pairwise = np.einsum("r,rij->ij", self.weights, self.pairwise)
        paths, scores = nbest_viterbi(unary, pairwise, self.lengths, k)
        log_probs = np.stack([self.path_log_probs(paths[:, n]) for n in range(k)], axis=1)
        return paths, np.where(np.isfinite(scores), log_probs, -np.inf)

    # ---- spans -------------------------------------------------------------------------------------
    def span_log_probs(self, scheme: SpanScheme, queries, *, per_chain: bool = False) -> np.ndarray:
        """log P(span | X) `[Q]` (`[R, Q]` per chain with `per_chain`) of queries `[Q, 4]`: rows
        (sentence b, type id c, start i, end j exclusive), 0 ≤ i < j ≤ L_b."""
        queries = np.asarray(queries, dtype=np.int64).reshape(-1, 4)
        R = self.unary.shape[0]
        Q = len(queries)
        out = np.full((R, Q), -np.inf)
        if Q:
            b, c, i, j = queries.T
            if (i < 0).any() or (j <= i).any() or (j > self.lengths[b]).any() or (c < 0).any() \
                    or (c >= len(scheme.types)).any():
                raise ConfigError("span queries need 0 <= start < end <= sentence length and a valid type")
            order = np.argsort(-(j - i), kind="stable")
            self._constrained(scheme, queries[order], lambda rows, values: out.__setitem__((slice(None), order[rows]),
                                                                                          values))
        return out if per_chain else self._mix(out)

    def span_probs(self, scheme: SpanScheme, queries) -> np.ndarray:
        """P(span | X) `[Q]` of queries `[Q, 4]` (sentence, type id, start, end exclusive)."""
        return np.exp(self.span_log_probs(scheme, queries))

    @cached_property
    def _scaled_padded(self):
        """(α̂, β̂, G) `[R, B, T, V]` (0 past a length): the scaled messages (`scaled_messages`) and the
        gain G_t = exp(u_t + max W + log c_{t−1} − log c_t) of the forward step into token t
        (exp(u_0 − log c_0) at a sentence's first), so that α̂_t = (α̂_{t−1}ᵀ exp(W − max W)) ⊙ G_t
        and a constrained forward message scaled by the same c_t stays ≤ α̂_t: its steps need no logs."""
        log_c = np.zeros(self.unary.shape[:3])
        log_c[:, self._rows[0], self._rows[1]] = self._log_c
        before = np.zeros_like(log_c)  # log c_{t−1} + max W, 0 at a first token
        before[:, :, 1:] = log_c[:, :, :-1] + self.pair_shift[:, :, :1]
        valid = np.arange(log_c.shape[2])[None, None, :] < self.lengths[None, :, None]
        gain = np.exp(self.unary + np.where(valid, before - log_c, 0.0)[..., None]) * valid[..., None]
        return self._padded(self._alpha), self._padded(self._beta), gain

    def _start_factors(self, scheme: SpanScheme, b, c, i):
        """The scaled constrained forward message at the first token of spans (b, c, i) `[R, N, V]`:
        (α̂_{i−1}ᵀ (exp W∘S_τ)) ⊙ G_i masked to type τ (S's sentence-start row ⊙ G_0 at i = 0)."""
        V = self.unary.shape[-1]
        alpha, _, gain = self._scaled_padded
        starts = self.transition * scheme.starts[:V][None]  # [R, V, V] exp W where the pair starts a chunk
        inner = np.matmul(alpha[:, b, np.maximum(i - 1, 0)], starts)
        first = scheme.starts[V].astype(np.float64)[None, None, :]  # sentence start
        message = np.where((i > 0)[None, :, None], inner, first) * gain[:, b, i]
        of_type = scheme.type_of[None, :] == c[:, None]  # [N, V]
        return np.where(of_type[None], message, 0.0)

    def _end_probs(self, scheme: SpanScheme, message, b, j):
        """P `[R, N]` of spans whose scaled constrained message at their last token j − 1 is `message`
        `[R, N, V]`: Σ_a m̂(a) Σ_c (exp W∘E)(a, c) G_j(c) β̂_j(c), or Σ_a m̂(a) E(a, end) at j = L."""
        _, T, V = self.unary.shape[1:]
        _, beta, gain = self._scaled_padded
        at = np.minimum(j, T - 1)
        ends = np.swapaxes(self.transition * scheme.ends[:, :V][None], 1, 2)  # [R, V(c), V(a)]
        inner = np.matmul(gain[:, b, at] * beta[:, b, at], ends)
        last = scheme.ends[:, V].astype(np.float64)[None, None, :]
        return np.einsum("rnv,rnv->rn", message, np.where((j < self.lengths[b])[None, :, None], inner, last))

    def _constrained(self, scheme: SpanScheme, queries, emit) -> None:
        """Constrained forward passes for queries sorted by decreasing length; `emit(rows, log_p [R, n])`."""
        b, c, i, j = queries.T
        length = j - i
        message = self._start_factors(scheme, b, c, i)  # [R, Q, V]
        continues = self.transition * scheme.continues[None]
        gain = self._scaled_padded[2]
        for k in range(int(length[0])):
            check_cancelled()  # each step is one vectorised pass over every query still running
            if k:
                active = int(np.searchsorted(-length, -k, side="left"))  # queries longer than k
                message = np.matmul(message[:, :active], continues) * gain[:, b[:active], i[:active] + k]
            done = np.flatnonzero(length[: message.shape[1]] == k + 1)
            if len(done):
                with np.errstate(divide="ignore"):
                    log_p = np.log(self._end_probs(scheme, message[:, done], b[done], j[done]))
                emit(done, np.minimum(log_p, 0.0))

    def spans_from(self, scheme: SpanScheme, starts, *, min_prob: float = 0.0, max_length: int | None = None):
        """Every span starting at `starts [N, 3]` rows (sentence b, type id c, start i) with its
        probability: (queries `[M, 4]`, P `[M]`) for each end j ≤ L_b (and j − i ≤ max_length),
        leaving out spans of probability below `min_prob`, and all longer ones from a start once the
        probability that its chunk runs on through the next token is below `min_prob` (an upper
        bound on every longer span's)."""
        starts = np.asarray(starts, dtype=np.int64).reshape(-1, 3)
        found_queries, found_probs = [np.zeros((0, 4), np.int64)], [np.zeros(0)]
        b, c, i = starts.T
        message = self._start_factors(scheme, b, c, i)  # [R, N, V] at token i + k
        continues = self.transition * scheme.continues[None]
        _, beta, gain = self._scaled_padded
        alive = np.arange(len(starts))
        k = 0
        while len(alive):
            check_cancelled()  # each step is one vectorised pass over every start still running
            j = i[alive] + k + 1
            with np.errstate(divide="ignore"):
                log_p = np.minimum(np.log(self._end_probs(scheme, message, b[alive], j)), 0.0)  # [R, n]
            p = np.exp(self._mix(log_p))
            keep = p >= min_prob
            found_queries.append(np.stack([b[alive], c[alive], i[alive], j], axis=1)[keep])
            found_probs.append(p[keep])
            running = j < self.lengths[b[alive]]
            if max_length is not None:
                running &= k + 1 < max_length
            if not running.any():
                break
            message, alive, j = message[:, running], alive[running], j[running]
            message = np.matmul(message, continues) * gain[:, b[alive], j]  # the chunk covers j
            if min_prob > 0:
                run_on = np.einsum("rnv,rnv->rn", message, beta[:, b[alive], j])
                with np.errstate(divide="ignore"):
                    going = np.exp(self._mix(np.log(run_on))) >= min_prob
                message, alive = message[:, going], alive[going]
            k += 1
        return np.concatenate(found_queries), np.concatenate(found_probs)


def span_queries(scheme: SpanScheme, spans_per_sentence: Sequence[Sequence[tuple[str, int, int]]]) -> np.ndarray:
    """Queries `[Q, 4]` (sentence, type id, start, end) of (type, start, end) spans per sentence."""
    rows = [(b, scheme.type_index(kind), start, end)
            for b, found in enumerate(spans_per_sentence) for kind, start, end in found]
    return np.array(rows, dtype=np.int64).reshape(-1, 4)


def product_span_probs(confidences: Sequence[float], spans_found: Sequence[tuple[str, int, int]]) -> list[float]:
    """Π_t p(y_t = label_t | X) over each span's tokens: the product of the token marginals, an
    approximation that ignores the correlation of neighbouring labels (kept for comparison)."""
    out = []
    for _, start, end in spans_found:
        out.append(float(np.prod(np.asarray(confidences[start:end], dtype=np.float64))))
    return out


def max_expected_f1_spans(candidates: Sequence[tuple[int, int, int, float]], expected_gold: float,
                          iterations: int = 20) -> list[tuple[int, int, int]]:
    """Span-F1-optimal decoding of one sentence from span marginals: the non-overlapping set of
    candidate spans (type id, start, end, P) maximising Σ P / (n + G)·2, G = expected number of gold
    spans, found by Dinkelbach's iteration: for a threshold λ pick the non-overlapping set
    maximising Σ (P − λ) (weighted interval scheduling), then λ ← expected F1 / 2 of that set."""
    items = sorted(candidates, key=lambda item: item[2])
    ends = [item[2] for item in items]
    previous = np.searchsorted(ends, [item[1] for item in items], side="right")  # spans ending ≤ start

    def best_set(threshold: float):
        value, take = [0.0] * (len(items) + 1), [False] * len(items)
        for n, (_, _, _, p) in enumerate(items):
            with_it = value[previous[n]] + p - threshold
            take[n] = with_it > value[n]
            value[n + 1] = with_it if take[n] else value[n]
        chosen, n = [], len(items)
        while n > 0:
            if take[n - 1]:
                chosen.append(items[n - 1])
                n = int(previous[n - 1])
            else:
                n -= 1
        return chosen[::-1]

    threshold, chosen = 0.5, []
    for _ in range(iterations):
        check_cancelled()
        chosen = best_set(threshold)
        gain = sum(p for *_, p in chosen)
        denominator = len(chosen) + expected_gold
        updated = gain / denominator if denominator > 0 else 0.0  # expected F1 / 2
        if abs(updated - threshold) < 1e-9:
            break
        threshold = updated
    return [(c, start, end) for c, start, end, _ in chosen]
