"""Probabilities that stay honest when the text changes: a POS tagger trained on CoNLL-2000's WSJ
and tested on CoNLL-2000's test set and on ten genres of MASC, gpseq against CRFsuite.

    python benchmarks/shift.py [--json OUT] [--quick] [--workdir DIR]

Training file: CoNLL-2000 train.txt, word → POS (column 1 as label). Systems, trained and tested
in the same run:
- `gpseq`: `gpseq train TRAIN --features pos --label-column 1 -o DIR`, nothing else (the
  default training carves its own dev split from TRAIN; versus_crf.py's `conll2000-pos`
  command, run by its `run_systems`), loaded with `Tagger.load` and tested with default settings.
- `gpseq_map_t`: the same trained model with its posterior variance switched off: a copy of the
  model directory whose variance scale α (`var:variance_scale` in arrays.npz, the α of
  `gpseq.predict.linear.LinearPredictive`) is the smallest positive number of its dtype
  (gpseq refuses to load an α that is not positive; √(1 + π α v / 8) is then 1 to machine
  precision, as at α = 0), so that its probabilities are the MAP weights' under a temperature
  alone: the T the training fitted for the chosen fit at α = β ≈ 0 on its dev split
  (`scores.calibration.map_temperature` in tagger.json; the model's own T where a model lacks it).
- `crfsuite`, `crfsuite_t`: as in versus_crf.py: sklearn-crfsuite with gpseq's feature strings,
  L-BFGS, c1 = c2 = 0.1, 100 iterations, all_possible_transitions=True, on the full training
  file; `_t` trained on train minus `gpseq.corpora.splits.train_dev_split(len(train), 0.1,
  seed=0)`, its token marginals tempered p^(1/T) and renormalised per token, T fitted by token
  NLL on that dev split.
- `crfsuite_ref`, `crfsuite_ref_t`: the same two with the features CRFsuite users usually
  configure (`_common.reference_features`, the sklearn-crfsuite tutorial's: a bias, the
  lower-cased word, istitle / isupper / isdigit, 3-character prefix and suffix, the lower-cased
  words at offsets −2, −1, +1, +2 with BOS / EOS markers; no POS features, POS is the label).

Test sets: `conll2000` (test.txt, POS column) and the ten MASC genres (`masc/<genre>.conll`).

Metrics per test set and system, from the per-token outcomes of `_bootstrap.outcomes` (a gold
label a system never saw, such as MASC's `LS`, is an error with clipped NLL): accuracy, token
NLL, ECE (15 bins, confidence of the returned label), Brier, AURC; the same on the OOV tokens —
word forms absent from the training file (exact, case-sensitive; `_bootstrap.unseen` and
`restrict`, shared with versus_crf.py) — as `oov_<metric>`, with `oov_tokens`;
`ece_if_calibrated` (`_bootstrap.calibrated_ece`: the ECE chance alone gives a calibrated system
with these confidences on this test set), temperature, tagging tokens/s.
For each test set and peer: gpseq − peer for NLL, ECE, accuracy and AURC with a 95 % interval
from a paired bootstrap over the test sentences (`_bootstrap.paired_bootstrap`, 1,000 draws)
and a better / tie / worse verdict for gpseq.

Summary over the ten genres, counted "k/10": gpseq's ECE ≤ that of both crfsuite and
crfsuite_t (and of both reference-feature CRFs); its NLL and its AURC below both; its accuracy ≥
crfsuite's − 0.2 points (and crfsuite_ref's); its OOV NLL and OOV ECE below crfsuite_t's; its
ECE and NLL below gpseq_map_t's.

--quick: the training file cut to its first 500 sentences, each test set to 300; the same
commands otherwise. Everything is written in a temporary folder (or --workdir) and the --json
file, which then carries meta/quick = true and is refused over a file git tracks. Never commit
quick figures as results.

Output: a table per test set, then the summary; with --json a flat JSON object:
`<testset>/<system>/<metric>`, `<testset>/data/...`, `<testset>/gpseq_minus_<peer>/<metric>`
([difference, low, high]), `significance/<testset>/<metric>_vs_<peer>`,
`significance/count/...` (over the genres), `summary/<testset>/<target>` booleans,
`summary/count/<target>` and `meta/...`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _bootstrap import calibrated_ece, metric, paired_bootstrap, restrict, unseen, verdict  # noqa: E402
from _common import REFERENCE_FEATURES, corpora_root, machine, run_meta  # noqa: E402
from versus_crf import (  # noqa: E402
    count_verdicts,
    corpora,
    refuse_tracked,
    run_systems,
    test_all,
    test_crf,
    test_gpseq,
    train_crf,
)
from gpseq.corpora import read_conll, write_conll  # noqa: E402
from gpseq.saved.directory import file_manifest  # noqa: E402
from gpseq.saved.meta import META_FILE  # noqa: E402

SYSTEMS = ("gpseq", "gpseq_map_t", "crfsuite", "crfsuite_t", "crfsuite_ref", "crfsuite_ref_t")
PEERS = SYSTEMS[1:]
GENRES = ("blog", "essays", "ficlets", "govt-docs", "jokes", "journal", "letters", "movie-script", "non-fiction",
          "travel-guides")
MEASURED = {"accuracy": "score", "token_nll": "token_nll", "ece": "ece", "brier": "brier", "aurc": "aurc"}  # ours:
# `_bootstrap.metric`'s name (its score is token accuracy for POS labels)
BOOTSTRAPPED = ("token_nll", "ece", "accuracy", "aurc")
QUICK_TRAIN, QUICK_TEST = 500, 300
LABEL_COLUMN = 1


# ---- the systems --------------------------------------------------------------------------------
def without_variance(model_dir: Path, copy_dir: Path) -> tuple[float, float]:
    """Copy a gpseq model directory with its variance scale α set to 0 in effect (MAP + T): the
    smallest positive number of its dtype, as a loaded α must be positive (column 0's variance,
    β σ² stored relative to α, goes with it), and its temperature the MAP's own
    (`map_temperature`, when the training recorded one). Returns (the model's α, the copy's T)."""
    shutil.rmtree(copy_dir, ignore_errors=True)
    shutil.copytree(model_dir, copy_dir)
    with np.load(copy_dir / "arrays.npz", allow_pickle=False) as saved:
        arrays = dict(saved)
    alpha = float(arrays["var:variance_scale"])
    scale = arrays["var:variance_scale"]
    arrays["var:variance_scale"] = np.full_like(scale, np.finfo(scale.dtype).tiny)
    meta_path = copy_dir / META_FILE
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    map_temperature = meta["scores"].get("calibration", {}).get("map_temperature")
    if map_temperature is not None:
        arrays["var:temperature"] = np.full_like(arrays["var:temperature"], map_temperature)
    temperature = float(arrays["var:temperature"])
    np.savez_compressed(copy_dir / "arrays.npz", **arrays)
    meta["files"] = file_manifest(copy_dir)  # arrays.npz changed: its size and sha256
    meta_path.write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return alpha, temperature


def train_systems(train_file: Path, train, first_test, workdir: Path) -> tuple[dict, dict]:
    """Train the six systems; (their metrics on `first_test`, their trained state)."""
    spec = next(c for c in corpora() if c.name == "conll2000-pos")
    read_options = {"label_column": LABEL_COLUMN, "encoding": "utf-8"}
    metrics, state = run_systems(train_file, read_options, train, first_test, spec.features, spec.cli_extras(),
                                 workdir, "pos")
    model_dir = state["gpseq"]["model_dir"]
    alpha, map_temperature = without_variance(model_dir, workdir / "pos.gpseq_map_t")
    state["gpseq"]["variance_scale"] = alpha
    state["gpseq_map_t"] = {"model_dir": workdir / "pos.gpseq_map_t", "temperature": map_temperature}
    temperature = state["gpseq"]["temperature"] or math.nan
    print(f"  gpseq α = {alpha:.4g}, T = {temperature:.3f}; CRFsuite, reference features …", flush=True)
    for system, tempered in (("crfsuite_ref", False), ("crfsuite_ref_t", True)):
        state[system] = train_crf(train_file, read_options, REFERENCE_FEATURES, workdir, f"pos.{system}", tempered)
        print(f"    {system}: {state[system]['train_s']:.1f} s"
              + (f" (T = {state[system]['temperature']:.3f})" if tempered else ""), flush=True)
    metrics.update(test_added(state, first_test))
    return metrics, state


def test_added(state: dict, test) -> dict:
    """Metrics of the systems versus_crf.py's `test_all` does not test: gpseq_map_t and the reference-feature CRFs."""
    metrics = {"gpseq_map_t": test_gpseq(state["gpseq_map_t"]["model_dir"], test)}
    for system in ("crfsuite_ref", "crfsuite_ref_t"):
        metrics[system] = test_crf(state[system], test)
    for system in metrics:
        for key in ("train_s", "temperature"):
            if state[system].get(key) is not None:
                metrics[system][key] = state[system][key]
    return metrics


# ---- metrics of one test set ----------------------------------------------------------------------
def measure(testset: str, metrics: dict, oov: np.ndarray) -> dict:
    """`<testset>/<system>/<metric>` of every system from its outcomes (popped from `metrics`), all
    tokens and OOV tokens; gpseq − peer by the paired bootstrap with verdicts."""
    results = {system: dataclasses.replace(metrics[system].pop("outcomes"), chunks=None)  # score: token accuracy
               for system in SYSTEMS}
    narrowed = {system: restrict(result, oov) for system, result in results.items()}
    out = {}
    for system in SYSTEMS:
        values = {key: metric(results[system], name) for key, name in MEASURED.items()}
        values.update({f"oov_{key}": metric(narrowed[system], name) for key, name in MEASURED.items()})
        values["oov_tokens"] = int(oov.sum())
        values["ece_if_calibrated"], values["ece_if_calibrated_q95"] = calibrated_ece(results[system])
        for key in ("temperature", "train_s", "tag_tokens_per_s"):
            if metrics[system].get(key) is not None:
                values[key] = metrics[system][key]
        for key, reported in (("accuracy", "token_accuracy"), ("token_nll", "token_nll"), ("ece", "ece")):
            value, check = values[key], metrics[system].get(reported)
            if check is not None and not math.isclose(value, check, rel_tol=1e-6, abs_tol=1e-9):
                print(f"    note: {testset} {system} {key} {value:.6f} from outcomes, {check:.6f} from evaluate",
                      flush=True)
        out.update({f"{testset}/{system}/{key}": value for key, value in values.items()})
    names = [MEASURED[key] for key in BOOTSTRAPPED]
    for peer in PEERS:
        for name, (diff, low, high) in paired_bootstrap(results["gpseq"], results[peer], names).items():
            key = next(k for k, n in MEASURED.items() if n == name)
            out[f"{testset}/gpseq_minus_{peer}/{key}"] = [diff, low, high]
            out[f"significance/{testset}/{key}_vs_{peer}"] = verdict(low, high, higher_is_better=key == "accuracy")
    return out


def run_testset(name: str, test, metrics: dict, vocabulary: set, path: Path) -> dict:
    oov = unseen(test, vocabulary)
    out = measure(name, metrics, oov)
    out.update({f"{name}/data/test_file": str(path), f"{name}/data/test_sentences": len(test),
                f"{name}/data/test_tokens": len(oov)})
    return out


# ---- summary --------------------------------------------------------------------------------------
def targets(testset: str, results: dict) -> dict:
    """The summary's targets on one test set (None where a metric is missing)."""
    def get(system, key):
        value = results.get(f"{testset}/{system}/{key}")
        return None if value is None or not math.isfinite(value) else value

    def below(key, peers, strict=True):
        ours, theirs = get("gpseq", key), [get(p, key) for p in peers]
        if ours is None or any(v is None for v in theirs):
            return None
        return bool(ours < min(theirs) if strict else ours <= min(theirs))

    def accuracy_within(peer):
        ours, theirs = get("gpseq", "accuracy"), get(peer, "accuracy")
        return None if ours is None or theirs is None else bool(100 * ours >= 100 * theirs - 0.2)

    plain, reference = ("crfsuite", "crfsuite_t"), ("crfsuite_ref", "crfsuite_ref_t")
    return {
        "ece_le_crfsuite_and_t": below("ece", plain, strict=False),
        "ece_le_crfsuite_ref_and_t": below("ece", reference, strict=False),
        "nll_below_crfsuite_and_t": below("token_nll", plain),
        "nll_below_crfsuite_ref_and_t": below("token_nll", reference),
        "aurc_below_crfsuite_and_t": below("aurc", plain),
        "aurc_below_crfsuite_ref_and_t": below("aurc", reference),
        "accuracy_ge_crfsuite_minus_0.2": accuracy_within("crfsuite"),
        "accuracy_ge_crfsuite_ref_minus_0.2": accuracy_within("crfsuite_ref"),
        "oov_nll_below_crfsuite_t": below("oov_token_nll", ("crfsuite_t",)),
        "oov_ece_below_crfsuite_t": below("oov_ece", ("crfsuite_t",)),
        "ece_below_gpseq_map_t": below("ece", ("gpseq_map_t",)),
        "nll_below_gpseq_map_t": below("token_nll", ("gpseq_map_t",)),
    }


def summarise(results: dict, done: list[str]) -> dict:
    out = {}
    counts: dict[str, list] = {}
    for testset in done:
        for target, value in targets(testset, results).items():
            out[f"summary/{testset}/{target}"] = value
            if testset in GENRES:
                counts.setdefault(target, []).append(value)
    for target, values in counts.items():
        out[f"summary/count/{target}"] = f"{sum(v is True for v in values)}/{len(GENRES)}"
    out.update(count_verdicts(results, corpora=set(GENRES)))
    return out


# ---- output ---------------------------------------------------------------------------------------
ROWS = (  # (metric, label, format)
    ("accuracy", "accuracy %", lambda v: f"{100 * v:.2f}"),
    ("token_nll", "token NLL", lambda v: f"{v:.4f}"),
    ("ece", "ECE", lambda v: f"{v:.4f}"),
    ("ece_if_calibrated_q95", "ECE if calibrated, 95 %", lambda v: f"{v:.4f}"),
    ("brier", "Brier", lambda v: f"{v:.4f}"),
    ("aurc", "AURC", lambda v: f"{v:.5f}"),
    ("oov_accuracy", "OOV accuracy %", lambda v: f"{100 * v:.2f}"),
    ("oov_token_nll", "OOV token NLL", lambda v: f"{v:.4f}"),
    ("oov_ece", "OOV ECE", lambda v: f"{v:.4f}"),
    ("oov_brier", "OOV Brier", lambda v: f"{v:.4f}"),
    ("oov_aurc", "OOV AURC", lambda v: f"{v:.5f}"),
    ("temperature", "temperature T", lambda v: f"{v:.3f}"),
)
SHORT = {"gpseq_map_t": "map_t", "crfsuite": "crf", "crfsuite_t": "crf_t", "crfsuite_ref": "crf_ref",
         "crfsuite_ref_t": "crf_ref_t"}


def table(testset: str, results: dict) -> str:
    data = {k.rsplit("/", 1)[1]: v for k, v in results.items() if k.startswith(f"{testset}/data/")}
    lines = [f"== {testset}  ({data.get('test_sentences')} sentences, {data.get('test_tokens')} tokens, "
             f"{results.get(f'{testset}/gpseq/oov_tokens')} OOV)",
             f"{'':<24}" + "".join(f"{s:>15}" for s in SYSTEMS)]
    for key, label, fmt in ROWS:
        cells = [results.get(f"{testset}/{s}/{key}") for s in SYSTEMS]
        if all(c is None for c in cells):
            continue
        lines.append(f"{label:<24}" + "".join(f"{fmt(c) if c is not None else '-':>15}" for c in cells))
    lines.append("gpseq − peer, 95 % paired bootstrap over sentences:")
    for key in BOOTSTRAPPED:
        cells = []
        for peer in PEERS:
            diff, low, high = results[f"{testset}/gpseq_minus_{peer}/{key}"]
            scale = 100 if key == "accuracy" else 1
            mark = {"better": "+", "worse": "−", "tie": "="}[results[f"significance/{testset}/{key}_vs_{peer}"]]
            cells.append(f"{SHORT[peer]} {scale * diff:+.4f} [{scale * low:+.4f}, {scale * high:+.4f}]{mark}")
        lines.append(f"  {key + (' (points)' if key == 'accuracy' else ''):<18}" + "; ".join(cells))
    return "\n".join(lines)


def overview(results: dict, done: list[str]) -> str:
    """Test set × system for the headline metrics."""
    lines = []
    for key, label, fmt in (ROWS[0], ROWS[1], ROWS[2], ROWS[5], ROWS[7], ROWS[8]):
        lines.append(f"{label:<16}" + "".join(f"{s:>15}" for s in SYSTEMS))
        for testset in done:
            cells = [results.get(f"{testset}/{s}/{key}") for s in SYSTEMS]
            lines.append(f"  {testset:<14}" + "".join(f"{fmt(c) if c is not None else '-':>15}" for c in cells))
    return "\n".join(lines)


def read_testsets(quick: bool):
    """[(name, path, sentences)]: CoNLL-2000's test set, then the MASC genres (POS labels)."""
    root = corpora_root()
    paths = [("conll2000", root / "conll2000" / "test.txt")]
    paths += [(genre, root / "masc" / f"{genre}.conll") for genre in GENRES]
    out = []
    for name, path in paths:
        sentences = read_conll(path, label_column=LABEL_COLUMN)
        out.append((name, path, sentences[:QUICK_TEST] if quick else sentences))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the flat JSON results here")
    parser.add_argument("--quick", action="store_true", help="reduced run (see above)")
    parser.add_argument("--workdir", type=Path, help="keep models and logs here (default: a temporary folder)")
    args = parser.parse_args()
    if args.quick and args.json is not None:
        refuse_tracked(args.json)
    from multiprocessing import forkserver

    forkserver.ensure_running()  # while this process is still light (`_common.in_fresh_process`)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="shift."))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"shift: {machine()}; work dir {workdir}", flush=True)
    started = time.perf_counter()
    train_file = corpora_root() / "conll2000" / "train.txt"
    train = read_conll(train_file, label_column=LABEL_COLUMN)
    if args.quick:
        train = train[:QUICK_TRAIN]
        train_file = workdir / "pos.train.txt"
        write_conll(train_file, train)
    vocabulary = {word for sentence in train for word in sentence.tokens}
    testsets = read_testsets(args.quick)
    results: dict = {}
    done = []
    try:
        name, path, test = testsets[0]
        print(f"training on {len(train)} sentences; testing on {name} …", flush=True)
        metrics, state = train_systems(train_file, train, test, workdir)
        results.update(run_testset(name, test, metrics, vocabulary, path))
        done.append(name)
        for name, path, test in testsets[1:]:
            print(f"{name}:", flush=True)
            try:
                metrics = test_all(state, test)
                metrics.update(test_added(state, test))
                results.update(run_testset(name, test, metrics, vocabulary, path))
                done.append(name)
            except Exception as error:  # noqa: BLE001 — record and go on with the other test sets
                traceback.print_exc()
                results[f"{name}/error"] = f"{type(error).__name__}: {error}"[:2000]
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    results.update(summarise(results, done))
    results.update({"meta/train_file": str(corpora_root() / "conll2000" / "train.txt"),
                    "meta/train_sentences": len(train), "meta/train_tokens": sum(len(s) for s in train),
                    "meta/gpseq_command": state["gpseq"]["command"],
                    "meta/gpseq_variance_scale": state["gpseq"]["variance_scale"],
                    "meta/gpseq_temperature": state["gpseq"]["temperature"],
                    "meta/gpseq_prior": state["gpseq"]["prior"], "meta/gpseq_decode": state["gpseq"]["decode"]})
    results.update(run_meta("shift.py", args.quick, started))

    print()
    for testset in done:
        print(table(testset, results))
        print()
    print(overview(results, done))
    print()
    for key, value in results.items():
        if key.startswith(("summary/count/", "significance/count/")) or key.endswith("/error"):
            print(f"{key}: {value}")
    print(f"gpseq: α = {state['gpseq']['variance_scale']:.4g}, T = {state['gpseq']['temperature'] or math.nan:.3f}, "
          f"prior {state['gpseq']['prior']}, decoder {state['gpseq']['decode']}; {results['meta/wall_s']:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
