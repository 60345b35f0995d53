"""GPNet unaries (`ModelConfig.unary = "gpnet"`): the hashed frequencies against the standard normal,
the random-feature prior covariance against the RBF kernel on sparse token vectors (error at the
closed-form O(1/√F) rate), the unaries' moments, joint draws and per-sequence Gaussians against
NumPy from the same weights, the KL against TFP, configuration errors, and a tiny tagger that
learns and round-trips through save/load."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.stats
import tensorflow as tf
import tensorflow_probability as tfp

from gpseq.errors import ConfigError, ModelFormatError
from gpseq.structured.gpnet_unaries import GPNetUnaries, hashed_normal
from gpseq.structured.model import ModelConfig, build_structured_gp
from gpseq.training.batching import SequenceData, make_batch

tfd = tfp.distributions


def _data(n_features=30, n_labels=3, lengths=(3, 2, 4), density=0.2, seed=0):
    """Sequences of sparse token rows with real-valued features (column 0 = padding, never active)."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths)
    n_tok = int(lengths.sum())
    dense = (rng.random((n_tok, n_features)) < density) * rng.uniform(0.5, 1.5, (n_tok, n_features))
    dense[:, 0] = 0.0
    dense[np.arange(n_tok), 1 + rng.integers(0, n_features - 1, n_tok)] = 1.0
    data = SequenceData(sp.csr_matrix(dense), np.concatenate([[0], np.cumsum(lengths)]),
                        rng.integers(0, n_labels, n_tok).astype(np.int32))
    batch = make_batch(data, np.arange(len(lengths)), dtype=np.float64)
    return {k: tf.convert_to_tensor(v) for k, v in batch.items()}, dense


def _tokens(batch, dense):
    """The real tokens' (b, t) positions in dense-row order."""
    lengths = batch["lengths"].numpy()
    return [(b, t) for b in range(len(lengths)) for t in range(lengths[b])]


def _np_features(dense, variance, lengthscale, F, seed=0):
    """φ `[N, F]` in NumPy from the dense rows and Ω's rows for every feature id."""
    omega = hashed_normal(np.arange(dense.shape[1]), F // 2, seed, tf.float64).numpy()  # [D, F/2]
    p = dense @ omega / lengthscale
    return np.sqrt(variance * 2.0 / F) * np.concatenate([np.cos(p), np.sin(p)], -1)


def _model(kernel="linear+rbf", n_features=30, n_labels=3, F=8, seed=0, **overrides):
    config = ModelConfig(kernel=kernel, unary="gpnet", num_random_features=F, **overrides)
    model = build_structured_gp(config, n_features, n_labels, None, tf.float64)
    rng = np.random.default_rng(seed)
    for variable in model.trainable_variables:  # away from the initial values
        variable.assign(variable + 0.3 * rng.standard_normal(variable.shape))
    return model


def test_hashed_normal_is_a_fixed_standard_normal_matrix():
    z = hashed_normal(np.arange(20_000), 50, seed=3, dtype=tf.float64).numpy()  # 10⁶ entries
    assert scipy.stats.kstest(z.ravel()[::5], "norm").pvalue > 1e-3
    assert abs(z.mean()) < 5e-3 and abs(z.var() - 1.0) < 5e-3
    assert abs(scipy.stats.kurtosis(z.ravel())) < 0.03
    corr = np.corrcoef(z[:, :8].T)  # columns independent
    np.testing.assert_array_less(np.abs(corr - np.eye(8)), 0.03)
    assert abs(np.corrcoef(z[:-1, 0], z[1:, 0])[0, 1]) < 0.03  # neighbouring ids independent
    other = hashed_normal(np.arange(20_000), 50, seed=4, dtype=tf.float64).numpy()
    assert abs(np.corrcoef(z.ravel(), other.ravel())[0, 1]) < 5e-3
    rows = hashed_normal(np.array([19_999, 7]), 50, seed=3, dtype=tf.float64).numpy()  # per row, any call
    np.testing.assert_array_equal(rows, z[[19_999, 7]])


def test_prior_covariance_approaches_the_rbf_kernel_at_the_random_feature_rate():
    """φ(x)ᵀφ(x') on sparse token rows against σ² exp(−‖x − x'‖²/(2ℓ²)): over 24 frequency seeds, the
    mean squared error per pair equals the closed form of Rahimi–Recht features,
    (2σ⁴/F) [(1 + e^{−2r²})/2 − e^{−r²}] with r² = ‖x − x'‖²/ℓ² (O(1/√F) root mean square)."""
    batch, dense = _data(lengths=(6, 5, 7))
    variance, lengthscale = 1.7, 1.5
    sq = ((dense[:, None] - dense[None]) ** 2).sum(-1)
    exact = variance * np.exp(-0.5 * sq / lengthscale**2)
    r2 = sq / lengthscale**2
    pos = _tokens(batch, dense)
    off = ~np.eye(len(pos), dtype=bool)
    rms = {}
    for F in (40, 640):
        errors = []
        for seed in range(24):
            gpnet = GPNetUnaries(2, num_features=F, variance=variance, lengthscale=lengthscale, seed=seed,
                                 dtype=tf.float64)
            phi = gpnet.features(batch).numpy()
            phi = np.stack([phi[b, t] for b, t in pos])
            errors.append((phi @ phi.T - exact)[off])
        mse = np.mean(np.square(errors), 0)
        expected = 2 * variance**2 / F * ((1 + np.exp(-2 * r2)) / 2 - np.exp(-r2))[off]
        assert 0.75 < mse.mean() / expected.mean() < 1.33, (F, mse.mean(), expected.mean())
        rms[F] = np.sqrt(mse.mean())
        diag = np.einsum("btf,btf->bt", *(2 * [gpnet.features(batch).numpy()]))  # k(x, x) = σ² exactly
        np.testing.assert_allclose(diag, variance, rtol=1e-12)
    assert 3.0 < rms[40] / rms[640] < 5.3  # √16 = 4


@pytest.mark.parametrize("full_covariance", [True, False])
def test_unary_moments_equal_numpy_from_the_same_weights(full_covariance):
    model = _model(gpnet_full_covariance=full_covariance)
    batch, dense = _data()
    gpnet = model.unaries.gpnet
    var, ls = float(gpnet.kernel.variance.numpy()), float(gpnet.kernel.lengthscales.numpy())
    phi = _np_features(dense, var, ls, 8)
    m = gpnet.q.q_mu.numpy()[0]  # [F, V]
    scale = tf.convert_to_tensor(gpnet.q.q_sqrt).numpy()[0]
    if full_covariance:  # [V, F, F] lower triangular
        assert np.allclose(scale, np.tril(scale))
        gp_var = np.einsum("nf,vfg,ng->nv", phi, np.einsum("vfk,vgk->vfg", scale, scale), phi)
    else:  # [F, V]
        gp_var = phi**2 @ scale**2
    lin = model.unaries.linear
    mu, s = lin.q_mu.numpy(), tf.convert_to_tensor(lin.q_variance).numpy()
    mean_np = model.unaries.label_bias.numpy() + dense @ mu + phi @ m
    var_np = dense**2 @ s + gp_var
    mean, variance = (x.numpy() for x in model.unaries.moments(batch))
    pos = _tokens(batch, dense)
    np.testing.assert_allclose(np.stack([mean[b, t] for b, t in pos]), mean_np, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.stack([variance[b, t] for b, t in pos]), var_np, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(model.unaries.mean(batch).numpy(), mean, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("full_covariance", [True, False])
def test_joint_draws_and_sequence_gaussians_equal_numpy(full_covariance):
    """Draws share w across the batch: tokens of different sequences covary by φᵀVφ'; the
    per-sequence blocks (score estimator) are Φ_n V Φ_nᵀ (paper-rbf: the GPNet part alone)."""
    model = _model(kernel="paper-rbf", gpnet_full_covariance=full_covariance)
    batch, dense = _data()
    gpnet = model.unaries.gpnet
    phi = _np_features(dense, float(gpnet.kernel.variance.numpy()), float(gpnet.kernel.lengthscales.numpy()), 8)
    scale = tf.convert_to_tensor(gpnet.q.q_sqrt).numpy()[0]
    if full_covariance:  # [V, F, F]
        cov = np.einsum("nf,vfk,mg,vgk->vnm", phi, scale, phi, scale)  # [V, N, N]
    else:  # [F, V]
        cov = np.einsum("nf,fv,mf->vnm", phi, scale**2, phi)
    mean = model.unaries.label_bias.numpy() + phi @ gpnet.q.q_mu.numpy()[0]
    S = 40_000
    f = model.unaries.sample(batch, S, tf.constant([1, 2])).numpy()[0]  # [S, B, T, V]
    pos = _tokens(batch, dense)
    draws = np.stack([f[:, b, t] for b, t in pos], 1)  # [S, N, V]
    var = np.stack([np.diag(c) for c in cov], 1)  # [N, V]
    np.testing.assert_array_less(np.abs(draws.mean(0) - mean), 5 * np.sqrt(var / S))
    centred = draws - draws.mean(0)
    emp = np.einsum("snv,smv->vnm", centred, centred) / S
    np.testing.assert_allclose(emp, cov, atol=0.04 * var.max())
    assert pos[0][0] != pos[5][0] and np.abs(cov[:, 0, 5]).max() > 0.2 * var.max()  # across sequences
    block_mean, block_cov = (x.numpy()[0] for x in model.unaries.gaussian_blocks(batch))
    lengths = batch["lengths"].numpy()
    start = 0
    for b, n in enumerate(lengths):
        idx = np.arange(start, start + n)
        np.testing.assert_allclose(block_mean[b, :n], mean[idx], rtol=1e-10)
        np.testing.assert_allclose(block_cov[b][:, :n, :n], cov[:, idx][:, :, idx], rtol=1e-10, atol=1e-12)
        start += n


def test_kl_equals_tfp_and_the_elbo_reaches_every_gpnet_variable():
    model = _model(gpnet_full_covariance=True)
    batch, _ = _data()
    gpnet = model.unaries.gpnet
    loc = tf.transpose(gpnet.q.q_mu[0])  # [V, F]
    q = tfd.MultivariateNormalTriL(loc, tf.convert_to_tensor(gpnet.q.q_sqrt)[0])
    expected = tf.reduce_sum(tfd.kl_divergence(q, tfd.MultivariateNormalDiag(tf.zeros_like(loc)))).numpy()
    expected += model.unaries.linear.kl().numpy() + model.pairwise.kl().numpy()
    np.testing.assert_allclose(model.prior_kl().numpy(), expected, rtol=1e-10)
    seed = tf.constant([5, 6])
    with tf.GradientTape() as tape:
        loss = -model.elbo(batch, 30, 3, seed)
    grads = tape.gradient(loss, gpnet.trainable_variables)
    names = [v.name for v, g in zip(gpnet.trainable_variables, grads) if g is None or not np.any(g.numpy())]
    assert names in ([], ["mixture_logits:0"]), names  # one component: its logit has no gradient


def test_score_estimator_trains_with_the_gpnet_blocks():
    model = _model(kernel="paper-rbf", estimator="score")
    batch, _ = _data()
    with tf.GradientTape() as tape:
        loss = -model.elbo(batch, 30, 8, tf.constant([3, 4]))
    q = model.unaries.gpnet.q
    grad_mu, grad_sqrt = tape.gradient(loss, [q.q_mu, q.q_sqrt.pretransformed_input])
    assert np.isfinite(loss.numpy())
    for grad in (grad_mu, grad_sqrt):
        assert np.all(np.isfinite(grad.numpy())) and np.any(grad.numpy() != 0.0)


def test_configuration_errors():
    for overrides in ({"kernel": "linear"}, {"kernel": "paper-linear"}, {"num_components": 2},
                      {"num_random_features": 7}, {"num_random_features": 0}):
        with pytest.raises(ConfigError):
            ModelConfig(unary="gpnet", **{"kernel": "linear+rbf", **overrides}).validate()
    with pytest.raises(ConfigError):
        ModelConfig(unary="gpnets").validate()
    with pytest.raises(ConfigError):
        GPNetUnaries(3, num_features=5)
    assert not ModelConfig(kernel="paper-rbf", unary="gpnet").has_inducing  # no K-means inducing inputs


def test_tagger_with_gpnet_unaries_learns_and_round_trips(sample_dir, tmp_path):
    from gpseq.corpora import read_conll
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger, TaggerConfig
    from gpseq.training.trainer import TrainingConfig

    train = read_conll(sample_dir / "train.conll")[:200]
    test = read_conll(sample_dir / "test.conll")
    config = TaggerConfig(
        features=get_preset("chunking"),
        model=ModelConfig(kernel="paper-rbf", unary="gpnet", num_random_features=256),  # the GPNet part alone
        training=TrainingConfig(epochs=3, batch_size=16, learning_rate=0.05, seed=1, early_stopping="none"),
        predict_samples=4,
        dtype="float32",
    )
    assert config.resolved_method() == "svi"
    tagger = Tagger.train(train, config)
    report = tagger.evaluate(test).to_dict()
    majority = max(sum(label == c for s in train for label in s.labels) for c in tagger.labels) / sum(
        len(s) for s in train)
    assert report["token_accuracy"] > majority + 0.2, (report["token_accuracy"], majority)
    state = tagger.model.get_state()
    assert not any(name.startswith("inducing_inputs") for name in state)
    assert max(v.size for v in state.values()) < tagger.model.num_features * 32  # Ω [D, F/2] is not saved
    tagger.save(tmp_path / "model")
    loaded = Tagger.load(tmp_path / "model")
    assert loaded.model.unaries.gpnet is not None
    for a, b in zip(tagger.tag(test[:10]), loaded.tag(test[:10])):
        assert a.labels == b.labels
        np.testing.assert_allclose(a.probabilities, b.probabilities, rtol=1e-5, atol=1e-7)
    meta_path = tmp_path / "model" / "tagger.json"  # a config that does not match the arrays
    meta = json.loads(meta_path.read_text())
    meta["config"]["model"]["num_random_features"] = 32
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ModelFormatError):
        Tagger.load(tmp_path / "model")
