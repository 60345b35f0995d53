"""The choice of the prior (gpseq/training/prior_path.py): cross-fitting pools out-of-fold
predictions of fold fits, the L1 path's one-standard-error rules (on a dev split the densest
strength not worse than the best; under cross-fitting a denser one only when better), the walk over
the variances, the MAP temperature, and the dev splits and folds of partially annotated corpora or
of labels the model does not know."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf

from helpers.laplace import sample_problem, scaled_unary_variance

from gpseq.structured import chain
from gpseq.training.batching import SequenceData
from gpseq.training.calibration import fit_calibration
from gpseq.training.chain_objective import NumpyChainObjective
from gpseq.training.laplace import fit_laplace


def test_cross_fitting_pools_out_of_fold_predictions_of_fold_fits():
    """A small corpus cross-fits: the held-out NLL reported for a prior is the token NLL of the
    out-of-fold predictions of fits on the other folds, at the calibrated (α, T) — recomputed
    here with independent fold fits, the scaled variance summed by hand (a held-out token's
    features its fold fit never saw count as unseen) and the TensorFlow chain's marginals."""
    from gpseq.corpora import kfold_indices
    from gpseq.tagger import TaggerConfig
    from gpseq.training.calibration import calibrated_potentials
    from gpseq.training.prior_path import FOLD_BUDGET_SHARE, concatenate, train_laplace

    sentences, featurizer, labels, data_of = sample_problem()

    config = TaggerConfig()
    config.training.prior_variance_grid, config.training.l1_grid = [4.0], [0.3]
    config.training.pairwise_variance_grid = [config.model.pairwise_prior_variance]
    config.training.max_iterations = 60
    train, dev = data_of(sentences[:40]), data_of(sentences[40:])
    _, scores = train_laplace(config, featurizer, len(labels), train, dev)
    assert scores["cross_fit_folds"] == config.training.cross_fit_folds == 3
    reported = scores["dev_token_nll_by_prior"]["4/0.3/1"]
    alpha, temperature = scores["calibration"]["variance_scale"], scores["calibration"]["temperature"]
    beta = scores["calibration"].get("unseen_scale")

    combined = concatenate(train, dev)
    groups, names = featurizer.column_groups()
    total, count = 0.0, 0
    for inside, held in kfold_indices(len(combined), 3, seed=config.training.seed):
        fit = fit_laplace(NumpyChainObjective(combined.subset(inside), len(labels)), groups, names,
                          prior_variance=4.0, l1=0.3, pairwise_prior_variance=config.model.pairwise_prior_variance,
                          max_iterations=int(FOLD_BUDGET_SHARE * 60))
        part = combined.subset(held)
        mean = fit.unary_moments(part.rows)[0]
        unary, _ = calibrated_potentials(mean, scaled_unary_variance(fit, part.rows, alpha, beta), fit.pairwise,
                                         fit.pairwise_variance, 1.0, temperature)
        _, pairwise = calibrated_potentials(mean, 0.0, fit.pairwise, fit.pairwise_variance, alpha, temperature)
        padded = np.zeros((len(part), part.lengths.max(), len(labels)))
        for b in range(len(part)):
            padded[b, : part.lengths[b]] = unary[part.offsets[b] : part.offsets[b + 1]]
        marg, _ = chain.marginals(tf.constant(padded), tf.constant(pairwise), tf.constant(part.lengths, tf.int32))
        for b in range(len(part)):
            gold = part.label_ids[part.offsets[b] : part.offsets[b + 1]]
            total -= np.log(np.maximum(marg.numpy()[b, np.arange(len(gold)), gold], 1e-12)).sum()
            count += len(gold)
    assert reported == pytest.approx(total / count, rel=2e-3)  # float32 objective in the fits


@pytest.mark.parametrize("crossfit", [True, False])
def test_the_l1_path_ends_at_the_first_strength_not_significantly_better(crossfit):
    """The L1 path at the first σ² fits its λ in order and stops after the first whose held-out NLL
    is worse than the best by one standard error (on a dev split) or not better than the choice by
    one (under cross-fitting; `PathChoice`): a λ of 30 after 0.3 (far sparser, a far worse fit) ends
    it either way, so 0.1 is never fitted; the other σ² is then fitted at the chosen λ only. Checked
    on the reported held-out NLLs."""
    from gpseq.tagger import TaggerConfig
    from gpseq.training.prior_path import train_laplace

    sentences, featurizer, labels, data_of = sample_problem()

    config = TaggerConfig()
    config.training.prior_variance_grid, config.training.l1_grid = [4.0, 16.0], [0.3, 30.0, 0.1]
    config.training.pairwise_variance_grid = [1.0]
    config.training.max_iterations = 30
    config.training.cross_fit_tokens = 10**6 if crossfit else 0
    _, scores = train_laplace(config, featurizer, len(labels), data_of(sentences[:40]), data_of(sentences[40:]))
    assert ("cross_fit_folds" in scores) == crossfit
    nll = scores["dev_token_nll_by_prior"]
    assert list(nll) == ["4/0.3/1", "4/30/1", "16/0.3/1"]
    assert nll["4/30/1"] > nll["4/0.3/1"]
    assert f"{scores['prior_variance']:g}/{scores['l1']:g}" in ("4/0.3", "16/0.3")


def test_choose_prior_walks_the_l1_path_then_the_variances_at_the_chosen_strength():
    """`choose_prior` on a hand-made ranking (per-sentence NLLs, so the one-standard-error rules are
    computed by hand): λ = 1 → 0.1 is better by far more than its standard error; 0.01 differs from
    0.1 by noise only and is denser, so it becomes the choice; 0 is worse than the best (0.1) by far
    more than a standard error, so the path ends there with 0.01 chosen; at λ = 0.01, σ² = 4 is
    better, σ² = 1 is not (the walk ends); at (4, 0.01) the pairwise prior variance 16 is lower by
    0.002 a sentence, far less than a standard error, and replaces 1 all the same (no margin on this
    walk); 64 is higher. Each fit is warm-started from the previous fit on the L1 path and from the
    choice so far on the σ² and σ²_P walks; the first fit gets the whole budget (number 0)."""
    from gpseq.training.prior_path import choose_prior

    base = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    noise = np.array([0.01, -0.01, 0.02, -0.02, 0.01, -0.015])  # sums to −0.005: 0.01 is the lower NLL
    sentence_nll = {(16.0, 1.0, 1.0): base + 0.5, (16.0, 0.1, 1.0): base, (16.0, 0.01, 1.0): base + noise,
                    (16.0, 0.0, 1.0): base + 0.2 + noise,
                    (4.0, 0.01, 1.0): base - 0.3 + noise, (1.0, 0.01, 1.0): base - 0.3 - noise,
                    (4.0, 0.01, 16.0): base - 0.302 + noise, (4.0, 0.01, 64.0): base - 0.297 + noise}
    calls = []

    def fit_at(number, prior, warm):
        calls.append((number, prior, warm))
        return prior

    def rank(prior):
        nll = sentence_nll[prior]
        return {"dev_sentence_nll": nll, "dev_tokens": 60, "dev_token_nll": nll.sum() / 60}

    choice, candidates = choose_prior(fit_at, rank, [16.0, 4.0, 1.0], [1.0, 0.1, 0.01, 0.0], [1.0, 16.0, 64.0],
                                      warm="init")
    assert choice.prior == choice.fit == (4.0, 0.01, 16.0)
    assert list(candidates) == [(16.0, 1.0, 1.0), (16.0, 0.1, 1.0), (16.0, 0.01, 1.0), (16.0, 0.0, 1.0),
                                (4.0, 0.01, 1.0), (1.0, 0.01, 1.0), (4.0, 0.01, 16.0), (4.0, 0.01, 64.0)]
    assert calls == [(0, (16.0, 1.0, 1.0), "init"), (1, (16.0, 0.1, 1.0), (16.0, 1.0, 1.0)),
                     (2, (16.0, 0.01, 1.0), (16.0, 0.1, 1.0)), (3, (16.0, 0.0, 1.0), (16.0, 0.01, 1.0)),
                     (4, (4.0, 0.01, 1.0), (16.0, 0.01, 1.0)), (5, (1.0, 0.01, 1.0), (4.0, 0.01, 1.0)),
                     (6, (4.0, 0.01, 16.0), (4.0, 0.01, 1.0)), (7, (4.0, 0.01, 64.0), (4.0, 0.01, 16.0))]
    assert candidates[(4.0, 0.01, 1.0)] == pytest.approx((base - 0.3 + noise).sum() / 60)


def test_the_l1_path_keeps_the_densest_strength_within_a_standard_error_of_the_best():
    """The "denser" rule against the best fitted so far, not the last choice: λ = 0.1 is the best;
    0.01 is worse than it, but by less than a standard error (chosen: denser); 0 is worse than 0.1 by
    more than a standard error (0.0035 a token against 0.0011): it ends the path, and 0.01 stays the
    choice. A strength worse than the best by more than a standard error right
    after the first ends the path with the first chosen."""
    from gpseq.training.prior_path import choose_prior

    base = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    wobble = np.array([0.03, -0.02, 0.03, -0.02, 0.03, -0.02])  # +0.0005 a token; sd 0.027 → SE 0.0011 a token
    ranks = {(16.0, 0.1, 1.0): base, (16.0, 0.01, 1.0): base + wobble, (16.0, 0.0, 1.0): base + wobble + 0.03}

    def rank(prior):
        nll = ranks[prior]
        return {"dev_sentence_nll": nll, "dev_tokens": 60, "dev_token_nll": nll.sum() / 60}

    choice, candidates = choose_prior(lambda number, prior, warm: prior, rank, [16.0], [0.1, 0.01, 0.0], [1.0])
    assert choice.prior == (16.0, 0.01, 1.0)
    assert list(candidates) == [(16.0, 0.1, 1.0), (16.0, 0.01, 1.0), (16.0, 0.0, 1.0)]

    ranks[(16.0, 0.01, 1.0)] = base + 0.1
    choice, candidates = choose_prior(lambda number, prior, warm: prior, rank, [16.0], [0.1, 0.01, 0.0], [1.0])
    assert choice.prior == (16.0, 0.1, 1.0)
    assert list(candidates) == [(16.0, 0.1, 1.0), (16.0, 0.01, 1.0)]


def test_one_standard_error_rule_on_paired_sentence_nlls():
    """`significantly_better`: the mean paired difference per token against one standard error
    (√B · sd of the per-sentence differences / tokens), by hand."""
    from gpseq.training.prior_path import significantly_better

    best = {"dev_sentence_nll": np.array([2.0, 3.0, 1.0, 4.0]), "dev_tokens": 10}
    # differences −0.2, −0.1, −0.3, −0.2: mean per token −0.08; sd 0.08165 → SE 2 · 0.08165 / 10 = 0.0163
    assert significantly_better({"dev_sentence_nll": np.array([1.8, 2.9, 0.7, 3.8]), "dev_tokens": 10}, best)
    # differences −0.5, +0.4, −0.3, +0.2: mean −0.02; sd 0.4203 → SE 0.0841: within it
    assert not significantly_better({"dev_sentence_nll": np.array([1.5, 3.4, 0.7, 4.2]), "dev_tokens": 10}, best)
    assert not significantly_better(best, best)


def _quick_config(seed=0):
    """The default training's config on one prior, with a small iteration budget."""
    from gpseq.tagger import TaggerConfig

    config = TaggerConfig()
    config.training.prior_variance_grid, config.training.l1_grid = [4.0], [0.3]
    config.training.pairwise_variance_grid = [1.0]
    config.training.max_iterations, config.training.seed = 20, seed
    return config


def test_cross_fitting_is_decided_on_the_dev_sentences_it_can_train_on():
    # 2 training + 4 dev sentences are the 2 · 3 that 3 folds need, but a dev sentence with a label
    # the model does not know cannot be trained on: with one in each, 2 sentences are left (no
    # cross-fitting; the dev split's known tokens still rank and calibrate)
    from gpseq.training.batching import UNKNOWN_LABEL_ID
    from gpseq.training.prior_path import train_laplace

    sentences, featurizer, labels, data_of = sample_problem()
    config = _quick_config()
    train, dev = data_of(sentences[:2]), data_of(sentences[2:6])
    unknown = dev.label_ids.copy()
    unknown[dev.offsets[:-1]] = UNKNOWN_LABEL_ID
    _, scores = train_laplace(config, featurizer, len(labels), train, SequenceData(dev.rows, dev.offsets, unknown))
    assert "cross_fit_folds" not in scores and scores["refit_sentences"] == 2
    _, clean = train_laplace(config, featurizer, len(labels), train, dev)
    assert clean["cross_fit_folds"] == 3 and clean["refit_sentences"] == 6


def test_cross_fitting_folds_each_train_on_a_labelled_sentence_of_a_partially_annotated_corpus():
    from gpseq.corpora.splits import kfold_indices
    from gpseq.training.batching import UNLABELLED_ID
    from gpseq.training.prior_path import train_laplace

    # the folds, by brute force over small cases: every index held out once, sizes within 1, each
    # fold's training part with a labelled index when two or more are, all labelled: the plain folds
    rng = np.random.default_rng(0)
    for n, k, seed in itertools.product(range(2, 13), range(2, 6), range(4)):
        if k > n:
            continue
        labelled = rng.random(n) < rng.random()
        folds = kfold_indices(n, k, seed, labelled=labelled)
        held = np.concatenate([test for _, test in folds])
        assert sorted(held.tolist()) == list(range(n))
        sizes = [len(test) for _, test in folds]
        assert max(sizes) - min(sizes) <= 1
        for inside, test in folds:
            assert sorted(np.concatenate([inside, test]).tolist()) == list(range(n))
            assert labelled.sum() < 2 or labelled[inside].any()
        plain = kfold_indices(n, k, seed)
        for (inside, test), (plain_inside, plain_test) in zip(kfold_indices(n, k, seed, labelled=np.ones(n, bool)), plain):
            np.testing.assert_array_equal(test, plain_test)
            np.testing.assert_array_equal(inside, plain_inside)

    # 1 labelled + 5 unlabelled training sentences, 2 labelled dev sentences: cross-fitted over the 8
    # at a seed whose shuffled folds would hold out all 3 labelled sentences at once
    sentences, featurizer, labels, data_of = sample_problem()
    train, dev = data_of(sentences[:6]), data_of(sentences[6:8])
    partial = train.label_ids.copy()
    partial[train.offsets[1]:] = UNLABELLED_ID
    labelled = np.isin(np.arange(8), [0, 6, 7])
    seed = next(seed for seed in range(1000)
                if any(labelled[test].sum() == 3 for _, test in kfold_indices(8, 3, seed)))
    _, scores = train_laplace(_quick_config(seed), featurizer, len(labels),
                              SequenceData(train.rows, train.offsets, partial), dev)
    assert scores["cross_fit_folds"] == 3 and scores["refit_sentences"] == 8


def test_a_dev_split_without_a_known_labelled_token_is_no_dev_split(caplog):
    # every dev token's label unknown to the model or `?`: nothing to rank priors or calibrate on —
    # the first prior of the grid, T = 1 and α = 1 (the no-dev path), one warning
    import logging

    from gpseq.training.batching import UNKNOWN_LABEL_ID, UNLABELLED_ID
    from gpseq.training.prior_path import train_laplace

    sentences, featurizer, labels, data_of = sample_problem()
    config = _quick_config()
    config.training.prior_variance_grid, config.training.l1_grid = [4.0, 16.0], [0.3, 0.0]
    config.training.pairwise_variance_grid = [2.0, 8.0]
    train, dev = data_of(sentences[:40]), data_of(sentences[40:48])
    unusable = np.where(np.arange(dev.n_tokens) % 2, UNKNOWN_LABEL_ID, UNLABELLED_ID).astype(np.int32)
    with caplog.at_level(logging.WARNING):
        state, scores = train_laplace(config, featurizer, len(labels), train,
                                      SequenceData(dev.rows, dev.offsets, unusable))
    assert len([record for record in caplog.records if record.levelno >= logging.WARNING]) == 1
    assert (scores["prior_variance"], scores["l1"], scores["pairwise_prior_variance"]) == (4.0, 0.3, 2.0)
    assert "calibration" not in scores and "dev_token_nll_by_prior" not in scores
    assert float(state["var:temperature"]) == 1.0 and float(state["var:variance_scale"]) == 1.0

    # calibration on no labelled token: the prior on log T alone, flat in α — α stays where it starts
    rng = np.random.default_rng(0)
    mean, variance = rng.normal(size=(6, 3)), rng.uniform(0.1, 2.0, size=(6, 3))
    fitted = fit_calibration(mean, variance, rng.normal(size=(3, 3)), rng.uniform(0.1, 1.0, size=(3, 3)),
                             np.full(6, UNKNOWN_LABEL_ID), np.array([0, 2, 6]))
    assert fitted["variance_scale"] == pytest.approx(1e-5) and fitted["temperature"] == pytest.approx(1.0)


def test_the_map_temperature_is_the_chosen_fits_own_by_brute_force():
    """`calibration.map_temperature`: the T that minimises the dev NLL of the chosen fit's MAP
    potentials u / T, P / T (no posterior variance) plus calibration's prior on log T — found here
    by a grid over T with an independent fit and the TensorFlow chain's marginals (no refit on
    train + dev, so the chosen fit is the one fitted here)."""
    from gpseq.tagger import TaggerConfig
    from gpseq.training.calibration import LOG_TEMPERATURE_SCALE
    from gpseq.training.prior_path import train_laplace

    sentences, featurizer, labels, data_of = sample_problem()
    config = TaggerConfig()
    config.training.prior_variance_grid, config.training.l1_grid = [4.0], [0.3]
    config.training.pairwise_variance_grid = [1.0]
    config.training.max_iterations = 60
    config.training.cross_fit_tokens = 0
    config.training.refit_with_dev = False
    train, dev = data_of(sentences[:36]), data_of(sentences[36:])
    _, scores = train_laplace(config, featurizer, len(labels), train, dev)
    reported = scores["calibration"]["map_temperature"]

    groups, names = featurizer.column_groups()
    fit = fit_laplace(NumpyChainObjective(train, len(labels)), groups, names, prior_variance=4.0, l1=0.3,
                      pairwise_prior_variance=1.0, max_iterations=60)
    mean = fit.unary_moments(dev.rows)[0]
    padded = np.zeros((len(dev), dev.lengths.max(), len(labels)))
    for b in range(len(dev)):
        padded[b, : dev.lengths[b]] = mean[dev.offsets[b] : dev.offsets[b + 1]]
    count = len(dev.label_ids)

    def objective(temperature):
        marg, _ = chain.marginals(tf.constant(padded / temperature), tf.constant(fit.pairwise / temperature),
                                  tf.constant(dev.lengths, tf.int32))
        nll = -sum(np.log(np.maximum(marg.numpy()[b, np.arange(dev.lengths[b]),
                                                   dev.label_ids[dev.offsets[b] : dev.offsets[b + 1]]], 1e-12)).sum()
                   for b in range(len(dev)))
        return (nll + 0.5 * (np.log(temperature) / LOG_TEMPERATURE_SCALE) ** 2) / count

    grid = np.exp(np.linspace(np.log(0.3), np.log(3.0), 181))
    best = grid[int(np.argmin([objective(t) for t in grid]))]
    assert reported == pytest.approx(best, rel=0.015)  # the grid's step is 1.3 % of T
