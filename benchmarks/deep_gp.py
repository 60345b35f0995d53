"""Deep-GP benchmark: gpseq's deep GP (DSVI and the nested bound) vs GPflux's `DeepGP`, same process.

1. The noisy step function of the seed (§5.1, after Rasmussen & Williams): 100 training points
   x ~ U(−1, 1), y = 1[x > 0] + N(0, 0.05²); 500 test points from the same distribution. Models with
   1, 2 and 3 layers (hidden width 1, linear identity mean on hidden layers, RBF kernels, M = 20
   K-means inducing inputs), full-batch Adam (lr 0.01): gpseq DSVI (S = 5 samples per step), gpseq
   nested bound (seed eq. 19, closed form), GPflux `build_constant_input_dim_deep_gp` (same M, same
   inner q(u) scale 1e-5, noise 1e-2, Keras fit; its builder starts hidden kernels at variance 1e-6,
   lengthscale 2, gpseq's at 1, 1: `--methods ...,gpflux_init` adds GPflux started like gpseq). Training time is wall time of all steps including
   tracing/compiling the step. Test log-likelihood per point from the mixture of
   S = 200 propagated samples; a PNG of the predictive density per model (benchmarks/results/).
2. diabetes (scikit-learn bundled; 442 × 10, standardised, 80/20 split): the same 9 models,
   hidden width 5, M = 30; test log-likelihood per point in the units of the original target.
3. (`--tagger`) deep-GP unaries (`ModelConfig(unary="deep", hidden_dims=8)`) vs the single-layer
   tagger (`unary="shallow"`) on CoNLL-2000, with the default kernel (weight-space linear part +
   RBF GP) and with "paper-rbf" (no linear part: the deep GP / the RBF GP alone; keys with suffix
   `_paper_rbf`), M = 32 K-means inducing inputs, the first `--tagger-train` training sentences (default
   2000), the first `--tagger-test` test sentences (default 500), 3 epochs of batch 32, Adam 0.02, no
   early stopping, 16 predictive samples; chunk F1, token NLL, ECE, token accuracy, training time.
   `--tagger-unaries` picks the unaries compared (default shallow,deep); "gpnet" =
   `ModelConfig(unary="gpnet", num_random_features=--gpnet-features)`: the RBF part as random
   Fourier features with a Gaussian weight posterior per label (diagonal; full with
   `--gpnet-full-covariance`) instead of the inducing-point GP; its keys are `gpnet` for the default
   F = 2000, `gpnet<F>` (and `gpnet<F>_full`) otherwise. `--tagger-seed` sets the training seed.

    python benchmarks/deep_gp.py [--quick] [--json PATH] [--steps N] [--tagger]
        [--tagger-kernels linear+rbf,paper-rbf] [--tagger-unaries shallow,deep,gpnet] [--gpnet-features 2000]
        [--gpnet-full-covariance] [--tagger-seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from gpseq.gp import Gaussian  # noqa: E402
from gpseq.training.trainer import Trainer  # noqa: E402
from gpseq.gp.deep import build_deep_gp  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("dsvi", "nested", "gpflux")


def step_data(seed=0, n_train=100, n_test=500, noise=0.05):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n_train, 1))
    Xt = rng.uniform(-1, 1, size=(n_test, 1))
    Y = (X > 0).astype(np.float64) + noise * rng.normal(size=X.shape)
    Yt = (Xt > 0).astype(np.float64) + noise * rng.normal(size=Xt.shape)
    return X, Y, Xt, Yt


def diabetes_data(seed=0):
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    rng = np.random.default_rng(seed)
    idx = rng.permutation(len(X))
    cut = int(0.8 * len(X))
    tr, te = idx[:cut], idx[cut:]
    xm, xs = X[tr].mean(0), X[tr].std(0)
    ym, ys = y[tr].mean(), y[tr].std()
    return ((X[tr] - xm) / xs, ((y[tr] - ym) / ys)[:, None], (X[te] - xm) / xs, ((y[te] - ym) / ys)[:, None], ys)


# ---- gpseq ------------------------------------------------------------------------------------------
def fit_gpseq(method, X, Y, layers, hidden, M, steps, seed=0):
    model = build_deep_gp(X, 1, Gaussian(1e-2), num_layers=layers, hidden_dims=hidden, num_inducing=M,
                          inference=method, num_samples=5, seed=seed)
    trainer = Trainer(model, learning_rate=0.01)  # tf.function graph (XLA compile costs more than it saves here)
    batch = (tf.constant(X), tf.constant(Y))
    start = time.perf_counter()
    trainer.fit([batch], steps)
    return model, time.perf_counter() - start  # includes tracing the step


PREDICT_SAMPLES = 200


def gpseq_predict(model, Xs, S=None):
    """Mixture components of the predictive y: (mean `[S, N]`, var `[S, N]`)."""
    m, v = model.predict_y(Xs, num_samples=S or PREDICT_SAMPLES, seed=(1, 2))
    return m.numpy()[..., 0], v.numpy()[..., 0]


# ---- GPflux -----------------------------------------------------------------------------------------
def fit_gpflux(X, Y, layers, M, steps, seed=0, match_init=False):
    import gpflow
    from gpflow.keras import tf_keras
    from gpflux.architectures import Config, build_constant_input_dim_deep_gp

    tf.random.set_seed(seed)
    np.random.seed(seed)
    gpflow.config.set_default_float(np.float64)
    cfg = Config(num_inducing=M, inner_layer_qsqrt_factor=1e-5, likelihood_noise_variance=1e-2, whiten=True)
    dgp = build_constant_input_dim_deep_gp(X, num_layers=layers, config=cfg)
    if match_init:  # gpseq's hidden-layer initialisation (kernel variance 1, lengthscales 1) instead of 1e-6, 2
        for layer in dgp.f_layers[:-1]:
            layer.kernel.kernel.variance.assign(1.0)
            layer.kernel.kernel.lengthscales.assign(np.ones(X.shape[1]))
    model = dgp.as_training_model()
    model.compile(tf_keras.optimizers.Adam(0.01))
    start = time.perf_counter()
    model.fit({"inputs": X, "targets": Y}, epochs=steps, batch_size=len(X), verbose=0, shuffle=False)
    return dgp, time.perf_counter() - start


def gpflux_predict(dgp, Xs, S=None):
    pm = dgp.as_prediction_model()
    means, variances = [], []
    for _ in range(S or PREDICT_SAMPLES):  # each call propagates one sample through the hidden layers
        out = pm(Xs)
        means.append(np.asarray(out.y_mean)[:, 0])
        variances.append(np.asarray(out.y_var)[:, 0])
    return np.stack(means), np.stack(variances)


# ---- evaluation and plots -----------------------------------------------------------------------------
def mixture_log_density(means, variances, y):
    """log (1/S) Σ_s N(y; m_s, v_s) per point `[N]` for components `[S, N]`."""
    logs = -0.5 * np.log(2 * np.pi * variances) - 0.5 * (y[None] - means) ** 2 / variances
    top = logs.max(0)
    return top + np.log(np.exp(logs - top).mean(0))


def run_grid(X, Y, Xt, Yt, layers_list, hidden, M, steps, methods, predict_grid=None, log=print):
    """Fits every (method, layers); returns {(method, L): dict(test_ll, train_s, grid)}."""
    out = {}
    for L in layers_list:
        for method in methods:
            if method.startswith("gpflux"):
                if X.shape[1] != hidden and L > 1:
                    hidden_note = f"(GPflux keeps hidden width = D = {X.shape[1]})"
                else:
                    hidden_note = ""
                dgp, secs = fit_gpflux(X, Y, L, M, steps, match_init=method == "gpflux_init")
                predict = lambda Xs, dgp=dgp: gpflux_predict(dgp, Xs)  # noqa: E731
            else:
                hidden_note = ""
                model, secs = fit_gpseq(method, X, Y, L, hidden, M, steps)
                predict = lambda Xs, model=model: gpseq_predict(model, Xs)  # noqa: E731
            m, v = predict(Xt)
            ll = float(mixture_log_density(m, v, Yt[:, 0]).mean())
            row = {"test_ll": ll, "train_s": secs}
            if predict_grid is not None:
                row["grid"] = predict(predict_grid)
            out[(method, L)] = row
            log(f"  {method:7s} L={L}  test LL {ll:8.4f}  train {secs:6.1f} s {hidden_note}")
    return out


def plot_step(results, X, Y, grid, path, layers_list, methods):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ys = np.linspace(-0.6, 1.6, 160)
    fig, axes = plt.subplots(len(layers_list), len(methods), figsize=(3.2 * len(methods), 2.4 * len(layers_list)),
                             sharex=True, sharey=True, squeeze=False)
    for i, L in enumerate(layers_list):
        for j, method in enumerate(methods):
            ax = axes[i, j]
            m, v = results[(method, L)]["grid"]  # [S, G]
            dens = np.exp(-0.5 * (ys[:, None, None] - m[None]) ** 2 / v[None]) / np.sqrt(2 * np.pi * v[None])
            dens = dens.mean(1)  # [Y, G]
            ax.imshow(np.log(dens + 1e-3), origin="lower", aspect="auto", cmap="Blues", vmin=np.log(1e-3),
                      extent=[grid[0, 0], grid[-1, 0], ys[0], ys[-1]])
            ax.plot(X[:, 0], Y[:, 0], "k.", ms=2)
            ax.set_title(f"{method}, {L} layer{'s' if L > 1 else ''}: LL {results[(method, L)]['test_ll']:.2f}",
                         fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    _quantise_png(path)


def _quantise_png(path, colours=64):
    """Rewrites a PNG with a 64-colour palette (a few tens of kB instead of hundreds)."""
    from PIL import Image

    Image.open(path).convert("RGB").quantize(colours).save(path, optimize=True)


def tagger_section(args) -> dict:
    """Deep / GPNet vs shallow unaries on a CoNLL-2000 subset (same features, data, schedule)."""
    from gpseq.corpora import read_conll
    from gpseq.features import get_preset
    from gpseq.structured.model import ModelConfig
    from gpseq.tagger import Tagger, TaggerConfig
    from gpseq.training.trainer import TrainingConfig

    root = Path(os.environ.get("GPSEQ_CORPORA", Path(__file__).resolve().parents[1].parent / "shared" / "corpora"))
    n_train, n_test = (500, 200) if args.quick else (args.tagger_train, args.tagger_test)
    train = read_conll(root / "conll2000" / "train.txt")[:n_train]
    test = read_conll(root / "conll2000" / "test.txt")[:n_test]
    print(f"CoNLL-2000 subset: {len(train)} train / {len(test)} test sentences")
    out = {}
    for kernel in args.tagger_kernels.split(","):
        suffix = "" if kernel == "linear+rbf" else "_" + kernel.replace("-", "_").replace("+", "_")
        for unary in args.tagger_unaries.split(","):
            config = TaggerConfig(
                features=get_preset("chunking"),
                model=ModelConfig(kernel=kernel, num_inducing=32, unary=unary, hidden_dims=8,
                                  num_random_features=args.gpnet_features,
                                  gpnet_full_covariance=args.gpnet_full_covariance),
                training=TrainingConfig(epochs=3, batch_size=32, learning_rate=0.02, early_stopping="none",
                                        seed=args.tagger_seed),
                predict_samples=16,
            )
            start = time.perf_counter()
            tagger = Tagger.train(train, config)
            secs = time.perf_counter() - start
            report = tagger.evaluate(test).to_dict()
            name = unary
            if unary == "gpnet" and (args.gpnet_features != ModelConfig.num_random_features or args.gpnet_full_covariance):
                name = f"gpnet{args.gpnet_features}" + ("_full" if args.gpnet_full_covariance else "")
            for key in ("chunk_f1", "token_nll", "ece", "token_accuracy"):
                out[f"conll_{key}_{name}{suffix}"] = float(report[key])
            out[f"conll_train_s_{name}{suffix}"] = secs
            print(f"  {kernel:10s} {name:10s} chunk F1 {report['chunk_f1']:.4f}  token NLL {report['token_nll']:.4f}  "
                  f"ECE {report['ece']:.4f}  accuracy {report['token_accuracy']:.4f}  train {secs:.1f} s", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="step function only: 1 and 2 layers, 100 steps, 50 predictive samples")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--steps", type=int, default=None, help="training steps per model (default 2000, quick 300)")
    parser.add_argument("--tagger", action="store_true", help="also run the CoNLL-2000 deep-unary comparison")
    parser.add_argument("--tagger-train", type=int, default=2000, help="training sentences for --tagger")
    parser.add_argument("--tagger-test", type=int, default=500, help="test sentences for --tagger")
    parser.add_argument("--methods", default="dsvi,nested,gpflux",
                        help="comma-separated: dsvi, nested, gpflux, gpflux_init (GPflux with gpseq's hidden init)")
    parser.add_argument("--tagger-kernels", default="linear+rbf,paper-rbf",
                        help="comma-separated ModelConfig kernels to compare the unaries with")
    parser.add_argument("--tagger-unaries", default="shallow,deep",
                        help="comma-separated ModelConfig unaries to compare: shallow, deep, gpnet")
    parser.add_argument("--gpnet-features", type=int, default=2000,
                        help="num_random_features F of the gpnet unaries")
    parser.add_argument("--gpnet-full-covariance", action="store_true",
                        help="a full q(w) covariance for the gpnet unaries (default diagonal)")
    parser.add_argument("--tagger-seed", type=int, default=0, help="training seed of --tagger")
    parser.add_argument("--step-only", action="store_true", help="skip the diabetes set")
    parser.add_argument("--plot-suffix", default="", help="suffix of the step-function PNG name")
    parser.add_argument("--plot-dir", type=Path, default=None,
                        help="where the step-function PNG goes (default benchmarks/results/; with --quick the "
                             "temporary directory)")
    parser.add_argument("--skip-regression", action="store_true", help="only the --tagger section")
    args = parser.parse_args()
    steps = args.steps or (100 if args.quick else 2000)
    layers_list = (1, 2) if args.quick else (1, 2, 3)
    global PREDICT_SAMPLES
    PREDICT_SAMPLES = 50 if args.quick else 200
    figures: dict[str, float] = {}
    methods = tuple(args.methods.split(","))
    try:
        import gpflux  # noqa: F401
    except ImportError:
        print("GPflux not importable: skipping it (pip install gpflux)", file=sys.stderr)
        methods = tuple(m for m in methods if not m.startswith("gpflux"))

    if not args.skip_regression:
        print(f"step function: {steps} Adam steps per model")
        X, Y, Xt, Yt = step_data()
        grid = np.linspace(-1.5, 1.5, 150)[:, None]
        res = run_grid(X, Y, Xt, Yt, layers_list, 1, 20, steps, methods, predict_grid=grid)
        # a --quick run's picture goes to the temporary directory (or --plot-dir): quick figures never
        # replace the committed ones
        plot_dir = args.plot_dir or (Path(tempfile.gettempdir()) if args.quick else RESULTS)
        plot_dir.mkdir(parents=True, exist_ok=True)
        plot_path = plot_dir / f"deep_gp_step{args.plot_suffix}.png"
        plot_step(res, X, Y, grid, plot_path, layers_list, methods)
        print(f"step-function plot: {plot_path}")
        for (method, L), row in res.items():
            figures[f"step_test_ll_{method}_l{L}"] = row["test_ll"]
            figures[f"step_train_s_{method}_l{L}"] = row["train_s"]

    if not args.quick and not args.skip_regression and not args.step_only:
        print(f"diabetes: {steps} Adam steps per model")
        Xd, Yd, Xdt, Ydt, y_scale = diabetes_data()
        res = run_grid(Xd, Yd, Xdt, Ydt, layers_list, 5, 30, steps, methods)
        for (method, L), row in res.items():
            figures[f"diabetes_test_ll_{method}_l{L}"] = row["test_ll"] - float(np.log(y_scale))
            figures[f"diabetes_train_s_{method}_l{L}"] = row["train_s"]

    if args.tagger:
        figures.update(tagger_section(args))

    print()
    print(f"{'figure':36s} value")
    for key, value in figures.items():
        print(f"{key:36s} {value:10.4f}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
