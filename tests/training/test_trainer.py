"""Trainer on the GP core: Adam and Adam + natural gradients fit an SVGP, one natural-gradient step
against its closed form on a conjugate Gaussian case, non-finite losses raise NumericalError, steps on
tuples of tensors through the concrete function equal the tf.function's."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from gpseq.errors import NumericalError
from gpseq.gp.kernels import RBF
from gpseq.gp.likelihoods import Gaussian
from gpseq.gp.models import SGPR, SVGP
from gpseq.training.trainer import Trainer


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
    seen, losses = [], []

    def record(progress):
        if progress.event == "step":
            seen.append(progress.step)
            losses.append(progress.loss)

    trainer = Trainer(model, learning_rate=0.0, natgrad_gamma=0.5, callbacks=[record])  # q(u) only
    trainer.fit(_batches(X, Y), max_steps=40)
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


def test_steps_on_tensor_tuples_equal_the_compiled_functions_call():
    # a tuple of eager tensors goes to the concrete function of its shapes, flat (Trainer._run_step):
    # the same losses and variables as through the tf.function (NumPy batches), one concrete function
    # per batch shape, and a non-finite batch still raises without changing a variable
    X, Y = _data()

    def run(as_tensors):
        model = SVGP(RBF(1.0, 1.0), Gaussian(0.5), np.linspace(-3, 3, 6)[:, None], num_data=200)
        trainer = Trainer(model, learning_rate=0.05)
        losses = []
        for start, size in [(0, 50), (50, 50), (100, 30), (130, 50)]:
            batch = (X[start:start + size], Y[start:start + size])
            losses.append(trainer.step(tuple(map(tf.constant, batch)) if as_tensors else batch))
        return trainer, losses

    fast, fast_losses = run(True)
    slow, slow_losses = run(False)
    assert len(fast._concrete) == 2 and not slow._concrete
    np.testing.assert_allclose(fast_losses, slow_losses, rtol=1e-13)
    for a, b in zip(fast.model.trainable_variables, slow.model.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-13)
    before = [v.numpy() for v in fast.model.trainable_variables]
    with pytest.raises(NumericalError):
        fast.step((tf.constant(X[:50]), tf.constant(Y[:50] * np.nan)))
    assert fast.state.step == 4
    for value, variable in zip(before, fast.model.trainable_variables):
        np.testing.assert_array_equal(value, variable.numpy())


def test_a_private_flat_call_with_other_arguments_falls_back_to_the_public_call():
    # `_run_step` uses TF's private ConcreteFunction._call_flat; a TF where it takes other arguments
    # (a TypeError before anything runs) must not break training: the step falls back to the public
    # call for good, with the same losses as the tf.function path
    X, Y = _data()

    class ChangedFlatCall:  # the concrete function as such a TF would have it
        def __init__(self, concrete):
            self.concrete, self.captured_inputs = concrete, concrete.captured_inputs

        def _call_flat(self, *args, **kwargs):
            raise TypeError("_call_flat() takes other arguments in this TF")

        def __call__(self, *args):
            return self.concrete(*args)

    def run(as_tensors):
        model = SVGP(RBF(1.0, 1.0), Gaussian(0.5), np.linspace(-3, 3, 6)[:, None], num_data=200)
        trainer = Trainer(model, learning_rate=0.05)
        losses = []
        for start in (0, 50, 100):
            batch = (X[start:start + 50], Y[start:start + 50])
            losses.append(trainer.step(tuple(map(tf.constant, batch)) if as_tensors else batch))
            if as_tensors and start == 0:  # traced and stepped flat: the next calls meet the changed TF
                assert trainer._flat_calls
                trainer._concrete = {key: ChangedFlatCall(c) for key, c in trainer._concrete.items()}
        return trainer, losses

    fast, fast_losses = run(True)
    slow, slow_losses = run(False)
    assert fast._flat_calls is False
    np.testing.assert_allclose(fast_losses, slow_losses, rtol=1e-13)


def _rbf(A, B, variance, lengthscale):
    return variance * np.exp(-0.5 * ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1) / lengthscale**2)


def _conjugate_case(full_cov, whiten):
    """An SVGP on 30 points with Gaussian noise and its NumPy precision Λ and b of q's Gaussian
    target, Λ = P + AᵀA / σ², b = Aᵀy / σ² (A = K_xz L⁻ᵀ, P = I whitened; A = K_xz K_zz⁻¹, P = K_zz⁻¹ else)."""
    rng = np.random.default_rng(3)
    X = rng.uniform(-3, 3, size=(30, 1))
    Y = np.sin(2 * X) + 0.1 * rng.normal(size=X.shape)
    Z = np.linspace(-3, 3, 6)[:, None]
    noise, jitter = 0.1, 1e-6
    model = SVGP(RBF(1.3, 0.8), Gaussian(noise), Z, num_data=30, full_cov=full_cov, whiten=whiten, jitter=jitter)
    kzz = _rbf(Z, Z, 1.3, 0.8) + jitter * np.eye(6)
    kxz = _rbf(X, Z, 1.3, 0.8)
    if whiten:
        A, prior_precision = np.linalg.solve(np.linalg.cholesky(kzz), kxz.T).T, np.eye(6)
    else:
        A, prior_precision = np.linalg.solve(kzz, kxz.T).T, np.linalg.inv(kzz)
    precision = prior_precision + A.T @ A / noise
    return model, (X, Y), precision, A.T @ Y[:, 0] / noise


@pytest.mark.parametrize("whiten", [True, False])
def test_one_natural_gradient_step_of_size_one_gives_the_exact_posterior(whiten):
    # full batch, conjugate Gaussian likelihood: θ ← θ + ∂ELBO/∂η lands on q(u) = N(Λ⁻¹ b, Λ⁻¹)
    model, batch, precision, b = _conjugate_case(full_cov=True, whiten=whiten)
    model.q.q_mu.assign(np.full((1, 6, 1), 0.4))
    trainer = Trainer(model, learning_rate=0.0, natgrad_gamma=1.0)
    trainer.step(batch)
    covariance = np.linalg.inv(precision)
    np.testing.assert_allclose(model.q.q_mu.numpy()[0, :, 0], covariance @ b, rtol=1e-6, atol=1e-8)
    scale = tf.convert_to_tensor(model.q.q_sqrt).numpy()[0, 0]
    np.testing.assert_allclose(scale @ scale.T, covariance, rtol=1e-6, atol=1e-8)


def test_diagonal_natural_gradient_step_of_size_one_is_a_jacobi_step():
    # q(v) = N(m, diag s): one step with γ = 1 gives s = 1 / diag Λ and m = (b − (Λ − diag Λ) m₀) / diag Λ
    model, batch, precision, b = _conjugate_case(full_cov=False, whiten=True)
    start = np.linspace(-0.5, 0.5, 6)
    model.q.q_mu.assign(start.reshape(1, 6, 1))
    Trainer(model, learning_rate=0.0, natgrad_gamma=1.0).step(batch)
    diagonal = np.diag(precision)
    expected = (b - (precision - np.diag(diagonal)) @ start) / diagonal
    np.testing.assert_allclose(model.q.q_mu.numpy()[0, :, 0], expected, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(tf.convert_to_tensor(model.q.q_sqrt).numpy()[0, :, 0] ** 2, 1.0 / diagonal,
                               rtol=1e-6)


def test_natural_gradients_are_refused_for_a_mixture_q():
    from gpseq.errors import ConfigError

    model = SVGP(RBF(1.0, 1.0), Gaussian(0.1), np.linspace(-3, 3, 5)[:, None], num_components=2)
    with pytest.raises(ConfigError, match="single-Gaussian"):
        Trainer(model, natgrad_gamma=0.5)


class _SeedRecorder(tf.Module):
    """loss(batch, seed) = (w · batch₀)², recording the seed it was given (NaN batches fail the step)."""

    dtype = tf.float64

    def __init__(self):
        super().__init__()
        self.w = tf.Variable(1.0, dtype=tf.float64)
        self.last_seed = tf.Variable([-1, -1], dtype=tf.int32, trainable=False)

    def loss(self, batch, seed):
        self.last_seed.assign(seed)
        return (self.w * batch[0]) ** 2


def test_each_step_draws_from_the_seed_and_its_own_step_number(tmp_path):
    # the stateless noise of step k is seeded by (config.seed, k): through step(), a refused step (not
    # counted), fit() and a resume from a checkpoint
    model = _SeedRecorder()
    trainer = Trainer(model, learning_rate=0.1, seed=7)
    seen = []
    for value in (1.0, 2.0):
        trainer.step(tf.constant([value], tf.float64))
        seen.append(model.last_seed.numpy().tolist())
    with pytest.raises(NumericalError):
        trainer.step(tf.constant([np.nan], tf.float64))
    trainer.step(tf.constant([3.0], tf.float64))
    seen.append(model.last_seed.numpy().tolist())
    assert seen == [[7, 0], [7, 1], [7, 2]] and trainer.state.step == 3

    def record(progress):
        if progress.event == "step":
            seen.append(model.last_seed.numpy().tolist())

    seen.clear()
    first = Trainer(model, learning_rate=0.1, seed=7, callbacks=[record], checkpoint_dir=tmp_path)
    first.fit([tf.constant([1.0], tf.float64)], max_steps=3)
    resumed = Trainer(model, learning_rate=0.1, seed=7, callbacks=[record], checkpoint_dir=tmp_path)
    resumed.fit([tf.constant([1.0], tf.float64)], max_steps=5, resume=True)
    assert seen == [[7, k] for k in range(5)]
