"""SVGP benchmark: gpseq vs GPflow in the same process.

1. Time per ELBO + gradient + Adam step (minibatch 256, float64, whitened full-covariance q(u), RBF
   kernel, K-means Z; gpseq: `Trainer.step`, which calls its compiled step's concrete function with
   the flat batch and checks the loss and gradients; GPflow: a `tf.function` of `training_loss`,
   `GradientTape` and Keras Adam) for M ∈ {100, 500}, on two datasets bundled with
   scikit-learn, repeated (with 1 % jitter) to N ≥ 5,000: diabetes (regression, Gaussian) and breast
   cancer (binary, Bernoulli probit). Ratio = gpseq time / GPflow time (≤ 1 means gpseq is faster).
2. Test NLPD on diabetes after a fixed number of steps: natural gradients on q(u) (γ = 0.1) + Adam
   on the hyperparameters vs Adam on everything (gpseq).

    python benchmarks/svgp.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_breast_cancer, load_diabetes  # noqa: E402

from _common import run_meta  # noqa: E402

from gpseq.gp import RBF, SVGP, Bernoulli, Gaussian, kmeans_inducing  # noqa: E402
from gpseq.training.trainer import Trainer  # noqa: E402

BATCH = 256
MIN_ROWS = 5000


def _standardise(a):
    return (a - a.mean(0)) / a.std(0)


def _repeat(X, Y, rng, min_rows=MIN_ROWS):
    reps = int(np.ceil(min_rows / len(X)))
    X = np.tile(X, (reps, 1)) + 0.01 * rng.normal(size=(reps * len(X), X.shape[1]))
    return X, np.tile(Y, (reps, 1))


def datasets(rng):
    Xd, yd = load_diabetes(return_X_y=True)
    Xb, yb = load_breast_cancer(return_X_y=True)
    reg = _repeat(_standardise(Xd), _standardise(yd)[:, None], rng)
    cls = _repeat(_standardise(Xb), yb[:, None].astype(np.float64), rng)
    return {"regression": reg, "binary": cls}


def _minibatches(X, Y, n, seed):
    rng = np.random.default_rng(seed)
    return [(tf.constant(X[i]), tf.constant(Y[i])) for i in (rng.choice(len(X), BATCH, replace=False) for _ in range(n))]


def _time_steps(step, batches, repeats):
    step(batches[0])  # trace + warm-up
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for b in batches:
            step(b)
        best = min(best, (time.perf_counter() - start) / len(batches))
    return best


def gpflow_adam_step(model, learning_rate):
    """A compiled step `batch -> loss` of Adam on a GPflow model's training loss."""
    opt = tf.keras.optimizers.Adam(learning_rate)
    opt.build(model.trainable_variables)

    @tf.function
    def step(batch):
        with tf.GradientTape() as tape:
            loss = model.training_loss(batch)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return step


def time_pair(kind, X, Y, M, steps, repeats):
    """Seconds per step (gpseq, GPflow) with identical initial state."""
    import gpflow

    Z = kmeans_inducing(X, M, seed=0)
    lik_ours = Gaussian(1.0) if kind == "regression" else Bernoulli("probit")
    ours = SVGP(RBF(1.0, 1.0), lik_ours, Z, num_data=len(X))
    trainer = Trainer(ours, learning_rate=0.01)
    lik_theirs = gpflow.likelihoods.Gaussian(1.0) if kind == "regression" else gpflow.likelihoods.Bernoulli()
    theirs = gpflow.models.SVGP(gpflow.kernels.SquaredExponential(), lik_theirs, Z.copy(), num_data=len(X))
    gpflow.set_trainable(theirs.inducing_variable, False)
    gpflow_step = gpflow_adam_step(theirs, 0.01)

    batches = _minibatches(X, Y, steps, seed=M)
    t_ours, t_theirs = np.inf, np.inf
    for _ in range(2):  # interleave: the machine is shared and noisy
        t_ours = min(t_ours, _time_steps(trainer.step, batches, repeats))
        t_theirs = min(t_theirs, _time_steps(gpflow_step, batches, repeats))
    return t_ours, t_theirs


def nlpd_comparison(rng, steps):
    """Test NLPD per point on diabetes (80/20 split of the original rows, train rows repeated)."""
    X, y = load_diabetes(return_X_y=True)
    X, y = _standardise(X), _standardise(y)[:, None]
    order = rng.permutation(len(X))
    test, train = order[: len(X) // 5], order[len(X) // 5:]
    Xtr, Ytr = _repeat(X[train], y[train], rng)
    Z = kmeans_inducing(Xtr, 100, seed=0)
    batches = tf.data.Dataset.from_tensor_slices((Xtr, Ytr)).shuffle(len(Xtr), seed=0).batch(BATCH).repeat()
    out = {}
    for name, gamma in (("natgrad", 0.1), ("adam", None)):
        model = SVGP(RBF(1.0, 1.0), Gaussian(1.0), Z, num_data=len(Xtr))
        Trainer(model, learning_rate=0.01, natgrad_gamma=gamma).fit(batches, max_steps=steps)
        out[name] = -float(tf.reduce_mean(model.predict_log_density((X[test], y[test]))))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (under a minute)")
    parser.add_argument("--json", type=str, default=None, help="write the figures as flat JSON here")
    args = parser.parse_args(argv)
    started, load_start = time.perf_counter(), os.getloadavg()[0]
    rng = np.random.default_rng(0)
    data = datasets(rng)
    steps, repeats, nlpd_steps = (10, 2, 150) if args.quick else (30, 3, 600)
    results = {}
    print(f"{'dataset':<11} {'N':>6} {'M':>4} {'gpseq ms/step':>14} {'GPflow ms/step':>15} {'ratio':>6}")
    for M in (100, 500):
        ratios = []
        for kind, (X, Y) in data.items():
            ours, theirs = time_pair(kind, X, Y, M, steps, repeats)
            ratios.append(ours / theirs)
            results[f"step_ms_gpseq_{kind}_m{M}"] = 1e3 * ours
            results[f"step_ms_gpflow_{kind}_m{M}"] = 1e3 * theirs
            results[f"step_time_ratio_vs_gpflow_{kind}_m{M}"] = ours / theirs
            print(f"{kind:<11} {len(X):>6} {M:>4} {1e3 * ours:>14.2f} {1e3 * theirs:>15.2f} {ours / theirs:>6.2f}")
        results[f"step_time_ratio_vs_gpflow_m{M}"] = float(np.exp(np.mean(np.log(ratios))))  # geometric mean
    nlpd = nlpd_comparison(np.random.default_rng(1), nlpd_steps)
    results["nlpd_natgrad"], results["nlpd_adam"] = nlpd["natgrad"], nlpd["adam"]
    results["nlpd_steps"] = nlpd_steps
    print(f"test NLPD after {nlpd_steps} steps (diabetes, M=100): natgrad+Adam {nlpd['natgrad']:.4f}, "
          f"Adam {nlpd['adam']:.4f}")
    import gpflow

    results["meta/gpflow_version"] = gpflow.__version__
    results["meta/load_average_1min_start"], results["meta/load_average_1min_end"] = load_start, os.getloadavg()[0]
    results.update(run_meta("svgp.py", args.quick, started))
    print(f"load average (1 min) {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
