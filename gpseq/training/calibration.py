"""Calibration of the predictive on held-out data: the posterior-variance scale α and temperature T.

The deterministic predictive (`StructuredGP.predictive_potentials`) replaces each Gaussian
potential N(m, α v) by m / √(1 + π α v / 8) / T. A diagonal posterior over correlated weights
gets the variance of a potential wrong by a factor that depends on how collinear the features
are (several features of one token carry the same evidence), and the ELBO or the Laplace
evidence does not see held-out tokens at all; α and T are fitted by the token NLL of the dev
split carved from the training data (the same information a CRF user's temperature uses), by
L-BFGS on (log α, log T), with a log-normal prior on T (MAP). NumPy only: one forward–backward
over the dev tokens per evaluation (the gradient of two parameters by finite differences).
"""

from __future__ import annotations

import numpy as np

from gpseq.structured.numpy_chain import TimeMajor

PROBIT = np.pi / 8.0
ALPHA_GRID = np.log([1e-5, 1e-3, 1e-1])  # starting points of the variance scale's search
LOG_TEMPERATURE_SCALE = 0.5  # prior std of log T: temperatures fitted on large dev splits stay near 1
# nats per token a larger α must gain over the first search to be taken: less is float noise (e.g. the
# near-zero objectives of held-out parts without a labelled token)
ALPHA_MARGIN = 1e-9


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
    importing `scipy.optimize` is slow (it is imported below only where α pays)."""
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
                          variance_scale: bool = True, sentences: bool = False) -> dict[str, float]:
    """`fit_calibration` of one (α, T) over several held-out parts, each
    `(mean, variance, pair_mean, pair_variance, labels, offsets)` predicted by its own fit (the
    out-of-fold predictions of cross-fitting): the NLL is per token of all parts together.

    The search, in forward–backward passes over the parts (each costs one): T at α = `start[0]`
    (Brent's bounded scalar search on log T); then, with `variance_scale`, the larger α of
    `ALPHA_GRID`, each with a coarse T search; only when one of them is better
    (by more than `ALPHA_MARGIN`) is (α, T) refined jointly by L-BFGS-B from it. The NLL is flat
    in α where α v ≪ 1, so a fitted α at the low end of the grid means the posterior variance does
    not help on these tokens (the usual case): the first search is then the answer.
    `variance_scale=False`: T alone (α stays `start[0]`), e.g. to rank candidate fits cheaply.
    `sentences`: also each held-out sentence's NLL at the fitted (α, T) (`dev_sentence_nll [B]`,
    the parts' sentences in order) and the token count (`dev_tokens`), to compare fits sentence by
    sentence (`gpseq.training.prior_path.significantly_better`)."""
    prepared = []
    for mean, variance, pair_mean, pair_variance, labels, offsets in parts:
        layout = TimeMajor(offsets)
        labels = labels[layout.order]
        token = np.flatnonzero(labels >= 0)
        prepared.append((layout, mean[layout.order], variance[layout.order], pair_mean, pair_variance, token,
                         labels[token]))
    count = max(1, sum(len(part[5]) for part in prepared))

    def token_nlls(x):
        """−log p(gold) of every labelled token, part by part (time-major)."""
        for layout, mean, variance, pair_mean, pair_variance, token, gold in prepared:
            unary, pairwise = calibrated_potentials(mean, variance, pair_mean, pair_variance, *np.exp(x))
            marg, _, _ = layout.forward_backward(unary, pairwise, pairs=False)
            yield -np.log(np.maximum(marg[token, gold], 1e-12))

    def token_nll(x):
        return sum(nll.sum() for nll in token_nlls(x)) / count

    def sentence_nll(x):
        """The NLL summed over each sentence's labelled tokens `[B]`, parts in order, each in corpus order."""
        out = []
        for (layout, *_, token, _), nll in zip(prepared, token_nlls(x)):
            by_layout = np.bincount(layout.sentence_of[token], weights=nll, minlength=len(layout.sentences))
            corpus = np.empty_like(by_layout)
            corpus[layout.sentences] = by_layout
            out.append(corpus)
        return np.concatenate(out)

    def objective(x):  # per token: dev NLL + the prior on log T
        return token_nll(x) + 0.5 * (x[1] / log_temperature_scale) ** 2 / count

    def best_temperature(log_alpha, window, xatol):
        """(objective, x) at the best log T for this log α within `window` of log T."""
        value, log_t = brent_minimize(lambda log_t: objective(np.array([log_alpha, log_t])), *window, xatol)
        return value, np.array([log_alpha, log_t])

    before = token_nll(np.zeros(2))
    log_alpha = float(np.clip(np.log(start[0]), *bounds[0]))
    value, x = best_temperature(log_alpha, bounds[1], 0.002)
    if variance_scale:
        window = (max(bounds[1][0], x[1] - 0.7), min(bounds[1][1], x[1] + 0.3))  # α > 0 shrinks: T ≤ the first
        probes = [best_temperature(a, window, 0.03) for a in ALPHA_GRID if a > log_alpha + 1.0]
        if probes and min(probes, key=lambda p: p[0])[0] < value - ALPHA_MARGIN:
            from scipy.optimize import minimize  # (slow to import: only where α pays)

            x0 = min(probes, key=lambda p: p[0])[1]
            result = minimize(objective, x0, method="L-BFGS-B", bounds=bounds, options={"maxiter": 50, "eps": 1e-6})
            if result.fun < value - ALPHA_MARGIN:
                value, x = float(result.fun), result.x
    alpha, temperature = np.exp(x)
    fitted = {"variance_scale": float(alpha), "temperature": float(temperature),
              "dev_token_nll_uncalibrated": float(before), "dev_token_nll": float(token_nll(x))}
    if sentences:
        fitted.update(dev_sentence_nll=sentence_nll(x), dev_tokens=count)
    return fitted


def held_out_decodes(parts, alpha: float, temperature: float) -> list[tuple[np.ndarray, ...]]:
    """What each decoder returns on held-out parts (`fit_calibration_parts`'s) under the predictive
    at (α, T), to choose the model's decoder by a held-out score: per part (gold labels, each
    token's most probable label, the Viterbi path of the posterior-mean potentials, offsets), in
    corpus order (`[N]` each; a negative gold id: unknown or unlabelled)."""
    from gpseq.structured.numpy_chain import viterbi

    out = []
    for mean, variance, pair_mean, pair_variance, labels, offsets in parts:
        layout = TimeMajor(offsets)
        unary, pairwise = calibrated_potentials(mean[layout.order], variance[layout.order], pair_mean,
                                                pair_variance, alpha, temperature)
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
