"""gpseq vs CRFsuite, trained and tested in the same run, with the same features.

    python benchmarks/tagger.py --protocol conll2000 [--quick] [--json out.json]
    python benchmarks/tagger.py --protocol paper [--quick] [--json out.json]

conll2000: train.txt → test.txt. paper: the seed paper's small-scale protocol on the four CRF++
sets — pool train+test, 5 seeded folds, train on N_seq = 150/50/20/50 sequences (BASE NP /
CHUNKING / SEGMENTATION / JAPANESE NE) drawn from outside the fold, test on the fold.
CRFsuite gets exactly the feature strings of gpseq's featuriser (same preset); its per-token
marginals and sequence probabilities go through the same `gpseq.evaluation.evaluate`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import (  # noqa: E402
    PAPER_SETS,
    corpora_root,
    crfsuite_features,
    crfsuite_gold_log_probs,
    crfsuite_marginals,
    machine,
    paper_folds,
    paper_pool,
    peak_rss_mb,
)
from gpseq.corpora import read_conll  # noqa: E402
from gpseq.evaluation.evaluate import evaluate  # noqa: E402
from gpseq.features import get_preset  # noqa: E402
from gpseq.structured.model import ModelConfig  # noqa: E402
from gpseq.tagger import Tagger, TaggerConfig  # noqa: E402
from gpseq.training.trainer import TrainingConfig  # noqa: E402

# ---- CRFsuite with gpseq's features -----------------------------------------------------------
def run_crfsuite(featurizer, train, test, labels, c1=0.1, c2=0.1, max_iterations=100):
    import sklearn_crfsuite

    X_train = crfsuite_features(featurizer, train)
    start = time.perf_counter()
    crf = sklearn_crfsuite.CRF(algorithm="lbfgs", c1=c1, c2=c2, max_iterations=max_iterations,
                               all_possible_transitions=True)
    crf.fit(X_train, [s.labels for s in train])
    train_s = time.perf_counter() - start
    start = time.perf_counter()
    X_test = crfsuite_features(featurizer, test)
    predicted = crf.predict(X_test)
    probs = crfsuite_marginals(crf, X_test, labels)
    tag_s = time.perf_counter() - start
    seq_logp = crfsuite_gold_log_probs(crf, X_test, test)
    report = evaluate([s.labels for s in test], predicted, labels=labels, probabilities=probs,
                      sequence_log_probs=seq_logp)
    n_tokens = sum(len(s) for s in test)
    return report.to_dict(), {"train_s": train_s, "tag_tokens_per_s": n_tokens / tag_s}


# ---- gpseq ------------------------------------------------------------------------------------
def run_gpseq(train, test, config: TaggerConfig, dev=None, log_every=None):
    def progress(p):
        if log_every and (p.event == "eval" or p.step % log_every == 0):
            extra = f" dev={p.dev_score:.4f}" if p.dev_score is not None else ""
            print(f"  step {p.step}/{p.total_steps} epoch {p.epoch} elbo/token {p.elbo_per_token:.4f}{extra}",
                  flush=True)

    start = time.perf_counter()
    tagger = Tagger.train(train, config, dev=dev, callbacks=[progress])
    train_s = time.perf_counter() - start
    n_tokens = sum(len(s) for s in test)
    start = time.perf_counter()
    tagger.tag(test, mean=True)
    mean_s = time.perf_counter() - start
    start = time.perf_counter()
    tagger.tag(test)
    mc_s = time.perf_counter() - start
    report = tagger.evaluate(test).to_dict()
    return tagger, report, {"train_s": train_s, "tag_tokens_per_s_mc": n_tokens / mc_s,
                            "tag_tokens_per_s_mean": n_tokens / mean_s, "steps": tagger.scores.get("steps")}


METRICS = ("chunk_f1", "token_error", "token_nll", "seq_nll", "ece")


def pick(report: dict) -> dict:
    out = {key: report.get(key) for key in METRICS}
    if out["token_error"] is None and report.get("token_accuracy") is not None:
        out["token_error"] = 1.0 - report["token_accuracy"]
    return out


def conll2000(args) -> dict:
    root = corpora_root() / "conll2000"
    train = read_conll(root / "train.txt")
    test = read_conll(root / "test.txt")
    if args.quick:
        train, test = train[:1000], test[:300]
    features = get_preset("chunking", min_count=args.min_count)
    config = TaggerConfig(
        features=features,
        model=ModelConfig(kernel=args.kernel, num_inducing=args.inducing, prior_variance=args.prior_variance),
        training=TrainingConfig(epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr,
                                early_stopping="f1", dev_fraction=0.05, patience=2, seed=0),
        predict_samples=args.samples,
    )
    results: dict = {}
    print(f"CoNLL-2000: {len(train)} train / {len(test)} test sentences; {machine()}", flush=True)
    tagger, report, timing = run_gpseq(train, test, config, log_every=100)
    for key, value in {**pick(report), **timing}.items():
        results[f"gpseq_{key}"] = value
    results["gpseq_peak_rss_mb"] = peak_rss_mb()
    labels = tagger.labels
    crf_report, crf_timing = run_crfsuite(tagger.featurizer, tagger_train_part(train, tagger), test, labels,
                                          max_iterations=args.crf_iterations)
    for key, value in {**pick(crf_report), **crf_timing}.items():
        results[f"crfsuite_{key}"] = value
    results["crfsuite_tag_tokens_per_s_mc"] = results.pop("crfsuite_tag_tokens_per_s")
    results["crfsuite_peak_rss_mb"] = peak_rss_mb()
    return results


def tagger_train_part(train, tagger):
    """The sentences gpseq actually trained on (its dev slice held out), so CRFsuite sees the same."""
    n_dev = tagger.scores.get("dev_sentences", 0)
    if not n_dev:
        return train
    rng = np.random.default_rng([tagger.config.training.seed, 7])
    order = rng.permutation(len(train))
    held = set(order[:n_dev].tolist())
    return [s for i, s in enumerate(train) if i not in held]


def paper(args) -> dict:
    results: dict = {}
    systems = ("gpseq", "gpseq_pseudo", "gpseq_paper", "crfsuite")
    for name, (_, n_seq, _) in PAPER_SETS.items():
        pool, template = paper_pool(name)
        metrics = ("token_error", "token_nll", "nll_total", "seq_nll", "ece", "train_s")
        per_system = {s: {m: [] for m in metrics} for s in systems}
        for fold, train, test in paper_folds(pool, n_seq, max_folds=2 if args.quick else None):
            features = get_preset("crfpp", template=template)
            base = dict(features=features, predict_samples=args.samples,
                        training=TrainingConfig(epochs=args.paper_epochs, batch_size=10, learning_rate=args.lr,
                                                early_stopping="none", seed=fold))
            configs = {
                "gpseq": TaggerConfig(model=ModelConfig(kernel="linear+rbf", num_inducing=args.paper_inducing), **base),
                "gpseq_pseudo": TaggerConfig(model=ModelConfig(kernel="linear+rbf", num_inducing=args.paper_inducing, likelihood="pseudo"),
                                             **base),
                "gpseq_paper": TaggerConfig(model=ModelConfig(kernel="paper-linear", num_inducing=args.paper_inducing,
                                                              rbf_conditional="full"), **base),
            }
            tagger = None
            for system, config in configs.items():
                tagger, report, timing = run_gpseq(train, test, config)
                per_system[system]["nll_total"].append(report["token_nll"] * report["n_tokens"])
                for metric, value in pick(report).items():
                    if metric in per_system[system]:
                        per_system[system][metric].append(value)
                per_system[system]["train_s"].append(timing["train_s"])
            crf_report, crf_timing = run_crfsuite(tagger.featurizer, train, test, tagger.labels)
            per_system["crfsuite"]["nll_total"].append(crf_report["token_nll"] * crf_report["n_tokens"])
            for metric, value in pick(crf_report).items():
                if metric in per_system["crfsuite"]:
                    per_system["crfsuite"][metric].append(value)
            per_system["crfsuite"]["train_s"].append(crf_timing["train_s"])
            print(f"{name} fold {fold}: " + ", ".join(
                f"{s} err={per_system[s]['token_error'][-1]:.4f} nll={per_system[s]['token_nll'][-1]:.4f}"
                for s in systems), flush=True)
        for system, metrics in per_system.items():
            for metric, values in metrics.items():
                values = [v for v in values if v is not None and np.isfinite(v)]
                results[f"{name}_{system}_{metric}_mean"] = float(np.mean(values)) if values else None
                results[f"{name}_{system}_{metric}_std"] = float(np.std(values)) if values else None
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=("conll2000", "paper"), default="conll2000")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--kernel", default="linear+rbf")
    parser.add_argument("--inducing", type=int, default=32)
    parser.add_argument("--paper-inducing", type=int, default=32)
    parser.add_argument("--prior-variance", type=float, default=1.0)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--paper-epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--min-count", type=int, default=1)
    parser.add_argument("--crf-iterations", type=int, default=100)
    args = parser.parse_args()
    if args.quick:
        args.epochs = min(args.epochs, 3)
        args.paper_epochs = min(args.paper_epochs, 10)
        args.crf_iterations = min(args.crf_iterations, 50)
    results = conll2000(args) if args.protocol == "conll2000" else paper(args)
    results["machine"] = machine()
    results["date"] = time.strftime("%Y-%m-%d")
    width = max(len(k) for k in results)
    for key, value in results.items():
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        print(f"{key:<{width}}  {shown}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
