"""The calibration of the default training (gpseq/training/calibration.py, `laplace.calibrate`).

The deterministic predictive's potentials are written twice, in NumPy for the TensorFlow-free
training (`training/calibration.calibrated_potentials`) and in TensorFlow for prediction
(`structured/predict.probit_scaled`): both against the formula's meaning and against each other.
The fit recovers a known temperature, is the MAP temperature under its prior on a few tokens, and
gives the same (α, T) over parts of a dev split as over the whole."""

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import expit

from helpers.laplace import sample_problem, scaled_unary_variance

from gpseq.training.batching import SequenceData
from gpseq.training.calibration import fit_calibration
from gpseq.training.chain_objective import NumpyChainObjective
from gpseq.training.laplace import fit_laplace


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


def test_calibration_recovers_a_variance_scale_that_generated_the_labels():
    """Labels drawn from the probit-scaled predictive at α = 0.5, T = 1.2 (one-token sentences: the
    chain is a softmax; variances spread over two decades so α and T are separable): the fit
    finds both (the staged search leaves the low end of the α grid only when it pays), and with
    variance_scale=False T alone absorbs what it can, at a worse NLL."""
    from gpseq.training.calibration import calibrated_potentials, fit_calibration

    rng = np.random.default_rng(3)
    N, V = 20000, 3
    mean = rng.normal(size=(N, V)) * 4.0
    variance = np.exp(rng.uniform(np.log(0.2), np.log(40.0), size=(N, V)))
    logits, _ = calibrated_potentials(mean, variance, np.zeros((V, V)), np.zeros((V, V)), 0.5, 1.2)
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    labels = (probs.cumsum(1) < rng.uniform(size=(N, 1))).sum(1).astype(np.int32)
    offsets = np.arange(N + 1, dtype=np.int64)
    args = (mean, variance, np.zeros((V, V)), np.zeros((V, V)), labels, offsets)
    fitted = fit_calibration(*args)
    assert fitted["variance_scale"] == pytest.approx(0.5, rel=0.25)
    assert fitted["temperature"] == pytest.approx(1.2, rel=0.1)
    temperature_only = fit_calibration(*args, variance_scale=False)
    assert temperature_only["variance_scale"] == pytest.approx(1e-5)
    assert temperature_only["dev_token_nll"] > fitted["dev_token_nll"] + 0.01


@pytest.mark.parametrize("low, high, where", [(-2.0, 2.0, 0.3137), (-2.0, 2.0, -2.0), (-1.0, 0.5, 0.5)])
def test_brent_finds_the_minimum_of_a_unimodal_function(low, high, where):
    """Against the closed-form minimiser of (x − c)² + |x − c| on the interval (clipped to its ends):
    a kink at the minimum, where parabolic steps do not help, in at most golden section's count."""
    from gpseq.training.calibration import brent_minimize

    c = 0.3137 if where == 0.3137 else (-5.0 if where == -2.0 else 3.0)
    calls = []
    value, x = brent_minimize(lambda x: calls.append(x) or (x - c) ** 2 + abs(x - c), low, high, 1e-4)
    assert x == pytest.approx(where, abs=1e-4)
    assert value == pytest.approx((where - c) ** 2 + abs(where - c), abs=1e-3)
    assert all(low <= each <= high for each in calls)
    assert len(calls) <= 2 * int(np.ceil(np.log(1e-4 / (high - low)) / np.log(0.618))) + 3


@pytest.mark.parametrize("seed", range(6))
def test_box_minimiser_finds_the_bounded_minimum_scipy_finds(seed):
    """`minimize_box` on a smooth convex function of three variables (log-sum-exp plus a
    quadratic, the shape of a dev NLL in log α, log T, log β) within a box: at an interior minimum
    and where bounds bind (one variable held by equal bounds in half the cases), its value is
    within 1e-9 of SciPy's L-BFGS-B's (on the same forward-difference gradients) or below it, and
    the KKT conditions hold (no free direction descends, a bound variable's gradient points out)."""
    from scipy.optimize import minimize

    from gpseq.training.calibration import minimize_box

    rng = np.random.default_rng(seed)
    a = rng.normal(size=(5, 3))
    c = rng.normal(size=5)
    shift = rng.normal(size=3) * 2.0

    def f(x):
        return float(np.logaddexp.reduce(a @ x + c) + 0.05 * np.sum((x - shift) ** 2) - shift @ x * 0.1)

    bounds = [(-1.0, 1.0), (-0.5, 2.0), (-3.0, 0.3)] if seed % 2 else [(-20.0, 20.0)] * 3
    if seed >= 4:
        bounds[1] = (0.2, 0.2)
    x0 = np.array([0.1, 0.2, -0.2])
    value, x = minimize_box(f, x0, bounds)
    reference = minimize(f, x0, method="L-BFGS-B", bounds=bounds, options={"maxiter": 200, "eps": 1e-6})
    assert value <= reference.fun + 1e-9
    low, high = np.array(bounds).T
    assert np.all((low <= x) & (x <= high))
    h = 1e-6
    for i in range(3):  # each variable: at a bound with the outward gradient, or stationary
        if low[i] == high[i]:
            continue
        g = (f(x + h * np.eye(3)[i]) - f(x - h * np.eye(3)[i])) / (2 * h)
        if x[i] <= low[i] + 1e-9:
            assert g >= -1e-5
        elif x[i] >= high[i] - 1e-9:
            assert g <= 1e-5
        else:
            assert abs(g) <= 1e-4


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_brent_on_a_smooth_function_matches_scipy_in_few_evaluations(seed):
    """On a smooth unimodal function (a dev NLL's shape in log T: log-sum-exp minus a linear term)
    the minimiser equals SciPy's bounded Brent (`minimize_scalar`) and the closed form, in far
    fewer evaluations than golden section's ≈ 18 at the calibration's tolerance."""
    from scipy.optimize import minimize_scalar

    from gpseq.training.calibration import brent_minimize

    rng = np.random.default_rng(seed)
    slope = rng.uniform(-0.8, 0.8)

    def f(x):
        calls.append(x)
        return np.logaddexp(x, -x) - slope * x  # minimum where tanh(x) = slope

    calls = []
    value, x = brent_minimize(f, -2.0, 2.0, 0.002)
    assert len(calls) <= 10
    assert x == pytest.approx(np.arctanh(slope), abs=0.002)
    assert x == pytest.approx(minimize_scalar(f, bounds=(-2.0, 2.0), method="bounded").x, abs=0.002)


def test_held_out_decodes_match_enumeration_of_every_label_path():
    """`held_out_decodes` against brute force on short chains: each token's most probable label
    under the calibrated predictive (marginals by summing every path's probability) and the
    highest-scoring path of the posterior-mean potentials, in corpus order; gold passes through."""
    import itertools

    from gpseq.training.calibration import calibrated_potentials, held_out_decodes

    rng = np.random.default_rng(5)
    V, lengths = 3, [4, 1, 3]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    N = offsets[-1]
    mean, variance = rng.normal(size=(N, V)) * 2.0, rng.gamma(1.0, 1.0, size=(N, V))
    pair_mean, pair_variance = rng.normal(size=(V, V)) * 1.5, rng.gamma(1.0, 0.5, size=(V, V))
    gold = rng.integers(-1, V, size=N)
    alpha, temperature = 0.3, 1.4
    (out_gold, best, path, out_offsets), = held_out_decodes(
        [(mean, variance, pair_mean, pair_variance, gold, offsets)], alpha, temperature)
    unary, pairwise = calibrated_potentials(mean, variance, pair_mean, pair_variance, alpha, temperature)
    for low, high in zip(offsets[:-1], offsets[1:]):
        paths = list(itertools.product(range(V), repeat=high - low))
        score = lambda y, u, p: sum(u[low + t, y[t]] for t in range(len(y))) + sum(  # noqa: E731
            p[y[t], y[t + 1]] for t in range(len(y) - 1))
        weights = np.exp([score(y, unary, pairwise) for y in paths])
        marginals = np.zeros((high - low, V))
        for y, w in zip(paths, weights):
            marginals[np.arange(high - low), list(y)] += w
        assert list(best[low:high]) == list(marginals.argmax(1))
        viterbi = max(paths, key=lambda y: score(y, mean, pair_mean))
        assert list(path[low:high]) == list(viterbi)
    assert np.array_equal(out_gold, gold) and np.array_equal(out_offsets, offsets)


def test_calibration_recovers_a_known_temperature():
    """Labels drawn from softmax(u / 2); a model holding the potentials u (no variance) must fit T ≈ 2."""
    rng = np.random.default_rng(4)
    V, D, N = 4, 40, 6000
    w = rng.normal(size=(D, V)) * 3.0
    features = rng.integers(1, D, size=N)
    logits = w[features] / 2.0
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    labels = np.array([rng.choice(V, p=row) for row in probs], np.int32)
    data = SequenceData(sp.csr_matrix((np.ones(N), (np.arange(N), features)), shape=(N, D)),
                        np.arange(N + 1, dtype=np.int64), labels)  # one-token sequences: the chain is a softmax
    fitted = fit_calibration(w[features], np.zeros((N, V)), np.zeros((V, V)), np.zeros((V, V)), labels,
                             data.offsets)
    assert fitted["temperature"] == pytest.approx(2.0, rel=0.06)
    assert fitted["dev_token_nll"] < fitted["dev_token_nll_uncalibrated"]


def test_calibration_on_a_few_tokens_is_the_map_temperature_under_its_prior():
    """With 12 one-token sentences the fitted T minimises Σ NLL + (log T)² / (2 s²) (grid reference)."""
    from gpseq.training.calibration import LOG_TEMPERATURE_SCALE

    rng = np.random.default_rng(9)
    V, N = 3, 12
    logits = rng.normal(size=(N, V)) * 3.0
    labels = logits.argmax(1).astype(np.int32)  # all right: the dev NLL alone would push T → 0
    offsets = np.arange(N + 1, dtype=np.int64)
    fitted = fit_calibration(logits, np.zeros((N, V)), np.zeros((V, V)), np.zeros((V, V)), labels, offsets)
    grid = np.linspace(-2.0, 2.0, 4001)
    log_p = lambda log_t: logits / np.exp(log_t) - np.logaddexp.reduce(logits / np.exp(log_t), axis=1, keepdims=True)
    totals = [-log_p(g)[np.arange(N), labels].sum() + 0.5 * (g / LOG_TEMPERATURE_SCALE) ** 2 for g in grid]
    assert np.log(fitted["temperature"]) == pytest.approx(grid[int(np.argmin(totals))], abs=2e-3)
    assert 0.2 < fitted["temperature"] < 1.0  # sharpened, but not to the bound


def test_calibration_over_parts_is_calibration_of_their_union():
    """fit_calibration_parts pools the held-out NLL: parts that share their potentials give the
    fit of the concatenated corpus."""
    from gpseq.training.calibration import fit_calibration_parts

    rng = np.random.default_rng(2)
    V = 3
    lengths = rng.integers(1, 6, size=30)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    mean = rng.normal(size=(offsets[-1], V)) * 2.0
    variance = rng.uniform(0.1, 3.0, size=mean.shape)
    pair_mean, pair_variance = rng.normal(size=(V, V)), rng.uniform(0.1, 1.0, size=(V, V))
    labels = rng.integers(V, size=offsets[-1]).astype(np.int32)
    whole = fit_calibration(mean, variance, pair_mean, pair_variance, labels, offsets)
    cut = offsets[12]
    parts = [(mean[:cut], variance[:cut], pair_mean, pair_variance, labels[:cut], offsets[:13]),
             (mean[cut:], variance[cut:], pair_mean, pair_variance, labels[cut:], offsets[12:] - cut)]
    pooled = fit_calibration_parts(parts)
    for key in ("variance_scale", "temperature", "dev_token_nll"):
        assert pooled[key] == pytest.approx(whole[key], rel=1e-6)


def test_calibration_in_parts_equals_calibration_on_the_whole_dev_split(monkeypatch):
    """`calibrate` runs the dev split in parts of `CHUNK_TOKENS` tokens: the same (α, T) and NLL."""
    import gpseq.training.chain_objective as chain_objective
    from gpseq.training.laplace import calibrate

    sentences, featurizer, labels, data_of = sample_problem()
    groups, names = featurizer.column_groups()
    fit = fit_laplace(NumpyChainObjective(data_of(sentences[:36]), len(labels)), groups, names, max_iterations=30)
    dev = data_of(sentences[36:])
    whole = calibrate(fit, dev)
    monkeypatch.setattr(chain_objective, "CHUNK_TOKENS", 40)
    assert len(chain_objective.chunk_bounds(dev.offsets, 40)) > 3
    parts = calibrate(fit, dev)
    assert parts.keys() == whole.keys()
    for key in whole:
        assert parts[key] == pytest.approx(whole[key], rel=1e-9)


def test_calibration_reports_each_dev_sentence_nll_at_the_fitted_temperature():
    from gpseq.training.laplace import calibrate

    sentences, featurizer, labels, data_of = sample_problem()
    groups, names = featurizer.column_groups()
    fit = fit_laplace(NumpyChainObjective(data_of(sentences[:36]), len(labels)), groups, names, max_iterations=30)
    dev = data_of(sentences[36:])
    fitted = calibrate(fit, dev, variance_scale=False, sentences=True)
    assert fitted["dev_tokens"] == dev.n_tokens and len(fitted["dev_sentence_nll"]) == len(dev)
    assert fitted["dev_sentence_nll"].sum() / dev.n_tokens == pytest.approx(fitted["dev_token_nll"], rel=1e-10)
    # each sentence's NLL by itself: the same predictive on that sentence alone
    one = dev.subset(np.array([3]))
    alone = calibrate(fit, one, variance_scale=False, sentences=True)
    from gpseq.training.calibration import calibrated_potentials
    from gpseq.structured.numpy_chain import TimeMajor

    mean = fit.unary_moments(one.rows)[0]
    unary, pairwise = calibrated_potentials(mean, scaled_unary_variance(fit, one.rows, 1e-5, 1e-5) / 1e-5,
                                            fit.pairwise, fit.pairwise_variance, 1e-5, fitted["temperature"])
    marg, _, _ = TimeMajor(one.offsets).forward_backward(unary, pairwise, pairs=False)
    expected = -np.log(marg[np.arange(one.n_tokens), one.label_ids]).sum()
    assert fitted["dev_sentence_nll"][3] == pytest.approx(expected, rel=1e-9)
    assert alone["dev_sentence_nll"].shape == (1,)
