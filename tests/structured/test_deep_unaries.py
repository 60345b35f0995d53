"""Deep-GP unaries (`ModelConfig.unary = "deep"`): the two layers' samples against dense NumPy
computations (hidden layer on sparse features, label GPs on the hidden inputs, joint correlations
through q(u)), the KL pieces against TFP, save/load, configuration errors, and a tiny tagger on
the bundled sample that learns far better than chance."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf
import tensorflow_probability as tfp

from gpseq.errors import ConfigError
from gpseq.structured.model import ModelConfig, build_structured_gp
from gpseq.training.batching import SequenceData, make_batch

tfd = tfp.distributions


def _tiny(kernel="paper-rbf", n_features=7, n_labels=3, Q=2, seed=0, **overrides):
    rng = np.random.default_rng(seed)
    lengths = np.array([3, 2, 4])
    n_tok = int(lengths.sum())
    dense = (rng.random((n_tok, n_features)) < 0.4).astype(np.float64)
    dense[:, 0] = 0.0
    dense[np.arange(n_tok), 1 + rng.integers(0, n_features - 1, n_tok)] = 1.0
    data = SequenceData(sp.csr_matrix(dense), np.concatenate([[0], np.cumsum(lengths)]),
                        rng.integers(0, n_labels, n_tok).astype(np.int32))
    Z = (rng.random((4, n_features)) < 0.5).astype(np.float64)
    Z[:, 0] = 0.0
    config = ModelConfig(kernel=kernel, num_inducing=4, unary="deep", hidden_dims=Q, **overrides)
    model = build_structured_gp(config, n_features, n_labels, Z, tf.float64)
    for variable in model.unaries.deep.trainable_variables:  # away from the initial values
        variable.assign(variable + 0.3 * rng.standard_normal(variable.shape))
    batch = {k: tf.convert_to_tensor(v) for k, v in make_batch(data, np.arange(3), dtype=np.float64).items()}
    return model, batch, dense, Z


def _np_rbf(A, B, variance, ls):
    d = ((A[:, None, :] - B[None, :, :]) / ls) ** 2
    return variance * np.exp(-0.5 * d.sum(-1))


def _dense_tokens(batch, dense):
    """Dense feature rows of the batch's real tokens in (b, t) order, and their (b, t) positions."""
    lengths = batch["lengths"].numpy()
    pos = [(b, t) for b in range(len(lengths)) for t in range(lengths[b])]
    return dense[: len(pos)], pos


def _layer(kernel, Z, X, q_mu, q_sqrt, jitter):
    """NumPy whitened sparse-GP marginals: mean `[N, P]`, A_w `[N, M]`, diag K̃ `[N]`, S `[P, M, M]`."""
    var, ls = float(kernel.variance.numpy()), kernel.lengthscales.numpy()
    L = np.linalg.cholesky(_np_rbf(Z, Z, var, ls) + jitter * np.eye(len(Z)))
    A = np.linalg.solve(L, _np_rbf(X, Z, var, ls).T).T
    return A @ q_mu, A, var - (A**2).sum(-1), np.einsum("pmk,plk->pml", q_sqrt, q_sqrt)


def test_hidden_layer_samples_match_dense_numpy():
    model, batch, dense, Z = _tiny()
    deep = model.unaries.deep
    S = 40_000
    _, H = deep.sample(batch, S, tf.constant([1, 2]), return_hidden=True)  # [S, B, T, Q]
    X, pos = _dense_tokens(batch, dense)
    q_sqrt = tf.convert_to_tensor(deep.q1.q_sqrt).numpy()[0]
    mean, A, k_tilde, Sq = _layer(deep.kernel1, Z, X, deep.q1.q_mu.numpy()[0], q_sqrt, ModelConfig().jitter)
    mean = mean + X @ deep.mean_weights.numpy()
    var = k_tilde[:, None] + np.einsum("nm,pmk,nk->np", A, Sq, A) + ModelConfig().jitter
    h = np.stack([H.numpy()[:, b, t] for b, t in pos], 1)  # [S, N, Q]
    se = np.sqrt(var / S)
    np.testing.assert_array_less(np.abs(h.mean(0) - mean), 5 * se)
    np.testing.assert_allclose(h.var(0), var, rtol=0.05)


def test_label_layer_given_deterministic_hidden_layer_matches_numpy_joint_moments():
    """With the hidden GP switched off (variance ~0, q(v_1) ~ a point) h = x W exactly; then the
    unaries' per-token means, variances and cross-token covariances (through the shared q(v_2))
    equal the NumPy sparse-GP moments on the hidden inputs."""
    model, batch, dense, Z = _tiny()
    deep = model.unaries.deep
    deep.kernel1.variance.assign(tf.constant(1e-12, tf.float64))
    deep.q1.q_sqrt.assign(tf.convert_to_tensor(deep.q1.q_sqrt) * 1e-6)
    S = 40_000
    f = model.unaries.sample(batch, S, tf.constant([3, 4]))[0].numpy()  # [S, B, T, V]
    X, pos = _dense_tokens(batch, dense)
    Hd = X @ deep.mean_weights.numpy()
    q_sqrt = tf.convert_to_tensor(deep.q2.q_sqrt).numpy()[0]
    mean, A, k_tilde, Sq = _layer(deep.kernel2, deep.inducing_inputs2.numpy(), Hd, deep.q2.q_mu.numpy()[0], q_sqrt,
                                  ModelConfig().jitter)
    mean = mean + model.unaries.label_bias.numpy()
    cov = np.einsum("nm,pmk,lk->pnl", A, Sq, A)  # [V, N, N] through q(v_2)
    var = np.stack([np.diag(c) for c in cov], 1) + k_tilde[:, None] + ModelConfig().jitter  # [N, V]
    samples = np.stack([f[:, b, t] for b, t in pos], 1)  # [S, N, V]
    np.testing.assert_array_less(np.abs(samples.mean(0) - mean), 5 * np.sqrt(var / S))
    np.testing.assert_allclose(samples.var(0), var, rtol=0.05)
    centred = samples - samples.mean(0)
    emp = np.einsum("snv,slv->vnl", centred, centred) / S  # tokens 0 and 3 are in different sequences
    np.testing.assert_allclose(emp[:, 0, 3], cov[:, 0, 3], atol=0.05 * np.sqrt(var[0] * var[3]).max())


def test_kl_pieces_equal_tfp_and_elbo_is_their_difference():
    model, batch, _, _ = _tiny(kernel="linear+rbf")
    deep = model.unaries.deep
    expected = 0.0
    for q in (deep.q1, deep.q2):
        loc = tf.transpose(q.q_mu[0])
        dist = tfd.MultivariateNormalTriL(loc, tf.convert_to_tensor(q.q_sqrt)[0])
        expected += tf.reduce_sum(tfd.kl_divergence(dist, tfd.MultivariateNormalDiag(tf.zeros_like(loc)))).numpy()
    qw = tfd.Normal(model.unaries.linear.q_mu, tf.sqrt(tf.convert_to_tensor(model.unaries.linear.q_variance)))
    pw = tfd.Normal(tf.constant(0.0, tf.float64), tf.sqrt(tf.constant(ModelConfig().prior_variance, tf.float64)))
    expected += tf.reduce_sum(tfd.kl_divergence(qw, pw)).numpy() + model.pairwise.kl().numpy()
    np.testing.assert_allclose(model.prior_kl().numpy(), expected, rtol=1e-10)
    seed = tf.constant([5, 6])
    ell = model.expected_log_likelihood(batch, 3, seed).numpy()
    np.testing.assert_allclose(model.elbo(batch, 30, 3, seed).numpy(), 10.0 * ell - expected, rtol=1e-10)
    with tf.GradientTape() as tape:
        loss = -model.elbo(batch, 30, 3, seed)
    grads = tape.gradient(loss, model.unaries.deep.trainable_variables)
    assert all(g is not None for g in grads)


@pytest.mark.parametrize("conditional", ["full", "diag"])
def test_within_sequence_covariance_has_the_conditional_block_only_when_full(conditional):
    """Hidden layer deterministic (as above): two tokens of one sequence covary through q(v_2),
    A S Aᵀ, plus K̃'s off-diagonal entry (seed eq. 18) with "full" and without it with "diag"
    (NumPy moments; 40,000 draws, tolerance 5 standard errors of the empirical covariance)."""
    model, batch, dense, Z = _tiny(rbf_conditional=conditional)
    deep = model.unaries.deep
    deep.kernel1.variance.assign(tf.constant(1e-12, tf.float64))
    deep.q1.q_sqrt.assign(tf.convert_to_tensor(deep.q1.q_sqrt) * 1e-6)
    deep.q2.q_sqrt.assign(tf.convert_to_tensor(deep.q2.q_sqrt) * 0.1)  # less noise around K̃'s share
    S = 40_000
    f = model.unaries.sample(batch, S, tf.constant([3, 4]))[0].numpy()  # [S, B, T, V]
    X, pos = _dense_tokens(batch, dense)
    Hd = X @ deep.mean_weights.numpy()
    Z2 = deep.inducing_inputs2.numpy()
    q_sqrt = tf.convert_to_tensor(deep.q2.q_sqrt).numpy()[0]
    _, A, k_tilde, Sq = _layer(deep.kernel2, Z2, Hd, deep.q2.q_mu.numpy()[0], q_sqrt, ModelConfig().jitter)
    k_full = _np_rbf(Hd, Hd, float(deep.kernel2.variance.numpy()), deep.kernel2.lengthscales.numpy()) - A @ A.T
    assert pos[0] == (0, 0) and pos[1] == (0, 1)  # tokens 0 and 1: the first sequence
    through_q = np.einsum("m,pmk,k->p", A[0], Sq, A[1])  # [V]
    expected = through_q + (k_full[0, 1] if conditional == "full" else 0.0)
    a, b = f[:, 0, 0] - f[:, 0, 0].mean(0), f[:, 0, 1] - f[:, 0, 1].mean(0)  # [S, V]
    se = np.sqrt(np.mean((a * b) ** 2, 0) / S)
    np.testing.assert_array_less(np.abs(np.mean(a * b, 0) - expected), 5 * se)
    assert abs(k_full[0, 1]) > 10 * se.max()  # "full" and "diag" are told apart


def test_configuration_errors():
    with pytest.raises(ConfigError):
        ModelConfig(unary="deeper").validate()
    with pytest.raises(ConfigError):
        build_structured_gp(ModelConfig(kernel="linear", unary="deep"), 5, 2, None)
    with pytest.raises(ConfigError):
        _tiny(num_components=2)
    with pytest.raises(ConfigError):
        _tiny(estimator="score")
    with pytest.raises(ConfigError):
        _tiny(kernel="paper-linear")


def test_tagger_with_deep_unaries_learns_the_sample(sample_dir, tmp_path):
    from gpseq.corpora import read_conll
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger, TaggerConfig
    from gpseq.training.trainer import TrainingConfig

    train = read_conll(sample_dir / "train.conll")[:200]
    test = read_conll(sample_dir / "test.conll")
    config = TaggerConfig(
        features=get_preset("chunking"),
        model=ModelConfig(kernel="linear+rbf", num_inducing=8, unary="deep", hidden_dims=4),  # weight-space linear part + deep GP
        training=TrainingConfig(epochs=2, batch_size=16, learning_rate=0.05, seed=1, early_stopping="none"),
        predict_samples=4,
        dtype="float32",
    )
    tagger = Tagger.train(train, config)
    report = tagger.evaluate(test).to_dict()
    majority = max(sum(label == c for s in train for label in s.labels) for c in tagger.labels) / sum(
        len(s) for s in train)
    assert report["token_accuracy"] > majority + 0.2
    tagger.save(tmp_path / "model")
    loaded = Tagger.load(tmp_path / "model")
    assert loaded.model.unaries.deep is not None
    for a, b in zip(tagger.tag(test[:10]), loaded.tag(test[:10])):
        assert a.labels == b.labels
        np.testing.assert_allclose(a.probabilities, b.probabilities, rtol=1e-4, atol=1e-6)
