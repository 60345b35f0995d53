"""Unconstrained L-BFGS in NumPy for the MAP fit (Nocedal & Wright 2006, Alg. 7.4–7.5).

SciPy's L-BFGS-B spends ≈ 140 ms per call in its bounded-problem machinery at n = 500 k free
weights (measured with SciPy 1.17 here: more than the whole corpus objective on CoNLL-2000); the
MAP fit has no bounds, so the two-loop recursion over m pairs (4 m n flops, a few ms) is all it
needs. Line search: backtracking on the Armijo condition with quadratic interpolation, first
trial step 1 (1/‖g‖ on the first iteration); a pair with sᵀy ≤ ε‖s‖‖y‖ is not stored.
Stopping as SciPy's: relative decrease of f below `ftol`, or max |g| below `gtol`.
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
    """−H g by the two-loop recursion over the stored (s, y, 1/sᵀy) pairs (oldest first), with
    in-place ufuncs into one scratch vector: no n-sized temporaries (at n ≈ 10⁶ allocating them
    costs more than the flops) and no multi-threaded BLAS level-1 calls (slower than one core here
    when the other core is busy)."""
    q = grad.copy()
    scratch = np.empty_like(q)

    def dot(a, b):
        return float(np.add.reduce(np.multiply(a, b, out=scratch)))

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


def minimize_lbfgs(fun: Callable[[np.ndarray], tuple[float, np.ndarray]], x0: np.ndarray, *,
                   max_iterations: int = 100, memory: int = 6, ftol: float = 1e-7, gtol: float = 1e-6,
                   callback: Callable[[np.ndarray], None] | None = None, max_backtracks: int = 30,
                   armijo: float = 1e-4) -> LbfgsResult:
    """Minimise `fun(x) -> (f, ∇f)` from `x0` by L-BFGS with `memory` pairs."""
    x = np.array(x0, dtype=np.float64)
    f, g = fun(x)
    nfev, message = 1, "iteration limit"
    pairs: deque = deque(maxlen=memory)
    nit = 0
    while nit < max_iterations:
        if np.max(np.abs(g), initial=0.0) <= gtol:
            message = "gradient below gtol"
            break
        d = _direction(g, pairs)
        slope = float(np.add.reduce(g * d))
        if slope >= 0.0:  # not a descent direction (numerical trouble): restart from steepest descent
            pairs.clear()
            d, slope = -g, -float(np.add.reduce(g * g))
        step = 1.0 if pairs else 1.0 / max(np.sqrt(-slope), 1e-12)
        for _ in range(max_backtracks):
            x_new = x + step * d
            f_new, g_new = fun(x_new)
            nfev += 1
            if np.isfinite(f_new) and f_new <= f + armijo * step * slope:
                break
            # minimiser of the quadratic through f, slope and f_new, kept within [0.1, 0.5] · step
            curvature = f_new - f - slope * step if np.isfinite(f_new) else np.inf
            trial = -slope * step * step / (2.0 * curvature) if curvature > 0 else 0.1 * step
            step = min(max(trial, 0.1 * step), 0.5 * step)
        else:
            message = "line search failed"
            break
        s, y = x_new - x, g_new - g
        sy = float(np.add.reduce(s * y))
        if sy > 1e-10 * np.sqrt(float(np.add.reduce(s * s)) * float(np.add.reduce(y * y))):
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
