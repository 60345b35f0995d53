"""Reliability diagrams: accuracy per confidence bin against the diagonal, with the histogram of
the items, as a PNG; and the per-item arrays that an evaluation report's bins stand for.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from gpseq.corpora._atomic import replacing
from gpseq.evaluation.metrics import calibration_bins, expected_calibration_error

__all__ = ["reliability_diagram", "from_bins"]


def reliability_diagram(
    confidence: np.ndarray,
    correct: np.ndarray,
    path: str | os.PathLike,
    n_bins: int = 15,
    title: str | None = None,
    unit: str = "tokens",
) -> Path:
    """Write a reliability diagram PNG (accuracy per confidence bin against the diagonal, histogram of
    the items: `unit` names them, e.g. "spans" for predicted entities).

    confidence, correct: [N]. Written atomically; returns the path.
    """
    from matplotlib.figure import Figure  # no pyplot: the Agg canvas is used, no global backend state

    counts, mean_confidence, accuracy = calibration_bins(confidence, correct, n_bins)
    ece = expected_calibration_error(confidence, correct, n_bins)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    width = 1.0 / n_bins
    figure = Figure(figsize=(5, 6), layout="constrained")
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    filled = counts > 0
    top.bar(
        edges[:-1][filled], accuracy[filled], width=width, align="edge", edgecolor="black", label="accuracy"
    )
    top.bar(
        edges[:-1][filled],
        (mean_confidence - accuracy)[filled],
        bottom=accuracy[filled],
        width=width,
        align="edge",
        color="tab:red",
        alpha=0.3,
        label="gap to confidence",
    )
    top.plot([0, 1], [0, 1], "k--", linewidth=1, label="perfect calibration")
    top.set_ylabel("accuracy")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.legend(loc="upper left")
    top.set_title(f"{title + ': ' if title else ''}ECE {ece:.4f} ({n_bins} bins, {int(counts.sum())} {unit})")
    bottom.bar(edges[:-1], counts, width=width, align="edge", edgecolor="black", color="grey")
    bottom.set_yscale("log" if counts.max(initial=0) > 0 else "linear")
    bottom.set_xlabel("confidence")
    bottom.set_ylabel(unit)
    path = Path(path)
    with replacing(path) as temp:  # through a symlink to its target; a device written directly
        figure.savefig(temp, format="png", dpi=100)
    return path


def from_bins(calibration: dict) -> tuple[np.ndarray, np.ndarray]:
    """(confidence, correct) arrays with the given per-bin counts, mean confidences and accuracies: bin b's
    n_b items get its mean confidence and round(n_b · accuracy_b) of them are correct (same bins and ECE)."""
    confidence, correct = [], []
    for count, mean_confidence, accuracy in zip(calibration["counts"], calibration["confidence"],
                                                calibration["accuracy"]):
        if not count:
            continue
        confidence.append(np.full(count, mean_confidence))
        correct.append(np.arange(count) < int(round(count * accuracy)))
    return np.concatenate(confidence), np.concatenate(correct)
