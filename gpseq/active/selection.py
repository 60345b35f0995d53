"""Active learning from the posterior: rank unlabelled sentences by how much annotating them is
worth, and pick a batch (`Tagger.select`, `gpseq select`).

The strategies (entropy, bald, least-confidence, margin, random), their levels and `normalise` are
defined in `gpseq.active.acquisition`, which scores a batch of chains; this module draws the chains from
the model. The default is the token entropy of the calibrated predictive (its total uncertainty, the
posterior's variance included): in simulated annotation it picked sentences that raised chunk F1
more than BALD's epistemic part alone did, on both corpora of `benchmarks/active_learning.py`.
BALD's draws: `variance_scale="calibrated"` (default) uses the calibrated predictive's draws (the
spread of q scaled by the fitted α, potentials divided by the temperature T, as
`samples=S` tagging does); a number c draws f from q with its spread scaled by c (c = 1: the
Laplace / SVI posterior itself) and no temperature. One seed is one set of draws for the whole pool
(the weights' noise keyed by feature id, `gpseq.structured.unaries`): a sentence's score does not
depend on the sentences scored with it, nor on the chunk size; nor do the sequence-level
strategies' sampled paths, drawn from a key of the sentence's tokens and the seed.

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

from gpseq._tensorflow import check_not_forked
from gpseq.active.acquisition import (LEVELS, STRATEGIES, chain_entropies, chain_scores, chain_token_marginals, combine,
                                      mixture_path_log_probs, sample_paths, sentence_keys)
from gpseq.corpora.types import Sentence, as_sentences
from gpseq.errors import ConfigError

__all__ = ["STRATEGIES", "LEVELS", "Selected", "select", "score_sentences", "chain_token_marginals",
           "chain_entropies", "sample_paths", "mixture_path_log_probs", "chain_scores"]

log = logging.getLogger("gpseq")

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

    from gpseq.training.batching import batch_signature

    # the functions reach the model through a weak reference: a strong one, held by the cache's
    # value, would keep every model a select ever scored with alive (a weak key's value must not
    # refer to its key)
    model_ref = weakref.ref(model)
    del model

    def chains(batch, samples, seed, scale):
        return _chains(model_ref(), kind, batch, samples, seed, scale)

    signature = [batch_signature(model_ref().dtype), tf.TensorSpec([], tf.int32), tf.TensorSpec([2], tf.int32),
                 tf.TensorSpec([], tf.float64)]
    cache[kind] = tf.function(chains, input_signature=signature)
    return cache[kind]


def _chains(model, kind: str, batch, samples, seed, scale):
    """The chains of `_potentials_fn` (traced there)."""
    import tensorflow as tf

    from gpseq.structured import predict

    def flatten(unary, pairwise):
        K, S = tf.shape(unary)[0], tf.shape(unary)[1]
        V = tf.shape(unary)[-1]
        flat_unary = tf.reshape(unary, tf.concat([[K * S], tf.shape(unary)[2:]], 0))
        flat_pairwise = tf.reshape(tf.tile(pairwise[None, :, 0], [K, 1, 1, 1]), [K * S, V, V])
        weights = tf.reshape(tf.repeat(model.mixture_weights()[:, None], S, axis=1), [-1]) / tf.cast(S, unary.dtype)
        return flat_unary, flat_pairwise, weights

    if kind == "predictive":
        unary, pairwise = predict.predictive_potentials(model, batch)
        return unary[None], pairwise[None], tf.ones([1], unary.dtype)
    if kind == "calibrated":
        return flatten(*predict.calibrated_samples(model, batch, samples, seed))
    unary, pairwise = model.sample_potentials(batch, samples, seed)
    mean, pair_mean = predict.mean_potentials(model, batch)
    root = tf.sqrt(tf.cast(scale, unary.dtype))
    return flatten(mean + root * (unary - mean), pair_mean + root * (pairwise - pair_mean))


def _chain_kind(strategy: str, samples: int | None, variance_scale, deterministic: bool) -> str:
    if strategy == "bald":
        return "calibrated" if variance_scale == "calibrated" else "posterior"
    return "predictive" if deterministic else "calibrated"


def score_sentences(tagger, sentences: Sequence[Sentence], strategy: str = "entropy", *, level: str = "token",
                    normalise: bool = False, samples: int | None = None, variance_scale="calibrated",
                    paths: int = 8, seed: int = 0, chunk: int = 0) -> np.ndarray:
    """The strategy's score `[N]` of each sentence (higher = more worth annotating); see the module
    docstring. `chunk` numbers the call for the random strategy's stream (`select` draws its own)."""
    _check(strategy, level, samples, variance_scale, paths, seed)
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
    # each piece's own stream for the sampled paths (only the sequence level samples any)
    keys = sentence_keys([sentences[i] for i in owners], seed, first) if level == "sequence" else None
    check_not_forked()  # the chains are drawn by TensorFlow
    R = 1 if kind == "predictive" else draws  # chains per batch (× the mixture's K, 1 by default)
    budget = max(BATCH_TOKENS // max(1, R // 8), max_tokens)
    parts: dict[str, np.ndarray] = {}
    import tensorflow as tf

    from gpseq.structured.spans import ChainPosterior

    for ids in token_batches(pieces.lengths, budget, 256):
        batch = {k: tf.convert_to_tensor(v) for k, v in make_batch(pieces, ids, dtype=tagger.predictor.dtype).items()}
        unary, pairwise, weights = chains_fn(batch, tf.constant(draws, tf.int32),
                                             tf.constant([seed, 0], tf.int32),  # the same draws in every batch
                                             tf.constant(scale, tf.float64))
        posterior = ChainPosterior(unary.numpy(), pairwise.numpy(), pieces.lengths[ids], weights.numpy())
        found = chain_scores(posterior, strategy, level=level, paths=paths, keys=None if keys is None else keys[ids])
        for key, value in found.items():
            parts.setdefault(key, np.zeros(len(owners)))[ids] = value
    return combine(parts, owners, lengths, strategy, normalise)


def _check(strategy, level, samples, variance_scale, paths, seed) -> None:
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if level not in LEVELS:
        raise ConfigError(f"level must be token or sequence, got {level!r}")
    from gpseq.config import MAX_SAMPLES

    if samples is not None and not 1 <= samples <= MAX_SAMPLES:
        raise ConfigError(f"samples must be in [1, {MAX_SAMPLES:,}] (posterior draws; memory grows with them), "
                          f"got {samples:,}")
    if strategy == "bald" and samples is not None and samples < 2:
        raise ConfigError("bald needs at least 2 posterior samples")
    if not (variance_scale == "calibrated" or (isinstance(variance_scale, (int, float))
                                               and not isinstance(variance_scale, bool) and variance_scale > 0)):
        raise ConfigError(f"variance_scale must be 'calibrated' or a positive number, got {variance_scale!r}")
    if not 1 <= paths <= MAX_SAMPLES:
        raise ConfigError(f"paths must be in [1, {MAX_SAMPLES:,}], got {paths:,}")
    # the draws' seed is an int32 (2**32 would alias 0) and NumPy's seeds are non-negative
    if not 0 <= seed < 2**31:
        raise ConfigError(f"seed must be in [0, 2**31), got {seed}")


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


def select(tagger, pool: Iterable, n: int, strategy: str = "entropy", *, level: str = "token",
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
    _check(strategy, level, samples, variance_scale, paths, seed)
    if isinstance(pool, str):  # not its characters, one chunk at a time
        as_sentences(pool)

    keep = n * candidates
    best: list[tuple] = []  # min-heap of (score, tie key, index, sentence): the `keep` best so far
    kept: set[tuple] = set()  # their token sequences
    done = tokens = 0
    # one stream each over the whole pool, a draw per sentence: the random order and the tie keys
    # do not depend on how the pool is cut into chunks
    order, tie_keys = np.random.default_rng([seed, 1]), np.random.default_rng([seed, 3])
    for number, chunk in enumerate(_chunks(pool, chunk_size)):
        chunk = as_sentences(chunk)
        usable = [i for i, s in enumerate(chunk) if len(s.tokens)]
        scores = np.full(len(chunk), -np.inf)
        if strategy == "random":
            scores[usable] = order.random(len(chunk))[usable]
        elif usable:
            scores[usable] = score_sentences(tagger, [chunk[i] for i in usable], strategy, level=level,
                                             normalise=normalise, samples=samples, variance_scale=variance_scale,
                                             paths=paths, seed=seed, chunk=number)
        ties = tie_keys.random(len(chunk))
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
