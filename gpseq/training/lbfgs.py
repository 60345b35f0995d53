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

Its vector work (n-sized: the pseudo-gradient, the two-loop recursion, trial points, new pairs) is
memory-bound and runs between the objective's evaluations on one thread; from PARALLEL_MIN
coordinates each step runs on the two halves of the coordinates at once, one on a worker thread
(NumPy releases the GIL in its loops), each step's passes fused over its half, with one join per
inner product. Sums of the halves' partial inner products differ from whole ones by rounding only.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np

PARALLEL_MIN = 1 << 17  # coordinates from which the vector work runs on two threads
_WORKER: list = []


@dataclass
class LbfgsResult:
    x: np.ndarray
    fun: float
    nit: int
    nfev: int
    message: str


class _Halves:
    """The coordinates as one part, or (from PARALLEL_MIN) two halves whose work runs at once."""

    def __init__(self, n: int):
        self.parts = [slice(0, n // 2), slice(n // 2, n)] if n >= PARALLEL_MIN else [slice(0, n)]

    def run(self, work: Callable) -> list:
        """[work(part) for each part], the first part on this thread while a worker does the second."""
        if len(self.parts) == 1:
            return [work(self.parts[0])]
        if not _WORKER:
            _WORKER.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpseq-lbfgs"))
        other = _WORKER[0].submit(work, self.parts[1])
        mine = work(self.parts[0])
        return [mine, other.result()]

    def sum(self, work: Callable) -> float:
        return float(sum(self.run(work)))


def _dot(a, b) -> float:  # NumPy's BLAS: one pass over memory (the training runs it on one thread)
    return float(np.dot(a, b))


def _direction(v, pairs, halves: _Halves, q, scratch) -> None:
    """q = −H v by the two-loop recursion over the stored (s, y, 1/sᵀy, sᵀy/yᵀy) pairs (oldest
    first), with updates in place (no n-sized temporaries: at large n allocating them costs more
    than the flops). Each step's update and the next inner product are one pass per half."""
    m = len(pairs)
    if m == 0:
        halves.run(lambda p: np.negative(v[p], out=q[p]))
        return
    alphas = [0.0] * m

    def first_loop(i, factor, p):  # q −= factor · y_(i+1) (the copy of v at the start), then s_i · q
        if i == m - 1:
            np.copyto(q[p], v[p])
        else:
            q[p] -= np.multiply(pairs[i + 1][1][p], factor, out=scratch[p])
        return _dot(pairs[i][0][p], q[p])

    factor = 0.0
    for i in range(m - 1, -1, -1):
        alphas[i] = pairs[i][2] * halves.sum(lambda p: first_loop(i, factor, p))
        factor = alphas[i]

    def second_loop(i, factor, p):  # q −= α₀ y₀ and q ·= γ (at the start) or q += factor · s_(i−1), then y_i · q
        if i == 0:
            q[p] -= np.multiply(pairs[0][1][p], alphas[0], out=scratch[p])
            q[p] *= pairs[-1][3]
        else:
            q[p] += np.multiply(pairs[i - 1][0][p], factor, out=scratch[p])
        return _dot(pairs[i][1][p], q[p])

    for i in range(m):
        factor = alphas[i] - pairs[i][2] * halves.sum(lambda p: second_loop(i, factor, p))

    def last(p):
        q[p] += np.multiply(pairs[-1][0][p], factor, out=scratch[p])
        np.negative(q[p], out=q[p])

    halves.run(last)


def pseudo_gradient(x: np.ndarray, grad: np.ndarray, l1: np.ndarray, out: np.ndarray | None = None,
                    scratch: np.ndarray | None = None, orthant: np.ndarray | None = None) -> np.ndarray:
    """The pseudo-gradient of f + Σ l1_i |x_i| (OWL-QN; `l1` shaped like `x`): ∇f + l1·sign(x) off
    zero; at zero the one-sided derivative that descends (g + l1 if that is < 0, g − l1 if that is
    > 0), else 0, which is g − clip(g, −l1, l1). With `orthant` (int8, shaped like `x`), also the
    orthant a step from x along −pseudo-gradient stays in: sign(x) off zero, −sign(v) at zero.
    Both values are computed everywhere and merged by masked copies (whole-array passes: gathering
    and scattering the coordinates off zero costs several times more); `scratch` is for the merge."""
    out = np.empty_like(grad) if out is None else out
    scratch = np.empty_like(grad) if scratch is None else scratch
    np.clip(grad, -l1, l1, out=out)
    np.subtract(grad, out, out=out)  # the value at zero
    moved = x != 0.0
    np.copysign(l1, x, out=scratch)
    np.add(grad, scratch, out=scratch)  # the value off zero
    np.copyto(out, scratch, where=moved)
    if orthant is not None:
        np.negative(np.sign(out, out=scratch), out=scratch)
        np.copyto(orthant, scratch, casting="unsafe")
        np.copyto(orthant, np.sign(x, out=scratch), where=moved, casting="unsafe")
    return out


def minimize_lbfgs(fun: Callable[[np.ndarray], tuple[float, np.ndarray]], x0: np.ndarray, *,
                   max_iterations: int = 100, memory: int = 6, ftol: float = 1e-7, gtol: float = 1e-6,
                   callback: Callable[[np.ndarray], None] | None = None, max_backtracks: int = 30,
                   armijo: float = 1e-4, l1: "np.ndarray | float | Callable | None" = None,
                   overwrite_x0: bool = False) -> LbfgsResult:
    """Minimise `fun(x) -> (f, ∇f)` (+ Σ l1_i |x_i| when `l1` is given: OWL-QN) from `x0` by
    L-BFGS with `memory` pairs. `fun` returns the smooth part; the result's `fun` includes the L1 term.
    The iterates live in two arrays, the current point and the trial point, swapped at each
    accepted step (`fun` and `callback` must not keep the array they are given); with
    `overwrite_x0` (float64 `x0`) one of them is `x0`'s, which its caller then no longer reads.
    `l1` may be a function of a slice of the coordinates that returns their weights: made where
    read, no x-sized array of them is held through the evaluations of `fun`."""
    x = np.asarray(x0, dtype=np.float64) if overwrite_x0 else np.array(x0, dtype=np.float64)
    del x0  # (with `overwrite_x0`, `x` is the caller's array: reading it after the first step reads a trial point)
    if callable(l1):  # the weights of a slice of the coordinates, made when read
        penalty = l1
    else:
        weights = None if l1 is None or not np.any(np.asarray(l1)) else \
            np.broadcast_to(np.asarray(l1, dtype=np.float64), x.shape)
        penalty = None if weights is None else weights.__getitem__
    halves = _Halves(x.size)
    d = np.empty_like(x)  # the direction; with `l1` the pseudo-gradient and the orthant (signs) too
    v = g_view = None
    if penalty is not None:
        v, orthant = np.empty_like(x), np.empty(x.shape, np.int8)

    def l1_term(point) -> float:
        return 0.0 if penalty is None else halves.sum(lambda p: np.dot(penalty(p), np.abs(point[p])))

    f_smooth, g = fun(x)
    f = f_smooth + l1_term(x)
    nfev, message = 1, "iteration limit"
    pairs: deque = deque()
    nit = 0
    x_new = np.empty_like(x)  # the trial point; after each accepted step, the old point's array
    while nit < max_iterations:
        scratch = np.empty_like(x)  # for this iteration's direction (freed before the evaluations)
        if penalty is None:
            g_view = g
            largest = max(halves.run(lambda p: float(np.max(np.abs(g[p], out=scratch[p]), initial=0.0))))
        else:
            def steepest(p):  # the pseudo-gradient, its largest |·| and the orthant the step stays in
                pseudo_gradient(x[p], g[p], penalty(p), out=v[p], scratch=scratch[p], orthant=orthant[p])
                return float(np.max(np.abs(v[p], out=scratch[p]), initial=0.0))

            largest = max(halves.run(steepest))
            g_view = v
        if largest <= gtol:
            message = "gradient below gtol"
            break
        _direction(g_view, pairs, halves, d, scratch)

        def slope_of(p):
            if penalty is not None:  # stay in the orthant of −v
                d[p][d[p] * g_view[p] >= 0.0] = 0.0
            return _dot(g_view[p], d[p])

        slope = halves.sum(slope_of)
        del scratch
        if slope >= 0.0:  # not a descent direction (numerical trouble): restart from steepest descent
            pairs.clear()
            halves.run(lambda p: np.negative(g_view[p], out=d[p]))
            slope = -halves.sum(lambda p: _dot(g_view[p], g_view[p]))
        step = 1.0 if pairs else 1.0 / max(np.sqrt(-slope), 1e-12)
        for _ in range(max_backtracks):

            def trial(p):  # x + step · d (projected on the orthant), and its decrease bound vᵀ(x_new − x)
                np.multiply(d[p], step, out=x_new[p])
                x_new[p] += x[p]
                if penalty is None:
                    return 0.0
                x_new[p][np.sign(x_new[p]) != orthant[p]] = 0.0
                return _dot(g_view[p], x_new[p] - x[p])

            bound = halves.sum(trial)
            decrease_bound = step * slope if penalty is None else bound
            g_new = None  # a rejected trial's gradient goes before the next evaluation makes its own
            f_smooth_new, g_new = fun(x_new)
            f_new = f_smooth_new + l1_term(x_new)
            nfev += 1
            if np.isfinite(f_new) and f_new <= f + armijo * decrease_bound:
                break
            if penalty is not None:
                step *= 0.5
                continue
            # minimiser of the quadratic through f, slope and f_new, kept within [0.1, 0.5] · step
            curvature = f_new - f - slope * step if np.isfinite(f_new) else np.inf
            trial_step = -slope * step * step / (2.0 * curvature) if curvature > 0 else 0.1 * step
            step = min(max(trial_step, 0.1 * step), 0.5 * step)
        else:
            message = "line search failed"
            break
        # the new pair, in the oldest pair's arrays once `memory` are stored
        s, y = (pairs.popleft()[:2]) if len(pairs) == memory else (np.empty_like(x), np.empty_like(x))

        def new_pair(p):
            np.subtract(x_new[p], x[p], out=s[p])
            np.subtract(g_new[p], g[p], out=y[p])
            return np.array([_dot(s[p], y[p]), _dot(s[p], s[p]), _dot(y[p], y[p])])

        sy, ss, yy = (float(t) for t in sum(halves.run(new_pair)))
        if sy > 1e-10 * np.sqrt(ss * yy):
            pairs.append((s, y, 1.0 / sy, sy / yy))
        decrease = (f - f_new) / max(abs(f), abs(f_new), 1.0)
        x, x_new, f, g = x_new, x, f_new, g_new
        nit += 1
        if callback is not None:
            callback(x)
        if decrease <= ftol:
            message = "relative decrease below ftol"
            break
    return LbfgsResult(x, float(f), nit, nfev, message)
