"""Active learning from the posterior: rank unlabelled sentences by how much annotating them is
worth, and pick a batch (`Tagger.select`, `gpseq select`).

Every score is a function of a batch's linear chains (`gpseq.structured.spans.ChainPosterior`:
R weighted chains p_r(y | X) over a padded batch), computed exactly by forward–backward in NumPy
(float64) except where said:

- **bald** — the mutual information between the labels and f under the posterior q(f),
  I(y; f) = H[E_q p(y | f)] − E_q H[p(y | f)], from R = S posterior draws of the potentials
  (epistemic uncertainty only: what more data would remove). `level="token"` (default):
  Σ_t H[p̄_t] − Σ_r w_r H[p_{r,t}], the token marginals' mutual information, exact given the draws.
  `level="sequence"`: the label *sequence's* mutual information Σ_r w_r KL(p_r ‖ p̄) (p̄ the
  mixture of the draws' chains, not itself a chain, so its entropy has no forward–backward):
  estimated by sampling `paths` label sequences from each draw's chain (forward filtering,
  backward sampling) and averaging log p_r(y) − log p̄(y), both exact for a given path; unbiased,
  error O(1/√(paths·S)).
  The draws: `variance_scale="calibrated"` (default) uses the calibrated predictive's draws (the
  spread of q scaled by the fitted α, potentials divided by the temperature T, as `samples=S`
  tagging does); a number c draws f from q with its spread scaled by c (c = 1: the Laplace / SVI
  posterior itself) and no temperature.
- **entropy** — of the model's predictive (deterministic by default; `samples=S`: the calibrated
  Monte Carlo one). `level="token"`: Σ_t H[p̄_t]; `level="sequence"`: H[p(y | X)], exact for one
  chain (log Z − E[score], pairwise marginals), estimated like sequence BALD for R > 1.
- **least-confidence** — 1 − P(best path | X): the most probable path by Viterbi, exact for the
  deterministic predictive (for R > 1, the best path of the mean potentials, scored under the
  mixture).
- **margin** — 1 − (P(best path) − P(second best path)), by 2-best Viterbi.
- **random** — a uniform draw per sentence (no model evaluation).

Scores are "higher = more worth annotating". `normalise=True` divides the additive scores (the
token sums, sequence entropy and BALD) by the sentence length and uses per-token geometric means
for the path probabilities (1 − P₁^(1/T), 1 − (P₁^(1/T) − P₂^(1/T))): otherwise long sentences,
which hold more uncertainty, come first.

A sentence longer than the model's `predict_max_tokens` is scored in consecutive pieces of at
most that many tokens (each its own chain): the token sums are exact, the sequence quantities add
the pieces' (their dependence across a cut is ignored) and path probabilities multiply.

`select` streams the pool in chunks (memory bounded by the chunk and the candidates kept, not by
the pool: a pool of 1 M tokens is fine), keeps the best `n · candidates` sentences — never two
with the same token sequence (the first read stays) — and picks the batch greedily by score,
skipping near-duplicates of a picked sentence (Jaccard similarity of the lower-cased token types
above `max_similarity`). Ties are broken by a seeded random key, so a ranking is reproducible
under its seed.
"""

from __future__ import annotations

import heapq
import logging
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from gpseq.corpora.types import Sentence
from gpseq.errors import ConfigError

__all__ = ["STRATEGIES", "LEVELS", "Selected", "select", "score_sentences", "chain_token_marginals",
           "chain_entropies", "sample_paths", "mixture_path_log_probs", "chain_scores"]

log = logging.getLogger("gpseq")

STRATEGIES = ("bald", "entropy", "least-confidence", "margin", "random")
LEVELS = ("token", "sequence")
CHUNK_SENTENCES = 2048  # sentences featurised and scored at a time
BATCH_TOKENS = 4096  # padded tokens per scored batch (R chains of them are held at once)
DEFAULT_SAMPLES = 16  # posterior draws for BALD


@dataclass
class Selected:
    """A picked sentence: its position in the pool, the sentence, its score (higher = more worth
    annotating) and the current model's tagging of it (`TaggedSentence`, spans with their exact
    probabilities for chunk labels)."""

    index: int
    sentence: Sentence
    score: float
    tagged: object = None


# ---- chain quantities ----------------------------------------------------------------------------
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


def sample_paths(posterior, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` label sequences from each chain, `[R, n, B, T]` (padding 0): forward filtering, backward
    sampling — y_{L−1} ∝ α_{L−1}, then y_t | y_{t+1} ∝ α_t(y_t) exp W(y_t, y_{t+1}) — by Gumbel-max."""
    R, B, T, V = posterior.unary.shape
    lengths = posterior.lengths
    paths = np.zeros((R, n, B, T), dtype=np.int64)
    transposed = np.swapaxes(posterior.pairwise, 1, 2)  # [R, V(next), V(this)]
    chain = np.arange(R)[:, None, None]
    following = np.zeros((R, n, B), dtype=np.int64)
    for t in range(T - 1, -1, -1):
        log_alpha = np.broadcast_to(posterior.log_alpha[:, None, :, t], (R, n, B, V))
        conditional = log_alpha + transposed[chain, following]  # [R, n, B, V]
        last = (t == lengths - 1)[None, None, :, None]
        logits = np.where(last, log_alpha, conditional)
        draw = np.argmax(logits + rng.gumbel(size=logits.shape), axis=-1)
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


def _mixture_terms(posterior, paths_per_chain: int, rng: np.random.Generator):
    """(log p_r(y_rn) `[R, n, B]`, log p̄(y_rn) `[R, n, B]`) for `n` paths sampled from each chain r."""
    R = posterior.unary.shape[0]
    paths = sample_paths(posterior, paths_per_chain, rng)  # [R, n, B, T]
    log_p = mixture_path_log_probs(posterior, paths)  # [Q, R, n, B]
    with np.errstate(divide="ignore"):
        log_w = np.log(posterior.weights)[:, None, None, None]
    shift = np.max(log_p + log_w, axis=0)
    log_mixture = shift + np.log(np.sum(np.exp(log_p + log_w - shift), axis=0))  # [R, n, B]
    own = log_p[np.arange(R), np.arange(R)]  # [R, n, B]: each path under the chain it came from
    return own, log_mixture


def chain_scores(posterior, strategy: str, *, level: str = "token", paths: int = 8,
                 rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
    """The parts of a strategy's score for each sentence of a batch, `[B]` each: {"sum": …} for the
    additive scores (bald, entropy), {"log_p1", "log_p2"} (log-probabilities of the best and second
    best paths) for least-confidence and margin."""
    rng = rng if rng is not None else np.random.default_rng(0)
    w = posterior.weights
    valid = _valid(posterior)
    if strategy in ("least-confidence", "margin"):
        _, log_probs = posterior.nbest(2 if strategy == "margin" else 1)
        out = {"log_p1": log_probs[:, 0]}
        if strategy == "margin":
            out["log_p2"] = log_probs[:, 1]  # −inf for a sentence with a single path
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
    own, log_mixture = _mixture_terms(posterior, paths, rng)
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


# ---- the model's chains ---------------------------------------------------------------------------
_COMPILED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _potentials_fn(model, kind: str):
    """A compiled `fn(batch, samples, seed, scale) -> (unary [R, B, T, V], pairwise [R, V, V],
    weights [R])` of the chains `kind` names: "predictive" (the deterministic calibrated chain,
    R = 1), "calibrated" (the calibrated Monte Carlo draws) or "posterior" (draws of q with their
    spread scaled by `scale`, no temperature)."""
    cache = _COMPILED.setdefault(model, {})
    if kind in cache:
        return cache[kind]
    import tensorflow as tf

    from gpseq.structured import predict
    from gpseq.training.batching import batch_signature

    def flatten(unary, pairwise):
        K, S = tf.shape(unary)[0], tf.shape(unary)[1]
        V = tf.shape(unary)[-1]
        flat_unary = tf.reshape(unary, tf.concat([[K * S], tf.shape(unary)[2:]], 0))
        flat_pairwise = tf.reshape(tf.tile(pairwise[None, :, 0], [K, 1, 1, 1]), [K * S, V, V])
        weights = tf.reshape(tf.repeat(model.mixture_weights()[:, None], S, axis=1), [-1]) / tf.cast(S, unary.dtype)
        return flat_unary, flat_pairwise, weights

    def chains(batch, samples, seed, scale):
        if kind == "predictive":
            unary, pairwise = predict.predictive_potentials(model, batch)
            return unary[None], pairwise[None], tf.ones([1], unary.dtype)
        if kind == "calibrated":
            return flatten(*predict.calibrated_samples(model, batch, samples, seed))
        unary, pairwise = model.sample_potentials(batch, samples, seed)
        mean, pair_mean = predict.mean_potentials(model, batch)
        root = tf.sqrt(tf.cast(scale, unary.dtype))
        return flatten(mean + root * (unary - mean), pair_mean + root * (pairwise - pair_mean))

    signature = [batch_signature(model.dtype), tf.TensorSpec([], tf.int32), tf.TensorSpec([2], tf.int32),
                 tf.TensorSpec([], tf.float64)]
    cache[kind] = tf.function(chains, input_signature=signature)
    return cache[kind]


def _chain_kind(strategy: str, samples: int | None, variance_scale, deterministic: bool) -> str:
    if strategy == "bald":
        return "calibrated" if variance_scale == "calibrated" else "posterior"
    return "predictive" if deterministic else "calibrated"


def score_sentences(tagger, sentences: Sequence[Sentence], strategy: str = "bald", *, level: str = "token",
                    normalise: bool = False, samples: int | None = None, variance_scale="calibrated",
                    paths: int = 8, seed: int = 0, chunk: int = 0) -> np.ndarray:
    """The strategy's score `[N]` of each sentence (higher = more worth annotating); see the module
    docstring. `chunk` numbers the call for the random streams (`select` passes its chunk number)."""
    _check(strategy, level, samples, variance_scale, paths)
    lengths = np.array([len(s.tokens) for s in sentences], dtype=np.int64)
    if strategy == "random":
        return np.random.default_rng([seed, chunk, 1]).random(len(sentences))
    import scipy.sparse as sp

    from gpseq.training.batching import SequenceData, make_batch, token_batches

    deterministic = tagger._deterministic(None, samples)
    kind = _chain_kind(strategy, samples, variance_scale, deterministic)
    draws = samples or (DEFAULT_SAMPLES if strategy == "bald" else tagger.config.predict_samples)
    scale = 1.0 if isinstance(variance_scale, str) else float(variance_scale)
    chains_fn = _potentials_fn(tagger.model, kind)
    matrix = tagger.featurizer.transform(list(sentences))
    data = SequenceData(sp.csr_matrix(matrix.rows), np.asarray(matrix.offsets, dtype=np.int64), None)
    # cut sentences into pieces of at most predict_max_tokens tokens (each scored as its own chain)
    max_tokens = tagger.config.predict_max_tokens
    pieces_per = np.maximum(1, -(-lengths // max_tokens))
    owners = np.repeat(np.arange(len(sentences)), pieces_per)
    first = np.arange(len(owners)) - np.repeat(np.cumsum(pieces_per) - pieces_per, pieces_per)
    starts = data.offsets[owners] + first * max_tokens
    stops = np.minimum(starts + max_tokens, data.offsets[owners + 1])
    pieces = data.slices(starts, stops)
    R = 1 if kind == "predictive" else draws  # chains per batch (× the mixture's K, 1 by default)
    budget = max(BATCH_TOKENS // max(1, R // 8), max_tokens)
    parts: dict[str, np.ndarray] = {}
    import tensorflow as tf

    from gpseq.structured.spans import ChainPosterior

    for number, ids in enumerate(token_batches(pieces.lengths, budget, 256)):
        batch = {k: tf.convert_to_tensor(v) for k, v in make_batch(pieces, ids, dtype=tagger.predictor.dtype).items()}
        unary, pairwise, weights = chains_fn(batch, tf.constant(draws, tf.int32),
                                             tf.constant([seed, chunk * 100003 + number], tf.int32),
                                             tf.constant(scale, tf.float64))
        posterior = ChainPosterior(unary.numpy(), pairwise.numpy(), pieces.lengths[ids], weights.numpy())
        found = chain_scores(posterior, strategy, level=level, paths=paths,
                             rng=np.random.default_rng([seed, chunk, number, 2]))
        for key, value in found.items():
            parts.setdefault(key, np.zeros(len(owners)))[ids] = value
    return combine(parts, owners, lengths, strategy, normalise)


def _check(strategy, level, samples, variance_scale, paths) -> None:
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if level not in LEVELS:
        raise ConfigError(f"level must be token or sequence, got {level!r}")
    if samples is not None and samples < 1:
        raise ConfigError(f"samples must be >= 1, got {samples}")
    if strategy == "bald" and samples is not None and samples < 2:
        raise ConfigError("bald needs at least 2 posterior samples")
    if not (variance_scale == "calibrated" or (isinstance(variance_scale, (int, float))
                                               and not isinstance(variance_scale, bool) and variance_scale > 0)):
        raise ConfigError(f"variance_scale must be 'calibrated' or a positive number, got {variance_scale!r}")
    if paths < 1:
        raise ConfigError(f"paths must be >= 1, got {paths}")


# ---- picking a batch ------------------------------------------------------------------------------
def _types(sentence: Sentence) -> frozenset:
    return frozenset(token.lower() for token in sentence.tokens)


class _Diverse:
    """The picked sentences' token types, for the Jaccard test of a candidate against all of them
    at once (an inverted index: token type -> picked ids)."""

    def __init__(self, max_similarity: float):
        self.max_similarity = max_similarity
        self.postings: dict[str, list[int]] = {}
        self.sizes: list[int] = []
        self.sequences: set[tuple] = set()

    def admits(self, sentence: Sentence) -> bool:
        if tuple(sentence.tokens) in self.sequences:
            return False
        if self.max_similarity >= 1.0 or not self.sizes:
            return True
        types = _types(sentence)
        hits = [i for token in types for i in self.postings.get(token, ())]
        if not hits:
            return True
        shared = np.bincount(np.asarray(hits, dtype=np.int64), minlength=len(self.sizes))
        union = len(types) + np.asarray(self.sizes) - shared
        return bool(np.all(shared <= self.max_similarity * np.maximum(union, 1)))

    def add(self, sentence: Sentence) -> None:
        types = _types(sentence)
        for token in types:
            self.postings.setdefault(token, []).append(len(self.sizes))
        self.sizes.append(len(types))
        self.sequences.add(tuple(sentence.tokens))


def select(tagger, pool: Iterable, n: int, strategy: str = "bald", *, level: str = "token",
           normalise: bool = False, samples: int | None = None, variance_scale="calibrated", paths: int = 8,
           max_similarity: float = 0.8, candidates: int = 4, seed: int = 0, chunk_size: int = CHUNK_SENTENCES,
           tag: bool = True, progress: Callable[[int, int], None] | None = None) -> list[Selected]:
    """The `n` sentences of `pool` most worth annotating under `strategy`, best first (fewer when
    the pool has fewer distinct sentences), each with its score and, with `tag`, the model's current
    tagging (`Tagger.tag`: labels, marginals, exact span probabilities). See the module docstring
    for the strategies and options; `pool` is any iterable of `Sentence`s or token lists, read in
    chunks of `chunk_size`; `progress(sentences, tokens)` is called after each chunk."""
    if n < 1:
        raise ConfigError(f"n must be >= 1, got {n}")
    if not 0.0 < max_similarity <= 1.0:
        raise ConfigError(f"max_similarity must be in (0, 1], got {max_similarity}")
    if candidates < 1 or chunk_size < 1:
        raise ConfigError("candidates and chunk_size must be >= 1")
    _check(strategy, level, samples, variance_scale, paths)
    from gpseq.tagger import _as_sentences

    keep = n * candidates
    best: list[tuple] = []  # min-heap of (score, tie key, index, sentence): the `keep` best so far
    kept: set[tuple] = set()  # their token sequences
    done = tokens = 0
    for number, chunk in enumerate(_chunks(pool, chunk_size)):
        chunk = _as_sentences(chunk)
        usable = [i for i, s in enumerate(chunk) if len(s.tokens)]
        scores = np.full(len(chunk), -np.inf)
        if usable:
            scores[usable] = score_sentences(tagger, [chunk[i] for i in usable], strategy, level=level,
                                             normalise=normalise, samples=samples, variance_scale=variance_scale,
                                             paths=paths, seed=seed, chunk=number)
        ties = np.random.default_rng([seed, number, 3]).random(len(chunk))
        for i in usable:
            entry = (float(scores[i]), float(ties[i]), done + i, chunk[i])
            key = tuple(chunk[i].tokens)
            if key in kept:  # an exact duplicate of a candidate: never two of them
                continue
            if len(best) < keep:
                heapq.heappush(best, entry)
            elif entry[:2] > best[0][:2]:
                kept.discard(tuple(heapq.heapreplace(best, entry)[3].tokens))
            else:
                continue
            kept.add(key)
        done += len(chunk)
        tokens += sum(len(s.tokens) for s in chunk)
        if progress is not None:
            progress(done, tokens)
    ranked = sorted(best, key=lambda entry: (-entry[0], -entry[1]))
    diverse = _Diverse(max_similarity)
    picked = []
    for score, _, index, sentence in ranked:
        if len(picked) == n:
            break
        if diverse.admits(sentence):
            diverse.add(sentence)
            picked.append(Selected(index, sentence, score))
    if len(picked) < n and len(ranked) >= keep:
        log.warning("only %d of %d sentences picked: the %d best candidates hold too many near-duplicates "
                    "(raise candidates or max_similarity)", len(picked), n, keep)
    if tag and picked:
        for item, tagged in zip(picked, tagger.tag([item.sentence for item in picked])):
            item.tagged = tagged
    return picked


def _chunks(pool: Iterable, size: int):
    chunk = []
    for sentence in pool:
        chunk.append(sentence)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
