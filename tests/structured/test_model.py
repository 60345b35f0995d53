"""The structured GP (gpseq/structured/model.py) on a tiny hand-made sparse design: the ELBO's KL
pieces against TFP's closed form, the expected log-likelihood against independent Monte Carlo over
the dense Gaussians and path enumeration, a black-box NumPy likelihood under the score estimator,
mixture components, the Monte Carlo path log-probability's clamp, and the array names of models
saved before the model was composed of parts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from helpers.tiny_design import tiny_batch, tiny_data, tiny_model, unary_gaussians

from gpseq.structured.likelihoods import BlackBoxLikelihood
from gpseq.structured.model import ModelConfig, StructuredGP, build_structured_gp


tfd = tfp.distributions


def test_pairwise_and_weight_kl_equal_tfp_closed_form():
    model, _ = tiny_model(kernel="linear")
    V = model.num_labels
    q = tfd.Normal(model.pairwise.mean, tf.sqrt(tf.convert_to_tensor(model.pairwise.variance)))
    p = tfd.Normal(tf.zeros([V, V], tf.float64), tf.sqrt(tf.constant(ModelConfig().pairwise_prior_variance, tf.float64)))
    expected = tf.reduce_sum(tfd.kl_divergence(q, p))
    np.testing.assert_allclose(model.pairwise.kl().numpy(), expected.numpy(), rtol=1e-12)
    qw = tfd.Normal(model.unaries.linear.q_mu, tf.sqrt(tf.convert_to_tensor(model.unaries.linear.q_variance)))
    pw = tfd.Normal(tf.constant(0.0, tf.float64), tf.sqrt(tf.constant(ModelConfig().prior_variance, tf.float64)))
    total = expected + tf.reduce_sum(tfd.kl_divergence(qw, pw))
    np.testing.assert_allclose(model.prior_kl().numpy(), total.numpy(), rtol=1e-10)


def _chain_log_lik(labels, unary, pairwise):
    """log p(y | f) by enumerating every path, vectorised over draws: `labels [T]`, `unary [n, T, V]`,
    `pairwise [n, V, V]` → `[n]`."""
    n, T, V = unary.shape
    paths = np.array(list(itertools.product(range(V), repeat=T)))  # [V^T, T]

    def score(path):  # [..., T] → [n, ...]
        s = unary[:, np.arange(T), path].sum(-1)
        if T > 1:
            s = s + pairwise[:, path[..., :-1], path[..., 1:]].sum(-1)
        return s

    return score(np.asarray(labels)) - np.logaddexp.reduce(score(paths), axis=-1)


def _independent_ell(model, Z, dense, data, conditional, n, seed, drop_k_tilde=False):
    """Σ_n Σ_k π_k E_{q_k}[log p(y_n | f_n)] by NumPy Monte Carlo over the dense Gaussians and path
    enumeration, with its standard error (n draws per sequence and component)."""
    rng = np.random.default_rng(seed)
    weights = model.mixture_weights().numpy()
    pair_mean = model.pairwise.mean.numpy()
    pair_sd = np.sqrt(np.asarray(model.pairwise.variance))
    total, variance = 0.0, 0.0
    for k, pi in enumerate(weights):
        for b, (means, covs) in enumerate(unary_gaussians(model, Z, dense, data, conditional, k, drop_k_tilde)):
            labels = data.label_ids[data.offsets[b] : data.offsets[b + 1]]
            T = len(labels)
            chols = np.linalg.cholesky(covs + 1e-9 * np.eye(T))  # [V, T, T]
            unary = means.T + np.einsum("vts,nsv->ntv", chols, rng.standard_normal((n, T, len(means))))
            pairwise = pair_mean + pair_sd * rng.standard_normal((n,) + pair_mean.shape)
            values = _chain_log_lik(labels, unary, pairwise)
            total += pi * values.mean()
            variance += pi**2 * values.var(ddof=1) / n
    return total, np.sqrt(variance)


def _brute_log_lik(labels, unary, pairwise):
    T, V = unary.shape
    scores = []
    for path in itertools.product(range(V), repeat=T):
        scores.append(sum(unary[t, path[t]] for t in range(T)) + sum(pairwise[path[t], path[t + 1]] for t in range(T - 1)))
    gold = sum(unary[t, labels[t]] for t in range(T)) + sum(pairwise[labels[t], labels[t + 1]] for t in range(T - 1))
    return gold - np.logaddexp.reduce(scores)


@pytest.mark.parametrize("kernel, K, whiten, conditional", [
    ("linear+rbf", 1, True, "full"), ("linear+rbf", 1, True, "diag"), ("linear+rbf", 2, True, "diag"),
    ("linear+rbf", 2, False, "diag"), ("linear+rbf", 1, False, "full"),
    ("linear", 2, True, "diag"),  # K > 1 without a q(u): one Gaussian, not K copies
])
def test_expected_log_likelihood_matches_independent_monte_carlo(kernel, K, whiten, conditional):
    """The model's Monte Carlo ELL (seed eqs. 8, 19) against NumPy Monte Carlo over the dense
    per-sequence Gaussians with path enumeration: within 4 combined standard errors, with the
    standard error small enough that the reference without K̃_n is off by more than 4 of them."""
    data, dense = tiny_data(seed=3)
    model, Z = tiny_model(kernel, seed=3, num_components=K, whiten=whiten, rbf_conditional=conditional)
    assert model.unaries.num_components == (K if kernel != "linear" else 1)
    if model.unaries.sparse is not None:  # a narrower q(u): K̃_n's share of the variance is then large
        q_sqrt = model.unaries.sparse.q.q_sqrt
        q_sqrt.assign(0.1 * tf.convert_to_tensor(q_sqrt))
    batch = tiny_batch(data)
    ell = tf.function(lambda seed: model.expected_log_likelihood(batch, 5000, seed))
    draws = np.array([ell(tf.constant([i, 1])).numpy() for i in range(8)])  # 8 × 5,000 draws
    estimate, estimate_se = draws.mean(), draws.std(ddof=1) / np.sqrt(len(draws))
    reference, reference_se = _independent_ell(model, Z, dense, data, conditional, 40000, seed=0)
    se = np.hypot(estimate_se, reference_se)
    assert abs(estimate - reference) < 4 * se, (estimate, reference, se)
    if kernel != "linear":  # the test would catch dropping K̃_n (seed eq. 18)
        without, without_se = _independent_ell(model, Z, dense, data, conditional, 40000, seed=0, drop_k_tilde=True)
        assert abs(estimate - without) > 4 * np.hypot(estimate_se, without_se), (estimate, without, se)


def test_black_box_numpy_likelihood_trains_with_score_estimator():
    """A likelihood TensorFlow cannot differentiate (tf.numpy_function, path enumeration in NumPy)
    gets, under the score-function estimator, exactly the value and the gradient of every trainable
    variable that the built-in chain gets (the estimator only evaluates the likelihood)."""
    data, _ = tiny_data(seed=2, n_seq=3)

    def numpy_chain_log_lik(labels, unary, pairwise, lengths):
        lead = unary.shape[:-3]
        out = np.zeros(lead + (unary.shape[-3],))
        pw = np.broadcast_to(pairwise, lead + (unary.shape[-3],) + pairwise.shape[-2:])
        for index in np.ndindex(*lead, unary.shape[-3]):
            b = index[-1]
            T = lengths[b]
            out[index] = _brute_log_lik(labels[b, :T], unary[index][:T], pw[index])
        return out

    black_box = BlackBoxLikelihood(numpy_chain_log_lik)
    batch = tiny_batch(data)
    for kernel in ("linear", "linear+rbf"):
        results = []
        for likelihood in (black_box, None):  # the same variables: the black box, then the built-in chain
            model, _ = tiny_model(kernel=kernel, seed=2, estimator="score", likelihood=likelihood)
            with tf.GradientTape() as tape:
                ell = model.expected_log_likelihood(batch, 4, tf.constant([0, 0]))
            grads = tape.gradient(ell, model.trainable_variables)
            results.append([ell.numpy()] + [tf.convert_to_tensor(g).numpy() for g in grads])
        for box, built_in in zip(*results):
            np.testing.assert_allclose(box, built_in, rtol=1e-8, atol=1e-12)
        assert all(np.abs(g).sum() > 0 for g in results[0][1:])
    # the pathwise estimator would get no likelihood gradient through it: refused when the model is
    # built, and a built model's likelihood cannot be swapped (the check is not bypassed)
    from gpseq.errors import ConfigError

    with pytest.raises(ConfigError, match='estimator="score"'):
        tiny_model(kernel="linear", seed=2, likelihood=black_box)
    model, _ = tiny_model(kernel="linear", seed=2)
    with pytest.raises(AttributeError):
        model.likelihood = black_box
    assert model.likelihood.name == "exact"


def test_score_function_runs_with_full_covariance_and_single_sample():
    # regressions: the full-covariance q(u) score broadcast over samples; with S = 1 there is no
    # leave-one-out control variate (must be 0, not 0/0)
    data, _ = tiny_data(n_seq=3, max_len=4, n_features=8, n_labels=3)
    model, _ = tiny_model(n_features=8, n_labels=3, estimator="score", full_covariance=True)
    batch = tiny_batch(data)
    for num_samples in (1, 3):
        with tf.GradientTape() as tape:
            ell = model.expected_log_likelihood(batch, num_samples, tf.constant([1, 2]))
        grads = [g for g in tape.gradient(ell, model.trainable_variables) if g is not None]
        assert np.isfinite(float(ell))
        assert grads and all(np.all(np.isfinite(tf.convert_to_tensor(g).numpy())) for g in grads)


def test_mc_sequence_log_probability_of_a_near_certain_long_path_is_not_positive():
    # float32: score − log Z of a long path with huge potentials rounds above 0 without the clamp
    from gpseq.structured import chain
    from gpseq.structured.predict import mc_log_prob

    rng = np.random.default_rng(0)
    K, S, B, T, V = 1, 4, 8, 60, 5
    labels = rng.integers(0, V, (B, T)).astype(np.int32)
    unary = rng.standard_normal((K, S, B, T, V)).astype(np.float32) + 40.0 * np.eye(V, dtype=np.float32)[labels]
    pairwise = rng.standard_normal((S, 1, V, V)).astype(np.float32)
    lengths = np.full(B, T, np.int32)

    _, log_z = chain.unary_marginals(unary, pairwise, lengths, return_log_partition=True)
    raw = chain.sequence_score(labels, unary, pairwise, lengths) - log_z
    logp = mc_log_prob(labels, unary, pairwise, lengths, tf.ones([1], tf.float32), log_z).numpy()
    assert np.all(logp <= 0.0) and np.all(np.isfinite(logp))
    np.testing.assert_allclose(logp, 0.0, atol=1e-3)  # the path is near-certain
    assert raw.shape == (K, S, B)


def test_mixture_components_without_an_inducing_gp_leave_the_model_a_single_gaussian():
    # K > 1 only shapes q(u); with the weight-space kernel alone there is no q(u), so the expected
    # log-likelihood equals the K = 1 model's (it was multiplied by K) and prediction runs
    from gpseq.structured.predict import monte_carlo_marginals

    data, _ = tiny_data(seed=4, n_seq=3)
    batch = tiny_batch(data)
    single, _ = tiny_model(kernel="linear", seed=4)
    mixture, _ = tiny_model(kernel="linear", seed=4, num_components=2)
    seed = tf.constant([2, 3])
    np.testing.assert_allclose(mixture.expected_log_likelihood(batch, 4, seed).numpy(),
                               single.expected_log_likelihood(batch, 4, seed).numpy(), rtol=1e-12)
    marg, _, _, _ = monte_carlo_marginals(mixture, batch, 4, seed)
    np.testing.assert_allclose(tf.reduce_sum(marg, -1).numpy()[data.lengths[:, None] > np.arange(marg.shape[1])],
                               1.0, atol=1e-9)


def test_array_names_are_those_of_models_saved_before_the_model_was_composed_of_parts():
    # the arrays.npz names written by gpseq before StructuredGP held unaries/pairwise objects
    # (listed from that version): models saved then load into the composed model
    common = ["inducing_inputs/data", "inducing_inputs/indices", "inducing_inputs/indptr", "inducing_inputs/shape",
              "var:label_bias", "var:pairwise_mean", "var:pairwise_variance/_pretransformed_input",
              "var:temperature", "var:variance_scale"]
    sparse = ["var:inducing/mixture_logits", "var:inducing/q_mu", "var:inducing/q_sqrt/_pretransformed_input",
              "var:kernel/lengthscales/_pretransformed_input", "var:kernel/variance/_pretransformed_input",
              "var:linear/prior_variance/_pretransformed_input", "var:linear/q_mu",
              "var:linear/q_variance/_pretransformed_input"]
    deep = ["var:deep/inducing_inputs2", "var:deep/mean_weights"] + [
        f"var:deep/{part}" for part in ("kernel1/lengthscales/_pretransformed_input",
                                        "kernel1/variance/_pretransformed_input",
                                        "kernel2/lengthscales/_pretransformed_input",
                                        "kernel2/variance/_pretransformed_input", "q1/mixture_logits", "q1/q_mu",
                                        "q1/q_sqrt/_pretransformed_input", "q2/mixture_logits", "q2/q_mu",
                                        "q2/q_sqrt/_pretransformed_input")]
    Z = np.eye(3, 6)
    for config, names in ((ModelConfig(kernel="linear+rbf", num_components=2), common + sparse),
                          (ModelConfig(kernel="paper-rbf", unary="deep", hidden_dims=2), common + deep)):
        model = build_structured_gp(config, 6, 2, Z, tf.float64)
        state = model.get_state()
        assert sorted(state) == sorted(names)
        for variable in model.trainable_variables:
            variable.assign(variable + 0.1)
        reloaded = build_structured_gp(config, 6, 2, StructuredGP.inducing_from_state(state), tf.float64)
        reloaded.set_state(model.get_state())
        for a, b in zip(model.trainable_variables, reloaded.trainable_variables):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
