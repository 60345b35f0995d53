"""Entity calibration, risk–coverage, thresholds and n-best coverage (gpseq/evaluation/trust.py) on
hand-computed cases."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from gpseq.errors import ConfigError
from gpseq.evaluation.trust import (curve_points, entity_report, frequency_bands, nbest_coverage, selective_summary,
                                    threshold_for_error, token_band_report)


def test_risk_coverage_and_aurc_hand_computed():
    # ranked 0.9 ✓, 0.8 ✗, 0.7 ✓, 0.6 ✗: risks 0, 1/2, 1/3, 1/2
    confidence = np.array([0.7, 0.9, 0.6, 0.8])
    correct = np.array([True, True, False, False])
    summary = selective_summary(confidence, correct, coverages=(0.5, 0.75, 1.0))
    assert summary["aurc"] == pytest.approx((0 + 1 / 2 + 1 / 3 + 1 / 2) / 4)
    assert summary["error_at_50"] == pytest.approx(1 / 2)
    assert summary["error_at_75"] == pytest.approx(1 / 3)
    assert summary["error_at_100"] == pytest.approx(1 / 2)
    curve = curve_points(confidence, correct, points=5)
    assert curve["coverage"] == [0.25, 0.5, 0.75, 1.0]
    assert curve["risk"] == pytest.approx([0, 1 / 2, 1 / 3, 1 / 2])
    assert curve["threshold"] == [0.9, 0.8, 0.7, 0.6]


def test_threshold_for_target_error_hand_computed():
    confidence = np.array([0.9, 0.9, 0.8, 0.7, 0.6])
    correct = np.array([True, True, False, True, True])
    # keep ≥ 0.9: 0/2; ≥ 0.8: 1/3; ≥ 0.7: 1/4; ≥ 0.6: 1/5
    assert threshold_for_error(confidence, correct, 0.25) == {"threshold": 0.6, "coverage": 1.0, "error": 0.2}
    assert threshold_for_error(confidence, correct, 0.1) == {"threshold": 0.9, "coverage": 0.4, "error": 0.0}
    wrong_first = threshold_for_error(np.array([0.9, 0.5]), np.array([False, True]), 0.1)
    assert wrong_first == {"threshold": None, "coverage": 0.0, "error": None}
    with pytest.raises(ConfigError, match="target error"):
        threshold_for_error(confidence, correct, 1.5)


def test_entity_report_hand_computed():
    gold = [[("NP", 0, 2), ("VP", 2, 3)], [("NP", 0, 1)]]
    predicted = [[("NP", 0, 2, 0.9), ("VP", 2, 4, 0.6)], [("NP", 0, 1, 0.7)]]
    product = [[("NP", 0, 2, 0.8), ("VP", 2, 4, 0.5)], [("NP", 0, 1, 0.7)]]
    report = entity_report(gold, predicted, product=product, n_bins=10, rare_share=0.4)
    assert report["n_predicted_spans"] == 3
    assert report["entity_brier"] == pytest.approx((0.1**2 + 0.6**2 + 0.3**2) / 3)
    assert report["entity_ece"] == pytest.approx((0.1 + 0.6 + 0.3) / 3)  # each span alone in its bin
    assert report["entity_precision"] == pytest.approx(2 / 3)
    assert report["entity_aurc"] == pytest.approx((0 + 0 + 1 / 3) / 3)  # ranked 0.9 ✓, 0.7 ✓, 0.6 ✗
    assert report["entity_brier_product"] == pytest.approx((0.2**2 + 0.5**2 + 0.3**2) / 3)
    # gold types: NP 2/3 (frequent), VP 1/3 < 0.4 (rare)
    assert report["n_predicted_spans_frequent"] == 2 and report["n_predicted_spans_rare"] == 1
    assert report["entity_brier_rare"] == pytest.approx(0.36)
    assert sum(report["entity_calibration"]["counts"]) == 3


def test_frequency_bands_and_token_bands():
    assert frequency_bands(Counter({"NP": 90, "PRT": 4, "VP": 6}), 0.05) == {"NP": "frequent", "PRT": "rare",
                                                                              "VP": "frequent"}
    gold = [["B-NP", "I-NP", "B-PRT"]]
    predicted = [["B-NP", "B-NP", "B-PRT"]]
    out = token_band_report(gold, predicted, np.array([0.9, 0.6, 0.5]), n_bins=10, rare_share=0.4)
    # gold shares: B-NP 1/3, I-NP 1/3, B-PRT 1/3 → all rare at 0.4
    assert out["n_tokens_rare"] == 3 and out["n_tokens_frequent"] == 0
    assert out["brier_rare"] == pytest.approx((0.1**2 + 0.6**2 + 0.5**2) / 3)


def test_nbest_coverage_hand_computed():
    ranks = [0, 2, None]
    probs = [[0.6, 0.2, 0.1], [0.5, 0.3, 0.1], [0.4, 0.2]]
    out = nbest_coverage(ranks, probs, ks=(1, 3), n_bins=10)
    assert out["nbest_coverage_1"] == pytest.approx(1 / 3)
    assert out["nbest_claimed_1"] == pytest.approx((0.6 + 0.5 + 0.4) / 3)
    assert out["nbest_coverage_3"] == pytest.approx(2 / 3)
    assert out["nbest_claimed_3"] == pytest.approx((0.9 + 0.9 + 0.6) / 3)
