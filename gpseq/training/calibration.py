"""Calibration of the predictive on held-out data: the posterior-variance scales α, β and temperature T.

The deterministic predictive (`StructuredGP.predictive_potentials`) replaces each Gaussian
potential N(m, v) by m / √(1 + π v / 8) / T. A diagonal posterior over correlated weights gets the
variance of a potential wrong by a factor that depends on how collinear the features are (several
features of one token carry the same evidence), and the ELBO or the Laplace evidence does not see
held-out tokens at all. So the variance is scaled: α times the part from the weights the training
data constrained, β times the part from the token's features the vocabulary lacks (column 0, the
prior variance of weights no data touched: `gpseq.features.featurizer`), fitted by the token NLL
of the dev split carved from the training data (the same information a CRF user's temperature
uses), with a log-normal prior on T (MAP). The default training fits T first, for the point
potentials alone, and then the scales at that T (`temperature`). The model stores β as the ratio
β / α in column 0's variance, so the saved predictive is α v with no third number. NumPy only: one
forward–backward over the dev tokens per evaluation (gradients by finite differences).
"""

from __future__ import annotations

import numpy as np

from typing import NamedTuple

from gpseq.structured.numpy_chain import TimeMajor

PROBIT = np.pi / 8.0
ALPHA_GRID = np.log([1e-5, 1e-3, 1e-1])  # starting points of the variance scales' search (α and β)
LOG_TEMPERATURE_SCALE = 0.5  # prior std of log T: temperatures fitted on large dev splits stay near 1
# nats per token a larger α must gain over the first search to be taken: less is float noise (e.g. the
# near-zero objectives of held-out parts without a labelled token)
ALPHA_MARGIN = 1e-9


class HeldOut(NamedTuple):
    """A fit's predictive moments on held-out sentences: unary `mean`, `variance` `[N, V]` (without
    column 0's part when `unseen` is given), the pairwise `pair_mean`, `pair_variance` `[V, V]`, gold
    `labels [N]` (negative: unknown or unlabelled) and sentence `offsets [B+1]`, in corpus order;
    `unseen [N]`: each token's variance from its features the vocabulary lacks (the same for every
    label), or None where the model does not count them."""

    mean: np.ndarray
    variance: np.ndarray
    pair_mean: np.ndarray
    pair_variance: np.ndarray
    labels: np.ndarray
    offsets: np.ndarray
    unseen: np.ndarray | None = None

    def reordered(self, order: np.ndarray) -> "HeldOut":
        """The tokens' arrays in `order` (e.g. `TimeMajor.order`); the pairwise, labels, offsets kept."""
        return self._replace(mean=self.mean[order], variance=self.variance[order],
                             unseen=None if self.unseen is None else self.unseen[order])

    def potentials(self, alpha: float, beta: float | None, temperature: float):
        """The predictive's point potentials (`calibrated_potentials`) with the unaries' variance
        α v + β u (α v where there is no `unseen` or no β)."""
        if self.unseen is None or beta is None:
            return calibrated_potentials(self.mean, self.variance, self.pair_mean, self.pair_variance, alpha,
                                         temperature)
        variance = alpha * self.variance + beta * self.unseen[:, None]
        return calibrated_potentials(self.mean, variance, self.pair_mean, alpha * self.pair_variance, 1.0,
                                     temperature)


def calibrated_potentials(mean, variance, pair_mean, pair_variance, alpha: float, temperature: float):
    """The predictive's point potentials: m / √(1 + π α v / 8) / T for the unaries and the pairwise."""
    unary = mean / np.sqrt(1.0 + PROBIT * alpha * variance) / temperature
    pairwise = pair_mean / np.sqrt(1.0 + PROBIT * alpha * pair_variance) / temperature
    return unary, pairwise


def brent_minimize(f, low: float, high: float, xatol: float) -> tuple[float, float]:
    """(f(x), x) at the minimum of a unimodal `f` on [low, high], to within about `xatol` in x, by
    Brent's method (Brent 1973, ch. 5): a parabola through the three best points where it steps
    inside the bracket and shrinks it fast enough, a golden-section step otherwise. On the smooth
    dev NLL of log T it takes fewer evaluations (each a forward–backward over the held-out tokens)
    than golden section alone. SciPy's `minimize_scalar(method="bounded")` is the same method, but
    importing `scipy.optimize` is slow and costs memory."""
    ratio = 0.5 * (3.0 - np.sqrt(5.0))  # the golden section's smaller share, 0.382
    a, b = float(low), float(high)
    x = w = v = a + ratio * (b - a)
    fx = fw = fv = f(x)
    step = before = 0.0  # the last step and the one before it
    while True:
        middle = 0.5 * (a + b)
        tol = 1.5e-8 * abs(x) + xatol / 3.0
        if abs(x - middle) <= 2.0 * tol - 0.5 * (b - a):
            return fx, x
        golden = True
        if abs(before) > tol:  # a parabola through (v, fv), (w, fw), (x, fx)
            r = (x - w) * (fx - fv)
            q = (x - v) * (fx - fw)
            p = (x - v) * q - (x - w) * r
            q = 2.0 * (q - r)
            if q > 0.0:
                p = -p
            q = abs(q)
            # accepted if it moves less than half the step before last and lands inside (a, b)
            if abs(p) < abs(0.5 * q * before) and q * (a - x) < p < q * (b - x):
                before, step = step, p / q
                golden = False
                if (x + step) - a < 2.0 * tol or b - (x + step) < 2.0 * tol:
                    step = tol if x < middle else -tol
        if golden:
            before = (a - x) if x >= middle else (b - x)
            step = ratio * before
        u = x + (step if abs(step) >= tol else (tol if step > 0 else -tol))
        fu = f(u)
        if fu <= fx:
            if u >= x:
                a = x
            else:
                b = x
            v, w, x, fv, fw, fx = w, x, u, fw, fx, fu
        else:
            if u < x:
                a = u
            else:
                b = u
            if fu <= fw or w == x:
                v, w, fv, fw = w, u, fw, fu
            elif fu <= fv or v == x or v == w:
                v, fv = u, fu


def minimize_box(fun, x0, bounds, *, max_iterations: int = 50, eps: float = 1e-6, gtol: float = 1e-7,
                 ftol: float = 2.2e-9) -> tuple[float, np.ndarray]:
    """(f(x), x) at a minimum of a smooth `fun` of a few variables within `bounds` ((low, high) per
    variable; low = high holds it) by projected BFGS (Nocedal & Wright 2006, §6.1 and §16.7) on
    forward-difference gradients (step `eps`, backwards at an upper bound): the dense inverse
    Hessian (n is 2 or 3 here), the first step 1/‖g‖ along −g, Armijo backtracking along the
    projected path, a variable at a bound whose gradient points outwards held for the step.
    Stops as SciPy's L-BFGS-B (which would do, but importing `scipy.optimize` costs a training
    tens of MB and a tenth of a second): max |free gradient| ≤ `gtol`, or a relative decrease ≤ `ftol`."""
    low, high = (np.array([bound[i] for bound in bounds], dtype=np.float64) for i in (0, 1))
    x = np.clip(np.asarray(x0, dtype=np.float64), low, high)
    movable = np.flatnonzero(high > low)

    def gradient(x, f):
        g = np.zeros_like(x)
        for i in movable:
            h = eps if x[i] + eps <= high[i] else -eps
            shifted = x.copy()
            shifted[i] += h
            g[i] = (fun(shifted) - f) / h
        return g

    f = fun(x)
    g = gradient(x, f)
    inverse = None  # the inverse Hessian estimate, after the first step
    for _ in range(max_iterations):
        free = (high > low) & ~((x <= low) & (g > 0)) & ~((x >= high) & (g < 0))
        if not free.any() or np.max(np.abs(g[free])) <= gtol:
            break
        d = np.zeros_like(x)
        if inverse is not None:
            d[free] = -inverse[np.ix_(free, free)] @ g[free]
        if inverse is None or g @ d >= 0.0:  # the first step, or not a descent direction: steepest descent
            d[free] = -g[free] / max(np.linalg.norm(g[free]), 1e-12)
        step = 1.0
        for _ in range(30):
            x_new = np.clip(x + step * d, low, high)
            f_new = fun(x_new)
            if f_new <= f + 1e-4 * (g @ (x_new - x)):
                break
            step *= 0.5
        else:
            break
        g_new = gradient(x_new, f_new)
        s, y = x_new - x, g_new - g
        sy = s @ y
        if sy > 1e-10 * np.linalg.norm(s) * np.linalg.norm(y):
            if inverse is None:
                inverse = np.eye(len(x)) * sy / (y @ y)
            rho = 1.0 / sy
            left = np.eye(len(x)) - rho * np.outer(s, y)
            inverse = left @ inverse @ left.T + rho * np.outer(s, s)
        decrease = (f - f_new) / max(abs(f), abs(f_new), 1.0)
        x, f, g = x_new, f_new, g_new
        if decrease <= ftol:
            break
    return float(f), x


def fit_calibration(mean: np.ndarray, variance: np.ndarray, pair_mean: np.ndarray, pair_variance: np.ndarray,
                    labels: np.ndarray, offsets: np.ndarray, **options) -> dict[str, float]:
    """Fit α and T by the token NLL of held-out sentences (`offsets [B+1]` into their tokens;
    unary moments `mean`, `variance` `[N, V]` and gold `labels [N]` in corpus order, −1 = a label
    the model does not know, skipped) plus a prior log T ~ N(0, `log_temperature_scale`²) (MAP):
    negligible on a dev split of thousands of tokens, it keeps a split of a few sentences from
    fitting an extreme T; returns α, T and the dev NLL per token before and after."""
    return fit_calibration_parts([(mean, variance, pair_mean, pair_variance, labels, offsets)], **options)


def fit_calibration_parts(parts, *, bounds=((-12.0, 3.0), (-2.0, 2.0)), start=(1e-5, 1.0),
                          log_temperature_scale: float = LOG_TEMPERATURE_SCALE,
                          variance_scale: bool = True, sentences: bool = False,
                          temperature: float | None = None) -> dict[str, float]:
    """`fit_calibration` of one (α, β, T) over several held-out parts (`HeldOut`, or tuples of its
    fields), each predicted by its own fit (the out-of-fold predictions of cross-fitting): the NLL
    is per token of all parts together. β (`unseen_scale`) is fitted where the parts carry column
    0's variance (`unseen`) and some token has features the vocabulary lacks.

    The search, in forward–backward passes over the parts (each costs one): T at α = β = `start[0]`
    (Brent's bounded scalar search on log T); then, with `variance_scale`, α at each larger value
    of `ALPHA_GRID` (and with β: β alone at each, and both at the middle one), each with a coarse T
    search; only when one of them is better (by more
    than `ALPHA_MARGIN`) are the scales and T refined jointly by `minimize_box` from it. The NLL is flat
    in a scale where its variance is ≪ 1, so a scale at the low end means that part of the
    posterior variance does not help on these tokens.
    `variance_scale=False`: T alone (the scales stay `start[0]`), e.g. to rank candidate fits cheaply.
    `temperature`: T held at this value instead of that first search (e.g. the point potentials'
    own, at α = β ≈ 0, which ranking the fit with `variance_scale=False` already found), and the
    scales fitted alone at it. On held-out data like the training data, T and the scales
    flatten the same potentials and trade off along a ridge of nearly equal NLL; a jointly fitted
    T can fall to 1 while the scales do its work on the unaries only, leaving the transitions as
    sharp as the training text had them. Held, T corrects the point model as a whole (unaries and
    transitions) and the scales add each token's own uncertainty on top of it.
    `sentences`: also each held-out sentence's NLL at the fitted scales and T (`dev_sentence_nll [B]`,
    the parts' sentences in order) and the token count (`dev_tokens`), to compare fits sentence by
    sentence (`gpseq.training.prior_path.significantly_better`)."""
    parts = [HeldOut(*part) for part in parts]
    unseen = all(part.unseen is not None for part in parts) and any(part.unseen.any() for part in parts)
    prepared = []
    for part in parts:
        layout = TimeMajor(part.offsets)
        labels = part.labels[layout.order]
        token = np.flatnonzero(labels >= 0)
        part = part.reordered(layout.order) if unseen else part._replace(unseen=None).reordered(layout.order)
        prepared.append((layout, part, token, labels[token]))
    count = max(1, sum(len(token) for _, _, token, _ in prepared))

    def scales(x):  # x = (log α, log T[, log β])
        alpha, temperature = np.exp(x[:2])
        return alpha, (np.exp(x[2]) if unseen else None), temperature

    def token_nlls(x):
        """−log p(gold) of every labelled token, part by part (time-major)."""
        alpha, beta, temperature = scales(x)
        for layout, part, token, gold in prepared:
            unary, pairwise = part.potentials(alpha, beta, temperature)
            marg, _, _ = layout.forward_backward(unary, pairwise, pairs=False)
            yield -np.log(np.maximum(marg[token, gold], 1e-12))

    def token_nll(x):
        return sum(nll.sum() for nll in token_nlls(x)) / count

    def sentence_nll(x):
        """The NLL summed over each sentence's labelled tokens `[B]`, parts in order, each in corpus order."""
        out = []
        for (layout, _, token, _), nll in zip(prepared, token_nlls(x)):
            by_layout = np.bincount(layout.sentence_of[token], weights=nll, minlength=len(layout.sentences))
            corpus = np.empty_like(by_layout)
            corpus[layout.sentences] = by_layout
            out.append(corpus)
        return np.concatenate(out)

    def objective(x):  # per token: dev NLL + the prior on log T
        return token_nll(x) + 0.5 * (x[1] / log_temperature_scale) ** 2 / count

    def best_temperature(log_scales, window, xatol):
        """(objective, x) at the best log T for these log scales (α, and β) within `window` of log T."""
        point = lambda log_t: np.array([log_scales[0], log_t, *log_scales[1:]])  # noqa: E731
        value, log_t = brent_minimize(lambda log_t: objective(point(log_t)), *window, xatol)
        return value, point(log_t)

    before = token_nll(np.zeros(3 if unseen else 2))
    low = float(np.clip(np.log(start[0]), *bounds[0]))
    first = (low, low) if unseen else (low,)
    if temperature is None:
        value, x = best_temperature(first, bounds[1], 0.002)
        window = (max(bounds[1][0], x[1] - 0.7), min(bounds[1][1], x[1] + 0.3))  # a scale > 0 shrinks: T ≤ the first
    else:  # a window and bounds of one point: Brent returns it, `minimize_box` holds it
        x = np.array([first[0], np.log(temperature), *first[1:]])
        value, window = objective(x), (x[1], x[1])
        bounds = (bounds[0], window)
    if variance_scale:
        larger = [a for a in ALPHA_GRID if a > low + 1.0]
        # each scale alone at each larger value; with unseen features also both at the middle one
        pairs = ([(a, low) for a in larger] + [(low, b) for b in larger] + [(larger[0], larger[0])]
                 if unseen and larger else [(a,) for a in larger])
        probes = [best_temperature(pair, window, 0.03) for pair in pairs]
        if probes and min(probes, key=lambda p: p[0])[0] < value - ALPHA_MARGIN:
            x0 = min(probes, key=lambda p: p[0])[1]
            refined, at = minimize_box(objective, x0, list(bounds) + ([bounds[0]] if unseen else []))
            if refined < value - ALPHA_MARGIN:
                value, x = refined, at
    alpha, beta, temperature = scales(x)
    fitted = {"variance_scale": float(alpha), "temperature": float(temperature),
              "dev_token_nll_uncalibrated": float(before), "dev_token_nll": float(token_nll(x))}
    if unseen:
        fitted["unseen_scale"] = float(beta)
    if sentences:
        fitted.update(dev_sentence_nll=sentence_nll(x), dev_tokens=count)
    return fitted


def held_out_decodes(parts, alpha: float, temperature: float,
                     unseen_scale: float | None = None) -> list[tuple[np.ndarray, ...]]:
    """What each decoder returns on held-out parts (`fit_calibration_parts`'s) under the predictive
    at (α, β = `unseen_scale`, T), to choose the model's decoder by a held-out score: per part (gold labels, each
    token's most probable label, the Viterbi path of the posterior-mean potentials, offsets), in
    corpus order (`[N]` each; a negative gold id: unknown or unlabelled)."""
    from gpseq.structured.numpy_chain import viterbi

    out = []
    for part in parts:
        mean, _, pair_mean, _, labels, offsets, _ = part = HeldOut(*part)
        layout = TimeMajor(offsets)
        unary, pairwise = part.reordered(layout.order).potentials(alpha, unseen_scale, temperature)
        marg, _, _ = layout.forward_backward(unary, pairwise, pairs=False)
        best = np.empty(len(marg), np.int64)
        best[layout.order] = marg.argmax(1)
        lengths = np.diff(offsets)
        sentence = np.repeat(np.arange(len(lengths)), lengths)
        position = np.arange(len(mean)) - offsets[sentence]
        padded = np.zeros((len(lengths), int(lengths.max(initial=0)), mean.shape[1]))
        padded[sentence, position] = mean
        path = viterbi(padded, np.asarray(pair_mean, np.float64), lengths)[sentence, position].astype(np.int64)
        out.append((np.asarray(labels), best, path, np.asarray(offsets)))
    return out
