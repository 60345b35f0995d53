"""Trainer: Adam and Adam + natural gradients fit an SVGP; non-finite losses raise NumericalError."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from gpseq.errors import NumericalError
from gpseq.gp.kernels import RBF
from gpseq.gp.likelihoods import Gaussian
from gpseq.gp.models import SGPR, SVGP
from gpseq.gp.trainer import Trainer


def _data():
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, size=(200, 1))
    return X, np.sin(2 * X) + 0.1 * rng.normal(size=X.shape)


def _batches(X, Y, size=50):
    return tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(200, seed=1).batch(size)


def test_natgrad_plus_adam_approaches_the_collapsed_bound():
    X, Y = _data()
    Z = np.linspace(-3, 3, 12)[:, None]
    model = SVGP(RBF(1.0, 0.7), Gaussian(0.05), Z, num_data=200)
    seen = []
    trainer = Trainer(model, learning_rate=0.0, natgrad_gamma=0.5)  # hyperparameters fixed: q(u) only
    losses = trainer.fit(_batches(X, Y), max_steps=40, callbacks=[lambda step, loss: seen.append(step)])
    assert len(losses) == 40 and seen == list(range(1, 41))
    bound = float(SGPR(RBF(1.0, 0.7), (X, Y), Z, noise_variance=0.05).elbo())
    elbo = float(model.elbo((X, Y)))
    assert elbo <= bound + 1e-6 and bound - elbo < 0.02 * abs(bound)


def test_adam_decreases_the_loss_and_learns_hyperparameters():
    X, Y = _data()
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = SVGP(RBF(1.0, 2.0), Gaussian(1.0), np.linspace(-3, 3, 10)[:, None], num_data=200)
    trainer = Trainer(model, learning_rate=0.05, strategy=strategy)
    start = float(model.loss((X, Y)))
    trainer.fit([(X[:100], Y[:100]), (X[100:], Y[100:])], max_steps=150)
    assert float(model.loss((X, Y))) < start - 100
    assert float(tf.convert_to_tensor(model.likelihood.variance)) < 0.3


def test_non_finite_loss_raises_numerical_error():
    X, Y = _data()
    model = SVGP(RBF(1.0, 1.0), Gaussian(0.1), np.linspace(-3, 3, 5)[:, None])
    with pytest.raises(NumericalError):
        Trainer(model).step((X, Y * np.nan))
