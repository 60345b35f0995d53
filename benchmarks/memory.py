"""Peak memory of the default training and tagging as the corpus grows (issue 17), beside CRFsuite's.

    python benchmarks/memory.py [--copies 1 5] [--json OUT] [--skip-crf]

CoNLL-2000 train repeated `copies` times with jitter (in copy c ≥ 1, each token's word has its
first letter's case swapped with probability 0.1, so the copies are not identical and the feature
table grows a little), written to a temporary CoNLL file. For each size:
- `gpseq train FILE --features chunking -o DIR` as its own process: wall time and its own peak RSS;
- `gpseq tag DIR FILE -o OUT` (CoNLL in, streamed) as its own process: wall time and peak RSS;
- CRFsuite trained as in `versus_crf.py` (`_crf_train.py`: python-crfsuite's Trainer, L-BFGS,
  c1 = c2 = 0.1, 100 iterations, gpseq's feature strings) as its own process, and its tagging
  (`_crf_tag.py`: the same file streamed, Viterbi labels and their marginals) as another.
Peak RSS is each process's own (`os.wait4`), measured from a light fork server, so this script's
own memory is not its floor. Memory, not speed, is the point: run it at any priority.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import corpora_root, gpseq_command, in_fresh_process, run_meta, run_timed  # noqa: E402
from versus_crf import TRAINER_PARAMS  # noqa: E402

from gpseq.corpora import read_conll, write_conll  # noqa: E402
from gpseq.corpora.types import Sentence  # noqa: E402


def jittered(sentences: list[Sentence], copies: int, seed: int = 0) -> list[Sentence]:
    """`copies` copies of `sentences`; in every copy after the first, each word's first letter has
    its case swapped with probability 0.1 (the other columns and the labels unchanged)."""
    rng = np.random.default_rng(seed)
    out = list(sentences)
    for _ in range(copies - 1):
        for sentence in sentences:
            rows = [list(row) for row in sentence.columns]
            for row, flip in zip(rows, rng.random(len(rows)) < 0.1):
                if flip and row[0]:
                    row[0] = row[0][0].swapcase() + row[0][1:]
            out.append(Sentence([row[0] for row in rows], list(sentence.labels), rows))
    return out


def measure(command: list[str], log: Path) -> dict:
    code, wall, rss = in_fresh_process(run_timed, command, str(log))
    if code != 0:
        raise RuntimeError(f"{' '.join(command)} exited with {code}; log {log}")
    return {"wall_s": wall, "peak_rss_mb": rss}


def crf_spec(train_file: Path, model_dir: Path, work: Path, name: str) -> Path:
    """The `_crf_train.py` spec for CRFsuite on `train_file` with the gpseq model's features."""
    config = json.loads((model_dir / "tagger.json").read_text())["config"]["features"]
    spec = {"train_file": str(train_file), "label_column": -1, "encoding": "utf-8", "feature_config": config,
            "params": TRAINER_PARAMS, "model_path": str(work / f"{name}.crfsuite"),
            "featurizer_dir": str(work / f"{name}.features"), "result": str(work / f"{name}.result.json")}
    path = work / f"{name}.spec.json"
    path.write_text(json.dumps(spec))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--skip-crf", action="store_true", help="gpseq only")
    args = parser.parse_args()
    from multiprocessing import forkserver

    forkserver.ensure_running()  # while this process is light (see _common.in_fresh_process)
    started = time.perf_counter()
    base = read_conll(corpora_root() / "conll2000" / "train.txt")
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="gpseq-memory-") as tmp:
        work = Path(tmp)
        for copies in args.copies:
            corpus = jittered(base, copies)
            train_file = work / f"train{copies}.conll"
            write_conll(train_file, corpus)
            tokens = sum(len(s) for s in corpus)
            key = f"x{copies}"
            results[f"{key}/sentences"], results[f"{key}/tokens"] = len(corpus), tokens
            print(f"{copies} copies: {len(corpus):,} sentences, {tokens:,} tokens", flush=True)
            model_dir = work / f"model{copies}"
            train = measure(gpseq_command() + ["train", str(train_file), "--features", "chunking", "-o",
                                               str(model_dir)], work / f"train{copies}.log")
            print(f"  gpseq train {train['wall_s']:.0f} s, peak {train['peak_rss_mb']:,.0f} MiB", flush=True)
            tag = measure(gpseq_command() + ["tag", str(model_dir), str(train_file), "--input-format", "conll", "-o",
                                             str(work / f"tag{copies}.out")],
                          work / f"tag{copies}.log")
            print(f"  gpseq tag {tag['wall_s']:.0f} s, peak {tag['peak_rss_mb']:,.0f} MiB", flush=True)
            for name, value in (("train", train), ("tag", tag)):
                for metric, number in value.items():
                    results[f"{key}/gpseq/{name}_{metric}"] = number
            if not args.skip_crf:
                spec = crf_spec(train_file, model_dir, work, f"crf{copies}")
                crf = measure([sys.executable, str(Path(__file__).with_name("_crf_train.py")), str(spec)],
                              work / f"crf{copies}.log")
                print(f"  CRFsuite train {crf['wall_s']:.0f} s, peak {crf['peak_rss_mb']:,.0f} MiB", flush=True)
                crf_tag = measure([sys.executable, str(Path(__file__).with_name("_crf_tag.py")), str(spec),
                                   str(train_file), str(work / f"crf_tag{copies}.out")], work / f"crf_tag{copies}.log")
                print(f"  CRFsuite tag {crf_tag['wall_s']:.0f} s, peak {crf_tag['peak_rss_mb']:,.0f} MiB", flush=True)
                for name, value in (("train", crf), ("tag", crf_tag)):
                    for metric, number in value.items():
                        results[f"{key}/crfsuite/{name}_{metric}"] = number
            train_file.unlink()
    sizes = sorted(args.copies)
    if len(sizes) > 1:
        low, high = f"x{sizes[0]}", f"x{sizes[-1]}"
        extra = results[f"{high}/tokens"] - results[f"{low}/tokens"]
        for system, name in (("gpseq", "train"), ("gpseq", "tag"), ("crfsuite", "train"), ("crfsuite", "tag")):
            first, last = results.get(f"{low}/{system}/{name}_peak_rss_mb"), results.get(f"{high}/{system}/{name}_peak_rss_mb")
            if first is not None and last is not None:
                results[f"growth/{system}/{name}_bytes_per_token"] = (last - first) * 2**20 / extra
                print(f"{system} {name}: +{(last - first) * 2**20 / extra:,.0f} bytes of peak RSS per added token")
    results.update(run_meta("memory.py", False, started))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
