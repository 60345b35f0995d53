"""The default training's fit (MAP + diagonal Laplace, gpseq/training/laplace.py) against
independent references: the log-space chain and autodiff (a stationary point, the exact Hessian
diagonal, the elastic-net optimality conditions), Monte Carlo over the weight posterior, and the
Fisher diagonal of the whole corpus; the model's arrays and a tagger importing without TensorFlow."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import tensorflow as tf

from helpers.laplace import synthetic_sequences

from gpseq.structured import chain
from gpseq.structured.model import ModelConfig, build_structured_gp
from gpseq.training.batching import make_batch
from gpseq.training.chain_objective import NumpyChainObjective, observed_pairs
from gpseq.training.laplace import fit_laplace, model_state


def _model(D, V):
    return build_structured_gp(ModelConfig(kernel="linear"), D, V, None, tf.float64)


def test_map_is_a_stationary_point_and_the_laplace_variance_inverts_the_exact_hessian_diagonal():
    rng = np.random.default_rng(3)
    data = synthetic_sequences(rng, n_seq=20, D=40, max_len=3)
    D, V = data.rows.shape[1], 3
    groups = np.zeros(D, np.int64)
    groups[1:] = 1 + (np.arange(1, D) % 2)  # two template groups
    fit = fit_laplace(NumpyChainObjective(data, V, dtype="float64"), groups, ["<pad>", "odd", "even"],
                      prior_variance=0.7, pairwise_prior_variance=2.0, bias_prior_variance=5.0, max_iterations=500,
                      tolerance=1e-14)
    support = observed_pairs(data, V)
    model = _model(D, V)  # the fit as the model the tagger builds from the saved arrays
    model.set_state(model_state(fit, prior_variance=0.7, alpha=0.5, temperature=1.5, dtype="float64"))
    np.testing.assert_allclose(model.unaries.linear.q_variance.numpy().ravel()[support], fit.weight_variance, rtol=1e-9)
    np.testing.assert_allclose(model.pairwise.variance.numpy(), fit.pairwise_variance, rtol=1e-9)
    assert float(model.variance_scale.numpy()) == 0.5 and float(model.temperature.numpy()) == 1.5
    batch = {k: tf.constant(v) for k, v in make_batch(data, np.arange(len(data)), dtype=np.float64).items()}
    w_obs = tf.Variable(model.unaries.linear.q_mu.numpy().ravel()[support])
    b, p = tf.Variable(model.unaries.label_bias.numpy()), tf.Variable(model.pairwise.mean.numpy())
    with tf.GradientTape(persistent=True) as outer:
        with tf.GradientTape() as tape:
            w = tf.reshape(tf.scatter_nd(support[:, None], w_obs, [D * V]), [D, V])
            table = tf.gather(w, batch["feature_ids"])
            unary = b + tf.einsum("btf,btfv->btv", batch["values"], tf.gather(table, batch["indices"]))
            objective = (-tf.reduce_sum(chain.log_likelihood(batch["labels"], unary, p, batch["lengths"]))
                         + 0.5 * tf.reduce_sum(w_obs**2) / 0.7 + 0.5 * tf.reduce_sum(p**2) / 2.0
                         + 0.5 * tf.reduce_sum(b**2) / 5.0)
        grad = tape.gradient(objective, w_obs)
    assert np.abs(grad.numpy()).max() < 1e-5
    hessian_diag = np.diag(outer.jacobian(grad, w_obs).numpy())  # exact: features fire ≤ once per token
    variance = model.unaries.linear.q_variance.numpy().ravel()
    # the Laplace variance uses the Fisher diagonal F_ii = Σ_t x² p(1−p) — the exact Hessian diagonal
    # of −log p when no feature fires twice within a sequence; check it where that holds
    once = _fires_once_per_sequence(data, support, V)
    np.testing.assert_allclose(variance[support][once], 1.0 / hessian_diag[once], rtol=1e-6)
    assert once.sum() > 10
    unseen = np.setdiff1d(np.arange(D * V), support)
    assert np.all(model.unaries.linear.q_mu.numpy().ravel()[unseen] == 0.0)


def test_model_state_names_the_arrays_as_the_model_does():
    data = synthetic_sequences(np.random.default_rng(7))
    D, V = data.rows.shape[1], 3
    fit = fit_laplace(NumpyChainObjective(data, V), np.zeros(D, np.int64), ["all"], max_iterations=3)
    mine = model_state(fit, prior_variance=4.0, alpha=1.0, temperature=1.0, dtype="float32")
    theirs = build_structured_gp(ModelConfig(kernel="linear"), D, V, None, tf.float32).get_state()
    assert {k: (v.shape, v.dtype) for k, v in mine.items()} == {k: (v.shape, v.dtype) for k, v in theirs.items()}


def _fires_once_per_sequence(data, support, V):
    """Mask over `support` of the pairs whose feature fires at most once in every sequence."""
    token_sequence = np.repeat(np.arange(len(data)), data.lengths)
    rows = data.rows.tocoo()
    counts = sp.csr_matrix((np.ones(rows.nnz), (token_sequence[rows.row], rows.col)),
                           shape=(len(data), rows.shape[1])).toarray()
    once = (counts <= 1).all(0)  # [D]
    return once[support // V]


def test_unary_moments_match_monte_carlo_over_the_weight_posterior():
    rng = np.random.default_rng(5)
    data = synthetic_sequences(rng, n_seq=4)
    D, V = data.rows.shape[1], 3
    model = _model(D, V)
    model.unaries.linear.q_mu.assign(rng.normal(size=(D, V)))
    model.unaries.linear.q_variance.assign(rng.uniform(0.1, 0.5, size=(D, V)))
    batch = {k: tf.constant(v) for k, v in make_batch(data, np.arange(len(data)), dtype=np.float64).items()}
    mean, variance = model.unaries.moments(batch)
    draws = model.unaries.sample(batch, 20000, tf.constant([1, 2], tf.int32))[0].numpy()  # [S, B, T, V]
    mask = tf.sequence_mask(batch["lengths"]).numpy()
    np.testing.assert_allclose(draws.mean(0)[mask], mean.numpy()[mask], atol=0.03)
    np.testing.assert_allclose(draws.var(0)[mask], variance.numpy()[mask], rtol=0.05)


def test_the_default_training_and_a_tagger_import_without_tensorflow():
    """The settings name the likelihoods the model maps to objects; `gpseq.tagger` and the default
    training import in a fresh interpreter without TensorFlow."""
    import subprocess
    import sys

    from gpseq.structured.config import LIKELIHOODS
    from gpseq.structured.likelihoods import LIKELIHOODS as objects

    assert tuple(LIKELIHOODS) == tuple(objects)
    code = ("import sys, gpseq.tagger, gpseq.training.prior_path, gpseq.training.calibration; "
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_l1_map_satisfies_the_elastic_net_optimality_conditions_by_autodiff():
    """fit_laplace with an L1 strength λ: at the optimum, by TensorFlow autodiff of the chain
    likelihood + Gaussian prior (independent of the NumPy objective), every nonzero weight has
    ∂/∂w + λ sign(w) = 0 and every zero weight |∂/∂w| ≤ λ; some weights are exactly zero."""
    rng = np.random.default_rng(4)
    data = synthetic_sequences(rng, n_seq=20, D=40, max_len=3)
    D, V, strength = data.rows.shape[1], 3, 0.8
    groups = np.zeros(D, np.int64)
    fit = fit_laplace(NumpyChainObjective(data, V, dtype="float64"), groups, ["all"], prior_variance=2.0,
                      pairwise_prior_variance=2.0, bias_prior_variance=5.0, l1=strength, max_iterations=2000,
                      tolerance=0.0)
    np.testing.assert_array_equal(fit.support, observed_pairs(data, V))
    g_w, g_b, g_p = _elastic_net_gradients(data, fit, D, V, 2.0, 2.0, 5.0)
    nonzero = fit.weights != 0.0
    assert 0 < nonzero.sum() < len(nonzero)
    np.testing.assert_allclose(g_w[nonzero] + strength * np.sign(fit.weights[nonzero]), 0.0, atol=1e-5)
    assert np.all(np.abs(g_w[~nonzero]) <= strength + 1e-6)
    np.testing.assert_allclose(g_b, 0.0, atol=1e-5)  # biases and pairwise: no L1
    np.testing.assert_allclose(g_p, 0.0, atol=1e-5)


def test_a_label_and_a_feature_only_the_carved_dev_split_holds_stay_in_the_model():
    # the dev split the default training carves from the corpus is refitted on (and, on a small
    # corpus, cross-fitted over): the model's labels and vocabulary are those of the whole file
    from gpseq import Tagger
    from gpseq.config import TaggerConfig
    from gpseq.corpora import Sentence
    from gpseq.corpora.splits import train_dev_split
    from gpseq.features import get_preset

    config = TaggerConfig(features=get_preset("ner"))
    rng = np.random.default_rng(5)
    words = ["the", "cat", "sat", "on", "a", "mat", "Paris", "Rome"]
    sentences = []
    for _ in range(40):
        tokens = list(rng.choice(words, size=int(rng.integers(3, 8))))
        sentences.append(Sentence(tokens, ["B-LOC" if t in ("Paris", "Rome") else "O" for t in tokens]))
    dev_ids = train_dev_split(len(sentences), config.training.dev_fraction, seed=config.training.seed,
                              max_dev=config.training.dev_max_sentences)[1]
    rare = int(dev_ids[0])  # the one sentence with B-ORG and the word Zyx: where the dev split takes it
    sentences[rare] = Sentence(["the", "Zyx", "sat"], ["O", "B-ORG", "O"])
    tagger = Tagger.train(sentences, config)
    assert tagger.labels == sorted({label for s in sentences for label in s.labels})
    assert any("Zyx" in name for name in tagger.featurizer.feature_names())
    assert tagger.scores["dev_sentences"] == len(dev_ids) and tagger.scores["refit_sentences"] == len(sentences)
    (tagged,) = tagger.tag([["the", "Zyx", "sat"]])
    assert tagged.probabilities[1][tagger.labels.index("B-ORG")] > tagged.probabilities[0][tagger.labels.index("B-ORG")]


def _elastic_net_gradients(data, fit, D, V, prior_variance, pairwise_variance, bias_variance):
    """∂/∂(w on the support, b, P) of −log p(y | x) + the Gaussian log prior at `fit`, by TensorFlow
    autodiff of the chain likelihood (independent of the NumPy objective)."""
    support = fit.support
    batch = {k: tf.constant(v) for k, v in make_batch(data, np.arange(len(data)), dtype=np.float64).items()}
    w_obs, b, p = (tf.Variable(fit.weights), tf.Variable(fit.bias), tf.Variable(fit.pairwise))
    with tf.GradientTape() as tape:
        w = tf.reshape(tf.scatter_nd(support[:, None], w_obs, [D * V]), [D, V])
        unary = b + tf.einsum("btf,btfv->btv", batch["values"], tf.gather(tf.gather(w, batch["feature_ids"]),
                                                                          batch["indices"]))
        smooth = (-tf.reduce_sum(chain.log_likelihood(batch["labels"], unary, p, batch["lengths"]))
                  + 0.5 * tf.reduce_sum(w_obs**2) / prior_variance + 0.5 * tf.reduce_sum(p**2) / pairwise_variance
                  + 0.5 * tf.reduce_sum(b**2) / bias_variance)
    return (g.numpy() for g in tape.gradient(smooth, [w_obs, b, p]))


def test_a_fit_preconditioned_by_its_starts_fisher_reaches_the_elastic_net_optimum_of_its_own_prior():
    """A fit started from another prior's fit, on a corpus with more sentences (a wider support),
    runs its L-BFGS in coordinates scaled by the start's Fisher diagonal: what it reaches must
    still be the optimum of its own objective, by the optimality conditions from autodiff."""
    rng = np.random.default_rng(5)
    data = synthetic_sequences(rng, n_seq=30, D=40, max_len=3)
    D, V, strength = data.rows.shape[1], 3, 0.3
    groups = np.zeros(D, np.int64)
    part = data.subset(np.arange(20))
    first = fit_laplace(NumpyChainObjective(part, V, dtype="float64"), groups, ["all"], prior_variance=8.0,
                        pairwise_prior_variance=1.0, bias_prior_variance=5.0, l1=1.0, max_iterations=300)
    assert first.fisher is not None and len(first.fisher[1]) == len(first.support)
    objective = NumpyChainObjective(data, V, dtype="float64")
    assert len(objective.support) > len(first.support)
    fit = fit_laplace(objective, groups, ["all"], prior_variance=2.0, pairwise_prior_variance=2.0,
                      bias_prior_variance=5.0, l1=strength, max_iterations=2000, tolerance=0.0, start=first)
    g_w, g_b, g_p = _elastic_net_gradients(data, fit, D, V, 2.0, 2.0, 5.0)
    nonzero = fit.weights != 0.0
    assert 0 < nonzero.sum() < len(nonzero)
    np.testing.assert_allclose(g_w[nonzero] + strength * np.sign(fit.weights[nonzero]), 0.0, atol=1e-5)
    assert np.all(np.abs(g_w[~nonzero]) <= strength + 1e-6)
    np.testing.assert_allclose(g_b, 0.0, atol=1e-5)
    np.testing.assert_allclose(g_p, 0.0, atol=1e-5)


def test_average_fit_sums_fold_fishers_to_the_fisher_of_the_whole_corpus():
    """k fold fits each trained on k − 1 folds: at one shared point, their Fisher diagonals summed
    and divided by k − 1 are the Fisher diagonal of the whole corpus (it is a sum over tokens),
    computed by the whole corpus's objective."""
    from gpseq.training.laplace import LaplaceFit, LaplaceReport, average_fit

    rng = np.random.default_rng(6)
    data = synthetic_sequences(rng, n_seq=24, D=30, max_len=4)
    D, V, k = data.rows.shape[1], 3, 3
    whole = NumpyChainObjective(data, V, dtype="float64")
    folds = np.arange(len(data)) % k
    insides = [NumpyChainObjective(data.subset(np.flatnonzero(folds != fold)), V, dtype="float64")
               for fold in range(k)]
    shared = whole.support
    for inside in insides:  # the point: weights every fold's objective has (each sees its support only)
        shared = np.intersect1d(shared, inside.support)
    dense_w = np.zeros(D * V)
    dense_w[shared] = rng.normal(size=len(shared))
    b, p = rng.normal(size=V), rng.normal(size=(V, V))
    fits = []
    for inside in insides:
        f_b, f_w, f_p = inside.fisher(b, dense_w[inside.support], p)
        fits.append(LaplaceFit(D, b, inside.support, dense_w[inside.support], np.ones(len(inside.support)), p,
                               np.ones((V, V)), LaplaceReport(), fisher=(f_b, f_w, f_p)))
    f_b, f_w, f_p = whole.fisher(b, dense_w[whole.support], p)
    average = average_fit(fits, whole.support)
    np.testing.assert_allclose(average.fisher[0], f_b, rtol=1e-10)
    # a pair outside a fold's support has no Fisher entry in that fold's fit (0): exact where every
    # fold has it, a lower bound elsewhere
    averaged, everywhere = average.fisher[1], np.isin(whole.support, shared)
    np.testing.assert_allclose(averaged[everywhere], f_w[everywhere], rtol=1e-10)
    assert np.all(averaged[~everywhere] <= f_w[~everywhere] + 1e-12) and (~everywhere).any()
    np.testing.assert_allclose(average.fisher[2], f_p, rtol=1e-10)
    # every fold fit has the same weights where it has a pair: their mean there is that weight
    np.testing.assert_allclose(average.weights[everywhere], dense_w[whole.support][everywhere], rtol=1e-14)


def test_held_out_moments_match_the_dense_weight_arrays():
    """`held_out`'s sparse products against X W and X² s with dense `[D, V]` arrays, by hand: the
    columns no weight of the support touches (and column 0) go to `unseen` as (Σ x)² σ₀²."""
    from gpseq.training.batching import SequenceData
    from gpseq.training.laplace import LaplaceFit, LaplaceReport

    rng = np.random.default_rng(3)
    D, V, N = 40, 3, 25
    support = np.sort(rng.choice(np.arange(V, 30 * V), 45, replace=False))  # features ≥ 30 never seen
    prior = rng.uniform(0.5, 3.0, D)
    fit = LaplaceFit(D, rng.normal(size=V), support, rng.normal(size=45), rng.uniform(0.1, 1.0, 45),
                     rng.normal(size=(V, V)), rng.uniform(size=(V, V)), LaplaceReport(), prior)
    X = sp.random(N, D, density=0.25, format="csr", random_state=4, data_rvs=lambda n: rng.uniform(0.5, 2.0, n))
    held = fit.held_out(SequenceData(X, np.array([0, 10, N]), rng.integers(0, V, N)))
    dense = X.toarray()
    W = np.zeros(D * V)
    W[support] = fit.weights
    s = np.repeat(prior, V)
    s[support] = fit.weight_variance
    seen = np.zeros(D, bool)
    seen[support // V] = True
    seen[0] = False
    np.testing.assert_allclose(held.mean, dense @ W.reshape(D, V) + fit.bias, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(held.variance, (dense[:, seen] ** 2) @ s.reshape(D, V)[seen], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(held.unseen, dense[:, ~seen].sum(1) ** 2 * prior[0], rtol=1e-12)


def test_a_fits_values_read_on_another_support_match_its_dense_array():
    """`LaplaceFit.on` (a start's means on the next fit's support) against indexing the dense
    `[D, V]` array, for supports that overlap in part, and empty ones."""
    from gpseq.training.laplace import LaplaceFit, LaplaceReport

    rng = np.random.default_rng(3)
    D, V = 40, 5
    for own_size, other_size in [(60, 70), (0, 10), (30, 0), (200, 200)]:
        support = np.sort(rng.choice(D * V, own_size, replace=False))
        other = np.sort(rng.choice(D * V, other_size, replace=False))
        vals = rng.normal(size=own_size)
        fit = LaplaceFit(D, np.zeros(V), support, vals, np.ones(own_size), np.zeros((V, V)), np.ones((V, V)),
                         LaplaceReport())
        dense = np.zeros(D * V)
        dense[support] = vals
        np.testing.assert_array_equal(fit.on(vals, other), dense[other])
