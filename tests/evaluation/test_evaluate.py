"""Metrics against seqeval, a streaming conlleval re-implementation and hand-computed cases."""

from __future__ import annotations

import itertools
import json
import math
import random

import numpy as np
import pytest

from gpseq.corpora import read_conll
from gpseq.errors import ConfigError, NumericalError
from gpseq.evaluation.evaluate import (aurc, brier_score, chunk_scores, evaluate, expected_calibration_error,
                                       reliability_diagram, risk_coverage, selective_error)


def _conlleval_split(label):
    head, sep, tail = label.partition("-")
    return (head, tail) if sep else (label, "")


def _conlleval_end(prev, tag, prev_type, type_):
    end = (prev, tag) in {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"), ("E", "E"), ("E", "I"), ("E", "O")}
    if prev not in ("O", ".") and prev_type != type_:
        end = True
    return end or prev in ("[", "]")


def _conlleval_start(prev, tag, prev_type, type_):
    start = (prev, tag) in {
        ("B", "B"),
        ("I", "B"),
        ("O", "B"),
        ("O", "I"),
        ("E", "E"),
        ("E", "I"),
        ("O", "E"),
    }
    if tag not in ("O", ".") and prev_type != type_:
        start = True
    return start or tag in ("[", "]")


def conlleval_counts(gold, predicted):
    """(correct, found_gold, found_predicted) per type, by conlleval's token-by-token state machine."""
    correct, found_gold, found_guessed = {}, {}, {}
    stream = []
    for g_sentence, p_sentence in zip(gold, predicted):
        stream += list(zip(g_sentence, p_sentence)) + [("O", "O")]  # a sentence boundary acts as O
    in_correct = False
    last_c, last_ct, last_g, last_gt = "O", "", "O", ""
    for g_label, p_label in stream:
        c, ct = _conlleval_split(g_label)
        g, gt = _conlleval_split(p_label)
        if in_correct:
            end_c = _conlleval_end(last_c, c, last_ct, ct)
            end_g = _conlleval_end(last_g, g, last_gt, gt)
            if end_c and end_g and last_gt == last_ct:
                in_correct = False
                correct[last_ct] = correct.get(last_ct, 0) + 1
            elif end_c != end_g or gt != ct:
                in_correct = False
        start_c = _conlleval_start(last_c, c, last_ct, ct)
        start_g = _conlleval_start(last_g, g, last_gt, gt)
        if start_c and start_g and gt == ct:
            in_correct = True
        if start_c:
            found_gold[ct] = found_gold.get(ct, 0) + 1
        if start_g:
            found_guessed[gt] = found_guessed.get(gt, 0) + 1
        last_c, last_ct, last_g, last_gt = c, ct, g, gt
    if in_correct:
        correct[last_ct] = correct.get(last_ct, 0) + 1
    return correct, found_gold, found_guessed


def _prf(correct, gold, guessed):
    p = correct / guessed if guessed else 0.0
    r = correct / gold if gold else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def _perturb(gold, labels, rate, seed):
    rng = random.Random(seed)
    return [[rng.choice(labels) if rng.random() < rate else label for label in sentence] for sentence in gold]


@pytest.mark.parametrize("rate, seed", [(0.05, 1), (0.3, 2)])
def test_chunk_f1_equals_seqeval_and_conlleval_on_conll2000(corpora_dir, rate, seed):
    seqeval_metrics = pytest.importorskip("seqeval.metrics")
    gold = [s.labels for s in read_conll(corpora_dir / "conll2000" / "test.txt")]
    labels = sorted({label for sentence in gold for label in sentence})
    predicted = _perturb(gold, labels, rate, seed)
    report = evaluate(gold, predicted, scheme="iob2")
    # seqeval, default (conlleval-compatible) mode
    assert report.chunk_f1 == pytest.approx(seqeval_metrics.f1_score(gold, predicted), abs=1e-9)
    assert report.chunk_precision == pytest.approx(seqeval_metrics.precision_score(gold, predicted), abs=1e-9)
    assert report.chunk_recall == pytest.approx(seqeval_metrics.recall_score(gold, predicted), abs=1e-9)
    table = seqeval_metrics.classification_report(gold, predicted, output_dict=True, digits=12)
    # conlleval's streaming counts
    correct, found_gold, found_guessed = conlleval_counts(gold, predicted)
    p, r, f = _prf(sum(correct.values()), sum(found_gold.values()), sum(found_guessed.values()))
    assert (report.chunk_precision, report.chunk_recall, report.chunk_f1) == pytest.approx(
        (p, r, f), abs=1e-9
    )
    assert report.n_correct_chunks == sum(correct.values()) and report.n_gold_chunks == sum(
        found_gold.values()
    )
    assert set(report.per_type) == set(found_gold) | set(found_guessed)
    for kind, score in report.per_type.items():
        expected = _prf(correct.get(kind, 0), found_gold.get(kind, 0), found_guessed.get(kind, 0))
        assert (score.precision, score.recall, score.f1) == pytest.approx(expected, abs=1e-9)
        if kind in table:
            row = table[kind]
            assert (score.precision, score.recall, score.f1) == pytest.approx(
                (row["precision"], row["recall"], row["f1-score"]), abs=1e-9
            )
            assert score.n_gold == row["support"]
    assert report.token_accuracy == pytest.approx(
        np.mean([g == q for gs, qs in zip(gold, predicted) for g, q in zip(gs, qs)]), abs=1e-12
    )


def test_chunk_scores_on_ill_formed_predictions_match_conlleval():
    rng = random.Random(5)
    tags = ["O", "B-A", "I-A", "B-B", "I-B", "B", "I"]
    gold = [[rng.choice(tags) for _ in range(rng.randint(1, 12))] for _ in range(300)]
    predicted = [[rng.choice(tags) for _ in sentence] for sentence in gold]
    scores = chunk_scores(gold, predicted, "iob2")
    correct, found_gold, found_guessed = conlleval_counts(gold, predicted)
    assert (scores.overall.n_correct, scores.overall.n_gold, scores.overall.n_predicted) == (
        sum(correct.values()),
        sum(found_gold.values()),
        sum(found_guessed.values()),
    )
    for kind, score in scores.per_type.items():
        assert (score.n_correct, score.n_gold, score.n_predicted) == (
            correct.get(kind, 0),
            found_gold.get(kind, 0),
            found_guessed.get(kind, 0),
        )


def test_pos_labels_give_no_chunk_scores():
    report = evaluate([["NN", "VBZ"]], [["NN", "NN"]], scheme="iob2")
    assert report.chunk_f1 is None and report.per_type is None and "'NN'" in report.chunk_note
    assert report.token_accuracy == 0.5 and report.token_error == 0.5
    assert evaluate([["NN"]], [["NN"]], scheme="auto").chunk_f1 is None
    assert evaluate([["B-NP", "I-NP"]], [["B-NP", "I-NP"]], scheme="auto").chunk_f1 == 1.0
    assert evaluate([["B-NP"]], [["B-NP"]], scheme=None).chunk_f1 is None


def test_ece_hand_computed():
    confidence = np.array([0.05, 0.25, 0.3, 0.6, 0.9, 0.95, 1.0])
    correct = np.array([0, 1, 0, 1, 1, 0, 1], dtype=bool)
    # 4 bins (0, .25], (.25, .5], (.5, .75], (.75, 1]: {.05, .25}, {.3}, {.6}, {.9, .95, 1.0}
    expected = (
        (2 / 7) * abs(0.5 - 0.15)
        + (1 / 7) * abs(0 - 0.3)
        + (1 / 7) * abs(1 - 0.6)
        + (3 / 7) * abs(2 / 3 - 0.95)
    )
    assert expected_calibration_error(confidence, correct, n_bins=4) == pytest.approx(expected, abs=1e-12)
    # one bin: |accuracy - mean confidence|
    assert expected_calibration_error(confidence, correct, n_bins=1) == pytest.approx(
        abs(4 / 7 - confidence.mean())
    )
    assert expected_calibration_error(np.array([0.0]), np.array([False]), n_bins=15) == 0.0


def test_brier_hand_computed_including_unseen_gold():
    p = np.array([[0.7, 0.2, 0.1], [0.5, 0.5, 0.0]])
    # token 1: gold 0 → .3² + .2² + .1² = .14 ; token 2: gold outside → .25 + .25 + 0 + (0 − 1)² = 1.5
    assert brier_score(p, np.array([0, -1])) == pytest.approx((0.14 + 1.5) / 2, abs=1e-12)


def test_unseen_gold_labels_are_errors_with_clipped_nll():
    labels = ["O", "B-NP", "I-NP"]
    gold = [["B-NP", "I-NP", "O"], ["B-VP"]]  # B-VP never seen in training
    predicted = [["B-NP", "I-NP", "O"], ["O"]]
    probabilities = [
        np.array([[0.1, 0.8, 0.1], [0.0, 0.25, 0.75], [0.6, 0.2, 0.2]]),
        np.array([[0.9, 0.05, 0.05]]),
    ]
    report = evaluate(
        gold,
        predicted,
        labels=labels,
        probabilities=probabilities,
        sequence_log_probs=[math.log(0.2), -math.inf],
        n_bins=2,
        eps=1e-6,
    )
    assert report.token_accuracy == 0.75
    assert report.n_unseen_gold_tokens == 1 and report.n_clipped_tokens == 1
    nll = [-math.log(0.8), -math.log(0.75), -math.log(0.6), -math.log(1e-6)]
    assert report.token_nll == pytest.approx(np.mean(nll), abs=1e-12)
    # predicted = argmax here; confidence/correctness: .8 right, .75 right, .6 right, .9 wrong (B-VP unseen)
    # bins (0, .5], (.5, 1]: all four in the upper bin: accuracy 3/4, confidence (.8+.75+.6+.9)/4
    assert report.ece == pytest.approx(abs(0.75 - (0.8 + 0.75 + 0.6 + 0.9) / 4), abs=1e-12)
    assert report.ece_argmax == pytest.approx(report.ece, abs=1e-12)
    brier = [0.01 + 0.04 + 0.01, 0.0 + 0.0625 + 0.0625, 0.16 + 0.04 + 0.04, 0.81 + 0.0025 + 0.0025 + 1.0]
    assert report.brier == pytest.approx(np.mean(brier), abs=1e-12)
    assert report.n_clipped_sequences == 1
    assert report.seq_nll == pytest.approx((-math.log(0.2) - math.log(1e-6)) / 2, abs=1e-12)
    assert report.seq_nll_per_token == pytest.approx((-math.log(0.2) - math.log(1e-6)) / 4, abs=1e-12)
    flat = report.to_dict()
    json.dumps(flat)
    assert (
        flat["chunk_f1[NP]"] == 1.0
        and flat["chunk_recall[VP]"] == 0.0
        and flat["token_nll"] == report.token_nll
    )
    assert all(not isinstance(value, (dict, list)) for value in flat.values())


def test_input_errors_are_gpseq_errors():
    with pytest.raises(ConfigError, match="sentence 1: 2 gold labels but 1 predicted"):
        evaluate([["O", "O"]], [["O"]])
    with pytest.raises(ConfigError, match="need `labels`"):
        evaluate([["O"]], [["O"]], probabilities=[np.ones((1, 1))])
    with pytest.raises(ConfigError, match="shape"):
        evaluate([["O"]], [["O"]], labels=["O"], probabilities=[np.ones((1, 2))])
    with pytest.raises(NumericalError):
        evaluate([["O"]], [["O"]], sequence_log_probs=[float("nan")])


def test_reliability_diagram_png(tmp_path):
    rng = np.random.default_rng(0)
    confidence = rng.uniform(size=500)
    path = reliability_diagram(
        confidence, rng.uniform(size=500) < confidence, tmp_path / "reliability.png", n_bins=10
    )
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert [p.name for p in tmp_path.iterdir()] == ["reliability.png"]


def test_plots_write_through_a_symlink_and_keep_an_existing_files_mode(tmp_path):
    """The library's plot functions (reliability diagram, risk–coverage) replace the file a path
    names: through a symlink its target (the link stays a link), an existing file's permissions
    kept — as `gpseq tag -o` writes. Before, the PNG was renamed onto the path itself: the link
    became a regular file and its target kept the old contents."""
    import os

    from gpseq.evaluation.trust import risk_coverage_plot, selective_curves

    rng = np.random.default_rng(1)
    confidence = rng.uniform(size=200)
    correct = rng.uniform(size=200) < confidence
    plots = {"reliability": lambda path: reliability_diagram(confidence, correct, path, n_bins=10),
             "risk": lambda path: risk_coverage_plot({"gpseq": selective_curves(confidence, correct)}, path)}
    for name, draw in plots.items():
        target, link = tmp_path / f"{name}-target.png", tmp_path / f"{name}.png"
        target.write_bytes(b"old")
        target.chmod(0o640)
        link.symlink_to(target)
        draw(link)
        assert link.is_symlink() and os.readlink(link) == str(target)
        assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert target.stat().st_mode & 0o777 == 0o640


def _aurc_by_definition(confidence, correct):
    """(AURC, [N] risk) for one ranking: tokens sorted by confidence descending, ties broken by
    position (a stable sort); risk(k) = errors among the first k / k; AURC = mean over k."""
    order = sorted(range(len(confidence)), key=lambda i: -confidence[i])
    errors, risk = 0, []
    for k, i in enumerate(order, start=1):
        errors += not correct[i]
        risk.append(errors / k)
    return sum(risk) / len(risk), risk


def _brute_force_selective(confidence, correct, coverage=0.9):
    """AURC, risk curve and error at `coverage`, averaged over every ranking consistent with the
    confidences (all orders of tied tokens, equally likely): enumerates all N! permutations."""
    n = len(confidence)
    k_cut = math.ceil(round(coverage * n, 9))
    total_aurc, total_risk, total_cut, count = 0.0, np.zeros(n), 0.0, 0
    for perm in itertools.permutations(range(n)):
        if any(confidence[perm[i]] < confidence[perm[i + 1]] for i in range(n - 1)):
            continue
        c = [confidence[i] for i in perm]
        ok = [correct[i] for i in perm]
        value, risk = _aurc_by_definition(c, ok)
        total_aurc += value
        total_risk += risk
        total_cut += sum(not x for x in ok[:k_cut]) / k_cut
        count += 1
    return total_aurc / count, total_risk / count, total_cut / count


@pytest.mark.parametrize("seed", range(12))
def test_aurc_and_error_at_90_against_brute_force_over_tie_orders(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 8))
    # few distinct values, so ties are common; every other seed continuous (no ties)
    confidence = rng.choice([0.2, 0.5, 0.9, 1.0], size=n) if seed % 2 else rng.uniform(size=n)
    correct = rng.uniform(size=n) < 0.6
    expected_aurc, expected_risk, expected_cut = _brute_force_selective(list(confidence), list(correct))
    assert aurc(confidence, correct) == pytest.approx(expected_aurc, abs=1e-12)
    np.testing.assert_allclose(risk_coverage(confidence, correct), expected_risk, atol=1e-12)
    assert selective_error(confidence, correct, 0.9) == pytest.approx(expected_cut, abs=1e-12)
    if seed % 2 == 0:  # no ties: the plain definition on the one ranking
        assert aurc(confidence, correct) == pytest.approx(_aurc_by_definition(confidence, correct)[0], abs=1e-12)


def test_aurc_on_larger_random_arrays_without_ties_matches_the_definition():
    rng = np.random.default_rng(3)
    confidence = rng.uniform(size=500)
    correct = rng.uniform(size=500) < confidence
    value, risk = _aurc_by_definition(list(confidence), list(correct))
    assert aurc(confidence, correct) == pytest.approx(value, abs=1e-12)
    k = 450  # ceil(0.9 · 500)
    assert selective_error(confidence, correct) == pytest.approx(risk[k - 1], abs=1e-12)
    # the result does not depend on the order of the tokens
    perm = rng.permutation(500)
    assert aurc(confidence[perm], correct[perm]) == pytest.approx(value, abs=1e-12)


def test_aurc_and_error_at_90_hand_computed():
    # ranked: .9 ok, .8 wrong, .7 ok, .6 ok, .5 wrong → risk 0, 1/2, 1/3, 1/4, 2/5
    confidence = np.array([0.6, 0.9, 0.5, 0.8, 0.7])
    correct = np.array([True, True, False, False, True])
    assert aurc(confidence, correct) == pytest.approx((0 + 1 / 2 + 1 / 3 + 1 / 4 + 2 / 5) / 5, abs=1e-12)
    assert selective_error(confidence, correct, 0.9) == pytest.approx(2 / 5, abs=1e-12)  # ceil(4.5) = 5
    assert selective_error(confidence, correct, 0.8) == pytest.approx(1 / 4, abs=1e-12)  # ceil(4.0) = 4
    # ties: two tokens at .9, one wrong: risk(1) = 1/2 in expectation, risk(2) = 1/2; then .5 ok: 1/3
    assert aurc([0.9, 0.9, 0.5], [True, False, True]) == pytest.approx((1 / 2 + 1 / 2 + 1 / 3) / 3, abs=1e-12)
    # 10 tokens, ceil(0.9 · 10) = 9 exactly (no rounding up to 10): the least confident, wrong, is left out
    conf10 = np.linspace(1.0, 0.1, 10)
    ok10 = np.array([True] * 9 + [False])
    assert selective_error(conf10, ok10, 0.9) == 0.0
    assert math.isnan(aurc(np.zeros(0), np.zeros(0, dtype=bool)))
    with pytest.raises(ConfigError):
        selective_error(conf10, ok10, 0.0)


def test_confidence_is_that_of_the_returned_label_not_the_argmax():
    labels = ["A", "B", "O"]
    gold = [["A", "B", "O", "O"]]
    # token 3: Viterbi returns O (p .4) though B has the larger marginal (.6); token 4: returns a label
    # outside the label set (confidence 0)
    predicted = [["A", "A", "O", "X"]]
    probs = [np.array([[0.7, 0.2, 0.1], [0.5, 0.4, 0.1], [0.0, 0.6, 0.4], [0.1, 0.1, 0.8]])]
    report = evaluate(gold, predicted, labels=labels, probabilities=probs, scheme=None, n_bins=5)
    confidence = np.array([0.7, 0.5, 0.4, 0.0])
    correct = np.array([True, False, True, False])
    assert report.token_accuracy == 0.5
    # 5 bins (0,.2], (.2,.4], (.4,.6], (.6,.8], (.8,1] (the first holding 0): {0}, {.4}, {.5}, {.7}
    assert report.ece == pytest.approx((1 / 4) * (0.0 + 0.6 + 0.5 + 0.3), abs=1e-12)
    assert report.ece == pytest.approx(expected_calibration_error(confidence, correct, 5), abs=1e-12)
    assert report.calibration["counts"] == [1, 1, 1, 1, 0]
    assert report.calibration["confidence"][:4] == pytest.approx([0.0, 0.4, 0.5, 0.7])
    assert report.calibration["accuracy"][:4] == [0.0, 1.0, 0.0, 1.0]
    # argmax: A (.7) right, A (.5) wrong, B (.6) wrong, O (.8) right
    argmax_conf = np.array([0.7, 0.5, 0.6, 0.8])
    argmax_ok = np.array([True, False, False, True])
    assert report.ece_argmax == pytest.approx(expected_calibration_error(argmax_conf, argmax_ok, 5), abs=1e-12)
    # ranked by confidence of the returned labels: .7 ok, .5 wrong, .4 ok, 0 wrong
    assert report.aurc == pytest.approx((0 + 1 / 2 + 1 / 3 + 2 / 4) / 4, abs=1e-12)
    assert report.error_at_90 == pytest.approx(2 / 4, abs=1e-12)  # ceil(3.6) = 4
    # Brier stays that of the full distribution
    gold_index = np.array([0, 1, 2, 2])
    assert report.brier == pytest.approx(brier_score(np.concatenate(probs), gold_index), abs=1e-12)
    flat = report.to_dict()
    assert {"ece", "ece_argmax", "aurc", "error_at_90", "brier"} <= set(flat)
    assert flat["aurc"] == report.aurc and flat["error_at_90"] == report.error_at_90
    # without probabilities there is nothing to rank by
    bare = evaluate(gold, predicted, scheme=None).to_dict()
    assert bare["aurc"] is None and bare["error_at_90"] is None and bare["ece_argmax"] is None


def test_report_reliability_diagram_uses_the_report_bins(tmp_path, monkeypatch):
    """A report made with n_bins=10 drew its diagram with 15 bins unless told again: the 10 bins'
    mean confidences were re-binned, and the plot's ECE was not the report's. Hand-computed: two
    tokens, p(returned) 0.48 (correct) and 0.52 (wrong), lie in 10-bin bins (0.4, 0.5] and (0.5, 0.6],
    ECE = ½·|1 − 0.48| + ½·|0 − 0.52| = 0.52 (15 bins would merge them: ECE 0)."""
    import gpseq.evaluation.evaluate as evaluate_module
    from gpseq.evaluation.metrics import expected_calibration_error

    probabilities = [np.array([[0.48, 0.52], [0.48, 0.52]])]
    report = evaluate_module.evaluate([["A", "A"]], [["A", "B"]], labels=["A", "B"], probabilities=probabilities,
                                      scheme=None, n_bins=10)
    assert report.ece == pytest.approx(0.52, abs=1e-12)
    seen = {}

    def spy(confidence, correct, path, n_bins=15, **_):
        seen["ece"] = expected_calibration_error(confidence, correct, n_bins)
        return path

    monkeypatch.setattr(evaluate_module, "reliability_diagram", spy)
    report.reliability_diagram(tmp_path / "r.png")
    assert seen["ece"] == pytest.approx(0.52, abs=1e-12)
