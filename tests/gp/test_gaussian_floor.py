"""The Gaussian likelihood's noise-variance floor: σ² = floor + softplus(stored value) cannot reach 0
(where log N(y; f, σ²) and v / σ² are NaN or infinite), against SciPy's normal density at the floor;
a checkpoint written before the floor (σ² = softplus(stored value)) still restores."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from gpseq._tfp import tfp
from scipy.stats import norm

from gpseq.errors import ConfigError
from gpseq.gp.kernels import RBF
from gpseq.gp.likelihoods import Gaussian
from gpseq.gp.models import SVGP
from gpseq.training.checkpoint import Checkpoints

FLOOR = Gaussian.VARIANCE_FLOOR


def _collapse(likelihood):
    """Drives the stored value where softplus underflows to 0 (what a long run of steps towards an
    interpolating fit does)."""
    (stored,) = likelihood.trainable_variables
    stored.assign(-1e4)


def test_variance_stays_at_the_floor_and_the_expectations_stay_finite():
    lik = Gaussian(0.5)
    _collapse(lik)
    assert float(tf.convert_to_tensor(lik.variance)) == pytest.approx(FLOOR, rel=1e-12)
    mean, var, y = np.array([[0.2], [-1.0]]), np.array([[0.01], [0.0]]), np.array([[0.2005], [-1.0]])
    expected = norm.logpdf(y, mean, np.sqrt(FLOOR)) - 0.5 * var / FLOOR
    got = lik.variational_expectations(tf.constant(mean), tf.constant(var), tf.constant(y)).numpy()
    np.testing.assert_allclose(got, expected[:, 0], rtol=1e-9)
    density = lik.predict_log_density(tf.constant(mean), tf.constant(var), tf.constant(y)).numpy()
    np.testing.assert_allclose(density, norm.logpdf(y, mean, np.sqrt(var + FLOOR))[:, 0], rtol=1e-9)


def test_svgp_loss_and_gradient_are_finite_at_the_floor():
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(20, 1))
    Y = np.sin(X)
    model = SVGP(RBF(1.0, 1.0), Gaussian(0.1), X[::4].copy(), num_data=20)
    _collapse(model.likelihood)
    with tf.GradientTape() as tape:
        loss = -model.elbo((tf.constant(X), tf.constant(Y)))
    grads = tape.gradient(loss, model.trainable_variables)
    assert np.isfinite(float(loss))
    assert all(np.all(np.isfinite(g.numpy())) for g in grads if g is not None)


def test_a_variance_at_or_below_the_floor_is_refused():
    for variance in (0.0, FLOOR, -1.0):
        with pytest.raises(ConfigError, match="floor"):
            Gaussian(variance)
    assert float(tf.convert_to_tensor(Gaussian(1e-8, variance_floor=0.0).variance)) == pytest.approx(1e-8)


class _GaussianBeforeTheFloor(Gaussian):
    """The likelihood as it was stored before the floor: σ² = softplus(stored value)."""

    def __init__(self, variance):
        super().__init__(variance)
        self.variance = tfp.util.TransformedVariable(tf.constant(variance, tf.float64), tfp.bijectors.Softplus(),
                                                     name="variance")


def _svgp(likelihood):
    return SVGP(RBF(1.3, 0.7), likelihood, np.linspace(-2, 2, 4)[:, None], num_data=10)


def test_a_checkpoint_written_before_the_floor_restores(tmp_path):
    old = _svgp(_GaussianBeforeTheFloor(0.37))
    step = tf.Variable(5, dtype=tf.int64)
    Checkpoints(tmp_path, old, tf.keras.optimizers.Adam(), step).save({"step": 5}, None)
    new = _svgp(Gaussian(1.0))
    state, _ = Checkpoints(tmp_path, new, tf.keras.optimizers.Adam(), tf.Variable(0, dtype=tf.int64)).restore()
    assert state["step"] == 5
    assert float(tf.convert_to_tensor(new.likelihood.variance)) == pytest.approx(0.37 + FLOOR, rel=1e-12)
