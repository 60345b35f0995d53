"""Metrics for acting on probabilities: entity-level calibration, selective prediction
(risk–coverage, AURC, error at fixed coverage, the threshold for a target error), n-best coverage
calibration, and their plots.

A predicted span (entity, chunk) is correct when a gold span has the same type, start and end
(conlleval); its confidence is the probability the tagger gives it (`TaggedSentence.spans`:
exact, or the product of token marginals for comparison). Token-level versions use the
returned label's marginal, as `gpseq.evaluation.evaluate` does. Risk–coverage orders items by confidence,
highest first, ties in random order (expectation; `gpseq.evaluation.evaluate.risk_coverage`).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gpseq.corpora._atomic import replacing
from gpseq.errors import ConfigError
from gpseq.evaluation.metrics import aurc, calibration_bins, expected_calibration_error, risk_coverage, selective_error

COVERAGES = (0.8, 0.9, 0.95)
RARE_SHARE = 0.05  # a type (label) is "rare" when it has less than this share of the gold spans (tokens)


def span_outcomes(gold_spans: Sequence[Sequence[tuple]], predicted: Sequence[Sequence[tuple]]):
    """(confidence [N], correct [N], type [N]) of every predicted span: `predicted[s]` holds
    (type, start, end, probability) tuples, `gold_spans[s]` (type, start, end) tuples."""
    if len(gold_spans) != len(predicted):
        raise ConfigError(f"{len(gold_spans)} gold sentences but {len(predicted)} predicted")
    confidence, correct, kinds = [], [], []
    for gold, found in zip(gold_spans, predicted):
        gold = {tuple(span[:3]) for span in gold}
        for kind, start, end, probability in found:
            confidence.append(float(probability))
            correct.append((kind, start, end) in gold)
            kinds.append(kind)
    return np.asarray(confidence, dtype=np.float64), np.asarray(correct, dtype=bool), kinds


def frequency_bands(counts: Counter, rare_share: float = RARE_SHARE) -> dict[str, str]:
    """{type: "frequent" | "rare"}: rare when the type has less than `rare_share` of all counts."""
    total = sum(counts.values())
    return {kind: ("rare" if total == 0 or n / total < rare_share else "frequent") for kind, n in counts.items()}


def calibration_summary(confidence: np.ndarray, correct: np.ndarray, n_bins: int = 15) -> dict:
    """ECE, Brier (mean (p − correct)²), mean confidence, accuracy and count of binary outcomes."""
    confidence = np.asarray(confidence, dtype=np.float64)
    correct = np.asarray(correct, dtype=np.float64)
    if not confidence.size:
        return {"ece": None, "brier": None, "confidence": None, "accuracy": None, "count": 0}
    return {
        "ece": expected_calibration_error(confidence, correct, n_bins),
        "brier": float(np.mean((confidence - correct) ** 2)),
        "confidence": float(confidence.mean()),
        "accuracy": float(correct.mean()),
        "count": int(confidence.size),
    }


def selective_summary(confidence: np.ndarray, correct: np.ndarray, coverages: Sequence[float] = COVERAGES) -> dict:
    """AURC and the error rate at each coverage (`error_at_80` …) of items ranked by confidence."""
    out = {"aurc": aurc(confidence, correct) if len(confidence) else None}
    for coverage in coverages:
        key = f"error_at_{round(100 * coverage)}"
        out[key] = selective_error(confidence, correct, coverage) if len(confidence) else None
    return out


def curve_points(confidence: np.ndarray, correct: np.ndarray, points: int = 101) -> dict:
    """The risk–coverage curve sampled at `points` coverages in (0, 1]: {"coverage", "risk", "threshold"}
    (threshold: the confidence of the last item kept at that coverage)."""
    risk = risk_coverage(confidence, correct)
    n = risk.size
    if not n:
        return {"coverage": [], "risk": [], "threshold": []}
    ranked = np.sort(np.asarray(confidence, dtype=np.float64))[::-1]
    ks = np.unique(np.clip(np.ceil(np.linspace(0, 1, points)[1:] * n - 1e-9).astype(int), 1, n))
    return {"coverage": (ks / n).tolist(), "risk": risk[ks - 1].tolist(), "threshold": ranked[ks - 1].tolist()}


def threshold_for_error(confidence: np.ndarray, correct: np.ndarray, target: float) -> dict:
    """The abstention threshold P with the largest coverage whose kept items (confidence ≥ P) have an
    error rate ≤ `target`: {"threshold", "coverage", "error"} (threshold None, coverage 0 when even
    the most confident group errs more; ties kept or dropped together, as `--abstain-below` does)."""
    if not 0.0 <= target < 1.0:
        raise ConfigError(f"target error must be in [0, 1), got {target}")
    confidence = np.asarray(confidence, dtype=np.float64)
    wrong = ~np.asarray(correct, dtype=bool)
    n = confidence.size
    if not n:
        return {"threshold": None, "coverage": 0.0, "error": None}
    order = np.argsort(-confidence, kind="stable")
    ranked = confidence[order]
    errors = np.cumsum(wrong[order])
    last_of_group = np.append(ranked[1:] != ranked[:-1], True)  # keep whole tie groups
    k = np.flatnonzero(last_of_group) + 1  # items kept at each distinct threshold
    error = errors[k - 1] / k
    ok = np.flatnonzero(error <= target + 1e-12)
    if not len(ok):
        return {"threshold": None, "coverage": 0.0, "error": None}
    best = ok[-1]
    return {"threshold": float(ranked[k[best] - 1]), "coverage": float(k[best] / n), "error": float(error[best])}


def nbest_coverage(gold_ranks: Sequence[int | None], nbest_probs: Sequence[Sequence[float]],
                   ks: Sequence[int] = (1, 2, 5, 10), n_bins: int = 10) -> dict:
    """n-best calibration: for each k, the fraction of sentences whose gold path is among the top k
    (`gold_ranks[s]`: its 0-based rank, None if not in the list) against the mean summed probability
    of the top k; with `ece_k` the ECE of that summed probability as a confidence that the gold path
    is in the top k."""
    if len(gold_ranks) != len(nbest_probs):
        raise ConfigError(f"{len(gold_ranks)} gold ranks for {len(nbest_probs)} n-best lists")
    out = {}
    for k in ks:
        claimed = np.array([min(1.0, float(np.sum(probs[:k]))) for probs in nbest_probs])
        inside = np.array([rank is not None and rank < k for rank in gold_ranks])
        out[f"nbest_coverage_{k}"] = float(inside.mean()) if inside.size else None
        out[f"nbest_claimed_{k}"] = float(claimed.mean()) if claimed.size else None
        out[f"nbest_ece_{k}"] = expected_calibration_error(claimed, inside, n_bins) if inside.size else None
    return out


def entity_report(gold_spans, predicted, *, product=None, n_bins: int = 15, rare_share: float = RARE_SHARE,
                  coverages: Sequence[float] = COVERAGES) -> dict:
    """Entity-level calibration and selective prediction of predicted spans with their probabilities
    (`predicted[s]`: (type, start, end, p)), overall and by frequency band of the gold types; with
    `product` (the same spans with the product-of-marginals probabilities) its ECE and Brier beside.
    Flat keys `entity_ece`, `entity_brier`, `entity_aurc`, `entity_error_at_90`,
    `entity_ece_frequent` …, and "entity_calibration" (bins) for the plot."""
    confidence, correct, kinds = span_outcomes(gold_spans, predicted)
    summary = calibration_summary(confidence, correct, n_bins)
    out = {"n_predicted_spans": summary["count"], "entity_ece": summary["ece"], "entity_brier": summary["brier"],
           "entity_confidence": summary["confidence"], "entity_precision": summary["accuracy"]}
    out.update({f"entity_{key}": value for key, value in selective_summary(confidence, correct, coverages).items()})
    if product is not None:
        p_confidence, p_correct, _ = span_outcomes(gold_spans, product)
        p_summary = calibration_summary(p_confidence, p_correct, n_bins)
        out["entity_ece_product"], out["entity_brier_product"] = p_summary["ece"], p_summary["brier"]
        out.update({f"entity_{key}_product": value
                    for key, value in selective_summary(p_confidence, p_correct, coverages).items()})
    bands = frequency_bands(Counter(span[0] for gold in gold_spans for span in gold), rare_share)
    kinds = np.array([bands.get(kind, "rare") for kind in kinds], dtype=object)
    for band in ("frequent", "rare"):
        chosen = kinds == band if len(kinds) else np.zeros(0, dtype=bool)
        band_summary = calibration_summary(confidence[chosen], correct[chosen], n_bins)
        out[f"entity_ece_{band}"] = band_summary["ece"]
        out[f"entity_brier_{band}"] = band_summary["brier"]
        out[f"n_predicted_spans_{band}"] = band_summary["count"]
    if confidence.size:
        counts, mean_confidence, accuracy = calibration_bins(confidence, correct, n_bins)
        out["entity_calibration"] = {"counts": counts.tolist(), "confidence": _nan_none(mean_confidence),
                                     "accuracy": _nan_none(accuracy)}
    return out


def token_band_report(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]], confidence: np.ndarray,
                      n_bins: int = 15, rare_share: float = RARE_SHARE) -> dict:
    """Token-level ECE and Brier of the returned labels by frequency band of the *predicted* label
    (its share of the gold tokens): `ece_frequent`, `ece_rare`, `brier_frequent` …"""
    gold_flat = [label for sentence in gold for label in sentence]
    predicted_flat = [label for sentence in predicted for label in sentence]
    bands = frequency_bands(Counter(gold_flat), rare_share)
    band = np.array([bands.get(label, "rare") for label in predicted_flat], dtype=object)
    correct = np.array([g == p for g, p in zip(gold_flat, predicted_flat)], dtype=bool)
    confidence = np.asarray(confidence, dtype=np.float64)
    out = {}
    for name in ("frequent", "rare"):
        chosen = band == name if len(band) else np.zeros(0, dtype=bool)
        summary = calibration_summary(confidence[chosen], correct[chosen], n_bins)
        out[f"ece_{name}"], out[f"brier_{name}"], out[f"n_tokens_{name}"] = (summary["ece"], summary["brier"],
                                                                            summary["count"])
    return out


def _nan_none(values) -> list:
    return [None if (x is None or (isinstance(x, float) and math.isnan(x))) else float(x) for x in values]


def risk_coverage_plot(curves: dict[str, dict], path: str | os.PathLike, title: str | None = None) -> Path:
    """Write a PNG of risk (error rate of what is kept) against coverage, one line per
    {name: `curve_points` dict with an "aurc"}, with the AURC in the legend; written atomically."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5, 4), layout="constrained")
    axes = figure.subplots()
    for name, curve in curves.items():
        if not curve.get("coverage"):
            continue
        axes.plot(curve["coverage"], curve["risk"], label=f"{name} (AURC {curve['aurc']:.4f})")
    for coverage in COVERAGES:
        axes.axvline(coverage, color="grey", linewidth=0.5, linestyle=":")
    axes.set_xlabel("coverage (fraction kept, most confident first)")
    axes.set_ylabel("risk (error rate of the kept)")
    axes.set_xlim(0, 1)
    axes.set_ylim(bottom=0)
    axes.legend(loc="upper left")
    axes.set_title(title or "risk–coverage")
    path = Path(path)
    with replacing(path) as temp:  # through a symlink to its target; a device written directly
        figure.savefig(temp, format="png", dpi=100)
    return path


def selective_curves(confidence: np.ndarray, correct: np.ndarray) -> dict:
    """`curve_points` with the AURC, for `risk_coverage_plot`."""
    return {**curve_points(confidence, correct), "aurc": aurc(confidence, correct) if len(confidence) else None}
