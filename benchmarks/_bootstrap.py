"""Paired bootstrap over test sentences: how far apart two systems' metrics on one test set really are.

Two taggers tested on the same sentences differ by a few thousandths in ECE or NLL; whether that
is the systems or the sample of sentences is what a reader needs to know before reading "wins".
`outcomes` keeps what the metrics of `gpseq.evaluation.evaluate` are computed from, per token and per
sentence; `paired_bootstrap` draws the test sentences with replacement (the same draw for both
systems, `RESAMPLES` times) and reports the difference A − B of each metric on the full set with
the 2.5 % and 97.5 % quantiles of its bootstrap distribution. The metrics are `gpseq.evaluation.metrics`'
own functions, so the full-set figures equal the reported ones. `unseen` and `restrict` narrow
outcomes to the out-of-vocabulary tokens (word forms absent from the training file), whose metrics
and bootstrap are then the same functions'.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from gpseq.evaluation.evaluate import DEFAULT_EPS
from gpseq.evaluation.metrics import aurc, expected_calibration_error, spans

RESAMPLES = 1000
METRICS = ("token_nll", "ece", "brier", "aurc", "score")


@dataclass
class Outcomes:
    """A system's results on a test set: per token (in sentence order) and per sentence."""

    offsets: np.ndarray  # [S + 1] token offsets of the sentences
    nll: np.ndarray  # [N] −log max(p(gold), eps)
    confidence: np.ndarray  # [N] p(returned label)
    correct: np.ndarray  # [N] returned label == gold
    brier: np.ndarray  # [N] Σ_j (p_j − 1[j = gold])²
    chunks: np.ndarray | None  # [S, 3] gold, predicted, correct chunks; None: the score is token accuracy


def outcomes(gold, predicted, probabilities, labels, chunked: bool, scheme: str = "iob2") -> Outcomes:
    """`Outcomes` of labels `predicted` with per-token distributions `probabilities` (`[T_s, V]`
    per sentence, columns in `labels` order) against `gold`; chunk counts when `chunked`."""
    index = {label: i for i, label in enumerate(labels)}
    flat = np.concatenate([np.asarray(p, np.float64) for p in probabilities])
    gold_flat = [label for sentence in gold for label in sentence]
    predicted_flat = [label for sentence in predicted for label in sentence]
    gold_index = np.array([index.get(label, -1) for label in gold_flat], np.int64)
    predicted_index = np.array([index.get(label, -1) for label in predicted_flat], np.int64)
    rows = np.arange(len(flat))
    p_gold = np.where(gold_index >= 0, flat[rows, np.maximum(gold_index, 0)], 0.0)
    chunks = None
    if chunked:
        counts = []
        for g, p in zip(gold, predicted):
            g_spans, p_spans = set(spans(list(g), scheme)), set(spans(list(p), scheme))
            counts.append((len(g_spans), len(p_spans), len(g_spans & p_spans)))
        chunks = np.array(counts, np.float64)
    return Outcomes(
        offsets=np.concatenate([[0], np.cumsum([len(s) for s in gold])]).astype(np.int64),
        nll=-np.log(np.maximum(p_gold, DEFAULT_EPS)),
        confidence=np.where(predicted_index >= 0, flat[rows, np.maximum(predicted_index, 0)], 0.0),
        correct=np.array([g == p for g, p in zip(gold_flat, predicted_flat)], bool),
        brier=np.sum(flat**2, axis=1) - 2.0 * p_gold + 1.0,
        chunks=chunks,
    )


def unseen(sentences, vocabulary) -> np.ndarray:
    """[N] whether each token's word form (`Sentence.tokens`: the token column the file was read
    with; exact, case-sensitive) is absent from `vocabulary`, in sentence order (as `Outcomes`)."""
    return np.array([word not in vocabulary for sentence in sentences for word in sentence.tokens], bool)


def restrict(result: Outcomes, keep: np.ndarray) -> Outcomes:
    """The outcomes of the tokens where `keep` [N] holds, in their sentences (some then empty); no
    chunk counts, so its score is token accuracy."""
    offsets = np.concatenate([[0], np.cumsum(keep)])[result.offsets]
    return dataclasses.replace(result, offsets=offsets, nll=result.nll[keep], confidence=result.confidence[keep],
                               correct=result.correct[keep], brier=result.brier[keep], chunks=None)


def _tokens(offsets: np.ndarray, sentences: np.ndarray) -> np.ndarray:
    """Token indices of `sentences` (with repeats, in the given order)."""
    starts, lengths = offsets[sentences], np.diff(offsets)[sentences]
    return np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())


def metric(result: Outcomes, name: str, sentences: np.ndarray | None = None) -> float:
    """Metric `name` of `METRICS` on the test sentences `sentences` (ids, repeats allowed; None: all)."""
    if sentences is None:
        sentences = np.arange(len(result.offsets) - 1)
    if name == "score" and result.chunks is not None:
        gold, predicted, correct = result.chunks[sentences].sum(0)
        return 2.0 * correct / (gold + predicted) if gold + predicted else 0.0
    tokens = _tokens(result.offsets, sentences)
    if name == "score":
        return float(result.correct[tokens].mean())
    if name == "token_nll":
        return float(result.nll[tokens].mean())
    if name == "brier":
        return float(result.brier[tokens].mean())
    if name == "ece":
        return expected_calibration_error(result.confidence[tokens], result.correct[tokens], 15)
    if name == "aurc":
        return aurc(result.confidence[tokens], result.correct[tokens])
    raise ValueError(f"unknown metric {name!r}")


def paired_bootstrap(a: Outcomes, b: Outcomes, names=METRICS, resamples: int = RESAMPLES,
                     seed: int = 0) -> dict[str, tuple[float, float, float]]:
    """{metric: (A − B on the full set, 2.5 % quantile, 97.5 % quantile)} over `resamples` draws
    of the test sentences with replacement, the same draws for A and B."""
    if not np.array_equal(a.offsets, b.offsets):
        raise ValueError("the two systems were not tested on the same sentences")
    count = len(a.offsets) - 1
    rng = np.random.default_rng(seed)
    draws = [rng.integers(0, count, count) for _ in range(resamples)]
    out = {}
    for name in names:
        diffs = np.array([metric(a, name, s) - metric(b, name, s) for s in draws])
        low, high = np.quantile(diffs, [0.025, 0.975])
        out[name] = (metric(a, name) - metric(b, name), float(low), float(high))
    return out


def verdict(low: float, high: float, higher_is_better: bool = False) -> str:
    """"better" / "worse" for A when the 95 % interval [low, high] of A − B excludes 0, else "tie"."""
    return "tie" if low <= 0.0 <= high else ("better" if (low > 0.0) == higher_is_better else "worse")


def calibrated_ece(result: Outcomes, draws: int = 200, seed: int = 0) -> tuple[float, float]:
    """(mean, 95th percentile) of the ECE that a perfectly calibrated system with these confidences
    shows on this many tokens: each token's correctness drawn as Bernoulli(its confidence), `draws`
    times. An observed ECE below the 95th percentile is within what the test set's size alone gives
    — a lower bound of that noise, as the draws are independent and the errors of one sentence's
    tokens are not."""
    rng = np.random.default_rng(seed)
    confidence = result.confidence
    values = [expected_calibration_error(confidence, rng.random(len(confidence)) < confidence, 15)
              for _ in range(draws)]
    return float(np.mean(values)), float(np.quantile(values, 0.95))
