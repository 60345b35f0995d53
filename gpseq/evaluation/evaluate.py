"""The evaluation report: token accuracy, conlleval chunk P/R/F1, NLL, expected calibration error,
Brier, selective prediction (risk–coverage: AURC, error at 90 % coverage); reliability plots.
The metric functions themselves are in `metrics.py`, the plot in `reliability.py` (both re-exported
here).

Calibration and selective prediction are measured on what the user gets: a token's confidence
is the probability its marginals give to the *returned* label (`predicted`, e.g. the Viterbi
path, not necessarily the argmax of the marginals), and it is correct when that label is the
gold one. The argmax-based ECE is kept as `ece_argmax`. Brier is the multiclass Brier score of
the full per-token distribution.

Gold labels outside the model's label set (never seen in training) are errors with probability
0: their NLL is clipped at -log(eps) and the number of clipped tokens is reported. A sentence with
a gold label `?` (a token left unlabelled, partial annotation) has no gold path and no gold chunks:
it is left out of every metric and counted (`n_skipped_sentences`, `n_skipped_tokens`). Chunk scores
are computed only when every gold and predicted label is a chunk label of the scheme (B-/I-/O
…); for other labellings (POS tags) they are None and `chunk_note` says why.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpseq.corpora.schemes import detect_scheme, is_chunk_labelling, normalise_scheme
from gpseq.corpora.types import UNLABELLED
from gpseq.errors import ConfigError, GpseqError, NumericalError
from gpseq.evaluation.metrics import (ChunkScore, ChunkScores, aurc, brier_score, calibration_bins, check_lengths,
                                      chunk_scores, expected_calibration_error, risk_coverage, selective_error)
from gpseq.evaluation.reliability import from_bins, reliability_diagram

__all__ = ["DEFAULT_EPS", "ChunkScore", "ChunkScores", "EvaluationReport", "aurc", "brier_score", "calibration_bins",
           "chunk_scores", "evaluate", "expected_calibration_error", "reliability_diagram", "risk_coverage",
           "selective_error"]

DEFAULT_EPS = 1e-12


@dataclass
class EvaluationReport:
    """Everything `evaluate` measured; None where the inputs did not allow a metric."""

    n_sentences: int
    n_tokens: int
    token_accuracy: float
    token_error: float
    scheme: str | None = None
    chunk_precision: float | None = None
    chunk_recall: float | None = None
    chunk_f1: float | None = None
    n_gold_chunks: int | None = None
    n_predicted_chunks: int | None = None
    n_correct_chunks: int | None = None
    per_type: dict[str, ChunkScore] | None = None
    chunk_note: str | None = None
    token_nll: float | None = None  # mean over tokens of −log p(gold label)
    seq_nll: float | None = None  # mean over sentences of −log p(gold path)
    seq_nll_per_token: float | None = None  # Σ_sentences −log p(gold path) / n_tokens
    ece: float | None = None  # on the returned labels: confidence p(predicted label), correct = predicted == gold
    ece_argmax: float | None = None  # on the argmax of the marginals: confidence max_v p(v)
    brier: float | None = None  # multiclass Brier of the full per-token distribution
    aurc: float | None = None  # area under the risk–coverage curve (returned labels and their confidences)
    error_at_80: float | None = None  # error rate of the ceil(0.8 N) most confident tokens
    error_at_90: float | None = None  # … 0.9 N
    error_at_95: float | None = None  # … 0.95 N
    n_bins: int = 15
    eps: float = DEFAULT_EPS
    n_unseen_gold_tokens: int | None = None  # gold labels outside the model's label set
    n_clipped_tokens: int | None = None  # tokens whose p(gold) < eps (NLL clipped at −log eps)
    n_clipped_sequences: int | None = None  # sentences whose log p(gold path) < log eps
    n_skipped_sentences: int = 0  # sentences left out: a gold label `?` (partial annotation)
    n_skipped_tokens: int = 0  # … and their tokens
    calibration: dict = field(default_factory=dict, repr=False)  # counts / confidence / accuracy per bin
    # entity-level calibration and selective prediction, calibration by frequency band, the abstention
    # threshold for a target error (`gpseq.evaluation.trust`; flat keys, merged into `to_dict`)
    trust: dict = field(default_factory=dict, repr=False)
    entity_calibration: dict = field(default_factory=dict, repr=False)  # per-bin, of predicted spans
    curves: dict = field(default_factory=dict, repr=False)  # risk–coverage curves {name: curve points}

    def to_dict(self) -> dict:
        """Flat JSON-able dict; per-type scores as `chunk_f1[TYPE]`, `chunk_precision[TYPE]` …"""
        skip = ("per_type", "calibration", "trust", "entity_calibration", "curves")
        out = {key: value for key, value in self.__dict__.items() if key not in skip}
        out.update(self.trust)
        for key, value in out.items():
            if isinstance(value, float) and not math.isfinite(value):
                out[key] = None
        for kind, score in (self.per_type or {}).items():
            out[f"chunk_precision[{kind}]"] = score.precision
            out[f"chunk_recall[{kind}]"] = score.recall
            out[f"chunk_f1[{kind}]"] = score.f1
            out[f"n_gold_chunks[{kind}]"] = score.n_gold
            out[f"n_predicted_chunks[{kind}]"] = score.n_predicted
            out[f"n_correct_chunks[{kind}]"] = score.n_correct
        return out

    def reliability_diagram(self, path: str | os.PathLike, n_bins: int | None = None) -> Path:
        """`reliability_diagram` from the report's per-bin counts (no per-token arrays are kept).

        Bin b's n_b tokens are given its mean confidence and round(n_b · accuracy_b) of them are
        marked correct: the same bins, bars, token counts and ECE as the per-token arrays give.
        n_bins: default the report's own (another count re-bins the bins' mean confidences, so the
        plot's ECE is no longer the report's)."""
        if not self.calibration:
            raise GpseqError("no calibration bins in the evaluation report: nothing to plot")
        return reliability_diagram(*from_bins(self.calibration), path,
                                   n_bins=self.n_bins if n_bins is None else n_bins)

    def entity_reliability_diagram(self, path: str | os.PathLike, n_bins: int | None = None) -> Path:
        """The reliability diagram of the predicted spans (correct = a gold span with the same type,
        start and end) from the report's per-bin counts, as `reliability_diagram`."""
        if not self.entity_calibration:
            raise GpseqError("no entity calibration in the evaluation report (no chunk labels or span probabilities)")
        return reliability_diagram(*from_bins(self.entity_calibration), path,
                                   n_bins=self.n_bins if n_bins is None else n_bins, title="entities", unit="spans")

    def risk_coverage_plot(self, path: str | os.PathLike) -> Path:
        """Risk–coverage curves of tokens and (when measured) predicted spans, exact and product."""
        from gpseq.evaluation.trust import risk_coverage_plot

        if not self.curves:
            raise GpseqError("no risk-coverage curves in the evaluation report: nothing to plot")
        return risk_coverage_plot(self.curves, path)

    def per_type_table(self) -> str:
        """A plain-text table of per-type chunk scores (conlleval's layout, percentages)."""
        if self.per_type is None:
            return f"no chunk scores: {self.chunk_note}"
        lines = [
            f"{'type':<12} {'precision':>9} {'recall':>9} {'F1':>9} {'gold':>7} {'pred':>7} {'correct':>7}"
        ]
        rows = [
            *self.per_type.items(),
            ("overall", ChunkScore(self.n_gold_chunks, self.n_predicted_chunks, self.n_correct_chunks)),
        ]
        for kind, s in rows:
            lines.append(
                f"{kind or '(none)':<12} {100 * s.precision:>9.2f} {100 * s.recall:>9.2f} {100 * s.f1:>9.2f} "
                f"{s.n_gold:>7} {s.n_predicted:>7} {s.n_correct:>7}"
            )
        return "\n".join(lines)



def evaluate(
    gold: Sequence[Sequence[str]],
    predicted: Sequence[Sequence[str]],
    *,
    labels: Sequence[str] | None = None,
    probabilities: Sequence[np.ndarray] | None = None,
    sequence_log_probs: Sequence[float] | None = None,
    scheme: str | None = "iob2",
    n_bins: int = 15,
    eps: float = DEFAULT_EPS,
    spans: Sequence[Sequence[tuple[str, int, int, float]]] | None = None,
    target_error: float | None = None,
) -> EvaluationReport:
    """Score predictions against gold labels.

    gold, predicted: [S][T_s] labels. labels: the model's label set [V]. probabilities: S arrays
    [T_s, V] of per-token marginals in `labels` order (token NLL, ECE, Brier, AURC, error at
    90 % coverage). ECE, the calibration bins, AURC and error_at_90 use the returned labels: a
    token's confidence is the probability of its `predicted` label (0 if that label is not in
    `labels`) and it is correct when predicted == gold; `ece_argmax` uses the argmax's
    probability and correctness instead. sequence_log_probs: [S] log p(gold path | x)
    (−inf allowed: clipped at log eps and counted). scheme: 'iob1'/'iob2'/'bioes', 'auto'
    (detect from gold) or None (no chunk scores).

    spans: per sentence, the chunks of `predicted` with their probabilities (type, start, end
    exclusive, P), e.g. `TaggedSentence.spans`: entity-level ECE, Brier, AURC and error at
    80/90/95 % coverage (`entity_*`), beside the same for the product of token marginals
    (`*_product`, from `probabilities`) and ECE by frequency band (`gpseq.evaluation.trust`). target_error:
    the abstention threshold with the largest coverage whose kept tokens (and, separately, spans)
    err at most that often (`abstain_threshold`, `abstain_coverage`, `abstain_error`, `entity_…`).
    """
    check_lengths(gold, predicted)
    if not 0 < eps < 1:
        raise ConfigError(f"eps must be in (0, 1), got {eps}")
    partial = [number for number, sentence in enumerate(gold) if UNLABELLED in sentence]
    skipped_tokens = sum(len(gold[number]) for number in partial)
    if partial:
        gold, predicted, probabilities, sequence_log_probs, spans = _without(
            partial, gold, predicted, probabilities, sequence_log_probs, spans)
        if not gold:
            raise GpseqError(f"no sentence to evaluate on: all {len(partial)} have tokens labelled "
                             f"{UNLABELLED!r} (unlabelled; evaluation needs every gold label of a sentence)")
    gold_flat = [label for sentence in gold for label in sentence]
    predicted_flat = [label for sentence in predicted for label in sentence]
    n_tokens = len(gold_flat)
    accuracy = (
        float(np.mean([g == p for g, p in zip(gold_flat, predicted_flat)])) if n_tokens else float("nan")
    )
    report = EvaluationReport(len(gold), n_tokens, accuracy, 1.0 - accuracy, n_bins=n_bins, eps=eps)
    report.n_skipped_sentences = len(partial)
    report.n_skipped_tokens = skipped_tokens

    if scheme is not None and str(scheme).lower() == "auto":
        scheme = detect_scheme([list(s) for s in gold])
        if scheme is None:
            report.chunk_note = "labels are not chunk labels: chunk scores omitted"
    if scheme is not None:
        scheme = normalise_scheme(scheme)
        report.scheme = scheme
        if is_chunk_labelling(set(gold_flat) | set(predicted_flat), scheme):
            scores = chunk_scores(gold, predicted, scheme)
            report.chunk_precision = scores.overall.precision
            report.chunk_recall = scores.overall.recall
            report.chunk_f1 = scores.overall.f1
            report.n_gold_chunks = scores.overall.n_gold
            report.n_predicted_chunks = scores.overall.n_predicted
            report.n_correct_chunks = scores.overall.n_correct
            report.per_type = scores.per_type
        else:
            odd = sorted(
                label
                for label in set(gold_flat) | set(predicted_flat)
                if not is_chunk_labelling([label], scheme)
            )
            report.chunk_note = (
                f"labels such as {odd[0]!r} are not {scheme} chunk labels: chunk scores omitted"
            )

    gold_index = None
    if labels is not None:
        index = {label: i for i, label in enumerate(labels)}
        gold_index = np.array([index.get(label, -1) for label in gold_flat], dtype=np.int64)
        report.n_unseen_gold_tokens = int(np.sum(gold_index < 0))

    if probabilities is not None:
        if labels is None:
            raise ConfigError("probabilities need `labels` (the order of their columns)")
        if len(probabilities) != len(gold):
            raise ConfigError(f"{len(probabilities)} probability arrays for {len(gold)} sentences")
        for number, (array, sentence) in enumerate(zip(probabilities, gold), start=1):
            shape = np.shape(array)
            if shape != (len(sentence), len(labels)):
                raise ConfigError(
                    f"sentence {number}: probabilities of shape {shape}, "
                    f"expected {(len(sentence), len(labels))}"
                )
        flat = (
            np.concatenate([np.asarray(a, dtype=np.float64) for a in probabilities], axis=0)
            if n_tokens
            else np.zeros((0, len(labels)))
        )
        if not np.all(np.isfinite(flat)) or (flat.size and flat.min() < 0):
            raise NumericalError("probabilities must be finite and non-negative")
        rows = np.arange(n_tokens)
        p_gold = (
            np.where(gold_index >= 0, flat[rows, np.maximum(gold_index, 0)], 0.0) if n_tokens else np.zeros(0)
        )
        clipped = p_gold < eps
        report.n_clipped_tokens = int(clipped.sum())
        report.token_nll = float(np.mean(-np.log(np.maximum(p_gold, eps)))) if n_tokens else float("nan")
        if n_tokens:
            predicted_index = np.array([index.get(label, -1) for label in predicted_flat], dtype=np.int64)
            confidence = np.where(predicted_index >= 0, flat[rows, np.maximum(predicted_index, 0)], 0.0)
            correct = np.array([g == p for g, p in zip(gold_flat, predicted_flat)], dtype=bool)
            report.ece = expected_calibration_error(confidence, correct, n_bins)
            report.ece_argmax = expected_calibration_error(
                flat.max(axis=1), flat.argmax(axis=1) == gold_index, n_bins
            )
            report.aurc = aurc(confidence, correct)
            report.error_at_80 = selective_error(confidence, correct, 0.8)
            report.error_at_90 = selective_error(confidence, correct, 0.9)
            report.error_at_95 = selective_error(confidence, correct, 0.95)
            report.brier = brier_score(flat, gold_index)
            counts, mean_confidence, bin_accuracy = calibration_bins(confidence, correct, n_bins)
            report.calibration = {
                "counts": counts.tolist(),
                "confidence": [None if np.isnan(x) else float(x) for x in mean_confidence],
                "accuracy": [None if np.isnan(x) else float(x) for x in bin_accuracy],
            }
            _trust_metrics(report, gold, predicted, confidence, correct, spans, target_error, n_bins)

    if sequence_log_probs is not None:
        log_probs = np.asarray(sequence_log_probs, dtype=np.float64)
        if log_probs.shape != (len(gold),):
            raise ConfigError(
                f"{log_probs.size} sequence log-probabilities for {len(gold)} sentences"
            )
        if np.isnan(log_probs).any() or (log_probs > 1e-6).any():
            raise NumericalError("sequence log-probabilities must be <= 0 and not NaN")
        floor = math.log(eps)
        report.n_clipped_sequences = int(np.sum(log_probs < floor))
        nll = -np.maximum(log_probs, floor)
        report.seq_nll = float(np.mean(nll)) if len(gold) else float("nan")
        report.seq_nll_per_token = float(np.sum(nll) / n_tokens) if n_tokens else float("nan")
    return report


def _without(left_out: list[int], gold, *per_sentence):
    """`gold` and each of the optional `per_sentence` sequences (None stays None) without the
    sentences `left_out`; ConfigError if one does not have a value per sentence."""
    keep = np.setdiff1d(np.arange(len(gold)), left_out)
    out = [[gold[i] for i in keep]]
    for values in per_sentence:
        if values is not None and len(values) != len(gold):
            raise ConfigError(f"{len(values)} per-sentence values for {len(gold)} sentences")
        out.append(None if values is None else [values[i] for i in keep])
    return out


def _trust_metrics(report: EvaluationReport, gold, predicted, confidence, correct, spans, target_error, n_bins):
    """Fill `report.trust` (flat), `entity_calibration` and `curves` from the tokens' returned-label
    confidences `[N]` and, for chunk labels, the predicted spans' probabilities (`gpseq.evaluation.trust`)."""
    from gpseq.corpora.schemes import spans as chunks_of
    from gpseq.evaluation.trust import entity_report, selective_curves, threshold_for_error, token_band_report

    report.trust.update(token_band_report(gold, predicted, confidence, n_bins))
    report.curves["tokens"] = selective_curves(confidence, correct)
    if target_error is not None:
        found = threshold_for_error(confidence, correct, target_error)
        report.trust.update({f"abstain_{key}": value for key, value in found.items()})
    if report.per_type is None:
        return
    if spans is None:
        return
    if len(spans) != len(gold):
        raise ConfigError(f"{len(spans)} span lists for {len(gold)} sentences")
    gold_spans = [chunks_of(sentence, report.scheme) for sentence in gold]
    product, position = [], 0
    for sentence, found in zip(predicted, spans):
        own = confidence[position:position + len(sentence)]
        product.append([(kind, start, end, float(np.prod(own[start:end]))) for kind, start, end, _ in found])
        position += len(sentence)
    entity = entity_report(gold_spans, spans, product=product, n_bins=n_bins)
    report.entity_calibration = entity.pop("entity_calibration", {})
    report.trust.update(entity)
    exact_confidence = np.array([p for found in spans for *_, p in found])
    gold_sets = [set(g) for g in gold_spans]
    exact_correct = np.array([tuple(span[:3]) in g for found, g in zip(spans, gold_sets) for span in found], dtype=bool)
    product_confidence = np.array([p for found in product for *_, p in found])
    report.curves["spans (exact)"] = selective_curves(exact_confidence, exact_correct)
    report.curves["spans (product)"] = selective_curves(product_confidence, exact_correct)
    if target_error is not None:
        found = threshold_for_error(exact_confidence, exact_correct, target_error)
        report.trust.update({f"entity_abstain_{key}": value for key, value in found.items()})
