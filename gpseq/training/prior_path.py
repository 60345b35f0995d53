"""The default training of the weight-space linear-chain GP around `fit_laplace`: the prior path,
cross-fitting, calibration and the refit.

`train_laplace` (what `Tagger.train` runs, through `gpseq.training.train`) fits priors (σ², λ, σ²_P)
along a warm-started walk — the L1 path at the first σ², then the other σ² at the chosen λ, then the
other pairwise prior variances σ²_P at the chosen (σ², λ) (`choose_prior`) — ranks them by the NLL
of the dev split carved from the training data at each fit's best temperature
(`gpseq.training.calibration`; a small corpus: of the out-of-fold predictions of cross-fitting
instead) with one-standard-error rules (`PathChoice`: on the L1 path the densest fit not worse
than the best — under cross-fitting a denser one only when better —, σ² only when better, σ²_P by
the lower NLL alone), calibrates the chosen fit's predictive in full (α, T) and refits it on
train + dev. The step budget is L-BFGS's, not a number of epochs.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from gpseq.corpora.splits import kfold_indices
from gpseq.features.rows import CsrRows
from gpseq.training.batching import UNKNOWN_LABEL_ID, SequenceData
from gpseq.training.calibration import fit_calibration_parts, held_out_decodes
from gpseq.training.chain_objective import NumpyChainObjective
from gpseq.training.laplace import LaplaceFit, average_fit, calibrate, fit_laplace, held_out_parts, model_state

# cross-fitting's fold fits run this share of the iteration budgets: they only rank the priors and
# calibrate, and choose the same priors and calibration as full budgets at a fraction of the cost
FOLD_BUDGET_SHARE = 0.4
# the walk's later fits, each warm-started from a neighbouring prior's fit, run this share of the
# budget: the held-out ranking of priors compares them as fitted, so a weak prior whose fit stopped
# short of its optimum ranks as if it were stronger
STEP_BUDGET_SHARE = 1 / 3
# the fits after the choice — the refit on train + dev, the fit on all the sentences after
# cross-fitting — start from the chosen fit (or the folds' average) and its Fisher diagonal, which
# preconditions them (`fit_laplace`): they move little and run this share
REFIT_BUDGET_SHARE = 0.15
log = logging.getLogger("gpseq.training")


def concatenate(*parts) -> SequenceData:
    """The sentences of the parts in order (labelled SequenceData, or `SentenceBlocks`) as one."""
    parts = [piece for part in parts for piece in ([part] if isinstance(part, SequenceData) else part)]
    starts = np.cumsum([0] + [part.n_tokens for part in parts[:-1]])
    offsets = np.concatenate([[0]] + [start + part.offsets[1:] for start, part in zip(starts, parts)])
    return SequenceData(CsrRows.stacked([CsrRows.of(part.rows) for part in parts]), offsets.astype(np.int64),
                        np.concatenate([part.label_ids for part in parts]))


def train_laplace(config, featurizer, num_labels: int, data: SequenceData, dev_data: SequenceData | None,
                  callbacks=None, init: "LaplaceFit | None" = None, choose_decode=None):
    """The default training of a `TaggerConfig`: fit q by `fit_laplace` along the walk of priors
    (σ², λ) of `choose_prior` (warm-started), each ranked by the dev NLL at its best temperature;
    calibrate the chosen one's predictive (α, T) on `dev_data`; refit it on train + dev (small
    corpora: cross-fitting, `cross_fitting`). Returns (the model's arrays as `model_state` names
    them, scores). `init`: a fit on
    this featurizer's columns and these labels that the fits on all the training data start from
    instead of 0 (a warm start, `Tagger.train(init=...)`; cross-fitting folds start cold).
    `choose_decode(decodes) -> (decoder, scores)`: given what each decoder returns on the held-out
    data the calibration was fitted on (`held_out_decodes` at the fitted (α, T)), the decoder the
    model uses by default (`scores["decode"]`; not called without calibration).

    BLAS runs on one thread meanwhile: the NumPy chain's products are [n, V] @ [V, V], where
    OpenBLAS's threads cost more than they save; and freed
    large arrays are kept for the next evaluation (`gpseq.training.allocator`)."""
    from threadpoolctl import threadpool_limits

    from gpseq.training.allocator import arrays_reused

    with threadpool_limits(1, user_api="blas"), arrays_reused():
        chosen, arguments, scores = _train_laplace(config, featurizer, num_labels, data, dev_data, callbacks, init,
                                                   choose_decode)
    # the model's dense [D, V] arrays after the fit's freed memory went back to the system (they are
    # large enough to be mapped afresh, on top of whatever the allocator kept)
    return model_state(chosen, **arguments), scores


def prior_grid(training, model, has_dev: bool) -> tuple[list[float], list[float], list[float]]:
    """The σ² (`prior_variance_grid`, in order), L1 strengths (`l1_grid`, strongest first) and
    pairwise prior variances (`pairwise_variance_grid`, in order) the default training walks
    (`choose_prior`). Without a dev split (or calibration) there is nothing to compare: the first
    of each."""
    variances = [float(v) for v in training.prior_variance_grid or []] or [float(model.prior_variance)]
    strengths = [float(l1) for l1 in training.l1_grid or []] or [0.0]
    pairwise = [float(v) for v in training.pairwise_variance_grid or []] or [float(model.pairwise_prior_variance)]
    grids = (variances, strengths, pairwise)
    return grids if has_dev and training.calibrate else tuple(grid[:1] for grid in grids)


def prior_key(prior: tuple[float, float, float]) -> str:
    """A prior (σ², λ, σ²_P) as the scores name it: "σ²/λ/σ²_P"."""
    return "/".join(f"{value:g}" for value in prior)


def choose_prior(fit_at, rank, variances, strengths, pairwise=(1.0,), warm=None, denser=True):
    """Walk the priors (σ², λ, σ²_P) and choose one (`PathChoice`): the L1 path (σ²₀, λ, σ²_P₀) for
    λ in `strengths` at the first σ² (each fit warm-started from the previous one, the sparsest
    first), then, at the chosen λ, the other σ² in order, then, at the chosen (σ², λ), the other
    pairwise prior variances in order (each warm-started from the fit chosen so far). The L1 path
    chooses the densest strength not worse than the best by one standard error and ends at the
    first that is (`denser`; else a strength replaces the choice only when better by one standard
    error, and the path ends at the first that is not); the σ² walk ends at the first prior not
    better than the choice so far by one standard error, the σ²_P walk at the first not lower.
    `fit_at(number, prior, warm)` fits the `number`-th prior of the walk (0: the first, on the
    whole budget); `rank(fit)` is its held-out ranking (`fit_calibration_parts(..., sentences=True)`).
    Returns (the `PathChoice`, the held-out NLL of every prior fitted, in fitting order)."""
    choice, candidates, number = PathChoice(), {}, 0

    def visit(prior, warm, rule):
        nonlocal number
        fit = fit_at(number, prior, warm)
        number += 1
        ranked = rank(fit)
        candidates[prior] = ranked["dev_token_nll"]
        return fit, choice.offer(prior, ranked, fit, rule)

    for l1 in strengths:
        warm, ended = visit((variances[0], l1, pairwise[0]), warm, "denser" if denser else "better")
        if ended:
            break
    del warm  # the fits a walk does not choose are let go of as soon as they are ranked
    for variance in variances[1:]:
        if visit((variance, choice.prior[1], pairwise[0]), choice.fit, "better")[1]:
            break
    for pair_variance in pairwise[1:]:  # V² weights, not a sparser or denser model: the lower NLL
        if visit((*choice.prior[:2], pair_variance), choice.fit, "lower")[1]:
            break
    return choice, candidates


def significantly_better(candidate: dict, best: dict) -> bool:
    """Whether the `candidate` fit's held-out NLL per token (`calibrate(..., sentences=True)`) is
    below the `best` one's by more than one standard error of their paired difference (sentences
    as the units): selection noise (dev NLLs within 1e-4 of each other on CoNLL-2000 POS tagging)
    decides nothing."""
    diff = candidate["dev_sentence_nll"] - best["dev_sentence_nll"]
    tokens = candidate["dev_tokens"]
    error = np.sqrt(len(diff)) * diff.std(ddof=1) / tokens if len(diff) > 1 else 0.0
    return diff.sum() / tokens < -error


class PathChoice:
    """The choice along a walk of priors (`choose_prior`), by one of three rules per offer:
    - "denser" (the L1 path, sparsest first): a strength becomes the choice unless its held-out
      NLL is worse than the best fitted so far by more than one standard error
      (`significantly_better`), and the path ends at the first that is. Among fits the held-out
      data cannot tell apart, the densest: a tagger whose evidence is spread over more features
      loses less when some of them are missing or changed in the tagged text (Sutton, Sindelar &
      McCallum 2006, weight undertraining; measured in benchmarks/RESULTS.md, "Denser ties");
    - "better" (σ², and the L1 path under cross-fitting): a prior replaces the choice only when its
      NLL is lower by more than one standard error, and the walk ends at the first that is not. On
      a small corpus the out-of-fold NLLs are too noisy for one standard error to tell a tie from a
      real loss (the same section);
    - "lower" (σ²_P): any lower NLL replaces the choice."""

    def __init__(self):
        self.prior, self.ranked, self.fit = None, None, None
        self.best = None  # the ranking of the lowest held-out NLL offered so far (the "denser" rule's reference)

    def offer(self, prior: tuple[float, float, float], ranked: dict, fit, rule: str = "better") -> bool:
        """Rank `fit` (of `prior`) by `ranked` against the choice so far under `rule`; True: the walk ends here."""
        if self.best is None or ranked["dev_token_nll"] < self.best["dev_token_nll"]:
            self.best = ranked
        if rule == "denser":
            taken = not significantly_better(self.best, ranked)
        elif rule == "better":
            taken = self.ranked is None or significantly_better(ranked, self.ranked)
        elif rule == "lower":
            taken = self.ranked is None or ranked["dev_token_nll"] < self.ranked["dev_token_nll"]
        else:
            raise ValueError(f"unknown rule {rule!r}")
        if taken:
            self.prior, self.ranked, self.fit = prior, ranked, fit
        return not taken


def small_corpus(training, tokens: int) -> bool:
    """Whether train + dev of `tokens` tokens is small enough for the default training to cross-fit
    over it (`cross_fit_tokens`, `cross_fit_folds`)."""
    return training.cross_fit_folds >= 2 and tokens <= training.cross_fit_tokens


def final_fit_sees_dev(training, tokens: int) -> bool:
    """Whether the default training's final weights train on a dev split (of a corpus of `tokens`
    tokens with it): by the refit on train + dev, or by cross-fitting over both."""
    return training.refit_with_dev or (training.calibrate and small_corpus(training, tokens))


def cross_fitting(training, data: SequenceData, dev_data: SequenceData | None) -> tuple[SequenceData, list] | None:
    """The sentences (train + dev) and folds (`kfold_indices`) the default training cross-fits over,
    or None: a small corpus (train + dev within `cross_fit_tokens`) that has a dev split to
    calibrate on and enough sentences for the folds, two or more of them with a labelled token (a
    partially annotated corpus: one in each fold's training part, `kfold_indices(labelled=...)`).
    `dev_data`: the dev sentences it can train on (no label unknown to the model)."""
    if dev_data is None or len(dev_data) == 0 or not training.calibrate:
        return None
    if not small_corpus(training, data.n_tokens + dev_data.n_tokens) or \
            len(data) + len(dev_data) < 2 * training.cross_fit_folds:
        return None
    combined = concatenate(data, dev_data)
    labelled = np.add.reduceat((combined.label_ids >= 0).astype(np.int64), combined.offsets[:-1]) > 0
    if labelled.sum() < 2:
        return None
    return combined, kfold_indices(len(combined), training.cross_fit_folds, seed=training.seed, labelled=labelled)


def _train_laplace(config, featurizer, num_labels, data, dev_data, callbacks, init=None, choose_decode=None):
    from gpseq.training.config import Progress

    tcfg, mcfg = config.training, config.model
    groups, names = featurizer.column_groups()
    shared = featurizer.config.unseen_shared  # how a token's unseen features add up (`LaplaceFit.held_out`)
    budget = tcfg.max_steps or tcfg.max_iterations
    step = max(1, round(budget * STEP_BUDGET_SHARE))
    refit = max(1, round(budget * REFIT_BUDGET_SHARE))
    if dev_data is not None and len(dev_data) > 0 and not (dev_data.label_ids >= 0).any():
        # every candidate would score 0 on it and calibration would fit the prior on log T alone
        log.warning("no token of the dev split (%d sentences) has a label the model knows: trained as "
                    "without a dev split (the first prior of the grid, no calibration)", len(dev_data))
        dev_data = None
    has_dev = dev_data is not None and len(dev_data) > 0
    variances, strengths, pairwise = prior_grid(tcfg, mcfg, has_dev)
    walk = len(strengths) + len(variances) + len(pairwise) - 2  # the most priors `choose_prior` fits
    total = budget + (walk - 1 + tcfg.evidence_rounds * walk) * step
    start = time.perf_counter()
    done = [0]

    def progress(round_, iteration, objective):
        done[0] += 1
        for callback in callbacks or []:
            callback(Progress(done[0], total, round_, objective, elapsed_s=time.perf_counter() - start))

    def fit(objective, prior, iterations, warm, evidence_rounds=0, release=False):
        prior_variance, l1, pairwise_variance = prior
        return fit_laplace(objective, groups, names, prior_variance=prior_variance, l1=l1,
                           pairwise_prior_variance=pairwise_variance, evidence_rounds=evidence_rounds,
                           max_iterations=iterations, refit_iterations=step, callback=progress, start=warm,
                           release_start=release)

    iterations: list[int] = []

    def path_fit(objective, number, prior, warm, share=1.0, evidence_rounds=0):
        """Fit the `number`-th prior of a walk on `objective` from `warm` (the previous fit), with
        `share` of its iteration budget: the whole budget from no start (or a saved model's, which
        has no Fisher diagonal), a step's from the previous fit of the walk."""
        cold = warm is None or warm.fisher is None
        current = fit(objective, prior, max(1, int(share * (budget if cold else step))), warm, evidence_rounds)
        iterations.extend(current.report.iterations)
        return current

    def run_path(objective, priors, warm):
        """Fit `priors` in order on `objective`, each warm-started from the previous fit (the first
        from `warm`). Returns the last fit."""
        for number, prior in enumerate(priors):
            warm = path_fit(objective, number, prior, warm)
        return warm

    trainable_dev = None
    if has_dev:
        # sentences of dev with a label train never saw cannot be trained on (unlabelled tokens can)
        clean = np.add.reduceat((dev_data.label_ids == UNKNOWN_LABEL_ID).astype(np.int64), dev_data.offsets[:-1]) == 0
        trainable_dev = dev_data if clean.all() else dev_data.subset(np.flatnonzero(clean))  # no copy if all clean
    crossfit = cross_fitting(tcfg, data, trainable_dev)
    scores: dict = {"method": "laplace"}
    if crossfit:
        # choose the prior and calibrate on the out-of-fold predictions of fits on the other folds
        combined, folds = crossfit
        total = int(len(folds) * FOLD_BUDGET_SHARE * total) + (refit if init is None else budget + (walk - 1) * step)
        objectives = [NumpyChainObjective(combined.subset(inside), num_labels, dtype=config.dtype)
                      for inside, _ in folds]
        parts = [combined.subset(held) for _, held in folds]

        def held_out(fold_fits):
            """Each fold fit's predictive moments on its held-out fold (`fit_calibration_parts`'s parts)."""
            return [fold.held_out(part, shared) for fold, part in zip(fold_fits, parts)]

        # every fold's fit warm-started from its fit at the previous prior; each prior ranked by the
        # held-out NLL of its fold fits at their best T
        choice, candidates = choose_prior(
            lambda number, prior, warm: [path_fit(objective, number, prior, each, FOLD_BUDGET_SHARE)
                                         for objective, each in zip(objectives, warm or [None] * len(folds))],
            lambda fold_fits: fit_calibration_parts(held_out(fold_fits), variance_scale=False, sentences=True),
            variances, strengths, pairwise, denser=False)
        prior, fold_fits, map_temperature = choice.prior, choice.fit, choice.ranked["temperature"]
        del objectives, choice
        predictions = held_out(fold_fits)
        calibration = fit_calibration_parts(predictions, temperature=map_temperature)  # (α, β) at the MAP's T
        calibration["map_temperature"] = map_temperature
        decodes = choose_decode and held_out_decodes(predictions, calibration["variance_scale"],
                                                     calibration["temperature"], calibration.get("unseen_scale"))
        del predictions
        dev_nll = candidates[prior] = calibration["dev_token_nll"]
        # the final fit on all the sentences: the objective is convex, so where it starts changes
        # only how soon it converges — from the average of the fold fits at the chosen pair (each
        # saw 1 − 1/k of these sentences), or along the walk from `init` when one is given
        final = NumpyChainObjective(combined, num_labels, dtype=config.dtype)
        if init is None:
            average = average_fit(fold_fits, final.support)
            del fold_fits
            chosen = fit(final, prior, refit, average, release=True)
            iterations.extend(chosen.report.iterations)
        else:
            del fold_fits
            walked = list(candidates)
            chosen = run_path(final, walked[: walked.index(prior) + 1], init)
        final.close()
        report = chosen.report
        scores.update(cross_fit_folds=len(folds), refit_sentences=len(combined))
    else:
        objective = NumpyChainObjective(data, num_labels, dtype=config.dtype)
        if has_dev and tcfg.calibrate:  # ranked by the dev NLL at the best T
            choice, candidates = choose_prior(
                lambda number, prior, warm: path_fit(objective, number, prior, warm,
                                                     evidence_rounds=tcfg.evidence_rounds),
                lambda current: calibrate(current, dev_data, shared, variance_scale=False, sentences=True),
                variances, strengths, pairwise, init)
            prior, chosen, map_temperature = choice.prior, choice.fit, choice.ranked["temperature"]
            del choice
            predictions = held_out_parts(chosen, dev_data, shared)
            # the chosen fit's T at α = β ≈ 0 (its ranking): the MAP's own, held while α, β are fitted
            calibration = fit_calibration_parts(predictions, temperature=map_temperature)
            calibration["map_temperature"] = map_temperature  # (a predictive without variance uses it)
            decodes = choose_decode and held_out_decodes(predictions, calibration["variance_scale"],
                                                         calibration["temperature"], calibration.get("unseen_scale"))
            del predictions
            dev_nll = candidates[prior] = calibration["dev_token_nll"]
        else:  # nothing to compare on: the first prior (`prior_grid`)
            prior, candidates, calibration, dev_nll = (variances[0], strengths[0], pairwise[0]), {}, None, None
            chosen = path_fit(objective, 0, prior, init, evidence_rounds=tcfg.evidence_rounds)
        report = chosen.report
        if has_dev and tcfg.refit_with_dev:
            # the held-out split has served (prior, calibration); the final weights see it too
            total += refit
            if (trainable_dev.label_ids >= 0).any():  # its chunks and the dev split's
                objective = objective.extended(trainable_dev)
            chosen = fit(objective, prior, refit, chosen, release=True)  # the walk's fit is not read again
            iterations.extend(chosen.report.iterations)
            scores["refit_sentences"] = len(data) + len(trainable_dev)
        objective.close()
    scores.update(prior_variance=prior[0], l1=prior[1], pairwise_prior_variance=prior[2],
                  prior_variances=report.prior_variances,
                  objective_per_token=report.objective_per_token)
    if candidates:  # the held-out NLL of each prior fitted
        scores["dev_token_nll_by_prior"] = {prior_key(each): nll for each, nll in candidates.items()}
    if calibration:
        scores["calibration"] = calibration
        if choose_decode is not None:  # on the predictions the calibration was fitted on
            scores["decode"], scores["decode_scores"] = choose_decode(decodes)
    scores.update(steps=done[0], lbfgs_iterations=iterations, nonzero_weights=chosen.report.nonzero_weights,
                  free_weights=chosen.report.free_weights)
    for callback in callbacks or []:
        callback(Progress(done[0], total, walk, -report.objective_per_token[-1], event="done",
                          dev_score=dev_nll, elapsed_s=time.perf_counter() - start))
    alpha, temperature = (calibration["variance_scale"], calibration["temperature"]) if calibration else (1.0, 1.0)
    arguments = dict(prior_variance=prior[0], alpha=alpha, temperature=temperature,
                     unseen_scale=calibration.get("unseen_scale") if calibration else None, dtype=config.dtype)
    return chosen, arguments, scores
