"""Acquisition scores of a batch of linear chains: how much annotating each sentence is worth,
from the chains alone (`gpseq.active.selection` draws the chains from a model and picks the batch).

Every score is a function of a batch's chains (`gpseq.structured.spans.ChainPosterior`: R weighted
chains p_r(y | X) over a padded batch), exact by forward–backward in NumPy (float64) unless said:

- **bald** — the mutual information I(y; f) = H[E_q p(y | f)] − E_q H[p(y | f)] from R = S
  posterior draws of the potentials (epistemic uncertainty only). `level="token"` (default):
  Σ_t H[p̄_t] − Σ_r w_r H[p_{r,t}], exact given the draws. `level="sequence"`: Σ_r w_r KL(p_r ‖ p̄)
  (p̄ the mixture of the draws' chains, which has no forward–backward), estimated by sampling
  `paths` label sequences from each draw's chain (forward filtering, backward sampling) and
  averaging log p_r(y) − log p̄(y); unbiased, error O(1/√(paths·S)).
- **entropy** — of the model's predictive (deterministic by default; `samples=S`: the calibrated
  Monte Carlo one). `level="token"`: Σ_t H[p̄_t]; `level="sequence"`: H[p(y | X)], exact for one
  chain (log Z − E[score]), estimated like sequence BALD for R > 1.
- **least-confidence** — 1 − P(best path | X), the best path by Viterbi (for R > 1, that of the
  mean potentials, scored under the mixture).
- **margin** — 1 − (P(best path) − P(second best path)), by 2-best Viterbi.
- **random** — a uniform draw per sentence (no model evaluation; drawn in `gpseq.active.selection`).

Scores are "higher = more worth annotating". `normalise=True` divides the additive scores (the
token sums, sequence entropy and BALD) by the sentence length and uses per-token geometric means
for the path probabilities (1 − P₁^(1/T), 1 − (P₁^(1/T) − P₂^(1/T))): otherwise long sentences,
which hold more uncertainty, come first.
"""

from __future__ import annotations

import numpy as np

__all__ = ["STRATEGIES", "LEVELS", "chain_token_marginals", "chain_entropies", "sample_paths",
           "mixture_path_log_probs", "chain_scores", "combine"]

STRATEGIES = ("bald", "entropy", "least-confidence", "margin", "random")
LEVELS = ("token", "sequence")


def _entropy(p: np.ndarray) -> np.ndarray:
    """−Σ p log p over the last axis (0 log 0 = 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)


def _valid(posterior) -> np.ndarray:
    """Mask of the real tokens `[B, T]`."""
    T = posterior.unary.shape[2]
    return np.arange(T)[None, :] < posterior.lengths[:, None]


def chain_token_marginals(posterior) -> np.ndarray:
    """p_r(y_t = v | X) `[R, B, T, V]` of each chain (0 past a length)."""
    log_marg = posterior.log_alpha + posterior.log_beta - posterior.log_z[:, :, None, None]
    marg = np.exp(np.minimum(log_marg, 0.0))
    return np.where(_valid(posterior)[None, :, :, None], marg, 0.0)


def chain_entropies(posterior) -> np.ndarray:
    """H[p_r(y | X)] `[R, B]` of each chain's distribution over label sequences, exactly:
    log Z_r − E_r[score(y)], the expected score from the token and pairwise marginals."""
    R, B, T, V = posterior.unary.shape
    valid = _valid(posterior)
    marg = chain_token_marginals(posterior)
    expected = np.einsum("rbtv,rbtv->rb", marg, posterior.unary)
    W = posterior.pairwise  # [R, V, V]
    for t in range(T - 1):
        pair = valid[:, t + 1]  # [B]: the transition t -> t+1 is inside the sentence
        if not pair.any():
            break
        log_xi = (posterior.log_alpha[:, :, t, :, None] + W[:, None]
                  + (posterior.unary[:, :, t + 1] + posterior.log_beta[:, :, t + 1])[:, :, None, :]
                  - posterior.log_z[:, :, None, None])  # [R, B, V, V]
        xi = np.exp(np.minimum(log_xi, 0.0))
        expected += np.where(pair[None], np.einsum("rbij,rij->rb", xi, W), 0.0)
    return np.where(posterior.lengths[None] > 0, posterior.log_z - expected, 0.0)


def _mix32(x: np.ndarray) -> np.ndarray:
    """lowbias32 on uint32 arrays (wrapping), as `gpseq.gp.hashed.mix32` in TensorFlow."""
    x = np.asarray(x).astype(np.uint32)
    with np.errstate(over="ignore"):  # uint32 arithmetic wraps by design
        for shift, factor in ((16, 0x7FEB352D), (15, 0x846CA68B)):
            x = (x ^ (x >> np.uint32(shift))) * np.uint32(factor)
    return x ^ (x >> np.uint32(16))


def sentence_keys(sentences, seed: int, pieces: np.ndarray | None = None) -> np.ndarray:
    """A uint32 key `[N]` per sentence from its tokens (`stable_hash`), the seed and (optionally) its
    piece number: the random streams `sample_paths` draws for a sentence, whatever it is batched with."""
    from gpseq.features.values import stable_hash

    hashes = np.array([stable_hash("\x1f".join(s.tokens)) for s in sentences], dtype=np.uint64)
    words = ((hashes >> np.uint64(32)) ^ hashes).astype(np.uint32)
    piece = np.zeros(len(words), dtype=np.uint32) if pieces is None else np.asarray(pieces).astype(np.uint32)
    with np.errstate(over="ignore"):
        return _mix32(words ^ _mix32(np.uint32(seed % 2**32) + piece * np.uint32(0x9E3779B9)))


def _keyed_gumbel(keys: np.ndarray, R: int, n: int, V: int):
    """`noise(t)`: Gumbel noise `[R, n, B, V]` for step t, a fixed function of (key of sentence b, t,
    r, k, v); the (r, k, v) part is hashed once."""
    with np.errstate(over="ignore"):  # uint32 arithmetic wraps by design
        element = _mix32(np.arange(R * n * V, dtype=np.uint32) * np.uint32(0x9E3779B9)).reshape(R, n, 1, V)

    def noise(t: int) -> np.ndarray:
        with np.errstate(over="ignore"):
            step = _mix32(np.uint32(t) * np.uint32(0x85EBCA6B) + np.uint32(0x632BE5AB))
            bits = _mix32(_mix32(keys ^ step)[None, None, :, None] + element)
        return -np.log(-np.log(((bits >> np.uint32(8)).astype(np.float64) + 0.5) * 2.0**-24))

    return noise


def sample_paths(posterior, n: int, rng: np.random.Generator, keys: np.ndarray | None = None) -> np.ndarray:
    """`n` label sequences from each chain, `[R, n, B, T]` (padding 0): forward filtering, backward
    sampling — y_{L−1} ∝ α_{L−1}, then y_t | y_{t+1} ∝ α_t(y_t) exp W(y_t, y_{t+1}) — by Gumbel-max.
    The Gumbel noise comes from `rng`, or with `keys [B]` (`sentence_keys`) from each sentence's own
    key: then a sentence's paths do not depend on the other sentences of the batch."""
    R, B, T, V = posterior.unary.shape
    lengths = posterior.lengths
    paths = np.zeros((R, n, B, T), dtype=np.int64)
    transposed = np.swapaxes(posterior.pairwise, 1, 2)  # [R, V(next), V(this)]
    chain = np.arange(R)[:, None, None]
    following = np.zeros((R, n, B), dtype=np.int64)
    keyed = None if keys is None else _keyed_gumbel(keys, R, n, V)
    for t in range(T - 1, -1, -1):
        log_alpha = np.broadcast_to(posterior.log_alpha[:, None, :, t], (R, n, B, V))
        conditional = log_alpha + transposed[chain, following]  # [R, n, B, V]
        last = (t == lengths - 1)[None, None, :, None]
        logits = np.where(last, log_alpha, conditional)
        noise = rng.gumbel(size=logits.shape) if keyed is None else keyed(t)
        draw = np.argmax(logits + noise, axis=-1)
        following = np.where((t < lengths)[None, None], draw, 0)
        paths[..., t] = following
    return paths


def mixture_path_log_probs(posterior, paths: np.ndarray) -> np.ndarray:
    """log p_q(y) `[Q, ...]` of label sequences `paths [..., B, T]` under every chain q (Q = R)."""
    R, B, T, V = posterior.unary.shape
    valid = _valid(posterior)
    lead = paths.shape[:-2]
    flat = paths.reshape((-1, B, T))  # [P, B, T]
    rows, times = np.arange(B)[None, None, :, None], np.arange(T)[None, None, None, :]
    chains = np.arange(R)[:, None, None, None]
    unary = posterior.unary[chains, rows, times, flat[None]]  # [Q, P, B, T]
    score = np.sum(np.where(valid[None, None], unary, 0.0), axis=-1)
    if T > 1:
        pair = posterior.pairwise[chains, flat[None, :, :, :-1], flat[None, :, :, 1:]]  # [Q, P, B, T-1]
        score += np.sum(np.where(valid[None, None, :, 1:], pair, 0.0), axis=-1)
    log_p = np.minimum(score - posterior.log_z[:, None, :], 0.0)
    return log_p.reshape((R,) + lead + (B,))


def _mixture_terms(posterior, paths_per_chain: int, rng: np.random.Generator, keys=None):
    """(log p_r(y_rn) `[R, n, B]`, log p̄(y_rn) `[R, n, B]`) for `n` paths sampled from each chain r."""
    paths = sample_paths(posterior, paths_per_chain, rng, keys)  # [R, n, B, T]
    with np.errstate(divide="ignore"):
        log_w = np.log(posterior.weights)[:, None, None]
    own = np.empty(paths.shape[:-1])
    log_mixture = np.empty(paths.shape[:-1])
    # one source chain's paths at a time: all R · n paths under all R chains at once is R² · n · B · T
    for r in range(len(paths)):
        log_p = mixture_path_log_probs(posterior, paths[r])  # [Q, n, B]
        shift = np.max(log_p + log_w, axis=0)
        log_mixture[r] = shift + np.log(np.sum(np.exp(log_p + log_w - shift), axis=0))
        own[r] = log_p[r]  # each path under the chain it came from
    return own, log_mixture


def chain_scores(posterior, strategy: str, *, level: str = "token", paths: int = 8,
                 rng: np.random.Generator | None = None, keys: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The parts of a strategy's score for each sentence of a batch, `[B]` each: {"sum": …} for the
    additive scores (bald, entropy), {"log_p1", "log_p2"} (log-probabilities of the best and second
    best paths) for least-confidence and margin. Sequence-level paths are sampled with `rng`, or
    per sentence from `keys` (`sample_paths`)."""
    rng = rng if rng is not None else np.random.default_rng(0)
    w = posterior.weights
    valid = _valid(posterior)
    if strategy in ("least-confidence", "margin"):
        _, log_probs = posterior.nbest(2 if strategy == "margin" else 1)
        out = {"log_p1": log_probs[:, 0]}
        if strategy == "margin":
            # the two paths come ranked by the mean potentials and carry their probabilities under
            # the posterior's mixture of chains (R > 1: Monte Carlo draws), where the order can
            # swap: the margin is between the more and the less probable of the two
            out = {"log_p1": np.maximum(log_probs[:, 0], log_probs[:, 1]),
                   "log_p2": np.minimum(log_probs[:, 0], log_probs[:, 1])}  # −inf for a single-path sentence
        return out
    if level == "token":
        per_chain = chain_token_marginals(posterior)  # [R, B, T, V]
        mean = np.einsum("r,rbtv->btv", w, per_chain)
        total = np.sum(np.where(valid, _entropy(mean), 0.0), axis=-1)
        if strategy == "bald":
            expected = np.einsum("r,rbt->bt", w, _entropy(per_chain))
            total = total - np.sum(np.where(valid, expected, 0.0), axis=-1)
        return {"sum": total}
    if strategy == "entropy" and len(w) == 1:
        return {"sum": chain_entropies(posterior)[0]}
    own, log_mixture = _mixture_terms(posterior, paths, rng, keys)
    if strategy == "bald":  # Σ_r w_r E_{p_r}[log p_r(y) − log p̄(y)]
        return {"sum": np.einsum("r,rb->b", w, np.mean(own - log_mixture, axis=1))}
    return {"sum": np.einsum("r,rb->b", w, np.mean(-log_mixture, axis=1))}  # H[p̄] = E_p̄[−log p̄(y)]


def combine(parts: dict[str, np.ndarray], owners: np.ndarray, lengths: np.ndarray, strategy: str,
            normalise: bool) -> np.ndarray:
    """Sentence scores `[N]` from the parts of their pieces (`owners[p]`: the sentence of piece p;
    `lengths [N]` the sentences' token counts)."""
    N = len(lengths)
    length = np.maximum(lengths, 1).astype(np.float64)
    if "sum" in parts:
        total = np.bincount(owners, weights=parts["sum"], minlength=N)
        return total / length if normalise else total
    log_p1 = np.bincount(owners, weights=parts["log_p1"], minlength=N)
    if normalise:
        log_p1 = log_p1 / length
    if strategy == "least-confidence":
        return 1.0 - np.exp(log_p1)
    gap = np.full(N, -np.inf)  # log P2 − log P1: the second best path differs from the best in one piece
    np.maximum.at(gap, owners, parts["log_p2"] - parts["log_p1"])
    log_p2 = log_p1 + (gap / length if normalise else gap)
    return 1.0 - (np.exp(log_p1) - np.exp(log_p2))
