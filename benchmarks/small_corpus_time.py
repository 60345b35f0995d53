"""Where a small corpus's `gpseq train` time goes, against CRFsuite's training process.

    python benchmarks/small_corpus_time.py [--corpora seg,basenp,chunking,japanesene] [--runs 5] [--json PATH]

For each CRF++ set (its own train.data), four whole processes, timed from start to exit like
`benchmarks/versus_crf.py` times them, in turn (A B C D A B C D …, `--runs` rounds; medians):

- `crfsuite`: CRFsuite's training process of versus_crf (`_crf_train.py`: read, featurise with
  gpseq's featurizer, train, save), no dev split: the yardstick of the "training ≤ 2×" target;
- `gpseq imports`: `python -c "import gpseq.cli, gpseq.features, gpseq.training.prior_path"`,
  the modules `gpseq train` needs before it reads a line;
- `gpseq bare fit`: `gpseq train FILE --features PRESET --set training.calibrate=false`: one MAP +
  Laplace fit at the first prior of the grid, no dev split, no prior search, no calibration;
- `gpseq default`: `gpseq train FILE --features PRESET`, the default command (the prior walk
  over cross-fitting folds, calibration, the decoder choice, the final fit).

Reported: the medians and each one's ratio to `crfsuite`. It measures what separates the default
from the 2× target on the smallest corpora; it does not score the models (versus_crf does).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import corpora_root, machine  # noqa: E402

SETS = {  # name: (folder, preset, encoding)
    "seg": ("seg", "segmentation", "utf-8"),
    "basenp": ("basenp", "chunking", "utf-8"),
    "chunking": ("chunking", "chunking", "utf-8"),
    "japanesene": ("JapaneseNE", "ner", "euc-jp"),
}
TRAINER_PARAMS = {"c1": 0.1, "c2": 0.1, "max_iterations": 100, "feature.possible_transitions": True}


def commands(name: str, work: Path) -> dict[str, list[str]]:
    from gpseq.features import get_preset

    folder, preset, encoding = SETS[name]
    train = corpora_root() / "crfpp" / folder / "train.data"
    spec = work / f"{name}.spec.json"
    spec.write_text(json.dumps({"train_file": str(train), "label_column": -1, "encoding": encoding,
                                "feature_config": get_preset(preset).to_dict(), "params": TRAINER_PARAMS,
                                "model_path": str(work / f"{name}.crfsuite"),
                                "featurizer_dir": str(work / f"{name}.features"),
                                "result": str(work / f"{name}.result.json")}))
    gpseq = [sys.executable, "-m", "gpseq", "train", str(train), "--features", preset, "--encoding", encoding]
    return {
        "crfsuite": [sys.executable, str(Path(__file__).with_name("_crf_train.py")), str(spec)],
        "gpseq imports": [sys.executable, "-c", "import gpseq.cli, gpseq.features, gpseq.training.prior_path"],
        "gpseq bare fit": [*gpseq, "--set", "training.calibrate=false", "-o", str(work / f"{name}.bare")],
        "gpseq default": [*gpseq, "-o", str(work / f"{name}.default")],
    }


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{command} exited with {done.returncode}: {done.stderr.decode(errors='replace')[-2000:]}")
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", default=",".join(SETS))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results = {"meta": {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"), "runs": args.runs}}
    with tempfile.TemporaryDirectory(prefix="small_corpus_time.") as work:
        for name in args.corpora.split(","):
            runs = commands(name, Path(work))
            for command in runs.values():  # one unrecorded round: file caches, .pyc files
                timed(command)
            seconds: dict[str, list[float]] = {label: [] for label in runs}
            for _ in range(args.runs):
                for label, command in runs.items():
                    seconds[label].append(timed(command))
            base = statistics.median(seconds["crfsuite"])
            for label, values in seconds.items():
                median = statistics.median(values)
                results[f"{name}/{label}/median_s"] = median
                results[f"{name}/{label}/ratio_to_crfsuite"] = median / base
                results[f"{name}/{label}/runs_s"] = values
                print(f"{name:10s} {label:15s} {median:6.3f} s  {median / base:5.2f}x CRFsuite", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
