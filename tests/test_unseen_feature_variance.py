"""The weight-space GP's predictive for features the training data never constrained.

A weight no training token touched keeps its prior N(0, σ²): a token's features that the vocabulary
lacks (counted in column 0 as √k, so x₀² = k) and the (feature, label) pairs no training token had
(off the support) add their prior variance to the potential and nothing to its mean. Checked against
a hand-computed count of unseen features, against the exact Gaussian posterior of a tiny Bayesian
linear model with a feature absent from its data, and against the potentials' variance summed by
hand over a token's features.
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


def test_column_0_counts_the_features_the_vocabulary_lacks():
    """In "the zebu sat", 'zebu' is new: tokens 0, 1 and 2 each miss one feature (its +1, 0 and −1
    word); column 0 is √1. A sentence of known words has no column 0; a 1-token new word misses its
    word at 0 only (the boundaries at ±1 are known values)."""
    featurizer = Featurizer(tiny_config()).fit(TRAIN)
    rows = featurizer.transform([Sentence(tokens=["the", "zebu", "sat"]), Sentence(tokens=["the", "cat"]),
                                 Sentence(tokens=["zebu"]), Sentence(tokens=["yak", "zebu"])]).rows.toarray()
    np.testing.assert_allclose(rows[:, 0], [1, 1, 1, 0, 0, 1, np.sqrt(2), np.sqrt(2)])
    assert featurizer.feature_names()[0] == "<unseen>"
    # every other column is a feature of the vocabulary, value 1, as before
    assert set(np.unique(rows[:, 1:])) <= {0.0, 1.0}
    assert rows[0, 1:].sum() == 4 - 1 and rows[6, 1:].sum() == 4 - 2


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
    summed by hand: s of a support pair, σ² of a pair off it, k σ² for the k features the vocabulary
    lacks (column 0)."""
    from gpseq.tagger import Tagger
    from gpseq.training.chain_objective import NumpyChainObjective
    from gpseq.training.laplace import fit_laplace

    featurizer = Featurizer(tiny_config()).fit(TRAIN)
    labels = ["D", "N", "V"]
    data = Tagger._sequence_data(featurizer, TRAIN, {l: i for i, l in enumerate(labels)})
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


def test_a_saved_model_predicts_with_the_prior_variance_of_unseen_features(tmp_path):
    """Trained, saved and loaded: the NumPy predictive's variance for a new word's token equals the
    fit's (the saved q(W) keeps σ² off the support), and the token's confidence is lower with the
    new word than with a known one in the same place."""
    from gpseq.config import TaggerConfig
    from gpseq.tagger import Tagger

    corpus = TRAIN * 10
    tagger = Tagger.train(corpus, TaggerConfig(features=tiny_config()))
    tagger.save(tmp_path / "m")
    loaded = Tagger.load(tmp_path / "m")
    predictive = loaded.predictor.linear
    rows = loaded.featurizer.transform([Sentence(tokens=["the", "zebu", "sat"])]).rows
    variance = rows.multiply(rows) @ predictive.weight_variance
    prior = loaded.scores["prior_variance"]
    assert np.all(variance[1] >= prior * 0.999)
    new, old = loaded.tag([["the", "zebu", "sat"], ["the", "cat", "sat"]])
    assert np.asarray(new.probabilities)[1].max() < np.asarray(old.probabilities)[1].max()


def test_info_shows_the_fitted_variance_scale(tmp_path):
    """`gpseq info` reports the calibration the training fitted (α and T from tagger.json's scores),
    and says when α is at its floor."""
    import json

    from test_cli import invoke

    corpus = tmp_path / "train.conll"
    corpus.write_text("".join(f"the\tD\n{w}\tN\nsat\tV\n\n" for w in ["cat", "dog", "yak", "zebu"] * 8))
    result = invoke("train", corpus, "-o", tmp_path / "m", "--features", "ner")
    assert result.exit_code == 0, result.stderr
    calibration = json.loads((tmp_path / "m" / "tagger.json").read_text())["scores"]["calibration"]
    shown = invoke("info", tmp_path / "m").stdout
    assert f"variance scale α = {calibration['variance_scale']:.3g}" in " ".join(shown.split())
    assert ("at its floor" in shown) == (calibration["variance_scale"] <= 1.5e-5)
