"""GPNet benchmark: GPNet vs gpseq SVGP vs GPflow SVGP (M = 500) in the same process.

Datasets: the regression (diabetes, Gaussian) and binary (breast cancer, Bernoulli probit) sets of
`benchmarks/svgp.py` — 80/20 split of the original rows, training rows repeated (1 % jitter) to
N ≥ 5,000 — and a synthetic 1 M-point regression (4 inputs uniform on [−2, 2], a smooth function,
Gaussian noise σ = 0.3, 10,000 test points). Every model: RBF kernel with ARD lengthscales
(initial ℓ = √D, σ² = 1), Gaussian noise σ² = 1 at the start, kernel hyperparameters learned,
minibatches of 256 drawn from the same seeded stream, Adam.

- gpseq SVGP and GPflow SVGP: M = 500 K-means inducing inputs (fixed), whitened full-covariance
  q(u), Adam (learning rate 0.01) on the ELBO.
- GPNet (`gpseq.gp.GPNet`) as `GPNet.fit` trains it, with the library's defaults unless an option
  overrides one: exact-GP pre-training of the hyperparameters on 1,000 training points (Gaussian
  likelihood; timed as training), then `GPNetTrainer` steps — random Fourier features, full weight
  covariance, measurement points per step, β_t = β₀ / (1 + decay t^power), the closed-form weight step
  for a Gaussian likelihood (Adam on it for Bernoulli), Adam 0.01 on everything else; on the 1 M set
  `--large-features` (800) random features unless `--features` is given.

Small sets: each model runs `--steps` steps; test NLPD (and RMSE or accuracy) is evaluated every
`--eval-every` steps, and the wall time to convergence is the training time (evaluations
excluded) until the test NLPD first comes within 1 % (at least 0.005 nats) of the run's best.
1 M set: each model trains for the same wall-time budget (`--budget` seconds) and is evaluated
along the way; the figures are at the budget.

    python benchmarks/gpnet.py [--quick] [--json PATH] [--only small|large] [--models gpnet,...]
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

from _common import machine  # noqa: E402
from svgp import _repeat, _standardise, gpflow_adam_step  # noqa: E402  (benchmarks/svgp.py's datasets)

from gpseq.gp import RBF, SVGP, Bernoulli, Gaussian, GPNet, GPNetTrainer, kmeans_inducing  # noqa: E402
from gpseq.training.trainer import Trainer  # noqa: E402

BATCH = 256
# GPNet's random features on the 1 M set (the library's default, 400, elsewhere): chosen on a
# validation split of the training points (benchmarks/results/gpnet.explore.txt, round 4) once the
# closed-form step became a low-rank update of a dense weight factor, O(F²M) per step, not O(F³)
LARGE_FEATURES = 800


# ---- data ----------------------------------------------------------------------------------------
def small_sets(seed=1):
    """{name: (kind, X_train, Y_train, X_test, Y_test)}: the svgp.py datasets, 80/20 split."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, kind, (X, y) in (("regression", "regression", load_diabetes(return_X_y=True)),
                               ("binary", "binary", load_breast_cancer(return_X_y=True))):
        X = _standardise(X)
        y = _standardise(y)[:, None] if kind == "regression" else y[:, None].astype(np.float64)
        order = rng.permutation(len(X))
        test, train = order[: len(X) // 5], order[len(X) // 5:]
        Xtr, Ytr = _repeat(X[train], y[train], rng)
        out[name] = (kind, Xtr, Ytr, X[test], y[test])
    return out


def synthetic(n_train=1_000_000, n_test=10_000, seed=2):
    """The 1 M-point regression: x ~ U[−2, 2]⁴, y = f(x) + N(0, 0.3²)."""
    rng = np.random.default_rng(seed)

    def f(X):
        return (np.sin(2 * X[:, 0]) + 0.5 * np.cos(1.5 * X[:, 1]) * X[:, 2] + 0.5 * np.sin(3 * X[:, 3])
                + 0.25 * X[:, 0] * X[:, 1])[:, None]

    X = rng.uniform(-2, 2, (n_train + n_test, 4))
    Y = f(X) + 0.3 * rng.normal(size=(len(X), 1))
    return "regression", X[:n_train], Y[:n_train], X[n_train:], Y[n_train:]


# ---- models --------------------------------------------------------------------------------------
def _likelihood_ours(kind):
    return Gaussian(1.0) if kind == "regression" else Bernoulli("probit")


def _kernel_ours(D):
    return RBF(1.0, np.full(D, np.sqrt(D)), ard=True)


class Runner:
    """A model with `train_step(batch)` and `evaluate(X, Y) → (nlpd, rmse or accuracy)`."""

    def __init__(self, name, step, predict_density, predict_mean, kind, setup=None):
        self.name, self.step, self.kind, self.setup = name, step, kind, setup
        self._density = tf.function(predict_density)
        self._mean = tf.function(predict_mean)

    def evaluate(self, X, Y):
        nlpd = -float(tf.reduce_mean(self._density(tf.constant(X), tf.constant(Y))))
        mean = self._mean(tf.constant(X)).numpy()
        if self.kind == "regression":
            return nlpd, float(np.sqrt(np.mean((mean - Y) ** 2)))
        return nlpd, float(np.mean((mean > 0.5) == (Y > 0.5)))


def gpseq_svgp(kind, X, Z, lr):
    model = SVGP(_kernel_ours(X.shape[1]), _likelihood_ours(kind), Z, num_data=len(X))
    trainer = Trainer(model, learning_rate=lr)
    return Runner("gpseq SVGP", trainer.step, lambda X, Y: model.predict_log_density((X, Y)),
                  lambda X: model.predict_y(X)[0], kind)


def gpflow_svgp(kind, X, Z, lr):
    import gpflow

    lik = gpflow.likelihoods.Gaussian(1.0) if kind == "regression" else gpflow.likelihoods.Bernoulli()
    kernel = gpflow.kernels.SquaredExponential(lengthscales=np.full(X.shape[1], np.sqrt(X.shape[1])))
    model = gpflow.models.SVGP(kernel, lik, Z.copy(), num_data=len(X))
    gpflow.set_trainable(model.inducing_variable, False)
    return Runner("GPflow SVGP", gpflow_adam_step(model, lr), lambda X, Y: model.predict_log_density((X, Y)),
                  lambda X: model.predict_y(X)[0], kind)


def gpnet(kind, X, Y, args):
    """GPNet as `GPNet.fit` trains it (`GPNetTrainer.pretrained`): the library's defaults unless an
    option overrides them; `setup` (the exact-GP pre-training) is timed as training."""
    D = X.shape[1]
    options = {"num_features": args.features, "num_measurement": args.measurement, "beta0": args.beta0,
               "beta_decay": args.beta_decay, "beta_power": args.beta_power, "residual_hidden": args.residual}
    model = GPNet(_kernel_ours(D), _likelihood_ours(kind), X, num_data=len(X),
                  **{k: v for k, v in options.items() if v is not None})
    fit = {"learning_rate": args.gpnet_lr, "update": args.update, "pretrain_points": args.pretrain_points}
    trainer = None

    def setup():
        nonlocal trainer
        trainer = GPNetTrainer.pretrained(model, X, Y, **{k: v for k, v in fit.items() if v is not None})

    return Runner("GPNet", lambda batch: trainer.step(batch), lambda X, Y: model.predict_log_density((X, Y)),
                  lambda X: model.predict_y(X)[0], kind, setup=setup)


MODELS = ("gpnet", "gpseq_svgp", "gpflow_svgp")


def runners(kind, X, Y, inducing_from, models, args):
    """(key, Runner) for each of `models` in `MODELS` order, built when it is due (one model's
    variables at a time); the SVGPs share 500 K-means inducing inputs of `inducing_from`."""
    Z = kmeans_inducing(inducing_from, 500, seed=0) if set(models) - {"gpnet"} else None
    make = {"gpnet": lambda: gpnet(kind, X, Y, args), "gpseq_svgp": lambda: gpseq_svgp(kind, X, Z, 0.01),
            "gpflow_svgp": lambda: gpflow_svgp(kind, X, Z, 0.01)}
    for key in MODELS:
        if key in models:
            yield key, make[key]()


# ---- runs ----------------------------------------------------------------------------------------
def run(runner, X, Y, Xte, Yte, *, steps=None, budget=None, eval_every=100, eval_seconds=None, seed=0):
    """Trains on seeded minibatches until `steps` or `budget` seconds of training; returns the
    evaluation history [(step, train seconds, nlpd, metric)]."""
    rng = np.random.default_rng(seed)
    history, spent, step, last_eval = [], 0.0, 0, 0.0
    if runner.setup is not None:
        start = time.perf_counter()
        runner.setup()
        spent = time.perf_counter() - start
        print(f"    {runner.name:<12} setup {spent:.1f} s", flush=True)
    while True:
        idx = rng.integers(0, len(X), BATCH)
        batch = (tf.constant(X[idx]), tf.constant(Y[idx]))
        start = time.perf_counter()
        runner.step(batch)
        spent += time.perf_counter() - start
        step += 1
        done = (steps is not None and step >= steps) or (budget is not None and spent >= budget)
        due = (eval_seconds is not None and spent - last_eval >= eval_seconds) or \
              (eval_seconds is None and step % eval_every == 0)
        if due or done:
            last_eval = spent
            nlpd, metric = runner.evaluate(Xte, Yte)
            history.append((step, spent, nlpd, metric))
            print(f"    {runner.name:<12} step {step:>6}  {spent:7.1f} s  NLPD {nlpd:.4f}  metric {metric:.4f}",
                  flush=True)
        if done:
            return history


def converged(history):
    """(train seconds, step) at which test NLPD first came within 1 % (≥ 0.005 nats) of the best."""
    best = min(h[2] for h in history)
    tol = max(0.01 * abs(best), 0.005)
    for step, seconds, nlpd, _ in history:
        if nlpd <= best + tol:
            return seconds, step
    return history[-1][1], history[-1][0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a reduced run (about a minute per model)")
    parser.add_argument("--json", type=str, default=None, help="write the figures as flat JSON here")
    parser.add_argument("--steps", type=int, default=3000, help="steps per model on the small sets")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--budget", type=float, default=300.0, help="training seconds per model, 1 M set")
    parser.add_argument("--large", type=int, default=1_000_000, help="training points of the synthetic set")
    # GPNet settings: the library's defaults (GPNet, GPNet.fit) unless given
    parser.add_argument("--features", type=int, default=None, help="GPNet random features (cos/sin pairs × 2)")
    parser.add_argument("--large-features", type=int, default=LARGE_FEATURES,
                        help="GPNet random features on the 1 M set when --features is not given")
    parser.add_argument("--measurement", type=int, default=None, help="GPNet measurement points per step")
    parser.add_argument("--gpnet-lr", type=float, default=None)
    parser.add_argument("--beta0", type=float, default=None)
    parser.add_argument("--beta-decay", type=float, default=None)
    parser.add_argument("--beta-power", type=float, default=None)
    parser.add_argument("--residual", type=int, default=None, help="GPNet residual MLP width (0: none)")
    parser.add_argument("--update", choices=["auto", "closed_form", "gradient"], default=None,
                        help="GPNet weight step (GPNetTrainer)")
    parser.add_argument("--pretrain-points", type=int, default=None, help="GPNet exact-GP pre-training points (0: none)")
    parser.add_argument("--only", choices=["small", "large"], default=None)
    parser.add_argument("--sets", default="regression,binary", help="small sets to run (comma-separated)")
    parser.add_argument("--models", default="gpnet,gpseq_svgp,gpflow_svgp",
                        help="comma-separated subset of gpnet, gpseq_svgp, gpflow_svgp")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.budget, args.large = 300, 30.0, 100_000
    tf.random.set_seed(0)
    models = args.models.split(",")
    results = {"machine": machine(), "batch": BATCH, "inducing": 500,
               "gpnet_options": {k: getattr(args, k) for k in ("features", "measurement", "gpnet_lr", "beta0",
                                                             "beta_decay", "beta_power", "residual", "update", "pretrain_points")}}
    metric_name = {"regression": "rmse", "binary": "accuracy"}
    if args.only in (None, "small"):
        for name, (kind, X, Y, Xte, Yte) in small_sets().items():
            if name not in args.sets.split(","):
                continue
            print(f"{name}: N = {len(X)}, D = {X.shape[1]}, test {len(Xte)}", flush=True)
            for key, runner in runners(kind, X, Y, X, models, args):
                history = run(runner, X, Y, Xte, Yte, steps=args.steps, eval_every=args.eval_every)
                seconds, step = converged(history)
                _, total, nlpd, metric = history[-1]
                results[f"{name}_{key}_nlpd"] = nlpd
                results[f"{name}_{key}_{metric_name[kind]}"] = metric
                results[f"{name}_{key}_best_nlpd"] = min(h[2] for h in history)
                results[f"{name}_{key}_seconds_to_convergence"] = seconds
                results[f"{name}_{key}_steps_to_convergence"] = step
                results[f"{name}_{key}_seconds_per_step"] = total / history[-1][0]
            if "gpnet" not in models or "gpseq_svgp" not in models:
                continue
            ratio = results[f"{name}_gpnet_nlpd"] / results[f"{name}_gpseq_svgp_nlpd"]
            results[f"{name}_gpnet_nlpd_relative_to_svgp"] = ratio
            # NLPD can be negative or near 0; the target is read on the difference relative to |SVGP|
            results[f"{name}_gpnet_nlpd_excess_over_svgp"] = (
                (results[f"{name}_gpnet_nlpd"] - results[f"{name}_gpseq_svgp_nlpd"])
                / abs(results[f"{name}_gpseq_svgp_nlpd"]))
    if args.only in (None, "large"):
        kind, X, Y, Xte, Yte = synthetic(args.large)
        print(f"synthetic: N = {len(X)}, D = {X.shape[1]}, test {len(Xte)}, budget {args.budget:.0f} s", flush=True)
        sub = X[np.random.default_rng(3).choice(len(X), 20_000, replace=False)]
        results["large_n"] = len(X)
        results["large_budget_s"] = args.budget
        large_args = argparse.Namespace(**dict(vars(args), features=args.features or args.large_features))
        results["large_gpnet_features"] = large_args.features
        for key, runner in runners(kind, X, Y, sub, models, large_args):
            history = run(runner, X, Y, Xte, Yte, budget=args.budget, eval_seconds=args.budget / 10)
            step, total, nlpd, rmse = history[-1]
            results[f"large_{key}_nlpd"], results[f"large_{key}_rmse"] = nlpd, rmse
            results[f"large_{key}_steps"], results[f"large_{key}_seconds"] = step, total
            results[f"large_{key}_curve"] = [[round(s, 1), round(n, 4)] for _, s, n, _ in history]
        results["large_noise_floor_nlpd"] = float(0.5 * np.log(2 * np.pi * 0.09) + 0.5)
    print(json.dumps({k: v for k, v in results.items() if not k.endswith("_curve")}, indent=1))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
