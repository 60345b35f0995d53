"""The fit of the default training of the weight-space linear-chain GP: MAP + diagonal Laplace.

The tagger's unaries f_j(x) = b_j + w_jᵀx are the GP with the linear kernel in weight space
(DESIGN "The expressiveness trap"), prior w ~ N(0, σ²_g I) for the weights of feature-template
group g, pairwise potentials P ~ N(0, σ²_P I), label biases b ~ N(0, σ²_b I). `fit_laplace`:

1. **MAP** of (b, W, P) by L-BFGS (`gpseq.training.lbfgs`) on the full-corpus exact chain
   log-likelihood plus the Gaussian log prior (CRFsuite's objective with an L2 per group), over
   the (feature, label) pairs seen in training (CRFsuite's feature set; the other weights are
   structural zeros); one sparse product X·W and one scaled forward–backward per evaluation, in
   NumPy (`gpseq.training.chain_objective`: no TensorFlow in the default training); a fit started
   from another fit (the prior walk, the refit) runs in coordinates scaled by that fit's Fisher
   diagonal plus the prior precision, where the raw curvature spans the features' counts;
2. **diagonal Laplace**: q(θ_i) = N(θ̂_i, 1 / (1/σ²_g + F_ii)) with F the Fisher (= Gauss–Newton)
   diagonal of the chain likelihood, free from its marginals: F[f, v] = Σ_t x_tf² p_t(v)(1 − p_t(v))
   (exact when a feature fires at most once in a sequence); for P the bound Σ_t ξ_t(i, j);
3. optionally (`evidence_rounds`, off by default: it over-shrinks the priors) MacKay's
   evidence fixed point per group, γ_g = Σ_{i∈g} (1 − s_i / σ²_g), σ²_g ← Σ_{i∈g} θ̂_i² / γ_g,
   then back to 1, warm-started.

The default training around these fits (prior path, cross-fitting, calibration, refit): `prior_path`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np

from gpseq.errors import NumericalError
from gpseq.features.padded import PAD_ID
from gpseq.features.rows import CsrRows
from gpseq.training.batching import SequenceData
from gpseq.training.calibration import HeldOut, fit_calibration_parts
from gpseq.training.lbfgs import minimize_lbfgs


@dataclass
class LaplaceReport:
    """What the fit did: prior variance per group, L-BFGS iterations and objective per round."""

    prior_variances: dict[str, float] = field(default_factory=dict)
    iterations: list[int] = field(default_factory=list)
    objective_per_token: list[float] = field(default_factory=list)
    evaluations: int = 0
    free_weights: int = 0
    nonzero_weights: int = 0


STRUCTURAL_ZERO_VARIANCE = 1e-12  # q(w) variance of the weights fixed at 0 (pairs never seen)


class PredictiveParts(NamedTuple):
    """What a fit's predictive moments of rows X read (`LaplaceFit.moments`)."""

    weights: CsrRows  # W on the support, CSR [D, V]
    delta: CsrRows  # q(W)'s variance minus `off` on the support, CSR [D, V]
    off: np.ndarray  # [D] each feature's weight variance off the support (its prior, or a structural zero)
    seen: np.ndarray  # [D] bool: the features the support has (column 0 never)


class LaplaceFit:
    """q(b, W, P) of a fit: means and diagonal variances; W on the `support` only (flat f·V + v).

    `prior_variance`: σ²_g of each feature's group `[D]` (with `feature_groups [D]`: one per group), the posterior
    variance of every weight off the support (a pair or feature no training token has); None: those are fixed at 0
    (a starting point). `fisher`: the likelihood's Fisher diagonals (b [V], W on the support [P], P [V, V]) at the
    means, which a fit started from this one preconditions with. `weight_variance` None: 1 / (1/σ²_g + F_ii),
    computed when read (a prior walk keeps two or three fits alive: each holds F, not that too)."""

    def __init__(self, num_features: int, bias: np.ndarray, support: np.ndarray, weights: np.ndarray,
                 weight_variance: np.ndarray | None, pairwise: np.ndarray, pairwise_variance: np.ndarray,
                 report: LaplaceReport, prior_variance: np.ndarray | None = None, fisher: tuple | None = None,
                 feature_groups: np.ndarray | None = None):
        if weight_variance is None and (fisher is None or prior_variance is None):
            raise ValueError("a fit without its weight variances needs its Fisher diagonal and prior variances")
        self.num_features, self.bias, self.support, self.weights = num_features, bias, support, weights
        self.pairwise, self.pairwise_variance, self.report, self.fisher = pairwise, pairwise_variance, report, fisher
        self._weight_variance, self._prior_variance, self._feature_groups = \
            weight_variance, prior_variance, feature_groups

    @property
    def prior_variance(self) -> np.ndarray | None:
        """σ²_g of each feature's group `[D]` float64 (None: weights off the support fixed at 0)."""
        if self._feature_groups is None or self._prior_variance is None:
            return self._prior_variance
        return self._prior_variance[self._feature_groups]

    @property
    def has_prior(self) -> bool:
        """Whether the weights off the support have their prior variance (else they are fixed at 0)."""
        return self._prior_variance is not None

    @property
    def weight_variance(self) -> np.ndarray:
        """q(W)'s variances on the support `[P]`."""
        if self._weight_variance is not None:
            return self._weight_variance
        return 1.0 / (1.0 / self.prior_variance[self.support // self.num_labels] + self.fisher[1])

    def feature_prior(self, feature: int) -> float:
        """σ²_g of one feature's group (the prior variance must be known)."""
        groups = self._feature_groups
        return float(self._prior_variance[feature if groups is None else groups[feature]])

    def release(self) -> None:
        """Let go of the weights' arrays (a start a fit has read and nothing reads again: the refit's)."""
        self.weights = self._weight_variance = self.fisher = None

    @property
    def num_labels(self) -> int:
        return len(self.bias)

    def dense(self, values: np.ndarray, fill: float = 0.0, dtype=np.float64) -> np.ndarray:
        """`values` on the support as a `[D, V]` array (`fill` elsewhere)."""
        out = np.full(self.num_features * self.num_labels, fill, dtype=dtype)
        out[self.support] = values
        return out.reshape(self.num_features, self.num_labels)

    def on(self, values: np.ndarray, support: np.ndarray) -> np.ndarray:
        """`values` on this fit's support, read at the flat indices `support` `[P']` (0 where this
        support lacks one), without a dense `[D, V]` array (a large corpus's peak in float64)."""
        own = self.support
        out = np.zeros(len(support), dtype=np.result_type(values, np.float64))
        if len(own):
            at = np.minimum(np.searchsorted(own, support), len(own) - 1)
            hit = own[at] == support
            out[hit] = values[at[hit]]
        return out

    def variance(self, transform=None, dtype=np.float64) -> np.ndarray:
        """q(W)'s variances `[D, V]` (`transform` applied to each), the prior variance σ²_g off the
        support: the weight-space GP's posterior for a weight no data constrained is its prior."""
        transform = transform or (lambda x: x)  # noqa: E731
        prior = self.prior_variance
        if prior is None:
            return self.dense(transform(self.weight_variance), fill=transform(STRUCTURAL_ZERO_VARIANCE), dtype=dtype)
        out = np.repeat(transform(np.asarray(prior, dtype=np.float64)).astype(dtype), self.num_labels)
        out[self.support] = transform(self.weight_variance)
        return out.reshape(self.num_features, self.num_labels)

    def moments(self) -> "PredictiveParts":
        """What the predictive moments of any rows read off this fit (`PredictiveParts`), made once
        for a batch of row sets (`held_out_parts`' dev parts) and not kept: a prior walk's live fits
        would each hold them. Sparse `[D, V]` products cost the support, not D · V."""
        D, V = self.num_features, self.num_labels
        feature = self.support // V
        counts = np.bincount(feature, minlength=D)
        indptr, columns = np.concatenate([[0], np.cumsum(counts)]), (self.support % V).astype(np.int32)
        prior = self.prior_variance
        off = np.full(D, STRUCTURAL_ZERO_VARIANCE) if prior is None else np.asarray(prior, np.float64)

        def on_support(values):  # `values` on the support as CSR [D, V]
            return CsrRows(np.asarray(values, np.float64), columns, indptr, (D, V))

        seen = counts > 0
        seen[PAD_ID] = False
        return PredictiveParts(on_support(self.weights), on_support(self.weight_variance - off[feature]), off, seen)

    @staticmethod
    def _variance(squares, parts: "PredictiveParts") -> np.ndarray:
        """X² s of float64 CSR `squares [N, D]` (X∘X), s = `variance()`, `[N, V]`, from the support
        and the per-feature variance off it without the dense s."""
        return squares.times(parts.delta) + squares.dot(parts.off)[:, None]

    def unary_moments(self, rows) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and variance of the unary potentials of CSR `rows [N, D]`, `[N, V]` each. A
        weight off the support keeps its prior variance (`variance`): a feature this fit never saw,
        and column 0 (the count of the features the vocabulary lacks, `gpseq.features.featurizer`),
        widen a token's potentials by their prior, as the weight-space GP's predictive does."""
        rows, parts = CsrRows.of(rows).astype(np.float64), self.moments()
        return rows.times(parts.weights) + self.bias, self._variance(rows._replace(data=rows.data * rows.data), parts)

    def held_out(self, data: SequenceData, shared: bool = True, parts: "PredictiveParts | None" = None) -> HeldOut:
        """The fit's predictive moments on labelled `data` as calibration's `HeldOut`, with the
        variance of each token's features this fit never saw apart in `unseen [N]` (the same for
        every label), so that calibration scales it by its own β: column 0 (the features the
        vocabulary lacks) and, for a fit on part of the vocabulary's data (a cross-fitting fold),
        the columns of features no token of its data had, which the saved model will only meet
        through column 0. Their k (x₀ = k and one per column for `shared` unseen weights, else x₀²
        and one per column) gives u = k² σ₀² (`shared`) or k σ₀², σ₀² the prior of column 0.
        `parts`: `moments()`, when the caller has them."""
        parts = parts or self.moments()
        rows = CsrRows.of(data.rows).narrowed().astype(np.float64)
        mean = rows.times(parts.weights) + self.bias  # b + X W
        squares = rows._replace(data=rows.data ** 2)
        if not self.has_prior:
            return HeldOut(mean, self._variance(squares, parts), self.pairwise, self.pairwise_variance,
                           data.label_ids, data.offsets)
        unseen = ~parts.seen[squares.indices]
        token = np.repeat(np.arange(squares.shape[0]), np.diff(squares.indptr))[unseen]
        count = np.bincount(token, weights=(rows.data if shared else squares.data)[unseen], minlength=squares.shape[0])
        squares.data[unseen] = 0.0
        prior = self.feature_prior(PAD_ID)
        return HeldOut(mean, self._variance(squares, parts), self.pairwise, self.pairwise_variance, data.label_ids,
                       data.offsets, (count ** 2 if shared else count) * prior)


def fit_laplace(
    objective,
    groups: np.ndarray,
    group_names: list[str],
    *,
    prior_variance: float = 1.0,
    pairwise_prior_variance: float = 1.0,
    bias_prior_variance: float = 10.0,
    l1: float = 0.0,
    evidence_rounds: int = 0,
    max_iterations: int = 100,
    refit_iterations: int = 40,
    tolerance: float = 1e-7,
    start: "LaplaceFit | None" = None,
    release_start: bool = False,
    callback: Callable[[int, int, float], None] | None = None,
) -> LaplaceFit:
    """MAP + diagonal Laplace (+ `evidence_rounds` evidence updates of the per-group prior
    variances) of the weight-space linear chain on the corpus of `objective`
    (`gpseq.training.chain_objective`), warm-started from `start` (a fit on the same support, or
    on a support it contains: a refit on more data). Only the support's (feature, label) pairs are
    free weights. `release_start`: `start`'s arrays are let go of once read (`LaplaceFit.release`),
    for a start nothing reads again.

    `groups [D]` gives each feature column's template group (index into `group_names`); the
    label biases and the pairwise potentials are groups of their own. `callback(round, iteration,
    log_posterior_per_token)` after every L-BFGS iteration.
    """
    D, V = objective.num_features, objective.num_labels
    support = objective.support  # [P] flat indices into [D, V]
    pair_group = np.asarray(groups, dtype=np.int32)[support // V]  # [P]
    n_groups = len(group_names)
    tokens = max(1, int(objective.n_tokens))
    sizes = (V, len(support), V * V)
    group_var = np.full(n_groups, float(prior_variance))
    pair_var, bias_var = float(pairwise_prior_variance), float(bias_prior_variance)
    counts = np.bincount(pair_group, minlength=n_groups)
    pair_group = pair_group if evidence_rounds else None  # read again only by evidence rounds (σ²_g apart)
    report = LaplaceReport()

    def unpack(theta):
        return theta[: sizes[0]], theta[sizes[0] : sizes[0] + sizes[1]], theta[sizes[0] + sizes[1] :].reshape(V, V)

    same_support = start is not None and len(start.support) == len(support) and np.all(start.support == support)

    def on_support(values):  # a start's values on its support, on this objective's (0 elsewhere)
        return values if same_support else start.on(values, support)

    fisher = None
    if start is None:
        theta = np.zeros(sum(sizes))
    else:
        theta = np.concatenate([start.bias, on_support(start.weights), start.pairwise.ravel()], dtype=np.float64)
        if start.fisher is not None:
            fisher = (start.fisher[0], on_support(start.fisher[1]), start.fisher[2])
        if release_start:
            start.release()

    for round_ in range(evidence_rounds + 1):
        inverse = 1.0 / group_var  # one σ² for every group (the default): a scalar precision, not [P]
        precision_w = inverse[0] if inverse.size and np.all(inverse == inverse[0]) else inverse[pair_group]

        def fun(theta):
            b, w, p = unpack(theta)
            nll, g_b, g_w, g_p = objective.value_and_grad(b, w, p)
            scratch = np.square(w)  # W's prior term and gradient through one support-sized buffer
            prior = 0.5 * (np.sum(b**2) / bias_var + np.sum(np.multiply(scratch, precision_w, out=scratch))
                           + np.sum(p**2) / pair_var)
            g_w += np.multiply(precision_w, w, out=scratch)
            del scratch
            grad = np.concatenate([g_b + b / bias_var, g_w, (g_p + p / pair_var).ravel()])
            report.evaluations += 1
            last[0] = (nll + prior) / tokens
            return nll + prior, grad

        iteration, last = [0], [float("nan")]

        def step_done(theta_k):
            iteration[0] += 1
            if callback is not None:
                callback(round_, iteration[0], -last[0])

        budget = max_iterations if round_ == 0 else refit_iterations

        def penalty(part):  # the L1 weights of coordinates `part`: l1 (× scale) on W, 0 on the biases and P
            out, low, high = np.zeros(part.stop - part.start), max(part.start, V), min(part.stop, V + sizes[1])
            if low < high:
                out[low - part.start : high - part.start] = l1 if scale is None else l1 * scale[low:high]
            return out

        # Started where a fit's Fisher diagonal is known, L-BFGS runs in θ / s with s = (F + prior
        # precision)^(−1/2): the objective's diagonal curvature there is ≈ 1 in every coordinate, where
        # raw it spans the feature counts (a bias fires at every token, most words once)
        scale = None if fisher is None else 1.0 / np.sqrt(np.concatenate(
            [fisher[0] + 1.0 / bias_var, fisher[1] + precision_w, np.ravel(fisher[2]) + 1.0 / pair_var]))
        if scale is not None:  # the fit needs only these now (support-sized: not held beside them)
            fisher, theta = None, theta / scale
        result = minimize_lbfgs(fun if scale is None else _scaled(fun, scale), theta,
                                max_iterations=budget, ftol=tolerance, gtol=1e-6, memory=6, callback=step_done,
                                l1=penalty if l1 > 0.0 else None, overwrite_x0=True)  # theta: this fit's own
        if not np.all(np.isfinite(result.x)):
            raise NumericalError("the MAP fit diverged (non-finite weights)")
        theta = result.x if scale is None else result.x * scale
        report.iterations.append(int(result.nit))
        report.objective_per_token.append(float(result.fun) / tokens)
        b, w, p = unpack(theta)
        f_b, f_w, f_p = objective.fisher(b, w, p)
        s_b = 1.0 / (1.0 / bias_var + f_b)
        s_p = 1.0 / (1.0 / pair_var + f_p)
        fisher = (f_b, f_w, f_p)
        if round_ == evidence_rounds:
            break
        s_w = 1.0 / (precision_w + f_w)  # [P]
        # MacKay's fixed point: γ_g = Σ_{i∈g} (1 − s_i/σ²_g) well-determined weights, σ²_g = Σ θ_i² / γ_g
        gamma = np.bincount(pair_group, weights=1.0 - s_w * precision_w, minlength=n_groups)
        squares = np.bincount(pair_group, weights=w**2, minlength=n_groups)
        valid = (counts > 0) & (gamma > 1e-8)
        group_var = np.clip(np.where(valid, squares / np.maximum(gamma, 1e-8), group_var), 1e-4, 1e4)
        pair_var = float(np.clip(np.sum(p**2) / max(np.sum(1.0 - s_p / pair_var), 1e-8), 1e-4, 1e4))
        bias_var = float(np.clip(np.sum(b**2) / max(np.sum(1.0 - s_b / bias_var), 1e-8), 1e-2, 1e4))
    report.prior_variances = {name: float(v) for name, v, c in zip(group_names, group_var, counts) if c > 0}
    report.prior_variances["<pairwise>"] = pair_var
    report.prior_variances["<bias>"] = bias_var
    report.free_weights = int(len(support))
    report.nonzero_weights = int(np.count_nonzero(w))
    # the weights' variances are read off the Fisher diagonal and the group priors (`LaplaceFit`)
    return LaplaceFit(D, b.copy(), support, w.copy(), None, p.copy(), s_p, report, prior_variance=group_var,
                      feature_groups=np.asarray(groups), fisher=fisher)


def _scaled(fun, scale):
    """`fun` of θ = s·z as a function of z: (f(s·z), s·∇f(s·z))."""
    def scaled(z):
        value, grad = fun(z * scale)
        return value, np.multiply(grad, scale, out=grad)
    return scaled


def average_fit(fits: list[LaplaceFit], support: np.ndarray) -> LaplaceFit:
    """The mean of fits of one model on different data, on `support` (the flat [D, V] support of
    the fit on their union, which holds each fit's; 0 where a fit lacks a pair): that fit's start.
    Fisher diagonals, which sum over tokens, are summed over the fits and divided by k − 1: k folds'
    fits each saw k − 1 of the k folds. Support-sized sums, not a dense [D, V] array per fold."""
    k, V = len(fits), fits[0].num_labels
    fisher = None
    if k > 1 and all(fit.fisher is not None for fit in fits):
        share = 1.0 / (k - 1)
        fisher = (share * sum(fit.fisher[0] for fit in fits),
                  share * sum(fit.on(fit.fisher[1], support) for fit in fits),
                  share * sum(fit.fisher[2] for fit in fits))
    return LaplaceFit(fits[0].num_features, sum(fit.bias for fit in fits) / k, support,
                      sum(fit.on(fit.weights, support) for fit in fits) / k, np.zeros(len(support)),
                      sum(fit.pairwise for fit in fits) / k, np.zeros((V, V)), fits[0].report, fisher=fisher)


def held_out_parts(fit: LaplaceFit, dev: SequenceData, shared: bool = True) -> list[HeldOut]:
    """The fit's predictive moments on the labelled `dev` split (`LaplaceFit.held_out`), in parts of
    at most `CHUNK_TOKENS` tokens (the forward–backward's arrays of one part at a time):
    `fit_calibration_parts`'s parts."""
    from gpseq.training.chain_objective import CHUNK_TOKENS, chunk_bounds

    parts = fit.moments()
    return [fit.held_out(dev if (low, high) == (0, len(dev)) else dev.subset(np.arange(low, high)), shared, parts)
            for low, high in chunk_bounds(dev.offsets, CHUNK_TOKENS)]


def calibrate(fit: LaplaceFit, dev: SequenceData, shared: bool = True, **options) -> dict[str, float]:
    """`fit_calibration` of the fit's predictive on the labelled `dev` split (`held_out_parts`)."""
    return fit_calibration_parts(held_out_parts(fit, dev, shared), **options)


def _softplus_inverse(x):
    x = np.asarray(x, dtype=np.float64)
    return x + np.log(-np.expm1(-x))


def model_state(fit: LaplaceFit, *, prior_variance: float, alpha: float, temperature: float,
                unseen_scale: float | None = None, dtype: str = "float32") -> dict[str, np.ndarray]:
    """The arrays of the weight-space `StructuredGP` holding q = `fit` and its calibration, as
    `StructuredGP.get_state` names them (Softplus-constrained variables by their pre-transformed
    values): what `Tagger.save` writes and `StructuredGP.set_state` reads, without TensorFlow."""
    cast = np.dtype(dtype).type
    # the [D, V] arrays made in `dtype` at once (values computed in float64 on the support): on a
    # large corpus a float64 copy of each would be the training's peak
    q_variance = fit.variance(_softplus_inverse, dtype=cast)
    if unseen_scale is not None and fit.has_prior:
        # column 0's variance times β / α: the predictive's α x₀² s₀ is then β x₀² σ² (`calibration`)
        q_variance[PAD_ID] = _softplus_inverse(fit.feature_prior(PAD_ID) * unseen_scale / alpha)
    arrays = {
        "var:label_bias": fit.bias,
        "var:pairwise_mean": fit.pairwise,
        "var:temperature": np.asarray(temperature),
        "var:variance_scale": np.asarray(alpha),
        "var:linear/q_mu": fit.dense(fit.weights, dtype=cast),
        "var:linear/prior_variance/_pretransformed_input": _softplus_inverse(prior_variance),
        "var:linear/q_variance/_pretransformed_input": q_variance,
        "var:pairwise_variance/_pretransformed_input": _softplus_inverse(fit.pairwise_variance),
    }
    return {name: np.asarray(value, dtype=cast) for name, value in arrays.items()}
