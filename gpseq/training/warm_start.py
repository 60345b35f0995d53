"""Warm start of the default training from a previous tagger (`Tagger.train(..., init=tagger)`):
its posterior means mapped onto a new featurizer's columns and label set, by feature name and
label, as the `LaplaceFit` the MAP fits start from.

The previous model is given as its parts (`gpseq.training.train.TrainedParts`, or anything with
the same `config`, `featurizer`, `labels`, `scores` and `arrays`: a `Tagger` has them): nothing here
calls the tagger.

A round of active learning adds sentences: the new featurizer has the old features plus new
ones (or loses some, e.g. under a frequency cut), the label set may gain labels. Weights of a
(feature, label) pair both taggers know start at the old value; every other weight, bias and
transition starts at 0, as a cold start does. The objective is convex, so the start changes the
number of L-BFGS iterations to convergence, not the optimum (up to the iteration budget).
"""

from __future__ import annotations

import numpy as np

from gpseq.errors import ConfigError
from gpseq.features.padded import PAD_ID

WEIGHTS, BIAS, PAIRWISE = "var:linear/q_mu", "var:label_bias", "var:pairwise_mean"


def previous_arrays(previous) -> dict[str, np.ndarray]:
    """The trained arrays of the `previous` model (`StructuredGP.get_state` names: its `arrays`,
    which do not build TensorFlow for a model of the default training), checked to be those of
    weight-space linear unaries."""
    state = previous.arrays
    missing = [name for name in (WEIGHTS, BIAS, PAIRWISE) if name not in state]
    if missing:
        raise ConfigError("init: the previous tagger has no weight-space linear unaries (arrays "
                          f"{', '.join(missing)}); a warm start needs a model of the default training")
    return state


def map_start(previous, featurizer, labels: list[str]):
    """A `LaplaceFit` on `featurizer`'s columns and `labels` holding `previous`'s posterior means
    where feature name and label match (0 elsewhere); variances are placeholders (the fit
    recomputes them)."""
    from gpseq.training.laplace import LaplaceFit, LaplaceReport

    state = previous_arrays(previous)
    weights = np.asarray(state[WEIGHTS], dtype=np.float64)  # [D_old, V_old]
    old_names = previous.featurizer.feature_names()
    if weights.shape != (len(old_names), len(previous.labels)):
        raise ConfigError(f"init: the previous tagger's weights have shape {weights.shape}, expected "
                          f"({len(old_names)}, {len(previous.labels)})")
    new_column = {name: j for j, name in enumerate(featurizer.feature_names())}
    new_label = {label: v for v, label in enumerate(labels)}
    column_map = np.array([new_column.get(name, -1) for name in old_names], dtype=np.int64)  # [D_old]
    label_map = np.array([new_label.get(label, -1) for label in previous.labels], dtype=np.int64)  # [V_old]
    rows, cols = np.nonzero(weights)
    keep = (column_map[rows] >= 0) & (label_map[cols] >= 0)
    V = len(labels)
    flat = column_map[rows[keep]] * V + label_map[cols[keep]]
    order = np.argsort(flat, kind="stable")
    support, values = flat[order], weights[rows[keep], cols[keep]][order]
    known = label_map >= 0
    bias = np.zeros(V)
    bias[label_map[known]] = np.asarray(state[BIAS], dtype=np.float64)[known]
    pairwise = np.zeros((V, V))
    old_pairwise = np.asarray(state[PAIRWISE], dtype=np.float64)
    pairwise[np.ix_(label_map[known], label_map[known])] = old_pairwise[np.ix_(known, known)]
    return LaplaceFit(num_features=featurizer.n_features, bias=bias, support=support, weights=values,
                      weight_variance=np.ones(len(support)), pairwise=pairwise, pairwise_variance=np.ones((V, V)),
                      report=LaplaceReport())


WARM_ITERATION_SHARE = 3  # a warm-started round runs max_iterations // this many L-BFGS iterations


def warm_config(config, previous):
    """The training configuration of a warm-started round: the previous tagger's chosen prior
    (σ², l1, σ²_P) instead of a search over the grid, no dev split, cross-fitting or calibration (the
    previous tagger's calibration is kept: `calibration_arrays`), and a third of the iteration
    budget, all on every training sentence."""
    import dataclasses

    scores = previous.scores or {}
    training = config.training
    budget = training.max_steps or training.max_iterations
    variance = scores.get("prior_variance", config.model.prior_variance)
    l1 = scores.get("l1", (training.l1_grid or [0.0])[0] if "l1_grid" in training.__dataclass_fields__ else 0.0)
    changes = dict(prior_variance_grid=[float(variance)], calibrate=False, dev_fraction=0.0,
                   max_iterations=max(1, budget // WARM_ITERATION_SHARE), max_steps=None)
    if "l1_grid" in training.__dataclass_fields__:
        changes["l1_grid"] = [float(l1)]
    if "pairwise_variance_grid" in training.__dataclass_fields__:
        changes["pairwise_variance_grid"] = [float(scores.get("pairwise_prior_variance",
                                                             config.model.pairwise_prior_variance))]
    return dataclasses.replace(config, training=dataclasses.replace(training, **changes))


def calibration_arrays(previous, dtype: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The previous tagger's calibration as model arrays for the warm-started `arrays`: its fitted
    variance scale α and temperature T, and column 0's variance (the unseen features' scale β
    relative to α, `gpseq.training.laplace.model_state`), the same for every label."""
    state = previous_arrays(previous)
    cast = np.dtype(dtype).type
    out = {name: np.asarray(state[name], dtype=cast) for name in ("var:temperature", "var:variance_scale")
           if name in state}
    name = "var:linear/q_variance/_pretransformed_input"
    if name in state and name in arrays:
        q_variance = np.array(arrays[name], dtype=cast)
        q_variance[PAD_ID] = cast(np.asarray(state[name])[PAD_ID, 0])
        out[name] = q_variance
    return out
