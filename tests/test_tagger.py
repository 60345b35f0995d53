"""The structured GP tagger: ELBO pieces against independent computations, estimators,
persistence, resume, and learning on the bundled sample."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from gpseq.features import get_preset
from gpseq.structured.likelihoods import BlackBoxLikelihood
from gpseq.structured.model import ModelConfig, StructuredGP, build_structured_gp
from gpseq.tagger import Tagger, TaggerConfig
from gpseq.training.batching import SequenceData, make_batch
from gpseq.training.trainer import TrainingConfig

tfd = tfp.distributions


# ---- a tiny model over a hand-made sparse design ------------------------------------------------
def _tiny_data(seed=0, n_seq=4, max_len=3, n_features=6, n_labels=2):
    rng = np.random.default_rng(seed)
    import scipy.sparse as sp

    lengths = rng.integers(1, max_len + 1, size=n_seq)
    n_tok = int(lengths.sum())
    dense = (rng.random((n_tok, n_features)) < 0.4).astype(np.float64)
    dense[:, 0] = 0.0  # column 0 is the padding column
    dense[np.arange(n_tok), 1 + rng.integers(0, n_features - 1, n_tok)] = 1.0  # ≥ 1 feature each
    rows = sp.csr_matrix(dense)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    labels = rng.integers(0, n_labels, size=n_tok).astype(np.int32)
    return SequenceData(rows, offsets, labels), dense


def _tiny_model(kernel="linear+rbf", n_features=6, n_labels=2, seed=0, likelihood=None, **overrides):
    rng = np.random.default_rng(seed + 100)
    config = ModelConfig(kernel=kernel, num_inducing=3, **{"rbf_conditional": "full", **overrides})
    Z = (rng.random((3, n_features)) < 0.5).astype(np.float64)
    Z[:, 0] = 0.0
    model = build_structured_gp(config, n_features, n_labels, Z if config.has_inducing else None, tf.float64,
                                likelihood=likelihood)
    # move the variational parameters away from their initial values
    for variable in model.trainable_variables:
        variable.assign(variable + 0.3 * rng.standard_normal(variable.shape))
    return model, Z


def _batch(data):
    return {k: tf.convert_to_tensor(v) for k, v in make_batch(data, np.arange(len(data)), dtype=np.float64).items()}


def test_pairwise_and_weight_kl_equal_tfp_closed_form():
    model, _ = _tiny_model(kernel="linear")
    V = model.num_labels
    q = tfd.Normal(model.pairwise.mean, tf.sqrt(tf.convert_to_tensor(model.pairwise.variance)))
    p = tfd.Normal(tf.zeros([V, V], tf.float64), tf.sqrt(tf.constant(ModelConfig().pairwise_prior_variance, tf.float64)))
    expected = tf.reduce_sum(tfd.kl_divergence(q, p))
    np.testing.assert_allclose(model.pairwise.kl().numpy(), expected.numpy(), rtol=1e-12)
    qw = tfd.Normal(model.unaries.linear.q_mu, tf.sqrt(tf.convert_to_tensor(model.unaries.linear.q_variance)))
    pw = tfd.Normal(tf.constant(0.0, tf.float64), tf.sqrt(tf.constant(ModelConfig().prior_variance, tf.float64)))
    total = expected + tf.reduce_sum(tfd.kl_divergence(qw, pw))
    np.testing.assert_allclose(model.prior_kl().numpy(), total.numpy(), rtol=1e-10)


def _unary_gaussians(model, Z, dense, data, conditional="full", component=0, drop_k_tilde=False):
    """Exact per-sequence Gaussian of the unaries of mixture `component`, computed densely in NumPy
    (seed eqs. 15–18): [(means [V, T], covariances [V, T, T]) per sequence]. `conditional="diag"`:
    K̃_n replaced by its diagonal; `drop_k_tilde`: without K̃_n (the reference of a known bug)."""
    import scipy.linalg

    mu = model.unaries.linear.q_mu.numpy()
    s = np.asarray(model.unaries.linear.q_variance)
    bias = model.unaries.label_bias.numpy()
    sparse = model.unaries.sparse
    if sparse is not None:
        variance = float(tf.convert_to_tensor(sparse.kernel.variance))
        lengthscale = float(np.squeeze(tf.convert_to_tensor(sparse.kernel.lengthscales)))

        def rbf(a, b):
            d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
            return variance * np.exp(-0.5 * d2 / lengthscale**2)

        kzz = rbf(Z, Z) + ModelConfig().jitter * np.eye(len(Z))
        L = np.linalg.cholesky(kzz)
        q_mu = sparse.q.q_mu.numpy()[component]  # [M, V] (of v when whitened)
        q_scale = tf.convert_to_tensor(sparse.q.q_sqrt).numpy()[component]  # [V, M, M] or [M, V]
    out = []
    for b in range(len(data)):
        X = dense[data.offsets[b] : data.offsets[b + 1]]
        means, covs = [], []
        for j in range(model.num_labels):
            means.append(bias[j] + X @ mu[:, j])
            covs.append(X @ np.diag(s[:, j]) @ X.T)
        if sparse is not None:
            kxz = rbf(X, Z)
            A_w = scipy.linalg.solve_triangular(L, kxz.T, lower=True).T  # K_xz L^-T
            A = A_w if sparse.whiten else kxz @ np.linalg.inv(kzz)  # the projection of q(u)
            cond = rbf(X, X) - A_w @ A_w.T
            if conditional == "diag":
                cond = np.diag(np.diag(cond))
            for j in range(model.num_labels):
                Sj = q_scale[j] @ q_scale[j].T if sparse.q.full_cov else np.diag(q_scale[:, j] ** 2)
                means[j] = means[j] + A @ q_mu[:, j]
                covs[j] = covs[j] + A @ Sj @ A.T + (0.0 if drop_k_tilde else cond)
        out.append((np.array(means), np.array(covs)))
    return out


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
        for b, (means, covs) in enumerate(_unary_gaussians(model, Z, dense, data, conditional, k, drop_k_tilde)):
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
    ("linear", 2, True, "diag"),  # K > 1 without a q(u): one Gaussian, not K copies (issue 18)
])
def test_expected_log_likelihood_matches_independent_monte_carlo(kernel, K, whiten, conditional):
    """The model's Monte Carlo ELL (seed eqs. 8, 19) against NumPy Monte Carlo over the dense
    per-sequence Gaussians with path enumeration: within 4 combined standard errors, with the
    standard error small enough that the reference without K̃_n is off by more than 4 of them."""
    data, dense = _tiny_data(seed=3)
    model, Z = _tiny_model(kernel, seed=3, num_components=K, whiten=whiten, rbf_conditional=conditional)
    assert model.unaries.num_components == (K if kernel != "linear" else 1)
    if model.unaries.sparse is not None:  # a narrower q(u): K̃_n's share of the variance is then large
        q_sqrt = model.unaries.sparse.q.q_sqrt
        q_sqrt.assign(0.1 * tf.convert_to_tensor(q_sqrt))
    batch = _batch(data)
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
    data, _ = _tiny_data(seed=2, n_seq=3)

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
    batch = _batch(data)
    for kernel in ("linear", "linear+rbf"):
        results = []
        for likelihood in (black_box, None):  # the same variables: the black box, then the built-in chain
            model, _ = _tiny_model(kernel=kernel, seed=2, estimator="score", likelihood=likelihood)
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
        _tiny_model(kernel="linear", seed=2, likelihood=black_box)
    model, _ = _tiny_model(kernel="linear", seed=2)
    with pytest.raises(AttributeError):
        model.likelihood = black_box
    assert model.likelihood.name == "exact"


# ---- the Tagger end to end on the bundled sample -------------------------------------------------
def _sample(split, sample_dir):
    from gpseq.corpora import read_conll

    return read_conll(sample_dir / f"{split}.conll")


def _quick_config(dtype="float32", **training):
    params = dict(epochs=3, batch_size=16, learning_rate=0.05, checkpoint_every=5, seed=1, early_stopping="none")
    params.update(training)
    return TaggerConfig(
        features=get_preset("chunking"),
        model=ModelConfig(kernel="linear+rbf", num_inducing=8),
        training=TrainingConfig(**params),
        predict_samples=4,
        dtype=dtype,
    )


@pytest.fixture(scope="module")
def trained(sample_dir, tmp_path_factory):
    train = _sample("train", sample_dir)
    return Tagger.train(train, _quick_config()), train


def test_tagger_learns_the_sample_better_than_chance(trained, sample_dir):
    tagger, train = trained
    test = _sample("test", sample_dir)
    report = tagger.evaluate(test).to_dict()
    majority = max(
        sum(label == candidate for s in train for label in s.labels) for candidate in tagger.labels
    ) / sum(len(s) for s in train)
    assert report["token_accuracy"] > majority + 0.2
    tagged = tagger.tag(test[:3])
    for result in tagged:
        np.testing.assert_allclose(result.probabilities.sum(-1), 1.0, atol=1e-5)


def test_save_load_gives_identical_predictions(trained, sample_dir, tmp_path):
    tagger, _ = trained
    test = _sample("test", sample_dir)[:20]
    tagger.save(tmp_path / "model")
    meta = json.loads((tmp_path / "model" / "tagger.json").read_text())
    assert meta["format_version"] == 1 and meta["labels"] == tagger.labels
    loaded = Tagger.load(tmp_path / "model")
    for a, b in zip(tagger.tag(test), loaded.tag(test)):
        assert a.labels == b.labels
        # float32 model: equal to float32 round-off (reduction order may differ between graphs)
        np.testing.assert_allclose(a.probabilities, b.probabilities, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(a.sequence_log_prob, b.sequence_log_prob, rtol=1e-4, atol=1e-4)


def test_resume_continues_from_the_checkpoint(sample_dir, tmp_path):
    train = _sample("train", sample_dir)[:60]
    config = _quick_config("float64", max_steps=8, epochs=10)
    straight = Tagger.train(train, config)
    interrupted = _quick_config("float64", max_steps=5, epochs=10)
    Tagger.train(train, interrupted, checkpoint_dir=tmp_path / "ckpt")
    resumed = Tagger.train(train, config, checkpoint_dir=tmp_path / "ckpt", resume=True)
    assert resumed.scores["steps"] == 8
    for a, b in zip(straight.model.trainable_variables, resumed.model.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-9, atol=1e-12)


def test_score_function_runs_with_full_covariance_and_single_sample():
    # regressions: the full-covariance q(u) score broadcast over samples; with S = 1 there is no
    # leave-one-out control variate (must be 0, not 0/0)
    data, _ = _tiny_data(n_seq=3, max_len=4, n_features=8, n_labels=3)
    model, _ = _tiny_model(n_features=8, n_labels=3, estimator="score", full_covariance=True)
    batch = _batch(data)
    for num_samples in (1, 3):
        with tf.GradientTape() as tape:
            ell = model.expected_log_likelihood(batch, num_samples, tf.constant([1, 2]))
        grads = [g for g in tape.gradient(ell, model.trainable_variables) if g is not None]
        assert np.isfinite(float(ell))
        assert grads and all(np.all(np.isfinite(tf.convert_to_tensor(g).numpy())) for g in grads)


def test_one_token_sentences_tag_and_train():
    # a batch whose longest sentence has one token (the chain pads the time axis internally)
    from gpseq.corpora.types import Sentence

    data, _ = _tiny_data(n_seq=3, max_len=1, n_features=6, n_labels=2)
    model, _ = _tiny_model(n_features=6, n_labels=2)
    batch = _batch(data)
    assert batch["values"].shape[1] == 1 and int(tf.reduce_max(batch["lengths"])) == 1
    from gpseq.structured.predict import monte_carlo_marginals

    marg, _, _, log_z = monte_carlo_marginals(model, batch, 4, tf.constant([0, 1]))
    assert marg.shape == (3, 1, 2)
    np.testing.assert_allclose(tf.reduce_sum(marg[:, 0], -1).numpy(), 1.0, atol=1e-9)
    with tf.GradientTape() as tape:
        elbo = model.elbo(batch, 3, 2, tf.constant([0, 1]))
    assert all(np.all(np.isfinite(tf.convert_to_tensor(g).numpy()))
               for g in tape.gradient(elbo, model.trainable_variables) if g is not None)
    # through the public API, in both prediction modes
    train = [Sentence(["a", "b"], ["X", "Y"]), Sentence(["b"], ["Y"]), Sentence(["a"], ["X"])] * 4
    from gpseq.features import get_preset

    config = TaggerConfig(features=get_preset("pos"), model=ModelConfig(kernel="linear+rbf", num_inducing=2),
                          training=TrainingConfig(epochs=1, batch_size=4, dev_fraction=0.0, seed=0))
    tagger = Tagger.train(train, config)
    for mean in (False, True):
        result = tagger.tag([["b"]], mean=mean)[0]
        assert result.probabilities.shape == (1, 2) and abs(result.probabilities.sum() - 1.0) < 1e-6


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


def test_natural_gradient_step_on_q_u_increases_the_elbo_and_trains_the_tagger(sample_dir):
    from gpseq.gp.natgrad import NaturalGradient

    data, _ = _tiny_data(n_seq=4, max_len=4, n_features=8, n_labels=3)
    model, _ = _tiny_model(n_features=8, n_labels=3)
    batch = _batch(data)
    seed = tf.constant([5, 6])  # common random numbers: the ELBO is a deterministic function of q(u)

    before = float(model.elbo(batch, 4, 8, seed))
    # a small step along the natural gradient ascends
    NaturalGradient(0.02).minimize(lambda: -model.elbo(batch, 4, 8, seed), model.variational_parameters())
    after = float(model.elbo(batch, 4, 8, seed))
    assert after > before

    # wired into training: q(u) moves only by natural-gradient steps, the rest by Adam
    train = _sample("train", sample_dir)[:60]
    config = TaggerConfig(features=get_preset("pos"), model=ModelConfig(kernel="linear+rbf", num_inducing=4),
                          training=TrainingConfig(epochs=2, batch_size=20, dev_fraction=0.0, seed=0,
                                                  natgrad_gamma=0.01))
    tagger = Tagger.train(train, config)
    assert tagger.scores["skipped_steps"] == 0
    # Adam does not touch q(u) here: it moved from its zero initial mean by natural-gradient steps
    assert np.abs(tagger.model.unaries.sparse.q.q_mu.numpy()).max() > 1e-3
    accuracy = tagger.evaluate(train).to_dict()["token_accuracy"]
    majority = max(np.unique(np.concatenate([s.labels for s in train]), return_counts=True)[1]) / sum(
        len(s) for s in train)
    assert accuracy > majority


def test_mixture_components_without_an_inducing_gp_leave_the_model_a_single_gaussian():
    # K > 1 only shapes q(u); with the weight-space kernel alone there is no q(u), so the expected
    # log-likelihood equals the K = 1 model's (it was multiplied by K) and prediction runs
    from gpseq.structured.predict import monte_carlo_marginals

    data, _ = _tiny_data(seed=4, n_seq=3)
    batch = _batch(data)
    single, _ = _tiny_model(kernel="linear", seed=4)
    mixture, _ = _tiny_model(kernel="linear", seed=4, num_components=2)
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


def test_strings_instead_of_tokenised_sentences_are_refused_by_name():
    """One string for the whole input (tag, select) is refused as such, not read as its characters;
    a string among the sentences is named. Neither message names another function (select's used
    to say "tag() takes ...")."""
    from gpseq.active.selection import select
    from gpseq.corpora.types import as_sentences
    from gpseq.errors import GpseqError

    with pytest.raises(GpseqError, match=r"got one string \('The cat sat \.'\)") as raised:
        as_sentences("The cat sat .")
    assert "tag()" not in str(raised.value)
    with pytest.raises(GpseqError, match=r"got a string \('Dogs bark'\)"):
        as_sentences([["The", "cat"], "Dogs bark"])
    with pytest.raises(GpseqError, match="one string"):
        select(None, "The cat sat on the mat .", 2, "random")
    assert [s.tokens for s in as_sentences([["The", "cat"], ("Dogs", "bark")])] == [["The", "cat"], ["Dogs", "bark"]]


def test_a_process_forked_after_tensorflow_started_refuses_to_run_it_instead_of_hanging():
    """TensorFlow does not survive a fork: a child forked after the parent's Monte Carlo prediction
    hung at its first TensorFlow operation. Any prediction that needs TensorFlow now raises the
    reason there (Tagger.tag with samples, select's draws); the linear model's deterministic
    predictive (plain NumPy) still runs. In subprocesses, bounded in time."""
    import subprocess
    import sys
    from pathlib import Path

    model = Path(__file__).resolve().parents[1] / "models" / "en_pos_conll2000"
    code = (
        "import os, sys\n"
        "from gpseq.tagger import Tagger\n"
        f"tagger = Tagger.load({str(model)!r})\n"
        "sentence = [['The', 'cat', 'sat', '.']]\n"
        "tagger.tag(sentence, samples=2)\n"  # TensorFlow starts here, in the parent
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    print('deterministic', tagger.tag(sentence)[0].labels, flush=True)\n"
        "    for what, call in (('tag', lambda: tagger.tag(sentence, samples=2)),\n"
        "                       ('select', lambda: tagger.select(sentence, 1, 'bald', tag=False))):\n"
        "        try:\n"
        "            call()\n"
        "            print(what, 'ran', flush=True)\n"
        "        except Exception as error:\n"
        "            print(what, 'refused:', error, flush=True)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("deterministic [")
    assert [line.split(":")[0] for line in lines[1:]] == ["tag refused", "select refused"]
    assert all("TensorFlow cannot run after a fork" in line for line in lines[1:])
