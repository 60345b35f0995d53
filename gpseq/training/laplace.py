"""The default training of the weight-space linear-chain GP: MAP + diagonal Laplace, prior
variance chosen on held-out data, calibrated predictive.

The tagger's unaries f_j(x) = b_j + w_jᵀx are the GP with the linear kernel in weight space
(DESIGN "The expressiveness trap"), prior w ~ N(0, σ²_g I) for the weights of feature-template
group g, pairwise potentials P ~ N(0, σ²_P I), label biases b ~ N(0, σ²_b I). `fit_laplace`:

1. **MAP** of (b, W, P) by L-BFGS on the full-corpus exact chain log-likelihood plus the Gaussian
   log prior (CRFsuite's objective with an L2 per group), over the (feature, label) pairs seen
   in training (CRFsuite's feature set; the other weights are structural zeros); one sparse
   product X·W and one scaled forward–backward per evaluation;
2. **diagonal Laplace**: q(θ_i) = N(θ̂_i, 1 / (1/σ²_g + F_ii)) with F the Fisher (= Gauss–Newton)
   diagonal of the chain likelihood, free from its marginals: F[f, v] = Σ_t x_tf² p_t(v)(1 − p_t(v))
   (exact when a feature fires at most once in a sequence); for P the bound Σ_t ξ_t(i, j);
3. optionally (`evidence_rounds`, off by default: measured to over-shrink the priors) MacKay's
   evidence fixed point per group, γ_g = Σ_{i∈g} (1 − s_i / σ²_g), σ²_g ← Σ_{i∈g} θ̂_i² / γ_g,
   then back to 1, warm-started.

`train_laplace` (what `Tagger.train` runs) fits one σ² per value of `training.prior_variance_grid`
(warm-started), calibrates each fit's predictive on the dev split carved from the training data
(`gpseq.training.calibration`), keeps the one of least calibrated dev NLL and refits it on
train + dev. The step budget is L-BFGS's, not a number of epochs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import tensorflow as tf

from gpseq.errors import NumericalError
from gpseq.structured.scaled_chain import forward_backward
from gpseq.training.batching import SequenceData, token_batches

@dataclass
class LaplaceReport:
    """What the fit did: prior variance per group, L-BFGS iterations and objective per round."""

    prior_variances: dict[str, float] = field(default_factory=dict)
    iterations: list[int] = field(default_factory=list)
    objective_per_token: list[float] = field(default_factory=list)
    evaluations: int = 0
    free_weights: int = 0


STRUCTURAL_ZERO_VARIANCE = 1e-12  # q(w) variance of the weights fixed at 0 (pairs never seen)


class _ChainObjective:
    """Negative log-likelihood of a corpus under point potentials (b, W, P), its gradient and the
    Fisher diagonal: unaries by one sparse product X W over all tokens, the chain by scaled
    forward–backward over length-sorted padded batches, ∂/∂W = Xᵀ (p − y) by one more product."""

    def __init__(self, model, data: SequenceData, max_tokens: int):
        self.model = model
        dtype = model.dtype
        rows = data.rows.tocoo()
        n_tokens = rows.shape[0]
        order = np.lexsort((rows.col, rows.row))
        indices = np.stack([rows.row[order], rows.col[order]], 1).astype(np.int64)
        self.features = tf.sparse.SparseTensor(indices, tf.constant(rows.data[order], dtype), rows.shape)
        self.features_squared = tf.sparse.map_values(tf.square, self.features)
        self.n_tokens = n_tokens
        self.batches = []
        for ids in token_batches(data.lengths, max_tokens):
            lengths = data.lengths[ids].astype(np.int32)
            T = int(lengths.max())
            position = np.full((len(ids), T), n_tokens, dtype=np.int32)  # n_tokens = a zero row
            steps = np.arange(T)[None, :]
            valid = steps < lengths[:, None]
            position[valid] = (data.offsets[ids][:, None] + steps)[valid]
            labels = np.zeros((len(ids), T), dtype=np.int32)
            labels[valid] = data.label_ids[position[valid]]
            self.batches.append(tuple(tf.constant(a) for a in (position, labels, lengths)))
        self.support = tf.constant(observed_pairs(data, model.num_labels))  # [P] flat ids into [D, V]

        def value_and_grad_support(b, w_support, p):
            nll, g_b, g_w, g_p = self._corpus_value_and_grad(b, self._dense(w_support), p)
            return nll, g_b, self._on_support(g_w), g_p

        def fisher_support(b, w_support, p):
            f_b, f_w, f_p = self._corpus_fisher(b, self._dense(w_support), p)
            return f_b, self._on_support(f_w), f_p

        self._value_and_grad_support = tf.function(value_and_grad_support)
        self._fisher_support = tf.function(fisher_support)

    def _per_batch(self, bias, weights, pairwise):
        """Yields (position [B, T], labels, lengths, marginals [B, T, V], Σξ [V, V], log Z [B], unary)."""
        V = self.model.num_labels
        unary_flat = tf.sparse.sparse_dense_matmul(self.features, weights) + bias  # [N, V]
        unary_flat = tf.concat([unary_flat, tf.zeros([1, V], unary_flat.dtype)], 0)
        for position, labels, lengths in self.batches:
            unary = tf.gather(unary_flat, position)  # [B, T, V]
            marg, pair_sum, log_z = forward_backward(unary, pairwise, lengths)
            yield position, labels, lengths, marg, pair_sum, log_z, unary

    def _corpus_value_and_grad(self, bias, weights, pairwise):
        V = self.model.num_labels
        nll = tf.zeros([], tf.float64)
        g_pair = tf.zeros_like(pairwise)
        resid_parts, position_parts = [], []
        for position, labels, lengths, marg, pair_sum, log_z, unary in self._per_batch(bias, weights, pairwise):
            mask = tf.cast(tf.sequence_mask(lengths, tf.shape(labels)[1]), weights.dtype)
            onehot = tf.one_hot(labels, V, dtype=weights.dtype) * mask[..., None]
            transitions = tf.einsum("bti,btj->ij", onehot[:, :-1], onehot[:, 1:])
            score = tf.reduce_sum(unary * onehot) + tf.reduce_sum(transitions * pairwise)
            nll += tf.reduce_sum(tf.cast(log_z, tf.float64)) - tf.cast(score, tf.float64)
            g_pair += pair_sum - transitions
            resid_parts.append(tf.reshape(marg - onehot, [-1, V]))
            position_parts.append(tf.reshape(position, [-1]))
        resid = tf.math.unsorted_segment_sum(tf.concat(resid_parts, 0), tf.concat(position_parts, 0),
                                             self.n_tokens + 1)[:-1]  # [N, V]
        g_w = tf.sparse.sparse_dense_matmul(self.features, resid, adjoint_a=True)  # [D, V]
        return nll, tf.reduce_sum(resid, 0), g_w, g_pair

    def _corpus_fisher(self, bias, weights, pairwise):
        V = self.model.num_labels
        f_pair = tf.zeros_like(pairwise)
        parts, position_parts = [], []
        for position, labels, lengths, marg, pair_sum, log_z, unary in self._per_batch(bias, weights, pairwise):
            parts.append(tf.reshape(marg * (1.0 - marg), [-1, V]))
            position_parts.append(tf.reshape(position, [-1]))
            f_pair += pair_sum  # Σ_t ξ_t ≥ Σ_t ξ_t (1 − ξ_t): transitions are seen thousands of times
        curvature = tf.math.unsorted_segment_sum(tf.concat(parts, 0), tf.concat(position_parts, 0),
                                                 self.n_tokens + 1)[:-1]
        f_w = tf.sparse.sparse_dense_matmul(self.features_squared, curvature, adjoint_a=True)
        return tf.reduce_sum(curvature, 0), f_w, f_pair

    def _dense(self, w_support):
        """The weights `[D, V]` from their values on the support (0 elsewhere), in the graph."""
        D, V = self.model.num_features, self.model.num_labels
        return tf.reshape(tf.scatter_nd(self.support[:, None], w_support, [D * V]), [D, V])

    def _on_support(self, matrix):
        return tf.gather(tf.reshape(matrix, [-1]), self.support)

    def _arguments(self, b, w_support, p):
        dtype = self.model.dtype.as_numpy_dtype
        return tuple(tf.constant(np.asarray(a, dtype)) for a in (b, w_support, p))

    def value_and_grad(self, b, w_support, p):
        """(−log-likelihood, ∂/∂b [V], ∂/∂w on the support [P], ∂/∂P [V, V]) at the given potentials."""
        nll, g_b, g_w, g_p = self._value_and_grad_support(*self._arguments(b, w_support, p))
        return float(nll), *(t.numpy().astype(np.float64) for t in (g_b, g_w, g_p))

    def fisher(self, b, w_support, p):
        """Fisher diagonals of (b [V], w on the support [P], P [V, V]) at the given potentials."""
        return tuple(t.numpy().astype(np.float64) for t in self._fisher_support(*self._arguments(b, w_support, p)))


def observed_pairs(data: SequenceData, num_labels: int) -> np.ndarray:
    """Flat indices f · V + v `[P]` (sorted) of the (feature, label) pairs that occur in the
    labelled `data`: the weights the MAP fit estimates (CRFsuite's feature set); every other
    weight is structurally 0. Column 0 (padding) never occurs."""
    known = data.label_ids >= 0
    token_of = np.repeat(np.arange(data.rows.shape[0]), np.diff(data.rows.indptr))
    keep = known[token_of]
    flat = data.rows.indices[keep].astype(np.int64) * num_labels + data.label_ids[token_of[keep]]
    return np.unique(flat)


def fit_laplace(
    model,
    data: SequenceData,
    groups: np.ndarray,
    group_names: list[str],
    *,
    prior_variance: float = 1.0,
    pairwise_prior_variance: float = 1.0,
    bias_prior_variance: float = 10.0,
    evidence_rounds: int = 0,
    max_iterations: int = 100,
    refit_iterations: int = 40,
    tolerance: float = 1e-7,
    max_tokens: int = 16384,
    callback: Callable[[int, int, float], None] | None = None,
    objective: "_ChainObjective | None" = None,
) -> LaplaceReport:
    """Fit `model` (a StructuredGP with the weight-space linear part and no inducing points) by
    MAP + diagonal Laplace (+ `evidence_rounds` evidence updates of the per-group prior
    variances), in place. Only the (feature, label) pairs seen in `data` are free weights.

    `groups [D]` gives each feature column's template group (index into `group_names`); the
    label biases and the pairwise potentials are groups of their own. `callback(round, iteration,
    log_posterior_per_token)` after every L-BFGS iteration.
    """
    from scipy.optimize import minimize

    if model.unaries.linear is None or model.unaries.sparse is not None or model.unaries.deep is not None:
        raise NumericalError("the Laplace fit needs the weight-space linear model (kernel 'linear')")
    objective = objective or _ChainObjective(model, data, max_tokens)  # reusable across fits of `data`
    D, V = model.num_features, model.num_labels
    support = objective.support.numpy()  # [P] flat indices into [D, V]
    pair_group = np.asarray(groups, dtype=np.int64)[support // V]  # [P]
    n_groups = len(group_names)
    tokens = max(1, int(data.lengths.sum()))
    sizes = (V, len(support), V * V)
    group_var = np.full(n_groups, float(prior_variance))
    pair_var, bias_var = float(pairwise_prior_variance), float(bias_prior_variance)
    counts = np.bincount(pair_group, minlength=n_groups)
    report = LaplaceReport()
    np_dtype = model.dtype.as_numpy_dtype
    dense = np.zeros(D * V, dtype=np_dtype)

    def unpack(theta):
        b = theta[: sizes[0]]
        w = theta[sizes[0] : sizes[0] + sizes[1]]
        p = theta[sizes[0] + sizes[1] :].reshape(V, V)
        return b, w, p

    def dense_weights(w):
        dense[support] = w
        return dense.reshape(D, V)

    theta = np.concatenate([
        model.unaries.label_bias.numpy().ravel(), model.unaries.linear.q_mu.numpy().ravel()[support],
        model.pairwise.mean.numpy().ravel(),
    ]).astype(np.float64)

    for round_ in range(evidence_rounds + 1):
        precision_w = (1.0 / group_var)[pair_group]  # [P]

        def fun(theta):
            b, w, p = unpack(theta)
            nll, g_b, g_w, g_p = objective.value_and_grad(b, w, p)
            prior = 0.5 * (np.sum(b**2) / bias_var + np.sum(precision_w * w**2) + np.sum(p**2) / pair_var)
            grad = np.concatenate([g_b + b / bias_var, g_w + precision_w * w,
                                   (g_p + p / pair_var).ravel()])
            report.evaluations += 1
            last[0] = (nll + prior) / tokens
            return nll + prior, grad

        iteration, last = [0], [float("nan")]

        def step_done(theta_k):
            iteration[0] += 1
            if callback is not None:
                callback(round_, iteration[0], -last[0])

        budget = max_iterations if round_ == 0 else refit_iterations
        result = minimize(fun, theta, jac=True, method="L-BFGS-B", callback=step_done,
                          options={"maxiter": budget, "ftol": tolerance, "gtol": 1e-6, "maxcor": 6})
        if not np.all(np.isfinite(result.x)):
            raise NumericalError("the MAP fit diverged (non-finite weights)")
        theta = result.x
        report.iterations.append(int(result.nit))
        report.objective_per_token.append(float(result.fun) / tokens)
        b, w, p = unpack(theta)
        f_b, f_w, f_p = objective.fisher(b, w, p)
        s_w = 1.0 / ((1.0 / group_var)[pair_group] + f_w)  # [P]
        s_b = 1.0 / (1.0 / bias_var + f_b)
        s_p = 1.0 / (1.0 / pair_var + f_p)
        if round_ == evidence_rounds:
            break
        # MacKay's fixed point: γ_g = Σ_{i∈g} (1 − s_i/σ²_g) well-determined weights, σ²_g = Σ θ_i² / γ_g
        gamma = np.bincount(pair_group, weights=1.0 - s_w * precision_w, minlength=n_groups)
        squares = np.bincount(pair_group, weights=w**2, minlength=n_groups)
        valid = (counts > 0) & (gamma > 1e-8)
        group_var = np.clip(np.where(valid, squares / np.maximum(gamma, 1e-8), group_var), 1e-4, 1e4)
        pair_var = float(np.clip(np.sum(p**2) / max(np.sum(1.0 - s_p / pair_var), 1e-8), 1e-4, 1e4))
        bias_var = float(np.clip(np.sum(b**2) / max(np.sum(1.0 - s_b / bias_var), 1e-8), 1e-2, 1e4))
    model.unaries.label_bias.assign(b.astype(np_dtype))
    model.unaries.linear.q_mu.assign(dense_weights(w))
    model.pairwise.mean.assign(p.astype(np_dtype))
    variance = np.full(D * V, STRUCTURAL_ZERO_VARIANCE, dtype=np_dtype)
    variance[support] = s_w
    model.unaries.linear.q_variance.assign(variance.reshape(D, V))
    model.pairwise.variance.assign(s_p.astype(np_dtype))
    report.prior_variances = {name: float(v) for name, v, c in zip(group_names, group_var, counts) if c > 0}
    report.prior_variances["<pairwise>"] = pair_var
    report.prior_variances["<bias>"] = bias_var
    report.free_weights = int(len(support))
    return report


def concatenate(first: SequenceData, second: SequenceData) -> SequenceData:
    """The sentences of `first` then those of `second` (both labelled)."""
    import scipy.sparse as sp

    offsets = np.concatenate([first.offsets, first.offsets[-1] + second.offsets[1:]])
    return SequenceData(sp.vstack([first.rows, second.rows], format="csr"), offsets,
                        np.concatenate([first.label_ids, second.label_ids]))


def train_laplace(config, featurizer, num_labels: int, data: SequenceData, dev_data: SequenceData | None, dtype,
                  callbacks=None):
    """The default training of a `TaggerConfig`: build the weight-space model; for each prior
    variance of `training.prior_variance_grid` (warm-started, ascending) fit it by `fit_laplace`
    and calibrate its predictive on `dev_data`; keep the one of least calibrated dev NLL; refit
    it on train + dev. Returns (model, scores)."""
    from gpseq.structured.model import build_structured_gp
    from gpseq.training.calibration import fit_calibration
    from gpseq.training.trainer import Progress

    tcfg, mcfg = config.training, config.model
    tf.random.set_seed(tcfg.seed)
    model = build_structured_gp(mcfg, featurizer.n_features, num_labels, None, dtype)
    groups, names = featurizer.column_groups()
    budget = tcfg.max_steps or tcfg.max_iterations
    refit = max(1, budget // 3)
    has_dev = dev_data is not None and len(dev_data) > 0
    grid = sorted(tcfg.prior_variance_grid or []) if has_dev and tcfg.calibrate else []
    grid = grid or [mcfg.prior_variance]
    total = budget + (len(grid) - 1 + tcfg.evidence_rounds * len(grid)) * refit
    start = time.perf_counter()
    done = [0]

    def progress(round_, iteration, objective):
        done[0] += 1
        for callback in callbacks or []:
            callback(Progress(done[0], total, round_, objective, elapsed_s=time.perf_counter() - start))

    def fit(corpus, prior_variance, iterations, objective=None, evidence_rounds=0):
        return fit_laplace(model, corpus, groups, names, prior_variance=prior_variance,
                           pairwise_prior_variance=mcfg.pairwise_prior_variance, evidence_rounds=evidence_rounds,
                           max_iterations=iterations, refit_iterations=refit, callback=progress, objective=objective)

    objective = _ChainObjective(model, data, 16384)
    iterations, candidates, best = [], {}, None
    for number, prior_variance in enumerate(grid):
        report = fit(data, prior_variance, budget if number == 0 else refit, objective, tcfg.evidence_rounds)
        iterations += report.iterations
        calibration = fit_calibration(model, dev_data) if has_dev and tcfg.calibrate else None
        dev_nll = calibration["dev_token_nll"] if calibration else None
        candidates[str(prior_variance)] = dev_nll
        if best is None or (dev_nll is not None and dev_nll < best[0]):
            best = (dev_nll, prior_variance, model.get_state(), calibration, report)
    dev_nll, prior_variance, state, calibration, report = best
    model.set_state(state)
    scores = {"method": "laplace", "prior_variance": prior_variance, "prior_variances": report.prior_variances,
              "objective_per_token": report.objective_per_token}
    if len(grid) > 1:
        scores["dev_token_nll_by_prior_variance"] = candidates
    if calibration:
        scores["calibration"] = calibration
    if has_dev and tcfg.refit_with_dev:
        # the held-out split has served (prior variance, calibration); the final weights see it too
        clean = np.add.reduceat((dev_data.label_ids < 0).astype(np.int64), dev_data.offsets[:-1]) == 0
        combined = concatenate(data, dev_data.subset(np.flatnonzero(clean)))
        total += refit
        iterations += fit(combined, prior_variance, refit).iterations
        scores["refit_sentences"] = len(combined)
    scores.update(steps=done[0], lbfgs_iterations=iterations)
    for callback in callbacks or []:
        callback(Progress(done[0], total, len(grid), -report.objective_per_token[-1], event="done",
                          dev_score=dev_nll, elapsed_s=time.perf_counter() - start))
    return model, scores
