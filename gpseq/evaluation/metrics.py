"""Metrics of labelled sequences: conlleval chunk precision/recall/F1, calibration bins and ECE,
the multiclass Brier score, selective prediction (risk–coverage, AURC, error at a coverage).

Every function takes flat arrays or label lists and returns numbers (`evaluate.py` builds the
report from them): confidence and correct `[N]`, probabilities `[N, V]`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpseq.corpora.schemes import spans
from gpseq.errors import ConfigError, NumericalError

__all__ = ["ChunkScore", "ChunkScores", "aurc", "brier_score", "calibration_bins", "check_lengths", "chunk_scores",
           "expected_calibration_error", "risk_coverage", "selective_error"]


@dataclass
class ChunkScore:
    """Chunk counts and scores (fractions in [0, 1]; 0 where a denominator is 0, as conlleval)."""

    n_gold: int
    n_predicted: int
    n_correct: int

    @property
    def precision(self) -> float:
        return self.n_correct / self.n_predicted if self.n_predicted else 0.0

    @property
    def recall(self) -> float:
        return self.n_correct / self.n_gold if self.n_gold else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r > 0 else 0.0


@dataclass
class ChunkScores:
    """Overall and per-type chunk scores."""

    overall: ChunkScore
    per_type: dict[str, ChunkScore]


def chunk_scores(
    gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]], scheme: str = "iob2"
) -> ChunkScores:
    """conlleval chunk precision/recall/F1: a chunk is correct when type, start and end all match.

    gold, predicted: [S][T_s] labels. Sentence boundaries end chunks. Per-type keys are chunk
    types ("" for bare B/I tags). ConfigError if a label is not a chunk label of `scheme`.
    """
    check_lengths(gold, predicted)
    gold_count, predicted_count, correct_count = Counter(), Counter(), Counter()
    for gold_labels, predicted_labels in zip(gold, predicted):
        gold_spans = set(spans(gold_labels, scheme))
        predicted_spans = set(spans(predicted_labels, scheme))
        gold_count.update(kind for kind, _, _ in gold_spans)
        predicted_count.update(kind for kind, _, _ in predicted_spans)
        correct_count.update(kind for kind, _, _ in gold_spans & predicted_spans)
    per_type = {
        kind: ChunkScore(gold_count[kind], predicted_count[kind], correct_count[kind])
        for kind in sorted(set(gold_count) | set(predicted_count))
    }
    overall = ChunkScore(sum(gold_count.values()), sum(predicted_count.values()), sum(correct_count.values()))
    return ChunkScores(overall, per_type)


def calibration_bins(confidence: np.ndarray, correct: np.ndarray, n_bins: int = 15):
    """Equal-width bins ((i/n, (i+1)/n], the first also holding 0) of confidence (e.g. of the returned label).

    confidence, correct: [N]. Returns counts [n_bins], mean confidence [n_bins], accuracy
    [n_bins] (NaN for empty bins).
    """
    confidence = np.asarray(confidence, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    if confidence.shape != correct.shape or confidence.ndim != 1:
        raise ConfigError("confidence and correct must be 1-D arrays of the same length")
    if n_bins < 1:
        raise ConfigError(f"n_bins must be >= 1, got {n_bins}")
    if confidence.size and (
        np.nanmin(confidence) < 0 or np.nanmax(confidence) > 1 + 1e-9 or np.isnan(confidence).any()
    ):
        raise NumericalError("confidences must lie in [0, 1]")
    index = np.clip(np.ceil(confidence * n_bins).astype(np.int64) - 1, 0, n_bins - 1)
    counts = np.bincount(index, minlength=n_bins).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_confidence = np.bincount(index, weights=confidence, minlength=n_bins) / counts
        accuracy = np.bincount(index, weights=correct, minlength=n_bins) / counts
    return counts.astype(np.int64), mean_confidence, accuracy


def expected_calibration_error(confidence: np.ndarray, correct: np.ndarray, n_bins: int = 15) -> float:
    """ECE = Σ_b (n_b / N) |accuracy_b − mean confidence_b|, equal-width bins. confidence, correct: [N]."""
    counts, mean_confidence, accuracy = calibration_bins(confidence, correct, n_bins)
    total = counts.sum()
    if total == 0:
        return float("nan")
    filled = counts > 0
    return float(np.sum(counts[filled] / total * np.abs(accuracy[filled] - mean_confidence[filled])))


def brier_score(probabilities: np.ndarray, gold_index: np.ndarray) -> float:
    """Mean over tokens of Σ_j (p_j − 1[j = gold])², over the label set plus the gold label.

    probabilities: [N, V]; gold_index: [N], −1 for a gold label outside the label set (its own
    term (0 − 1)² = 1 is then added to Σ_j p_j²).
    """
    probabilities = np.asarray(probabilities, dtype=np.float64)
    gold_index = np.asarray(gold_index, dtype=np.int64)
    if probabilities.ndim != 2 or gold_index.shape != probabilities.shape[:1]:
        raise ConfigError("brier_score needs probabilities [N, V] and gold_index [N]")
    if probabilities.shape[0] == 0:
        return float("nan")
    seen = gold_index >= 0
    p_gold = np.where(seen, probabilities[np.arange(len(gold_index)), np.maximum(gold_index, 0)], 0.0)
    return float(np.mean(np.sum(probabilities**2, axis=1) - 2.0 * p_gold + 1.0))


def _expected_cumulative_errors(confidence: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """[N] expected number of errors among the k most confident tokens, k = 1..N.

    Tokens are ranked by confidence, highest first. Within a group of tied confidences the
    order is taken as uniformly random and the expectation is used: the first j tokens of a
    tied group of size g holding e errors contribute j · e / g errors. The result therefore does
    not depend on the order of the tokens in the input (a stable sort would make it depend on
    where tied tokens happen to sit in the corpus).
    """
    confidence = np.asarray(confidence, dtype=np.float64)
    correct = np.asarray(correct, dtype=bool)
    if confidence.shape != correct.shape or confidence.ndim != 1:
        raise ConfigError("confidence and correct must be 1-D arrays of the same length")
    if np.isnan(confidence).any():
        raise NumericalError("confidences must not be NaN")
    n = confidence.size
    order = np.argsort(-confidence, kind="stable")
    sorted_confidence = confidence[order]
    errors = (~correct[order]).astype(np.float64)
    cumulative = np.concatenate([[0.0], np.cumsum(errors)])  # [N + 1], errors among the first k
    starts_mask = np.ones(n, dtype=bool)
    starts_mask[1:] = sorted_confidence[1:] != sorted_confidence[:-1]
    group = np.cumsum(starts_mask) - 1  # [N] tie group of each ranked position
    starts = np.flatnonzero(starts_mask)  # [G] first position of each group
    ends = np.append(starts[1:], n)  # [G] one past its last position
    a, b = starts[group], ends[group]
    k = np.arange(1, n + 1)
    return cumulative[a] + (k - a) * (cumulative[b] - cumulative[a]) / (b - a)


def risk_coverage(confidence: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """Selective risk [N]: risk[k − 1] = expected error rate of the k most confident tokens.

    confidence, correct: [N]. Ties in confidence: expectation over a random order within the
    tied group (see `_expected_cumulative_errors`).
    """
    expected_errors = _expected_cumulative_errors(confidence, correct)
    return expected_errors / np.arange(1, expected_errors.size + 1)


def aurc(confidence: np.ndarray, correct: np.ndarray) -> float:
    """Area under the risk–coverage curve: mean over k = 1..N of the risk of the k most confident tokens.

    confidence, correct: [N]. Lower is better; it is small when errors get low confidence.
    NaN for N = 0.
    """
    risk = risk_coverage(confidence, correct)
    return float(risk.mean()) if risk.size else float("nan")


def selective_error(confidence: np.ndarray, correct: np.ndarray, coverage: float = 0.9) -> float:
    """Error rate of the ceil(coverage · N) most confident tokens (ties as in `risk_coverage`).

    confidence, correct: [N]; coverage in (0, 1]. NaN for N = 0.
    """
    if not 0.0 < coverage <= 1.0:
        raise ConfigError(f"coverage must be in (0, 1], got {coverage}")
    expected_errors = _expected_cumulative_errors(confidence, correct)
    n = expected_errors.size
    if n == 0:
        return float("nan")
    k = min(n, max(1, math.ceil(coverage * n - 1e-9)))  # 1e-9: 0.9 · N may round up past an integer
    return float(expected_errors[k - 1] / k)


def check_lengths(gold, predicted) -> None:
    if len(gold) != len(predicted):
        raise ConfigError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
    for number, (g, p) in enumerate(zip(gold, predicted), start=1):
        if len(g) != len(p):
            raise ConfigError(f"sentence {number}: {len(g)} gold labels but {len(p)} predicted")
