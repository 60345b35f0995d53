"""Unconstrained L-BFGS in NumPy for the MAP fit (Nocedal & Wright 2006, Alg. 7.4–7.5).

SciPy's L-BFGS-B spends more per call in its bounded-problem machinery than a corpus objective
costs at hundreds of thousands of free weights; the MAP fit has no bounds, so the two-loop
recursion over m pairs (4 m n flops) is all it needs. Line search: backtracking on the Armijo
condition with quadratic interpolation, first trial step 1 (1/‖g‖ on the first iteration); a pair
with sᵀy ≤ ε‖s‖‖y‖ is not stored.
Stopping as SciPy's: relative decrease of f below `ftol`, or max |g| below `gtol`.

With `l1` (a weight per coordinate, or one for all) it is OWL-QN (Andrew & Gao 2007), for
f(x) + Σ_i l1_i |x_i|: the pseudo-gradient (the steepest-descent direction of the non-smooth
objective, 0 where a coordinate at zero should stay there) replaces the gradient, the direction is
kept in the orthant the pseudo-gradient points into, and every trial point is projected onto the
current orthant (coordinates that would cross zero are set to zero), so exact zeros appear; the
curvature pairs use the smooth part's gradients only. The line search then backtracks by halving.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class LbfgsResult:
    x: np.ndarray
    fun: float
    nit: int
    nfev: int
    message: str


def _direction(grad, pairs) -> np.ndarray:
    """−H g by the two-loop recursion over the stored (s, y, 1/sᵀy) pairs (oldest first): inner
    products by NumPy's BLAS (one pass over memory; the default training runs it on one thread,
    `prior_path.train_laplace`), updates by in-place ufuncs into one scratch vector (no n-sized
    temporaries: at large n allocating them costs more than the flops). SciPy's own BLAS is not
    used: it is a second library, outside the thread limit the training sets when it loads later."""
    q = grad.copy()
    scratch = np.empty_like(q)

    def dot(a, b):
        return float(np.dot(a, b))

    def add_scaled(vector, factor):  # q += factor · vector
        q.__iadd__(np.multiply(vector, factor, out=scratch))

    alphas = []
    for s, y, rho in reversed(pairs):
        a = rho * dot(s, q)
        add_scaled(y, -a)
        alphas.append(a)
    if pairs:
        s, y, _ = pairs[-1]
        q *= dot(s, y) / dot(y, y)
    for (s, y, rho), a in zip(pairs, reversed(alphas)):
        add_scaled(s, a - rho * dot(y, q))
    return np.negative(q, out=q)


def pseudo_gradient(x: np.ndarray, grad: np.ndarray, l1: np.ndarray) -> np.ndarray:
    """The pseudo-gradient of f + Σ l1_i |x_i| (OWL-QN; `l1` shaped like `x`): ∇f + l1·sign(x) off
    zero; at zero the one-sided derivative that descends (g + l1 if that is < 0, g − l1 if that is
    > 0), else 0."""
    right, left = grad + l1, grad - l1  # the derivatives on either side of x_i, or at x_i = 0 going up / down
    # at zero: right if < 0, left if > 0, else 0 (left ≤ right, so at most one of the two is nonzero)
    at_zero = np.minimum(right, 0.0)
    at_zero += np.maximum(left, 0.0)
    return np.where(x > 0.0, right, np.where(x < 0.0, left, at_zero))


def minimize_lbfgs(fun: Callable[[np.ndarray], tuple[float, np.ndarray]], x0: np.ndarray, *,
                   max_iterations: int = 100, memory: int = 6, ftol: float = 1e-7, gtol: float = 1e-6,
                   callback: Callable[[np.ndarray], None] | None = None, max_backtracks: int = 30,
                   armijo: float = 1e-4, l1: "np.ndarray | float | None" = None) -> LbfgsResult:
    """Minimise `fun(x) -> (f, ∇f)` (+ Σ l1_i |x_i| when `l1` is given: OWL-QN) from `x0` by
    L-BFGS with `memory` pairs. `fun` returns the smooth part; the result's `fun` includes the L1 term."""
    x = np.array(x0, dtype=np.float64)
    penalty = None if l1 is None or not np.any(np.asarray(l1)) else \
        np.broadcast_to(np.asarray(l1, dtype=np.float64), x.shape)

    def total(point, smooth):  # the objective, L1 term included
        return smooth if penalty is None else smooth + float(np.add.reduce(penalty * np.abs(point)))

    f_smooth, g = fun(x)
    f = total(x, f_smooth)
    nfev, message = 1, "iteration limit"
    pairs: deque = deque(maxlen=memory)
    nit = 0
    while nit < max_iterations:
        v = g if penalty is None else pseudo_gradient(x, g, penalty)
        if np.max(np.abs(v), initial=0.0) <= gtol:
            message = "gradient below gtol"
            break
        d = _direction(v, pairs)
        if penalty is not None:
            d[d * v >= 0.0] = 0.0  # stay in the orthant of −v
        slope = float(np.dot(v, d))
        if slope >= 0.0:  # not a descent direction (numerical trouble): restart from steepest descent
            pairs.clear()
            d, slope = -v, -float(np.dot(v, v))
        step = 1.0 if pairs else 1.0 / max(np.sqrt(-slope), 1e-12)
        orthant = None if penalty is None else np.where(x != 0.0, np.sign(x), np.sign(-v))
        for _ in range(max_backtracks):
            x_new = x + step * d
            if orthant is not None:
                x_new[np.sign(x_new) != orthant] = 0.0
                decrease_bound = float(np.dot(v, x_new - x))
            else:
                decrease_bound = step * slope
            f_smooth_new, g_new = fun(x_new)
            f_new = total(x_new, f_smooth_new)
            nfev += 1
            if np.isfinite(f_new) and f_new <= f + armijo * decrease_bound:
                break
            if orthant is not None:
                step *= 0.5
                continue
            # minimiser of the quadratic through f, slope and f_new, kept within [0.1, 0.5] · step
            curvature = f_new - f - slope * step if np.isfinite(f_new) else np.inf
            trial = -slope * step * step / (2.0 * curvature) if curvature > 0 else 0.1 * step
            step = min(max(trial, 0.1 * step), 0.5 * step)
        else:
            message = "line search failed"
            break
        s, y = x_new - x, g_new - g
        sy = float(np.dot(s, y))
        if sy > 1e-10 * np.sqrt(float(np.dot(s, s)) * float(np.dot(y, y))):
            pairs.append((s, y, 1.0 / sy))
        decrease = (f - f_new) / max(abs(f), abs(f_new), 1.0)
        x, f, g = x_new, f_new, g_new
        nit += 1
        if callback is not None:
            callback(x)
        if decrease <= ftol:
            message = "relative decrease below ftol"
            break
    return LbfgsResult(x, float(f), nit, nfev, message)
