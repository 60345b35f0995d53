"""The weight-space GP's predictive for features the training data never constrained.

A weight no training token touched keeps its prior N(0, σ²): a token's features that the vocabulary
lacks (counted in column 0: k, one shared unknown of variance k² σ², or √k, k independent ones of
variance k σ²) and the (feature, label) pairs no training token had (off the support) add their
prior variance to the potential and nothing to its mean. Checked against a hand-computed count of
unseen features, against the exact Gaussian posterior of tiny Bayesian linear models with features
absent from their data, against the potentials' variance summed by hand over a token's features,
and the fitted scales (α, β, T) against a brute-force search of the held-out NLL.
"""

from __future__ import annotations

import numpy as np
import pytest

from gpseq.corpora.types import Sentence
from gpseq.features import Featurizer
from gpseq.features.config import FeatureConfig


def tiny_config(**overrides) -> FeatureConfig:
    """bias, lower-cased word at −1, 0, +1: four templates."""
    return FeatureConfig(attributes=["lower"], window=1, **overrides).validate()


TRAIN = [Sentence(tokens=["the", "cat", "sat"], labels=["D", "N", "V"]),
         Sentence(tokens=["a", "dog", "ran"], labels=["D", "N", "V"])]


@pytest.mark.parametrize("shared", [True, False])
def test_column_0_counts_the_features_the_vocabulary_lacks(shared):
    """In "the zebu sat", 'zebu' is new: tokens 0, 1 and 2 each miss one feature (its +1, 0 and −1
    word); column 0 is k = 1. A sentence of known words has no column 0; a 1-token new word misses its
    word at 0 only (the boundaries at ±1 are known values); "yak zebu" misses k = 2 per token: column
    0 is 2 for shared weights, √2 for independent ones (so that x₀² σ² is k² σ² or k σ²)."""
    featurizer = Featurizer(tiny_config(unseen_shared=shared)).fit(TRAIN)
    rows = featurizer.transform([Sentence(tokens=["the", "zebu", "sat"]), Sentence(tokens=["the", "cat"]),
                                 Sentence(tokens=["zebu"]), Sentence(tokens=["yak", "zebu"])]).rows.toarray()
    two = 2.0 if shared else np.sqrt(2)
    np.testing.assert_allclose(rows[:, 0], [1, 1, 1, 0, 0, 1, two, two], rtol=1e-6)
    assert featurizer.feature_names()[0] == "<unseen>"
    # every other column is a feature of the vocabulary, value 1, as before
    assert set(np.unique(rows[:, 1:])) <= {0.0, 1.0}
    assert rows[0, 1:].sum() == 4 - 1 and rows[6, 1:].sum() == 4 - 2


def test_a_featurizer_saved_without_unseen_shared_keeps_the_square_root(tmp_path):
    """A model's featurizer.json from before the shared count (no `unseen_shared` key) loads with
    √k in column 0, so its saved predictive is unchanged."""
    import json

    featurizer = Featurizer(tiny_config()).fit(TRAIN)
    featurizer.save(tmp_path / "f")
    path = next((tmp_path / "f").glob("*.json"))
    data = json.loads(path.read_text())
    del data["config"]["unseen_shared"]
    path.write_text(json.dumps(data))
    loaded = Featurizer.load(tmp_path / "f")
    assert loaded.config.unseen_shared is False
    rows = loaded.transform([Sentence(tokens=["yak", "zebu"])]).rows.toarray()
    np.testing.assert_allclose(rows[:, 0], np.sqrt(2), rtol=1e-6)


def test_shared_unseen_weights_have_the_exact_posterior_of_one_tied_weight():
    """Bayesian linear regression whose features 3, 4, 5 never occur in training and are tied to one
    weight (w₃ = w₄ = w₅ ~ N(0, σ²): one unknown behind them all): the exact predictive variance at a
    point with those three features on is the one without them plus (x₃ + x₄ + x₅)² σ² = k² σ² —
    what column 0 = k gives — where independent weights would give k σ² (column 0 = √k)."""
    rng = np.random.default_rng(1)
    sigma2, noise = 1.7, 0.2
    X = rng.normal(size=(30, 3))
    # the tied model's design: features 0-2 and the sum of 3-5 (zero in training) as one column
    design = np.concatenate([X, np.zeros((30, 1))], axis=1)
    covariance = np.linalg.inv(design.T @ design / noise + np.eye(4) / sigma2)
    x = np.array([0.3, -1.2, 0.5, 1.0, 1.0, 1.0])
    tied = np.concatenate([x[:3], [x[3:].sum()]])
    k = 3
    np.testing.assert_allclose(tied @ covariance @ tied, x[:3] @ covariance[:3, :3] @ x[:3] + k ** 2 * sigma2)
    independent = np.linalg.inv(np.concatenate([X, np.zeros((30, 3))], axis=1).T
                                @ np.concatenate([X, np.zeros((30, 3))], axis=1) / noise + np.eye(6) / sigma2)
    np.testing.assert_allclose(x @ independent @ x, x[:3] @ covariance[:3, :3] @ x[:3] + k * sigma2)


@pytest.mark.parametrize("config", [dict(unseen_column=False), dict(hashing_dim=64), dict(l2_normalize=True)])
def test_no_column_0_where_it_does_not_apply(config):
    featurizer = Featurizer(tiny_config(**config)).fit(TRAIN)
    rows = featurizer.transform([Sentence(tokens=["the", "zebu", "sat"])]).rows.toarray()
    assert not rows[:, 0].any()


def test_an_unconstrained_weight_has_its_prior_variance_in_the_exact_gaussian_posterior():
    """Bayesian linear regression y = Xw + ε, w ~ N(0, σ² I), with a feature whose column is all zero
    in the training data: its posterior variance is σ² and its covariance with the others is 0, so
    a test point's predictive variance is the one without it plus x² σ² — the rule the tagger's
    predictive applies to unseen features."""
    rng = np.random.default_rng(0)
    sigma2, noise = 2.5, 0.3
    X = rng.normal(size=(20, 4))
    X[:, 3] = 0.0  # feature 3 never occurs in training
    covariance = np.linalg.inv(X.T @ X / noise + np.eye(4) / sigma2)
    np.testing.assert_allclose(covariance[3, 3], sigma2)
    np.testing.assert_allclose(covariance[3, :3], 0.0, atol=1e-15)
    x = np.array([0.5, -1.0, 2.0, 3.0])
    np.testing.assert_allclose(x @ covariance @ x, x[:3] @ covariance[:3, :3] @ x[:3] + x[3] ** 2 * sigma2)


def test_potential_variance_is_the_sum_over_features_with_prior_variance_off_the_support():
    """The default fit's predictive variance of each label's potential, for tokens with unseen words,
    summed by hand: s of a support pair, σ² of a pair off it, x₀² σ² for the k features the vocabulary
    lacks (column 0 = k: k² σ²)."""
    from gpseq.training.batching import SequenceData
    from gpseq.training.chain_objective import NumpyChainObjective
    from gpseq.training.laplace import fit_laplace

    featurizer = Featurizer(tiny_config()).fit(TRAIN)
    labels = ["D", "N", "V"]
    data = SequenceData.featurised(featurizer, TRAIN, {l: i for i, l in enumerate(labels)})
    groups, names = featurizer.column_groups()
    sigma2 = 0.8
    fit = fit_laplace(NumpyChainObjective(data, 3), groups, names, prior_variance=sigma2, max_iterations=50)
    assert not np.any(fit.support < 3)  # column 0 is never free
    test = [Sentence(tokens=["the", "zebu", "sat"]), Sentence(tokens=["yak", "zebu"])]
    rows = featurizer.transform(test).rows
    _, variance = fit.unary_moments(rows)
    on_support = dict(zip(fit.support.tolist(), fit.weight_variance.tolist()))
    dense = rows.toarray()
    for t in range(dense.shape[0]):
        for v in range(3):
            expected = sum(float(x) ** 2 * on_support.get(f * 3 + v, sigma2) for f, x in enumerate(dense[t]) if x)
            np.testing.assert_allclose(variance[t, v], expected, rtol=1e-10)
    # 'zebu' in place of 'cat' (seen with N only): N's variance rises from cat's posterior s to σ²; D's
    # and V's were σ² already (pairs off the support)
    known = fit.unary_moments(featurizer.transform([Sentence(tokens=["the", "cat", "sat"])]).rows)[1]
    np.testing.assert_allclose(variance[1, [0, 2]], known[1, [0, 2]], rtol=1e-12)
    assert variance[1, 1] > known[1, 1]


def test_a_saved_model_predicts_with_the_fitted_scales_of_both_variances(tmp_path):
    """Trained, saved and loaded: the NumPy predictive's scaled variance for a new word's token is
    α (the fit's variance of the seen features) + β σ² k² (the k features the vocabulary lacks) with
    the α, β the training fitted, and the token's confidence is lower with the new word than with a
    known one in the same place."""
    from gpseq.config import TaggerConfig
    from gpseq.tagger import Tagger

    corpus = [Sentence(tokens=[d, f"n{i}", v], labels=["D", "N", "V"])
              for i, (d, v) in enumerate([("the", "sat"), ("a", "ran")] * 20)]  # each noun once: new to other folds
    tagger = Tagger.train(corpus, TaggerConfig(features=tiny_config()))
    tagger.save(tmp_path / "m")
    loaded = Tagger.load(tmp_path / "m")
    calibration = loaded.scores["calibration"]
    alpha, beta = calibration["variance_scale"], calibration["unseen_scale"]
    predictive = loaded.predictor.linear
    assert predictive.alpha == pytest.approx(alpha, rel=1e-6)
    rows = loaded.featurizer.transform([Sentence(tokens=["the", "zebu", "sat"]),
                                        Sentence(tokens=["yak", "zebu"])]).rows.toarray()
    k = rows[:, 0]
    np.testing.assert_allclose(k, [1, 1, 1, 2, 2])
    seen = rows[:, 1:] ** 2 @ predictive.weight_variance[1:]
    prior = loaded.scores["prior_variance"]
    scaled = alpha * (rows ** 2 @ predictive.weight_variance)
    np.testing.assert_allclose(scaled, alpha * seen + beta * prior * (k ** 2)[:, None], rtol=1e-4)
    new, old = loaded.tag([["the", "zebu", "sat"], ["the", "n1", "sat"]])
    assert np.asarray(new.probabilities)[1].max() < np.asarray(old.probabilities)[1].max()


def _held_out_problem():
    """Short held-out sentences where some tokens have unseen features, their labels noise there and
    following the mean elsewhere; (HeldOut, nll(α, β, T) by enumerating every label path, the prior
    scale on log T)."""
    import itertools

    from gpseq.training.calibration import HeldOut

    rng = np.random.default_rng(3)
    V, lengths = 3, [3, 2, 4, 3, 2, 3, 4, 2, 3, 3, 2, 4]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    N = offsets[-1]
    mean = rng.normal(scale=3.0, size=(N, V))
    variance = rng.uniform(0.5, 4.0, size=(N, V))
    unseen = np.where(rng.random(N) < 0.4, rng.choice([16.0, 64.0], size=N), 0.0)
    pair_mean, pair_variance = rng.normal(size=(V, V)), rng.uniform(0.1, 1.0, size=(V, V))
    # labels follow the mean where a token has no unseen feature and are random where it has: the
    # held-out NLL wants little of the seen variance and much of the unseen one
    labels = np.where(unseen > 0, rng.integers(0, V, size=N), (mean + rng.gumbel(size=(N, V))).argmax(1))
    scale = 0.5  # the prior on log T, as `log_temperature_scale`

    def nll(alpha, beta, temperature):
        unary = mean / np.sqrt(1 + np.pi / 8 * (alpha * variance + beta * unseen[:, None])) / temperature
        pairwise = pair_mean / np.sqrt(1 + np.pi / 8 * alpha * pair_variance) / temperature
        total = 0.0
        for b in range(len(lengths)):
            u = unary[offsets[b]:offsets[b + 1]]
            scores = {path: u[np.arange(len(u)), path].sum() + sum(pairwise[i, j] for i, j in zip(path, path[1:]))
                      for path in itertools.product(range(V), repeat=len(u))}
            log_z = np.logaddexp.reduce(list(scores.values()))
            for t in range(len(u)):  # the marginal of the gold label at t
                total -= np.logaddexp.reduce([s for p, s in scores.items() if p[t] == labels[offsets[b] + t]]) - log_z
        return total / N + 0.5 * (np.log(temperature) / scale) ** 2 / N

    return HeldOut(mean, variance, pair_mean, pair_variance, labels, offsets, unseen), nll, scale


def test_fitted_scales_reach_the_brute_force_minimum_of_the_held_out_nll():
    """`fit_calibration_parts` on held-out tokens where some have unseen features: its (α, β, T)
    objective is no worse than the best point of a brute-force grid over the three (the NLL computed
    here by enumerating every label path of each short sentence), and where the unseen tokens' labels
    are noise and the others follow the mean, β comes out far above α."""
    from gpseq.training.calibration import fit_calibration_parts

    part, nll, scale = _held_out_problem()
    N = len(part.labels)
    fitted = fit_calibration_parts([part], log_temperature_scale=scale)
    found = nll(fitted["variance_scale"], fitted["unseen_scale"], fitted["temperature"])
    grid = np.exp(np.linspace(np.log(1e-4), np.log(20.0), 13))
    best = min(nll(a, b, t) for a in grid for b in grid for t in np.exp(np.linspace(-1.0, 1.0, 11)))
    assert found <= best + 1e-6
    assert fitted["dev_token_nll"] == pytest.approx(found - 0.5 * (np.log(fitted["temperature"]) / scale) ** 2 / N,
                                                    rel=1e-6)
    assert fitted["unseen_scale"] > 10 * fitted["variance_scale"]


def test_held_temperature_is_the_point_potentials_own_and_the_scales_fit_at_it():
    """The default training's calibration: T of the point potentials alone (`variance_scale=False`,
    what ranking a fit finds) is the brute-force best T at α = β = 1e-5, and with `temperature`
    held there, (α, β) are no worse than the best point of a brute-force grid over the two at it."""
    from gpseq.training.calibration import fit_calibration_parts

    part, nll, scale = _held_out_problem()
    own_t = fit_calibration_parts([part], log_temperature_scale=scale, variance_scale=False)["temperature"]
    fitted = fit_calibration_parts([part], log_temperature_scale=scale, temperature=own_t)
    temperatures = np.exp(np.linspace(-2.0, 2.0, 401))  # calibration's bounds on log T
    own = temperatures[int(np.argmin([nll(1e-5, 1e-5, t) for t in temperatures]))]
    assert fitted["temperature"] == pytest.approx(own, rel=0.011)  # the grid's step is 1 % of T
    found = nll(fitted["variance_scale"], fitted["unseen_scale"], fitted["temperature"])
    grid = np.exp(np.linspace(np.log(1e-4), np.log(20.0), 13))
    assert found <= min(nll(a, b, fitted["temperature"]) for a in grid for b in grid) + 1e-6
    assert fitted["unseen_scale"] > 10 * fitted["variance_scale"]


def test_info_shows_the_fitted_variance_scale(tmp_path):
    """`gpseq info` reports the calibration the training fitted (α, β and T from tagger.json's
    scores), and says when a scale is at its floor."""
    import json

    from helpers.cli import invoke

    corpus = tmp_path / "train.conll"
    corpus.write_text("".join(f"the\tD\nn{i}\tN\nsat\tV\n\n" for i in range(32)))  # each noun once
    result = invoke("train", corpus, "-o", tmp_path / "m", "--features", "ner")
    assert result.exit_code == 0, result.stderr
    calibration = json.loads((tmp_path / "m" / "tagger.json").read_text())["scores"]["calibration"]
    shown = invoke("info", tmp_path / "m").stdout
    alpha, beta = calibration["variance_scale"], calibration["unseen_scale"]
    floor = lambda scale: " (at its floor)" if scale <= 1.5e-5 else ""  # noqa: E731
    words = " ".join(word for word in shown.split() if word != "│")  # the table's cells wrap
    assert f"variance scale α = {alpha:.3g}{floor(alpha)}, unseen-feature scale β = {beta:.3g}{floor(beta)}" in words
