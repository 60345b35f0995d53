"""GPNet's weight factor (`weight_factor`): a dense square root of V updated by the low-rank
closed-form step against the lower-triangular one re-factorised in O(F³) (the same V, so the same
predictions), its default, and the save format: version 2 records the factor, a version-1 file
(lower triangular, no such key) still loads and predicts as written, a newer version is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from gpseq.errors import ConfigError, ModelFormatError
from gpseq.gp import GPNet, GPNetTrainer
from gpseq.gp.kernels import RBF
from gpseq.gp.likelihoods import Bernoulli, Gaussian


def _data(seed=0, N=80):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, (N, 2))
    return X, np.sin(2 * X[:, :1]) * np.cos(X[:, 1:]) + 0.1 * rng.normal(size=(N, 1))


def _net(X, factor, **settings):
    return GPNet(RBF(1.0, [0.9, 1.3], ard=True), Gaussian(0.05), X, num_data=len(X), num_features=30,
                 num_measurement=12, weight_factor=factor, seed=3, **settings)


def test_default_factor_is_dense_where_the_closed_form_step_applies():
    X, _ = _data()
    assert _net(X, "auto").weight_factor == "dense"
    assert GPNet(RBF(), Bernoulli(), X, num_data=80, num_features=10).weight_factor == "lower"
    assert GPNet(RBF(), Gaussian(), X, num_data=80, num_features=10, full_cov=False).weight_factor == "lower"
    with pytest.raises(ConfigError):
        _net(X, "upper")
    with pytest.raises(ConfigError, match="full_cov"):  # asked for, not silently replaced
        _net(X, "dense", full_cov=False)


def test_dense_and_lower_factor_training_give_the_same_model():
    """40 closed-form steps (minibatches of 16, measurement points and β as the trainer draws them;
    hyperparameters fixed, so only the weight step differs): the dense factor's low-rank updates and
    the lower factor's O(F³) re-factorisation hold the same V, so the two runs agree to rounding —
    predictive mean and variance within 1e-8 (float64, 40 steps). Jitter 1e-12: `safe_cholesky`
    always adds the model's jitter, on the lower path to the F × F inner matrix (V grows by jitter × V
    each step), on the dense path to the M × M one; with the default 1e-6 (and Adam on the kernel
    and noise) the two runs agreed to 2e-6."""
    X, Y = _data(1)
    nets = [_net(X, factor, learn_hyperparameters=False, jitter=1e-12) for factor in ("lower", "dense")]
    batches = [(X[i:i + 16], Y[i:i + 16]) for i in range(0, 80, 16)]
    for net in nets:
        GPNetTrainer(net, learning_rate=0.0, seed=5).fit(batches, max_steps=40)
    Xs = np.random.default_rng(2).uniform(-3, 3, (25, 2))
    (m0, v0), (m1, v1) = (net.predict_f(Xs) for net in nets)
    assert float(tf.reduce_max(tf.abs(v0))) > 1e-3  # not collapsed to nothing
    np.testing.assert_allclose(m1.numpy(), m0.numpy(), atol=1e-8)
    np.testing.assert_allclose(v1.numpy(), v0.numpy(), atol=1e-8)
    L = nets[1].q_sqrt().numpy()[0]
    assert np.abs(np.triu(L, 1)).max() > 1e-3  # the dense factor is no longer triangular


def test_dense_factor_round_trip(tmp_path):
    X, Y = _data(2)
    net = _net(X, "dense")
    GPNetTrainer(net, seed=1).fit([(X, Y)], max_steps=5)
    path = tmp_path / "dense.npz"
    net.save(path)
    with np.load(path, allow_pickle=False) as data:
        config = json.loads(str(data["config"]))
    assert config["format_version"] == 2 and config["weight_factor"] == "dense"
    loaded = GPNet.load(path)
    assert loaded.weight_factor == "dense"
    Xs = np.linspace(-3, 3, 14).reshape(7, 2)
    for a, b in zip(net.predict_y(Xs), loaded.predict_y(Xs)):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-12)


def _version_one_file(path, net):
    """What the version-1 writer put in a file: the same arrays, the config without `weight_factor`."""
    config = net.config()
    del config["weight_factor"]
    config["format_version"] = 1
    arrays = {"state/" + name: value for name, value in net.get_state().items()}
    arrays["config"] = np.asarray(json.dumps(config))
    np.savez(path, **arrays)


def test_version_one_file_loads_with_its_lower_factor(tmp_path):
    """A version-1 file stores the lower factor as a raw array (strict lower part, Softplus⁻¹ of the
    diagonal); it loads as a lower-factor model with the same V: predictive variance computed
    here from the raw array in NumPy."""
    X, Y = _data(3)
    net = _net(X, "lower")
    GPNetTrainer(net, seed=2).fit([(X, Y)], max_steps=5)
    path = tmp_path / "v1.npz"
    _version_one_file(path, net)
    loaded = GPNet.load(path)
    assert loaded.weight_factor == "lower"
    Xs = np.linspace(-3, 3, 14).reshape(7, 2)
    raw = np.load(path)["state/q_sqrt_raw"][0]
    L = np.tril(raw, -1) + np.diag(np.log1p(np.exp(np.diag(raw))))
    phi = loaded.features(Xs).numpy()
    mean, var = loaded.predict_f(Xs)
    np.testing.assert_allclose(var.numpy()[:, 0], np.sum((phi @ L) ** 2, 1), rtol=1e-10)
    np.testing.assert_allclose(mean.numpy(), net.predict_f(Xs)[0].numpy(), rtol=1e-12)
    GPNetTrainer(loaded, seed=2).fit([(X, Y)], max_steps=2)  # and trains on (the O(F³) step)


def test_newer_version_is_refused(tmp_path):
    X, _ = _data(4)
    net = _net(X, "dense")
    path = tmp_path / "new.npz"
    config = dict(net.config(), format_version=3)
    np.savez(path, config=np.asarray(json.dumps(config)),
             **{"state/" + name: value for name, value in net.get_state().items()})
    with pytest.raises(ModelFormatError, match="version 3"):
        GPNet.load(path)
