"""The paired bootstrap of `benchmarks/versus_crf.py` (`benchmarks/_bootstrap.py`): its metrics on a
set of sentences are `gpseq.evaluation.evaluate`'s on those sentences, and its interval behaves as one."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from _bootstrap import metric, outcomes, paired_bootstrap  # noqa: E402

from gpseq.evaluation.evaluate import evaluate  # noqa: E402

LABELS = ["B-NP", "I-NP", "O"]


def random_system(rng, gold, sharpness):
    """Labels and per-token distributions that put extra mass on the gold label."""
    probabilities, predicted = [], []
    for sentence in gold:
        logits = rng.standard_normal((len(sentence), len(LABELS)))
        logits[np.arange(len(sentence)), [LABELS.index(g) for g in sentence]] += sharpness
        p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        probabilities.append(p)
        predicted.append([LABELS[i] for i in p.argmax(1)])
    return predicted, probabilities


@pytest.fixture
def systems():
    rng = np.random.default_rng(0)
    gold = [[LABELS[i] for i in rng.integers(0, 3, rng.integers(1, 12))] for _ in range(60)]
    return gold, random_system(rng, gold, 2.0), random_system(rng, gold, 1.0)


def test_metrics_of_a_resample_equal_evaluate_on_the_resampled_sentences(systems):
    gold, (predicted, probabilities), _ = systems
    result = outcomes(gold, predicted, probabilities, LABELS, chunked=True)
    draw = np.random.default_rng(1).integers(0, len(gold), len(gold))
    report = evaluate([gold[i] for i in draw], [predicted[i] for i in draw], labels=LABELS,
                      probabilities=[probabilities[i] for i in draw])
    assert metric(result, "token_nll", draw) == pytest.approx(report.token_nll, rel=1e-12)
    assert metric(result, "ece", draw) == pytest.approx(report.ece, rel=1e-12)
    assert metric(result, "brier", draw) == pytest.approx(report.brier, rel=1e-12)
    assert metric(result, "aurc", draw) == pytest.approx(report.aurc, rel=1e-12)
    assert metric(result, "score", draw) == pytest.approx(report.chunk_f1, rel=1e-12)
    tokens = outcomes(gold, predicted, probabilities, LABELS, chunked=False)
    assert metric(tokens, "score", draw) == pytest.approx(report.token_accuracy, rel=1e-12)


def test_the_interval_holds_the_full_set_difference_and_separates_different_systems(systems):
    gold, sharp, blunt = systems
    a = outcomes(gold, *sharp, LABELS, chunked=True)
    b = outcomes(gold, *blunt, LABELS, chunked=True)
    same = paired_bootstrap(a, a, resamples=200)
    assert all(value == (0.0, 0.0, 0.0) for value in same.values())  # paired: identical systems never differ
    apart = paired_bootstrap(a, b, resamples=200)
    for name, (diff, low, high) in apart.items():
        assert low <= diff <= high
        assert diff == pytest.approx(metric(a, name) - metric(b, name))
    assert apart["token_nll"][2] < 0 and apart["score"][1] > 0  # the sharper system, clearly better


def test_calibrated_ece_equals_its_binomial_closed_form():
    """One confidence c for all n tokens: one bin, ECE = |K/n − c| with K ~ Binomial(n, c), whose
    mean is Σ_k pmf(k) |k/n − c|; confidence 1 gives 0 exactly."""
    from scipy.stats import binom

    from _bootstrap import Outcomes, calibrated_ece

    n, c = 40, 0.8
    ones = np.ones(n, bool)
    result = Outcomes(np.array([0, n]), np.zeros(n), np.full(n, c), ones, np.zeros(n), None)
    mean, q95 = calibrated_ece(result, draws=4000)
    k = np.arange(n + 1)
    expected = float(np.sum(binom.pmf(k, n, c) * np.abs(k / n - c)))
    assert mean == pytest.approx(expected, abs=0.003)
    assert q95 > mean
    sure = Outcomes(np.array([0, n]), np.zeros(n), np.ones(n), ones, np.zeros(n), None)
    assert calibrated_ece(sure) == (0.0, 0.0)
