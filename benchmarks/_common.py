"""What every benchmark script needs: where the corpora are, what machine it ran on, peak RSS.

Imported by the scripts as `from _common import ...` (they run as `python benchmarks/<name>.py`,
which puts this folder on sys.path)."""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def corpora_root() -> Path:
    """`GPSEQ_CORPORA`, default `../shared/corpora` beside the repository."""
    return Path(os.environ.get("GPSEQ_CORPORA", ROOT.parent / "shared" / "corpora"))


def cpu_model() -> str:
    """The CPU's model string from /proc/cpuinfo."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine() -> str:
    return f"{os.cpu_count()} cores, {cpu_model()}, Python {platform.python_version()}"


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, MiB (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# ---- the seed paper's small-scale protocol on the four CRF++ sets -----------------------------
PAPER_SETS = {  # name: (folder under crfpp/, N_seq training sequences per fold, encoding)
    "basenp": ("basenp", 150, "utf-8"),
    "chunking": ("chunking", 50, "utf-8"),
    "segmentation": ("seg", 20, "utf-8"),
    "japanesene": ("JapaneseNE", 50, "euc-jp"),
}


def paper_pool(name: str):
    """(pool, template text) of a PAPER_SETS entry: its train.data + test.data sentences, in that order."""
    from gpseq.corpora import read_conll

    folder, _, encoding = PAPER_SETS[name]
    root = corpora_root() / "crfpp" / folder
    pool = read_conll(root / "train.data", encoding=encoding) + read_conll(root / "test.data", encoding=encoding)
    return pool, (root / "template").read_text(encoding=encoding)


def paper_folds(pool, n_seq: int, max_folds: int | None = None):
    """The seed's small-scale protocol: yields (fold, train, test) for 5 seeded folds of `pool`;
    train = N_seq sequences drawn (seeded by the fold) from outside the fold, test = the fold."""
    import numpy as np

    from gpseq.corpora import kfold_indices

    folds = kfold_indices(len(pool), 5, seed=0)
    for fold, (outside, inside) in enumerate(folds[:max_folds]):
        rng = np.random.default_rng([fold, 11])
        chosen = rng.choice(outside, size=min(n_seq, len(outside)), replace=False)
        yield fold, [pool[i] for i in sorted(chosen)], [pool[i] for i in inside]


# ---- CRFsuite given gpseq's feature strings ---------------------------------------------------
def crfsuite_features(featurizer, sentences):
    """python-crfsuite input: per sentence, per token {feature string: 1.0} of gpseq's featuriser."""
    import numpy as np

    names = np.asarray(featurizer.feature_names(), dtype=object)
    matrix = featurizer.transform(sentences)
    rows = matrix.rows.tocsr()
    out = []
    for b in range(len(sentences)):
        seq = []
        for t in range(matrix.offsets[b], matrix.offsets[b + 1]):
            cols = rows.indices[rows.indptr[t] : rows.indptr[t + 1]]
            seq.append({names[c]: 1.0 for c in cols})
        out.append(seq)
    return out


REFERENCE_FEATURES = "reference"  # `_crf_train.py`'s feature_config for `reference_features`


def reference_features(sentences, pos_column: int | None = None):
    """python-crfsuite input with the features CRFsuite users usually configure (the sklearn-crfsuite
    tutorial's `word2features`, widened to offsets ±2): per token a bias, the lower-cased word,
    istitle / isupper / isdigit, its 3-character prefix and suffix, and the lower-cased words at
    offsets −2, −1, +1, +2 (`__BOS__` / `__EOS__` past the sentence's ends). With `pos_column` (the
    index, in file order, of the corpus's POS column in `Sentence.columns`; None where the corpus has
    none, or where POS is the label), also its POS tag and `postag[:2]`, the POS tags at −2, −1, +1,
    +2 and `postag[:2]` at −1 and +1, as the tutorial does (the markers past the ends)."""
    out = []
    for sentence in sentences:
        lower = [word.lower() for word in sentence.tokens]
        pos = None if pos_column is None else [row[pos_column] for row in sentence.columns]
        n = len(lower)
        seq = []
        for t, word in enumerate(sentence.tokens):
            features = {"bias": 1.0, "word.lower": lower[t], "word.istitle": word.istitle(),
                        "word.isupper": word.isupper(), "word.isdigit": word.isdigit(), "prefix3": word[:3],
                        "suffix3": word[-3:]}
            if pos is not None:
                features["postag"] = pos[t]
                features["postag[:2]"] = pos[t][:2]
            for offset in (-2, -1, 1, 2):
                at = t + offset
                inside = 0 <= at < n
                marker = "__BOS__" if at < 0 else "__EOS__"
                features[f"{offset:+d}:word.lower"] = lower[at] if inside else marker
                if pos is not None:
                    features[f"{offset:+d}:postag"] = pos[at] if inside else marker
                    if abs(offset) == 1:
                        features[f"{offset:+d}:postag[:2]"] = pos[at][:2] if inside else marker
            seq.append(features)
        out.append(seq)
    return out


def crfsuite_marginals(crf, X, labels):
    """Per sentence [T, V] token marginals of a fitted sklearn_crfsuite.CRF in `labels` order
    (labels the CRF does not know get 0, labels of the CRF outside `labels` are dropped)."""
    import numpy as np

    index = {label: i for i, label in enumerate(labels)}
    probs = []
    for seq in crf.predict_marginals(X):
        p = np.zeros((len(seq), len(labels)))
        for t, dist in enumerate(seq):
            for label, value in dist.items():
                if label in index:
                    p[t, index[label]] = value
        probs.append(p)
    return probs


def crfsuite_gold_log_probs(crf, X, sentences):
    """log p(gold path | x) per sentence under a fitted sklearn_crfsuite.CRF; −inf when a gold
    label was never seen in training (CRFsuite's `probability` raises on it, PEERS.md)."""
    import numpy as np

    tagger = crf.tagger_
    known = set(crf.classes_)
    out = []
    for x, s in zip(X, sentences):
        if any(label not in known for label in s.labels):
            out.append(-np.inf)
            continue
        tagger.set(x)
        out.append(float(np.log(max(tagger.probability(s.labels), 1e-300))))
    return out


def temper(probabilities, temperature: float):
    """p^(1/T) renormalised per row. probabilities: [N, V]."""
    import numpy as np

    logits = np.log(np.maximum(probabilities, 1e-300)) / temperature
    logits -= logits.max(axis=1, keepdims=True)
    out = np.exp(logits)
    return out / out.sum(axis=1, keepdims=True)


def fit_temperature(probabilities, gold_index) -> float:
    """T minimising the mean token NLL −log max(p^(1/T)[gold] / Σ, eps) (gpseq.evaluation.evaluate's token NLL).

    probabilities: [N, V]; gold_index: [N], −1 for labels outside the model's set (left out:
    tempering cannot change their NLL). Grid over log T in [log 0.05, log 20], then a bounded
    scalar search around the best grid point.
    """
    import math

    import numpy as np
    from scipy.optimize import minimize_scalar

    from gpseq.evaluation.evaluate import DEFAULT_EPS

    seen = gold_index >= 0
    if not seen.any():
        return 1.0
    log_p = np.log(np.maximum(probabilities[seen], 1e-300))
    gold = gold_index[seen]
    rows = np.arange(len(gold))

    def nll(log_t: float) -> float:
        z = log_p / math.exp(log_t)
        z_max = z.max(axis=1, keepdims=True)
        log_norm = z_max[:, 0] + np.log(np.exp(z - z_max).sum(axis=1))
        return float(np.mean(-np.maximum(z[rows, gold] - log_norm, math.log(DEFAULT_EPS))))

    grid = np.linspace(math.log(0.05), math.log(20.0), 41)
    values = [nll(g) for g in grid]
    best = int(np.argmin(values))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    result = minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-4})
    log_t = float(result.x) if result.fun <= values[best] else float(grid[best])
    return math.exp(log_t)


def run_meta(script: str, quick: bool, started: float) -> dict:
    """The `meta/...` keys every benchmark's JSON ends with: date, machine, the command that ran
    (`benchmarks/<script>` and this process's arguments), quick, gpseq version, git HEAD, wall
    seconds since `started` (a `time.perf_counter()` value) and this process's peak RSS."""
    import shlex

    import gpseq

    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return {
        "meta/date": time.strftime("%Y-%m-%d %H:%M"),
        "meta/machine": machine(),
        "meta/command": shlex.join(["python", f"benchmarks/{script}", *sys.argv[1:]]),
        "meta/quick": bool(quick),
        "meta/gpseq_version": gpseq.__version__,
        "meta/git_head": head.stdout.strip() or None,
        "meta/wall_s": time.perf_counter() - started,
        "meta/process_peak_rss_mb": peak_rss_mb(),
    }


# ---- commands as processes: wall time and their own peak RSS ---------------------------------
def gpseq_command() -> list[str]:
    """The `gpseq` console script of this interpreter's environment, else `python cli.py`."""
    script = Path(sys.executable).with_name("gpseq")
    return [str(script)] if script.exists() else [sys.executable, str(ROOT / "cli.py")]


def run_timed(command: list[str], log_path: str) -> tuple[int, float, float]:
    """Runs in a worker process: the command's exit code, wall time and its own peak RSS (MiB)."""
    with open(log_path, "wb") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (RUSAGE_CHILDREN is a max over all)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, wall, usage.ru_maxrss / 1024.0


def in_fresh_process(function, *args):
    """`function(*args)` in a new process forked from the light fork server (start it with
    `multiprocessing.forkserver.ensure_running()` while the calling script is still light).

    Why not a plain subprocess or a spawned worker: on Linux a child's ru_maxrss starts at the
    RSS of the process that forked it (the high-water mark of the pre-exec address space is
    kept), so a child of this process — which holds TensorFlow and the loaded models — would
    report this process's RSS as its own peak."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("forkserver")) as pool:
        return pool.submit(function, *args).result()
