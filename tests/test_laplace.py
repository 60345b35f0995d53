"""The default training (MAP + diagonal Laplace + calibration) against independent references:
the log-space chain, autodiff, brute-force enumeration of label paths, and a known temperature."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

from gpseq.structured import chain
from gpseq.structured.model import ModelConfig, build_structured_gp
from gpseq.structured.numpy_chain import TimeMajor
from gpseq.training.batching import SequenceData, make_batch, token_batches
from gpseq.training.calibration import fit_calibration
from gpseq.training.chain_objective import NumpyChainObjective, observed_pairs
from gpseq.training.laplace import fit_laplace, model_state



@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_time_major_numpy_chain_equals_the_log_space_chain(scale):
    rng = np.random.default_rng(6)
    lengths = np.array([7, 1, 3, 2, 6, 3])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    V = 4
    unary = rng.normal(size=(offsets[-1], V)) * scale
    pairwise = rng.normal(size=(V, V)) * scale / 3
    layout = TimeMajor(offsets)
    marg, pair_sum, log_z = layout.forward_backward(unary[layout.order], pairwise)
    padded = np.zeros((len(lengths), lengths.max(), V))
    for b, length in enumerate(lengths):
        padded[b, :length] = unary[offsets[b]:offsets[b + 1]]
    ref_marg, ref_pair = chain.marginals(tf.constant(padded), tf.constant(pairwise), tf.constant(lengths, tf.int32))
    ref_z = chain.log_partition(tf.constant(padded), tf.constant(pairwise), tf.constant(lengths, tf.int32)).numpy()
    mine = np.zeros_like(padded)
    corpus_token = layout.order  # time-major row → corpus token
    sentence = np.repeat(np.arange(len(lengths)), lengths)[corpus_token]
    mine[sentence, corpus_token - offsets[sentence]] = marg
    np.testing.assert_allclose(mine, ref_marg.numpy(), atol=1e-10)
    np.testing.assert_allclose(pair_sum, tf.reduce_sum(ref_pair, [0, 1]).numpy(), atol=1e-9)
    np.testing.assert_allclose(log_z, ref_z[layout.sentences], rtol=1e-12)


def test_token_batches_bound_the_padded_size():
    lengths = np.array([3, 50, 7, 7, 1, 20, 2, 9])
    for max_sentences in (None, 2):
        batches = token_batches(lengths, 20, max_sentences)
        assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
        for ids in batches:
            assert len(ids) == 1 or len(ids) * lengths[ids].max() <= 20
            assert max_sentences is None or len(ids) <= max_sentences


def _synthetic(rng, n_seq=12, V=3, D=9, max_len=5):
    """Sequences whose tokens have 2-3 distinct active features each (binary) and random labels."""
    lengths = rng.integers(1, max_len + 1, size=n_seq)
    rows, labels = [], []
    for length in lengths:
        for _ in range(length):
            row = np.zeros(D)
            row[rng.choice(np.arange(1, D), size=int(rng.integers(2, 4)), replace=False)] = 1.0
            rows.append(row)
            labels.append(int(rng.integers(V)))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return SequenceData(sp.csr_matrix(np.array(rows)), offsets, np.array(labels, np.int32))


def _model(D, V):
    return build_structured_gp(ModelConfig(kernel="linear"), D, V, None, tf.float64)


def test_objective_value_and_gradient_equal_autodiff_of_the_chain_likelihood():
    rng = np.random.default_rng(1)
    data = _synthetic(rng)
    D, V = data.rows.shape[1], 3
    objective = NumpyChainObjective(data, V, dtype="float64")
    support = objective.support
    b, w, p = rng.normal(size=V), np.zeros((D, V)), rng.normal(size=(V, V))
    w.ravel()[support] = rng.normal(size=len(support))  # weights off the support are structurally 0
    nll, g_b, g_w, g_p = objective.value_and_grad(b, w.ravel()[support], p)
    batch = {k: tf.constant(v) for k, v in make_batch(data, np.arange(len(data)), dtype=np.float64).items()}
    variables = [tf.Variable(b), tf.Variable(w), tf.Variable(p)]
    with tf.GradientTape() as tape:
        table = tf.gather(variables[1], batch["feature_ids"])
        unary = variables[0] + tf.einsum("btf,btfv->btv", batch["values"], tf.gather(table, batch["indices"]))
        reference = -tf.reduce_sum(chain.log_likelihood(batch["labels"], unary, variables[2], batch["lengths"]))
    grads = tape.gradient(reference, variables)
    np.testing.assert_allclose(nll, reference.numpy(), rtol=1e-10)
    theirs = [tf.convert_to_tensor(g).numpy() for g in grads]
    theirs[1] = theirs[1].ravel()[support]
    for mine, reference in zip((g_b, g_w, g_p), theirs):
        np.testing.assert_allclose(mine, reference, atol=1e-9)


def _path_enumeration(unary, pairwise):
    """All label paths of one sequence with their probabilities (brute force)."""
    T, V = unary.shape
    paths = np.array(list(itertools.product(range(V), repeat=T)))
    scores = unary[np.arange(T), paths].sum(1) + pairwise[paths[:, :-1], paths[:, 1:]].sum(1)
    probs = np.exp(scores - scores.max())
    return paths, probs / probs.sum()


@pytest.mark.parametrize("value", [1.0, 0.5])  # indicator features (X∘X = X) and real values
def test_fisher_diagonal_equals_the_variance_of_the_sufficient_statistics_by_enumeration(value):
    """F[f, v] = Var_p(Σ_t x_tf [y_t = v]) summed over sequences, exact when f fires once per sequence."""
    rng = np.random.default_rng(2)
    V, D, T = 3, 10, 4
    sequences = []
    for _ in range(3):
        rows = np.zeros((T, D))
        for t, features in enumerate(rng.permutation(np.arange(1, D))[: 2 * T].reshape(T, 2)):
            rows[t, features] = value  # every feature fires at most once in the sequence
        sequences.append(rows)
    data = SequenceData(sp.csr_matrix(np.vstack(sequences)), np.arange(0, 3 * T + 1, T, dtype=np.int64),
                        rng.integers(V, size=3 * T).astype(np.int32))
    objective = NumpyChainObjective(data, V, dtype="float64")
    support = objective.support
    b, w, p = rng.normal(size=V), np.zeros((D, V)), rng.normal(size=(V, V))
    w.ravel()[support] = rng.normal(size=len(support))
    f_b, f_w, f_p = objective.fisher(b, w.ravel()[support], p)
    expected = np.zeros((D, V))
    for rows in sequences:
        paths, probs = _path_enumeration(b + rows @ w, p)
        onehot = np.eye(V)[paths]  # [P, T, V]
        stats = np.einsum("td,ptv->pdv", rows, onehot)  # sufficient statistics per path
        mean = np.einsum("p,pdv->dv", probs, stats)
        expected += np.einsum("p,pdv->dv", probs, (stats - mean) ** 2)
    np.testing.assert_allclose(f_w, expected.ravel()[support], atol=1e-9)
    assert len(support) > 10


def test_map_is_a_stationary_point_and_the_laplace_variance_inverts_the_exact_hessian_diagonal():
    rng = np.random.default_rng(3)
    data = _synthetic(rng, n_seq=20, D=40, max_len=3)
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
    data = _synthetic(np.random.default_rng(7))
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


def test_calibration_recovers_a_known_temperature():
    """Labels drawn from softmax(u / 2); a model holding the potentials u (no variance) must fit T ≈ 2."""
    rng = np.random.default_rng(4)
    V, D, N = 4, 40, 6000
    w = rng.normal(size=(D, V)) * 3.0
    features = rng.integers(1, D, size=N)
    logits = w[features] / 2.0
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    labels = np.array([rng.choice(V, p=row) for row in probs], np.int32)
    data = SequenceData(sp.csr_matrix((np.ones(N), (np.arange(N), features)), shape=(N, D)),
                        np.arange(N + 1, dtype=np.int64), labels)  # one-token sequences: the chain is a softmax
    fitted = fit_calibration(w[features], np.zeros((N, V)), np.zeros((V, V)), np.zeros((V, V)), labels,
                             data.offsets)
    assert fitted["temperature"] == pytest.approx(2.0, rel=0.06)
    assert fitted["dev_token_nll"] < fitted["dev_token_nll_uncalibrated"]


def test_unary_moments_match_monte_carlo_over_the_weight_posterior():
    rng = np.random.default_rng(5)
    data = _synthetic(rng, n_seq=4)
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


def test_lbfgs_reaches_the_minimiser_of_an_ill_conditioned_quadratic_and_of_rosenbrock():
    from gpseq.training.lbfgs import minimize_lbfgs

    rng = np.random.default_rng(8)
    basis, _ = np.linalg.qr(rng.normal(size=(50, 50)))
    hessian = basis @ np.diag(np.logspace(0, 4, 50)) @ basis.T
    target = rng.normal(size=50)
    result = minimize_lbfgs(lambda x: (0.5 * (x - target) @ hessian @ (x - target), hessian @ (x - target)),
                            np.zeros(50), max_iterations=2000, ftol=0.0, gtol=1e-9, memory=10)
    np.testing.assert_allclose(result.x, target, atol=1e-8)  # closed form: H (x − t) = 0

    def rosenbrock(x):
        f = 100.0 * (x[1] - x[0] ** 2) ** 2 + (1.0 - x[0]) ** 2
        return f, np.array([-400.0 * x[0] * (x[1] - x[0] ** 2) - 2.0 * (1.0 - x[0]), 200.0 * (x[1] - x[0] ** 2)])

    result = minimize_lbfgs(rosenbrock, np.array([-1.2, 1.0]), max_iterations=500, ftol=0.0, gtol=1e-10)
    np.testing.assert_allclose(result.x, [1.0, 1.0], atol=1e-6)



def test_owlqn_matches_soft_thresholding_and_a_bound_constrained_split_formulation():
    """With `l1`, minimize_lbfgs minimises f + Σ l1_i |x_i|: against the closed form (soft
    thresholding) for a separable quadratic, and against SciPy's L-BFGS-B on the split
    formulation x = x⁺ − x⁻, x± ≥ 0 (a different algorithm) for a logistic regression."""
    from scipy.optimize import minimize

    from gpseq.training.lbfgs import minimize_lbfgs

    rng = np.random.default_rng(3)
    h, c = rng.uniform(0.5, 5.0, size=40), rng.normal(scale=2.0, size=40)
    l1 = np.full(40, 1.0)
    l1[:5] = 0.0  # unpenalised coordinates
    result = minimize_lbfgs(lambda x: (0.5 * np.sum(h * (x - c) ** 2), h * (x - c)), np.zeros(40),
                            max_iterations=500, ftol=0.0, gtol=1e-10, l1=l1)
    expected = np.sign(c) * np.maximum(np.abs(c) - l1 / h, 0.0)  # argmin ½h(x−c)² + l1|x|
    np.testing.assert_allclose(result.x, expected, atol=1e-7)
    assert np.sum(result.x == 0.0) == np.sum(expected == 0.0) > 5  # exact zeros, not tiny values

    X = rng.normal(size=(200, 30))
    y = (X[:, :3] @ np.array([2.0, -1.5, 1.0]) + 0.5 * rng.normal(size=200) > 0).astype(float)

    def logistic(w):
        z = X @ w
        p = 1.0 / (1.0 + np.exp(-z))
        return float(np.sum(np.logaddexp(0.0, z) - y * z) + 0.05 * w @ w), X.T @ (p - y) + 0.1 * w

    strength = 4.0
    ours = minimize_lbfgs(logistic, np.zeros(30), max_iterations=1000, ftol=0.0, gtol=1e-9, l1=strength)

    def split(v):
        f, g = logistic(v[:30] - v[30:])
        return f + strength * v.sum(), np.concatenate([g + strength, -g + strength])

    reference = minimize(split, np.zeros(60), jac=True, method="L-BFGS-B", bounds=[(0, None)] * 60,
                         options={"ftol": 1e-15, "gtol": 1e-10, "maxiter": 5000})
    np.testing.assert_allclose(ours.fun, reference.fun, rtol=1e-8)
    np.testing.assert_allclose(ours.x, reference.x[:30] - reference.x[30:], atol=1e-4)
    assert 0 < np.count_nonzero(ours.x) < 30

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


def test_calibration_on_a_few_tokens_is_the_map_temperature_under_its_prior():
    """With 12 one-token sentences the fitted T minimises Σ NLL + (log T)² / (2 s²) (grid reference)."""
    from gpseq.training.calibration import LOG_TEMPERATURE_SCALE

    rng = np.random.default_rng(9)
    V, N = 3, 12
    logits = rng.normal(size=(N, V)) * 3.0
    labels = logits.argmax(1).astype(np.int32)  # all right: the dev NLL alone would push T → 0
    offsets = np.arange(N + 1, dtype=np.int64)
    fitted = fit_calibration(logits, np.zeros((N, V)), np.zeros((V, V)), np.zeros((V, V)), labels, offsets)
    grid = np.linspace(-2.0, 2.0, 4001)
    log_p = lambda log_t: logits / np.exp(log_t) - np.logaddexp.reduce(logits / np.exp(log_t), axis=1, keepdims=True)
    totals = [-log_p(g)[np.arange(N), labels].sum() + 0.5 * (g / LOG_TEMPERATURE_SCALE) ** 2 for g in grid]
    assert np.log(fitted["temperature"]) == pytest.approx(grid[int(np.argmin(totals))], abs=2e-3)
    assert 0.2 < fitted["temperature"] < 1.0  # sharpened, but not to the bound


def test_l1_map_satisfies_the_elastic_net_optimality_conditions_by_autodiff():
    """fit_laplace with an L1 strength λ: at the optimum, by TensorFlow autodiff of the chain
    likelihood + Gaussian prior (independent of the NumPy objective), every nonzero weight has
    ∂/∂w + λ sign(w) = 0 and every zero weight |∂/∂w| ≤ λ; some weights are exactly zero."""
    rng = np.random.default_rng(4)
    data = _synthetic(rng, n_seq=20, D=40, max_len=3)
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


def test_calibration_over_parts_is_calibration_of_their_union():
    """fit_calibration_parts pools the held-out NLL: parts that share their potentials give the
    fit of the concatenated corpus."""
    from gpseq.training.calibration import fit_calibration_parts

    rng = np.random.default_rng(2)
    V = 3
    lengths = rng.integers(1, 6, size=30)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    mean = rng.normal(size=(offsets[-1], V)) * 2.0
    variance = rng.uniform(0.1, 3.0, size=mean.shape)
    pair_mean, pair_variance = rng.normal(size=(V, V)), rng.uniform(0.1, 1.0, size=(V, V))
    labels = rng.integers(V, size=offsets[-1]).astype(np.int32)
    whole = fit_calibration(mean, variance, pair_mean, pair_variance, labels, offsets)
    cut = offsets[12]
    parts = [(mean[:cut], variance[:cut], pair_mean, pair_variance, labels[:cut], offsets[:13]),
             (mean[cut:], variance[cut:], pair_mean, pair_variance, labels[cut:], offsets[12:] - cut)]
    pooled = fit_calibration_parts(parts)
    for key in ("variance_scale", "temperature", "dev_token_nll"):
        assert pooled[key] == pytest.approx(whole[key], rel=1e-6)


def _sample_problem():
    """48 sentences of the sample corpus, a `pos` featurizer fitted on them, their labels and a
    function from sentences to `SequenceData`."""
    from conftest import SAMPLE

    from gpseq.corpora import read_conll
    from gpseq.features import Featurizer, get_preset

    sentences = read_conll(SAMPLE / "train.conll")[:48]
    featurizer = Featurizer(get_preset("pos")).fit(sentences)
    labels = sorted({label for s in sentences for label in s.labels})
    index = {label: i for i, label in enumerate(labels)}

    def data_of(part):
        matrix = featurizer.transform(part)
        ids = np.array([index[label] for s in part for label in s.labels], np.int64)
        return SequenceData(matrix.rows.tocsr(), np.asarray(matrix.offsets, np.int64), ids)

    return sentences, featurizer, labels, data_of


def test_cross_fitting_pools_out_of_fold_predictions_of_fold_fits():
    """A small corpus cross-fits: the held-out NLL reported for a prior is the token NLL of the
    out-of-fold predictions of fits on the other folds, at the calibrated (α, T) — recomputed
    here with independent fold fits and the TensorFlow chain's marginals."""
    from gpseq.corpora import kfold_indices
    from gpseq.tagger import TaggerConfig
    from gpseq.training.calibration import calibrated_potentials
    from gpseq.training.prior_path import FOLD_BUDGET_SHARE, concatenate, train_laplace

    sentences, featurizer, labels, data_of = _sample_problem()

    config = TaggerConfig()
    config.training.prior_variance_grid, config.training.l1_grid = [4.0], [0.3]
    config.training.pairwise_variance_grid = [config.model.pairwise_prior_variance]
    config.training.max_iterations = 60
    train, dev = data_of(sentences[:40]), data_of(sentences[40:])
    _, scores = train_laplace(config, featurizer, len(labels), train, dev)
    assert scores["cross_fit_folds"] == config.training.cross_fit_folds == 3
    reported = scores["dev_token_nll_by_prior"]["4/0.3/1"]
    alpha, temperature = scores["calibration"]["variance_scale"], scores["calibration"]["temperature"]

    combined = concatenate(train, dev)
    groups, names = featurizer.column_groups()
    total, count = 0.0, 0
    for inside, held in kfold_indices(len(combined), 3, seed=config.training.seed):
        fit = fit_laplace(NumpyChainObjective(combined.subset(inside), len(labels)), groups, names,
                          prior_variance=4.0, l1=0.3, pairwise_prior_variance=config.model.pairwise_prior_variance,
                          max_iterations=int(FOLD_BUDGET_SHARE * 60))
        part = combined.subset(held)
        unary, pairwise = calibrated_potentials(*fit.unary_moments(part.rows), fit.pairwise, fit.pairwise_variance,
                                                alpha, temperature)
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
    is not better than the choice so far by one standard error (`PathChoice`), on a dev split and
    under cross-fitting alike: a λ of 30 after 0.3 (far sparser, a far worse fit) ends it, so 0.1 is
    never fitted; the other σ² is then fitted at the chosen λ only. Checked on the reported
    held-out NLLs."""
    from gpseq.tagger import TaggerConfig
    from gpseq.training.prior_path import train_laplace

    sentences, featurizer, labels, data_of = _sample_problem()

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
    """`choose_prior` on a hand-made ranking (per-sentence NLLs, so the one-standard-error rule is
    computed by hand): λ = 1 → 0.1 is better by far more than its standard error, 0.01 only by noise
    (the path ends, 0 is not fitted); at λ = 0.1, σ² = 4 is better, σ² = 1 is not (the walk ends);
    at (4, 0.1) the pairwise prior variance 16 is lower by 0.002 a sentence, far less than a
    standard error, and replaces 1 all the same (no margin on this walk); 64 is higher. Each fit is warm-started from
    the previous fit on the L1 path and from the choice so far on the σ² and σ²_P walks; the first
    fit gets the whole budget (number 0)."""
    from gpseq.training.prior_path import choose_prior

    base = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    noise = np.array([0.01, -0.01, 0.02, -0.02, 0.01, -0.015])
    sentence_nll = {(16.0, 1.0, 1.0): base + 0.5, (16.0, 0.1, 1.0): base, (16.0, 0.01, 1.0): base + noise,
                    (4.0, 0.1, 1.0): base - 0.3 + noise, (1.0, 0.1, 1.0): base - 0.3 - noise,
                    (4.0, 0.1, 16.0): base - 0.302 + noise, (4.0, 0.1, 64.0): base - 0.297 + noise}
    calls = []

    def fit_at(number, prior, warm):
        calls.append((number, prior, warm))
        return prior

    def rank(prior):
        nll = sentence_nll[prior]
        return {"dev_sentence_nll": nll, "dev_tokens": 60, "dev_token_nll": nll.sum() / 60}

    choice, candidates = choose_prior(fit_at, rank, [16.0, 4.0, 1.0], [1.0, 0.1, 0.01, 0.0], [1.0, 16.0, 64.0],
                                      warm="init")
    assert choice.prior == choice.fit == (4.0, 0.1, 16.0)
    assert list(candidates) == [(16.0, 1.0, 1.0), (16.0, 0.1, 1.0), (16.0, 0.01, 1.0), (4.0, 0.1, 1.0),
                                (1.0, 0.1, 1.0), (4.0, 0.1, 16.0), (4.0, 0.1, 64.0)]
    assert calls == [(0, (16.0, 1.0, 1.0), "init"), (1, (16.0, 0.1, 1.0), (16.0, 1.0, 1.0)),
                     (2, (16.0, 0.01, 1.0), (16.0, 0.1, 1.0)), (3, (4.0, 0.1, 1.0), (16.0, 0.1, 1.0)),
                     (4, (1.0, 0.1, 1.0), (4.0, 0.1, 1.0)), (5, (4.0, 0.1, 16.0), (4.0, 0.1, 1.0)),
                     (6, (4.0, 0.1, 64.0), (4.0, 0.1, 16.0))]
    assert candidates[(4.0, 0.1, 1.0)] == pytest.approx((base - 0.3 + noise).sum() / 60)


@pytest.mark.parametrize("cpus", [1, 2, 3, 8])
def test_row_blocks_product_equals_scipy_product(monkeypatch, cpus):
    """The threaded row-block product is SciPy's product: blocks of any count (forced below the
    size threshold), rows with no nonzeros, a 1-column dense factor."""
    import gpseq.training.row_blocks as chain_objective  # RowBlocks

    monkeypatch.setattr(chain_objective, "PARALLEL_NONZEROS", 0)
    monkeypatch.setattr(chain_objective.os, "cpu_count", lambda: cpus)
    rng = np.random.default_rng(cpus)
    matrix = sp.random(57, 40, density=0.1, format="csr", random_state=cpus, dtype=np.float32).tolil()
    matrix[5:9] = 0.0
    matrix = matrix.tocsr()
    blocks = chain_objective.RowBlocks(matrix)
    assert len(blocks.blocks) == min(cpus, 4)
    for _, _, block in blocks.blocks:  # views: no second copy of the corpus
        assert np.shares_memory(block.data, matrix.data) or block.nnz == 0
    for width in (1, 7):
        dense = rng.normal(size=(40, width)).astype(np.float32)
        np.testing.assert_array_equal(blocks @ dense, matrix @ dense)
        # out += X·dense in place, twice: SciPy's product added to what `out` held
        start = rng.normal(size=(57, width)).astype(np.float32)
        out = start.copy()
        blocks.accumulate(dense, out)
        blocks.accumulate(dense.astype(np.float64), out)  # another dtype: converted to out's
        np.testing.assert_allclose(out, start + 2 * (matrix @ dense), rtol=1e-6, atol=1e-6)


def test_row_blocks_accumulate_without_scipys_kernel(monkeypatch):
    """`RowBlocks.accumulate` adds SciPy's product when its in-place kernel is missing (another
    SciPy) or the matrix's indices are 64-bit."""
    import gpseq.training.row_blocks as chain_objective  # RowBlocks

    matrix = sp.random(30, 20, density=0.2, format="csr", random_state=1, dtype=np.float32)
    dense = np.random.default_rng(1).normal(size=(20, 3)).astype(np.float32)
    wide = matrix.copy()
    wide.indices, wide.indptr = wide.indices.astype(np.int64), wide.indptr.astype(np.int32)
    for name, kernel, rows in (("no kernel", None, matrix), ("64-bit indices", chain_objective._MATVECS, wide)):
        monkeypatch.setattr(chain_objective, "_MATVECS", kernel)
        out = np.ones((30, 3), np.float32)
        chain_objective.RowBlocks(rows).accumulate(dense, out)
        np.testing.assert_allclose(out, 1 + matrix @ dense, rtol=1e-6, err_msg=name)


def test_sentence_blocks_featurise_the_corpus_as_a_whole_transform_does():
    """The default training featurises its corpus a block at a time (`SentenceBlocks`): the blocks,
    concatenated, are the whole corpus's matrix and labels, and the objective is the same."""
    from gpseq.training.batching import SentenceBlocks
    from gpseq.training.prior_path import concatenate

    sentences, featurizer, labels, data_of = _sample_problem()
    whole = data_of(sentences)
    blocks = SentenceBlocks(sentences, data_of, size=7)
    assert len(blocks) == len(sentences) and blocks.n_tokens == whole.n_tokens == sum(map(len, sentences))
    assert len(list(blocks)) == -(-len(sentences) // 7)
    joined = concatenate(blocks)
    assert (joined.rows != whole.rows).nnz == 0 and joined.rows.shape == whole.rows.shape
    np.testing.assert_array_equal(joined.offsets, whole.offsets)
    np.testing.assert_array_equal(joined.label_ids, whole.label_ids)
    V = len(labels)
    mine, reference = NumpyChainObjective(blocks, V, dtype="float64"), NumpyChainObjective(whole, V, dtype="float64")
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(mine.support, reference.support)
    b, p, w = rng.normal(size=V), rng.normal(size=(V, V)), rng.normal(size=len(reference.support))
    for a, e in zip(mine.value_and_grad(b, w, p), reference.value_and_grad(b, w, p)):
        np.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-10)


def test_calibration_in_parts_equals_calibration_on_the_whole_dev_split(monkeypatch):
    """`calibrate` runs the dev split in parts of `CHUNK_TOKENS` tokens: the same (α, T) and NLL."""
    import gpseq.training.chain_objective as chain_objective
    from gpseq.training.laplace import calibrate

    sentences, featurizer, labels, data_of = _sample_problem()
    groups, names = featurizer.column_groups()
    fit = fit_laplace(NumpyChainObjective(data_of(sentences[:36]), len(labels)), groups, names, max_iterations=30)
    dev = data_of(sentences[36:])
    whole = calibrate(fit, dev)
    monkeypatch.setattr(chain_objective, "CHUNK_TOKENS", 40)
    assert len(chain_objective.chunk_bounds(dev.offsets, 40)) > 3
    parts = calibrate(fit, dev)
    assert parts.keys() == whole.keys()
    for key in whole:
        assert parts[key] == pytest.approx(whole[key], rel=1e-9)


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


def test_calibration_reports_each_dev_sentence_nll_at_the_fitted_temperature():
    from gpseq.training.laplace import calibrate

    sentences, featurizer, labels, data_of = _sample_problem()
    groups, names = featurizer.column_groups()
    fit = fit_laplace(NumpyChainObjective(data_of(sentences[:36]), len(labels)), groups, names, max_iterations=30)
    dev = data_of(sentences[36:])
    fitted = calibrate(fit, dev, variance_scale=False, sentences=True)
    assert fitted["dev_tokens"] == dev.n_tokens and len(fitted["dev_sentence_nll"]) == len(dev)
    assert fitted["dev_sentence_nll"].sum() / dev.n_tokens == pytest.approx(fitted["dev_token_nll"], rel=1e-10)
    # each sentence's NLL by itself: the same predictive on that sentence alone
    one = dev.subset(np.array([3]))
    alone = calibrate(fit, one, variance_scale=False, sentences=True)
    from gpseq.training.calibration import calibrated_potentials
    from gpseq.structured.numpy_chain import TimeMajor

    mean, variance = fit.unary_moments(one.rows)
    unary, pairwise = calibrated_potentials(mean, variance, fit.pairwise, fit.pairwise_variance, 1e-5,
                                            fitted["temperature"])
    marg, _, _ = TimeMajor(one.offsets).forward_backward(unary, pairwise, pairs=False)
    expected = -np.log(marg[np.arange(one.n_tokens), one.label_ids]).sum()
    assert fitted["dev_sentence_nll"][3] == pytest.approx(expected, rel=1e-9)
    assert alone["dev_sentence_nll"].shape == (1,)


def test_chunks_evaluated_two_at_a_time_give_the_serial_sums_exactly(monkeypatch):
    """`NumpyChainObjective` evaluates two chunks at once (`CHUNK_THREADS`) and adds their W parts
    in chunk order: the value, gradient and Fisher are bit for bit those of one chunk at a time
    (float32, where a different order of the sums would show), which match the one-chunk
    objective in float64; a chunk that fails raises instead of leaving the next one waiting."""
    import gpseq.training.chain_objective as chain_objective

    sentences, _, labels, data_of = _sample_problem()
    data, V = data_of(sentences), len(labels)
    rng = np.random.default_rng(3)
    many = NumpyChainObjective(data, V, chunk_tokens=60)
    assert len(many.chunks) >= 8
    b, p = rng.normal(size=V), rng.normal(size=(V, V))
    w = rng.normal(size=len(many.support)).astype(np.float32)
    results = {}
    for threads in (1, 2):
        monkeypatch.setattr(chain_objective, "CHUNK_THREADS", threads)
        results[threads] = many.value_and_grad(b, w, p) + many.fisher(b, w, p)
    for serial, threaded in zip(results[1], results[2]):
        np.testing.assert_array_equal(serial, threaded)
    whole = NumpyChainObjective(data, V, dtype="float64")
    for mine, reference in zip(results[2], whole.value_and_grad(b, w, p) + whole.fisher(b, w, p)):
        np.testing.assert_allclose(mine, reference, rtol=1e-4, atol=1e-3)

    def broken(*args):
        raise RuntimeError("chunk failed")

    monkeypatch.setattr(many.chunks[3], "value_and_grad", broken)
    with pytest.raises(RuntimeError, match="chunk failed"):
        many.value_and_grad(b, w, p)


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


def test_an_objective_evaluates_the_same_after_its_extended_objective_was_evaluated():
    # the extended objective shares the original's [D, V] weight scratch array and writes a wider
    # support into it: the original, evaluated after it, must not see those weights
    rng = np.random.default_rng(1)
    original = _synthetic(rng, n_seq=4, V=3, D=6, max_len=3)
    D, V = original.rows.shape[1], 3
    extra = SequenceData(sp.csr_matrix(np.eye(D)[1:]), np.arange(D, dtype=np.int64), np.arange(D - 1, dtype=np.int32) % V)
    objective = NumpyChainObjective(original, V, dtype="float64")
    extended = objective.extended(extra)
    assert len(np.setdiff1d(extended.support, objective.support)) > 0  # pairs outside the original's support
    b, p = rng.normal(size=V), rng.normal(size=(V, V))
    w = np.zeros(D * V)
    w[objective.support] = rng.normal(size=len(objective.support))
    expected = 0.0  # −log p(y | x) by enumerating the label paths of each sentence
    for n in range(len(original)):
        low, high = original.offsets[n], original.offsets[n + 1]
        paths, probs = _path_enumeration(b + original.rows[low:high].toarray() @ w.reshape(D, V), p)
        expected -= np.log(probs[np.all(paths == original.label_ids[low:high], axis=1)][0])
    first = objective.value_and_grad(b, w[objective.support], p)[0]
    extended.value_and_grad(b, np.full(len(extended.support), 5.0), p)
    again = objective.value_and_grad(b, w[objective.support], p)[0]
    assert first == pytest.approx(expected, rel=1e-10)
    assert again == pytest.approx(expected, rel=1e-10)


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

    sentences, featurizer, labels, data_of = _sample_problem()
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
    sentences, featurizer, labels, data_of = _sample_problem()
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

    sentences, featurizer, labels, data_of = _sample_problem()
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


def test_gpseq_train_reports_the_decoder_it_kept_with_both_held_out_scores(sample_dir, tmp_path):
    """The summary of the default `gpseq train` names the decoder the training kept (decode "auto")
    with the held-out score of each, as the saved model has them."""
    import json
    import re

    from typer.testing import CliRunner

    from gpseq import cli

    lines = (sample_dir / "train.conll").read_text(encoding="utf-8").split("\n\n")[:80]
    train = tmp_path / "train.conll"
    train.write_text("\n\n".join(lines) + "\n", encoding="utf-8")
    result = CliRunner().invoke(cli.app, ["train", str(train), "--features", "chunking", "-o", str(tmp_path / "m")],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "m" / "tagger.json").read_text())
    chosen, scores = meta["config"]["decode"], meta["scores"]["decode_scores"]
    assert chosen in ("viterbi", "max-marginal") and scores["metric"] == "chunk_f1"
    row = re.search(r"decoder \(dev\)\s+│\s+(\S+) \(chunk F1 ([\d.]+); (\S+) ([\d.]+)\)", result.output)
    assert row, result.output
    assert row.group(1) == chosen and row.group(3) == ({"viterbi", "max-marginal"} - {chosen}).pop()
    assert float(row.group(2)) == pytest.approx(scores[chosen], abs=6e-5)
    assert float(row.group(4)) == pytest.approx(scores[row.group(3)], abs=6e-5)


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
    data = _synthetic(rng, n_seq=30, D=40, max_len=3)
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
    data = _synthetic(rng, n_seq=24, D=30, max_len=4)
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
    average = average_fit(fits)
    np.testing.assert_allclose(average.fisher[0], f_b, rtol=1e-10)
    # a pair outside a fold's support has no Fisher entry in that fold's fit (0): exact where every
    # fold has it, a lower bound elsewhere
    averaged, everywhere = average.fisher[1][whole.support], np.isin(whole.support, shared)
    np.testing.assert_allclose(averaged[everywhere], f_w[everywhere], rtol=1e-10)
    assert np.all(averaged[~everywhere] <= f_w[~everywhere] + 1e-12) and (~everywhere).any()
    np.testing.assert_allclose(average.fisher[2], f_p, rtol=1e-10)


@pytest.mark.parametrize("mask_size", [0, 1 << 26])  # sorted (np.unique) and marked in a mask
def test_observed_pairs_are_the_feature_label_pairs_of_labelled_tokens(monkeypatch, mask_size):
    import gpseq.training.chain_objective as objective_module

    monkeypatch.setattr(objective_module, "PAIR_MASK_SIZE", mask_size)
    rng = np.random.default_rng(7)
    data = _synthetic(rng, n_seq=15, D=25, max_len=4)
    data.label_ids[::5] = -1  # unlabelled tokens add no pair
    V = 3
    expected = sorted({f * V + int(label) for row, label in zip(data.rows.toarray(), data.label_ids) if label >= 0
                       for f in np.flatnonzero(row)})
    np.testing.assert_array_equal(observed_pairs(data, V), expected)
