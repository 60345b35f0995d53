"""The deterministic predictive's potentials are written twice, in NumPy for the TensorFlow-free
training (`training/calibration.calibrated_potentials`) and in TensorFlow for prediction
(`structured/predict.probit_scaled`): both against the formula's meaning and against each other."""

import numpy as np
import pytest
from scipy.special import expit


def test_probit_scaling_matches_the_expected_sigmoid_of_a_gaussian():
    """m / √(1 + π v / 8) is MacKay's approximation of E[σ(f)], f ~ N(m, v): checked against
    Gauss–Hermite quadrature of E[σ(f)] (|error| < 0.02 over m, v of a trained tagger's range)."""
    from gpseq.training.calibration import calibrated_potentials

    m, v = np.meshgrid(np.linspace(-6, 6, 25), np.array([0.0, 0.1, 1.0, 4.0, 16.0]))
    nodes, weights = np.polynomial.hermite_e.hermegauss(80)  # ∫ g(x) N(x; 0, 1) dx ≈ Σ w g(x) / √(2π)
    expected = (expit(m[..., None] + np.sqrt(v)[..., None] * nodes) * weights).sum(-1) / np.sqrt(2 * np.pi)
    unary, _ = calibrated_potentials(m, v, np.zeros((1, 1)), np.zeros((1, 1)), alpha=1.0, temperature=1.0)
    assert np.abs(expit(unary) - expected).max() < 0.02
    assert np.allclose(unary[0], m[0])  # no variance, no scaling


@pytest.mark.parametrize("alpha, temperature", [(1.0, 1.0), (1e-3, 1.3), (0.25, 0.7)])
def test_numpy_and_tensorflow_predictive_potentials_agree(alpha, temperature):
    import tensorflow as tf

    from gpseq.structured.predict import probit_scaled
    from gpseq.training.calibration import calibrated_potentials

    rng = np.random.default_rng(0)
    mean, variance = rng.normal(size=(50, 7)) * 3, rng.gamma(1.0, 2.0, size=(50, 7))
    pair_mean, pair_variance = rng.normal(size=(7, 7)), rng.gamma(1.0, 0.5, size=(7, 7))
    unary, pairwise = calibrated_potentials(mean, variance, pair_mean, pair_variance, alpha, temperature)
    as_tf = lambda a: tf.constant(a, tf.float64)  # noqa: E731
    np.testing.assert_allclose(probit_scaled(as_tf(mean), as_tf(variance), alpha, temperature).numpy(), unary,
                               rtol=1e-12)
    np.testing.assert_allclose(probit_scaled(as_tf(pair_mean), as_tf(pair_variance), alpha, temperature).numpy(),
                               pairwise, rtol=1e-12)
