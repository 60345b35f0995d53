"""The L-BFGS of the default training (gpseq/training/lbfgs.py): the minimiser of an ill-conditioned
quadratic and of Rosenbrock's function, and with an L1 penalty (OWL-QN) soft thresholding and
SciPy's L-BFGS-B on the split formulation."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(params=["one part", "two halves"])
def halves(request, monkeypatch):
    """Every test twice: with the vector work on one thread, and split in two halves run at once
    (what vectors of PARALLEL_MIN coordinates or more get)."""
    if request.param == "two halves":
        monkeypatch.setattr("gpseq.training.lbfgs.PARALLEL_MIN", 2)
    return request.param


def test_lbfgs_reaches_the_minimiser_of_an_ill_conditioned_quadratic_and_of_rosenbrock(halves):
    from gpseq.training.lbfgs import minimize_lbfgs

    rng = np.random.default_rng(8)
    basis, _ = np.linalg.qr(rng.normal(size=(50, 50)))
    hessian = basis @ np.diag(np.logspace(0, 4, 50)) @ basis.T
    target = rng.normal(size=50)
    result = minimize_lbfgs(lambda x: (0.5 * (x - target) @ hessian @ (x - target), hessian @ (x - target)),
                            np.zeros(50), max_iterations=2000, ftol=0.0, gtol=1e-9, memory=10)
    np.testing.assert_allclose(result.x, target, atol=1e-8)  # closed form: H (x − t) = 0

    def rosenbrock(x):
        f = 100.0 * (x[1] - x[0] ** 2) ** 2 + (1.0 - x[0]) ** 2
        return f, np.array([-400.0 * x[0] * (x[1] - x[0] ** 2) - 2.0 * (1.0 - x[0]), 200.0 * (x[1] - x[0] ** 2)])

    start = np.array([-1.2, 1.0])
    result = minimize_lbfgs(rosenbrock, start, max_iterations=500, ftol=0.0, gtol=1e-10)
    np.testing.assert_allclose(result.x, [1.0, 1.0], atol=1e-6)
    assert start.tolist() == [-1.2, 1.0]  # not written to
    # started in the caller's array (`overwrite_x0`): the same iterates, to the bit
    again = minimize_lbfgs(rosenbrock, start.copy(), max_iterations=500, ftol=0.0, gtol=1e-10, overwrite_x0=True)
    assert again.x.tolist() == result.x.tolist() and (again.nit, again.nfev) == (result.nit, result.nfev)


def test_owlqn_matches_soft_thresholding_and_a_bound_constrained_split_formulation(halves):
    """With `l1`, minimize_lbfgs minimises f + Σ l1_i |x_i|: against the closed form (soft
    thresholding) for a separable quadratic, and against SciPy's L-BFGS-B on the split
    formulation x = x⁺ − x⁻, x± ≥ 0 (a different algorithm) for a logistic regression."""
    from scipy.optimize import minimize

    from gpseq.training.lbfgs import minimize_lbfgs

    rng = np.random.default_rng(3)
    h, c = rng.uniform(0.5, 5.0, size=40), rng.normal(scale=2.0, size=40)
    l1 = np.full(40, 1.0)
    l1[:5] = 0.0  # unpenalised coordinates
    result = minimize_lbfgs(lambda x: (0.5 * np.sum(h * (x - c) ** 2), h * (x - c)), np.zeros(40),
                            max_iterations=500, ftol=0.0, gtol=1e-10, l1=l1)
    expected = np.sign(c) * np.maximum(np.abs(c) - l1 / h, 0.0)  # argmin ½h(x−c)² + l1|x|
    np.testing.assert_allclose(result.x, expected, atol=1e-7)
    assert np.sum(result.x == 0.0) == np.sum(expected == 0.0) > 5  # exact zeros, not tiny values
    # the weights given as a function of a slice of the coordinates: the same iterates, to the bit
    again = minimize_lbfgs(lambda x: (0.5 * np.sum(h * (x - c) ** 2), h * (x - c)), np.zeros(40),
                           max_iterations=500, ftol=0.0, gtol=1e-10, l1=lambda part: l1[part].copy())
    assert again.x.tobytes() == result.x.tobytes() and (again.nit, again.fun) == (result.nit, result.fun)

    X = rng.normal(size=(200, 30))
    y = (X[:, :3] @ np.array([2.0, -1.5, 1.0]) + 0.5 * rng.normal(size=200) > 0).astype(float)

    def logistic(w):
        z = X @ w
        p = 1.0 / (1.0 + np.exp(-z))
        return float(np.sum(np.logaddexp(0.0, z) - y * z) + 0.05 * w @ w), X.T @ (p - y) + 0.1 * w

    strength = 4.0
    ours = minimize_lbfgs(logistic, np.zeros(30), max_iterations=1000, ftol=0.0, gtol=1e-9, l1=strength)

    def split(v):
        f, g = logistic(v[:30] - v[30:])
        return f + strength * v.sum(), np.concatenate([g + strength, -g + strength])

    reference = minimize(split, np.zeros(60), jac=True, method="L-BFGS-B", bounds=[(0, None)] * 60,
                         options={"ftol": 1e-15, "gtol": 1e-10, "maxiter": 5000})
    np.testing.assert_allclose(ours.fun, reference.fun, rtol=1e-8)
    np.testing.assert_allclose(ours.x, reference.x[:30] - reference.x[30:], atol=1e-4)
    assert 0 < np.count_nonzero(ours.x) < 30


def test_pseudo_gradient_and_orthant_match_their_one_sided_definitions_coordinate_by_coordinate():
    """OWL-QN's pseudo-gradient at each coordinate from the one-sided derivatives of g_i x + l1_i |x|
    (written out per coordinate, Andrew & Gao 2007, eq. 4), and the orthant of the step along its
    negative: the sign of x off zero, else the sign the step takes."""
    from gpseq.training.lbfgs import pseudo_gradient

    rng = np.random.default_rng(3)
    n = 400
    x = np.where(rng.random(n) < 0.5, 0.0, rng.normal(size=n))
    grad = rng.normal(size=n) * 0.2
    grad[:20] = 0.0
    l1 = np.where(rng.random(n) < 0.1, 0.0, 0.15)
    orthant = np.zeros(n, np.int8)
    v = pseudo_gradient(x, grad, l1, orthant=orthant)
    for i in range(n):
        if x[i] != 0.0:
            expected, side = grad[i] + l1[i] * np.sign(x[i]), np.sign(x[i])
        else:
            right, left = grad[i] + l1[i], grad[i] - l1[i]  # one-sided derivatives at 0
            expected = right if right < 0 else left if left > 0 else 0.0
            side = -np.sign(expected)
        assert v[i] == pytest.approx(expected, abs=1e-15), i
        assert orthant[i] == side, i
