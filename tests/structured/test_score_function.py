"""The seed's score-function estimator (seed §4–5.2, `gpseq.structured.estimators`): every trainable
variable gets a gradient, the gradients agree with the pathwise ones in expectation, and the
control variates reduce their variance at the estimator's default sample count."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from helpers.tiny_design import tiny_batch, tiny_data

from gpseq.errors import ConfigError
from gpseq.structured import estimators
from gpseq.structured.model import ModelConfig, build_structured_gp
from gpseq.training.trainer import Trainer


def _model(estimator, K=1, kernel="linear+rbf", seed=0, **overrides):
    """A tiny model whose every trainable (pre-transformed) variable is set to 0.3·N(0, 1): variances
    ≈ softplus(0) ≈ 0.7, so that the score-function variance stays moderate."""
    rng = np.random.default_rng(seed)
    config = ModelConfig(kernel=kernel, num_inducing=3, num_components=K, estimator=estimator, **overrides)
    Z = (rng.random((3, 6)) < 0.5).astype(np.float64)
    Z[:, 0] = 0.0
    model = build_structured_gp(config, 6, 2, Z if config.has_inducing else None, tf.float64)
    for variable in model.trainable_variables:
        variable.assign(0.3 * rng.standard_normal(variable.shape))
    return model


def _gradients(model, batch, reps, num_samples, use_control_variates=True):
    """`reps` independent gradient estimates of the batch's expected log-likelihood `[reps, P]`."""

    @tf.function
    def one(seed):
        with tf.GradientTape() as tape:
            if model.estimator == "score":
                ell = estimators.score_function_ell(model, batch, num_samples, seed, use_control_variates)
            else:
                ell = model.expected_log_likelihood(batch, num_samples, seed)
        grads = tape.gradient(ell, model.trainable_variables)
        assert all(g is not None for g in grads)
        return [tf.reshape(tf.convert_to_tensor(g), [-1]) for g in grads]

    return np.array([np.concatenate([g.numpy() for g in one(tf.constant([rep, 11]))]) for rep in range(reps)])


def _slices(model):
    out, offset = {}, 0
    for variable in model.trainable_variables:
        size = int(np.prod(variable.shape))
        out.setdefault(variable.name.split(":")[0], []).append(slice(offset, offset + size))
        offset += size
    return out


@pytest.mark.parametrize("kernel, K", [("linear", 1), ("linear+rbf", 1), ("linear+rbf", 2), ("paper-rbf", 2)])
def test_every_trainable_variable_gets_a_score_function_gradient(kernel, K):
    data, _ = tiny_data(seed=5, n_seq=3)
    model = _model("score", K, kernel)
    with tf.GradientTape() as tape:
        loss = model.loss(tiny_batch(data), tf.constant([1, 2]))
    for variable, grad in zip(model.trainable_variables, tape.gradient(loss, model.trainable_variables)):
        assert grad is not None, variable.name
        assert np.all(np.isfinite(tf.convert_to_tensor(grad).numpy())), variable.name
    names = {v.name.split(":")[0] for v in model.trainable_variables}
    assert "label_bias" in names and ("mixture_logits" in names) == (K > 1 and kernel != "linear")


def test_the_trainer_refuses_a_variable_the_loss_does_not_reach():
    class Frozen(tf.Module):
        def __init__(self):
            super().__init__()
            self.used = tf.Variable(1.0, name="used")
            self.unused = tf.Variable(1.0, name="left_out")

        def loss(self, batch, seed):
            return tf.reduce_sum(batch) * self.used**2

    with pytest.raises(ConfigError, match="left_out"):
        Trainer(Frozen(), learning_rate=0.1).step(tf.ones([3]))


@pytest.mark.parametrize("K", [1, 2])
def test_score_function_gradients_agree_with_pathwise_in_expectation(K):
    """Every element of every trainable variable (label bias, q(w) mean and variance, kernel
    hyperparameters, q(u) mean and Cholesky factor, mixture weights, pairwise mean and variance):
    the mean of 40 estimates of each estimator (S = 200 pathwise, 1600 score), |difference| < 4.5 standard errors
    (measured from the repetitions; ~100 elements, so P(max |z| > 4.5) ≈ 7e-4 if both are unbiased)."""
    data, _ = tiny_data(seed=5, n_seq=3)
    batch = tiny_batch(data)
    pathwise, score = _model("pathwise", K), _model("score", K)
    assert [v.name for v in pathwise.trainable_variables] == [v.name for v in score.trainable_variables]
    reps = 40
    path = _gradients(pathwise, batch, reps, 200)
    scored = _gradients(score, batch, reps, 1600)
    se = np.sqrt(path.var(0, ddof=1) / reps + scored.var(0, ddof=1) / reps)
    unreached = se == 0  # weights of features the batch lacks: exactly zero under both
    assert np.all(path[:, unreached] == 0) and np.all(scored[:, unreached] == 0)
    z = np.where(unreached, 0.0, path.mean(0) - scored.mean(0)) / np.where(unreached, 1.0, se)
    for name, parts in _slices(score).items():
        elements = np.concatenate([z[part] for part in parts])
        assert np.all(np.abs(elements) < 4.5), (name, elements)
    # the test has power: per variable the standard error is well below the gradient itself
    for name, parts in _slices(score).items():
        if name in ("lengthscales", "mixture_logits"):  # small gradients here; still checked above
            continue
        size = np.linalg.norm(np.concatenate([path.mean(0)[part] for part in parts]))
        noise = np.linalg.norm(np.concatenate([se[part] for part in parts]))
        assert noise < 0.3 * size, (name, noise, size)


def test_control_variates_halve_the_gradient_variance_at_the_default_sample_count():
    """At `DEFAULT_SAMPLES["score"]` draws, the summed per-element variance of the gradient over
    400 seeded repetitions is at least 2× smaller with the control variates than without."""
    data, _ = tiny_data(seed=5, n_seq=3)
    batch = tiny_batch(data)
    model = _model("score", 1)
    S = estimators.DEFAULT_SAMPLES["score"]
    assert model.num_samples == S
    with_cv = _gradients(model, batch, 400, S).var(0, ddof=1)
    without = _gradients(model, batch, 400, S, use_control_variates=False).var(0, ddof=1)
    ratio = without.sum() / with_cv.sum()
    assert ratio >= 2.0, ratio


@pytest.mark.parametrize("conditional", ["full", "diag"])
def test_gaussian_blocks_equal_the_dense_numpy_per_sequence_gaussians(conditional):
    """`Unaries.gaussian_blocks` (the q(f_n) the estimator scores) against the dense NumPy
    computation of seed eqs. 15–18 plus X_n diag(s_j) X_nᵀ (`helpers.tiny_design.unary_gaussians`)."""
    from helpers.tiny_design import tiny_model, unary_gaussians

    data, dense = tiny_data(seed=3)
    model, Z = tiny_model(seed=3, estimator="score", rbf_conditional=conditional)
    mean, cov = (t.numpy() for t in model.unaries.gaussian_blocks(tiny_batch(data)))
    jitter = ModelConfig().jitter
    for b, (means, covs) in enumerate(unary_gaussians(model, Z, dense, data, conditional)):
        T = data.offsets[b + 1] - data.offsets[b]
        np.testing.assert_allclose(mean[0, b, :T], means.T, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(cov[0, b, :, :T, :T], covs + jitter * np.eye(T), rtol=1e-7, atol=1e-12)
        pad = cov.shape[-1] - T  # padded tokens: an identity block, uncorrelated with the sentence
        np.testing.assert_array_equal(cov[0, b, :, T:, T:], np.broadcast_to(np.eye(pad), (2, pad, pad)))
        np.testing.assert_array_equal(cov[0, b, :, :T, T:], 0.0)


def test_covariance_scores_by_contractions_equal_the_per_draw_computation():
    """`covariance_score_gradient` (sums over draws as matrix products) against the per-draw T × T
    scores h_s = ½(α_s α_sᵀ − P) and the split-half coefficients written out draw by draw."""
    rng = np.random.default_rng(0)
    K, B, V, T, S = 2, 3, 2, 4, 6
    values = rng.standard_normal((K, B, S))
    alpha = rng.standard_normal((K, B, V, T, S))
    precision = rng.standard_normal((K, B, V, T, T))
    h = 0.5 * (np.einsum("kbvts,kbvus->kbvtus", alpha, alpha) - precision[..., None])  # [K, B, V, T, T, S]
    L = values[:, :, None, None, None, :]
    halves = [np.arange(S) < S // 2, np.arange(S) >= S // 2]
    coefficient = [(L * h**2)[..., half].sum(-1) / (h**2)[..., half].sum(-1) for half in halves]
    expected = sum(((L - coefficient[1 - i][..., None]) * h)[..., half].sum(-1) for i, half in enumerate(halves)) / S
    got = estimators.covariance_score_gradient(tf.constant(values), tf.constant(alpha), tf.constant(precision))
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10, atol=1e-12)
    plain = estimators.covariance_score_gradient(tf.constant(values), tf.constant(alpha), tf.constant(precision),
                                                 use_control_variates=False)
    np.testing.assert_allclose(plain.numpy(), (L * h).mean(-1), rtol=1e-10, atol=1e-12)
