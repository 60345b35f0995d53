"""Streaming `gpseq tag` on ~1 MB of raw text: peak RSS and tokens/s per --batch-size.

    python benchmarks/tag_stream.py [--quick] [--json PATH] [--model DIR] [--megabytes 1.0]

Builds the raw text by repeating the sentences of the bundled sample corpus (corpora/sample/*.conll,
tokens joined with spaces, a blank line every 8 sentences), trains a small model with the CLI
unless --model is given, then runs `python cli.py tag MODEL FILE -o OUT` in a subprocess for each
batch size and reads that child's peak RSS from os.wait4 (its own rusage, not the parent's). Bounded
memory shows as a peak RSS that does not grow with the input: the same command on one sentence
(start-up: TensorFlow, model load, first traces) and on a 10× smaller file is measured beside it.
There is no peer tool here: the figures are gpseq's own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "corpora" / "sample"


from _common import cpu_model  # noqa: E402
def sample_sentences() -> list[str]:
    """Text of every sentence of the sample corpus (tokens joined by spaces)."""
    sentences = []
    for name in ("train.conll", "dev.conll", "test.conll"):
        tokens: list[str] = []
        for line in (SAMPLE / name).read_text(encoding="utf-8").splitlines():
            fields = line.split()
            if fields:
                tokens.append(fields[0])
            elif tokens:
                sentences.append(" ".join(tokens))
                tokens = []
        if tokens:
            sentences.append(" ".join(tokens))
    return sentences


def write_text(path: Path, n_bytes: int, sentences: list[str]) -> int:
    """Repeat the sentences (paragraphs of 8) until the file holds at least n_bytes; returns its size."""
    written = 0
    with open(path, "w", encoding="utf-8") as handle:
        i = 0
        while written < n_bytes:
            paragraph = " ".join(sentences[(i + k) % len(sentences)] for k in range(8)) + "\n\n"
            handle.write(paragraph)
            written += len(paragraph.encode("utf-8"))
            i += 8
    return path.stat().st_size


def run_measured(command: list[str]) -> tuple[float, float, int]:
    """Run `command`; return (wall seconds, peak RSS of the child in MiB, exit status)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    start = time.perf_counter()
    child = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    stderr = child.stderr.read().decode("utf-8", "replace")
    child.stderr.close()
    if child.returncode != 0:
        sys.exit(f"command failed ({child.returncode}): {' '.join(command)}\n{stderr}")
    return elapsed, usage.ru_maxrss / 1024.0, child.returncode  # ru_maxrss is KiB on Linux


def count_tokens(conll_output: Path) -> tuple[int, int]:
    tokens = sentences = 0
    previous_blank = True
    with open(conll_output, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                tokens += 1
                if previous_blank:
                    sentences += 1
                previous_blank = False
            else:
                previous_blank = True
    return tokens, sentences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="0.25 MB and two batch sizes")
    parser.add_argument("--json", type=Path, help="write the figures as a flat JSON object")
    parser.add_argument("--model", type=Path, help="an existing model directory (default: train a small one)")
    parser.add_argument("--megabytes", type=float, default=None, help="size of the raw text (default 1.0)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None)
    parser.add_argument("--samples", type=int, default=None, help="tag with Monte Carlo marginals (default: --mean)")
    args = parser.parse_args()
    megabytes = args.megabytes or (0.25 if args.quick else 1.0)
    batch_sizes = args.batch_sizes or ([64, 512] if args.quick else [32, 256, 1024])
    cli = [sys.executable, str(ROOT / "cli.py")]
    mode = ["--samples", str(args.samples)] if args.samples else ["--mean"]

    with tempfile.TemporaryDirectory(prefix="gpseq-tag-stream-") as tmp:
        tmp = Path(tmp)
        model = args.model
        if model is None:
            model = tmp / "model"
            seconds, rss, _ = run_measured([*cli, "train", str(SAMPLE / "train.conll"), "-o", str(model),
                                            "--features", "ner", "--inducing", "16", "--max-steps", "40",
                                            "--set", "training.early_stopping=\"none\""])
            print(f"trained a small model in {seconds:.1f} s (peak RSS {rss:.0f} MiB)")
        sentences = sample_sentences()
        big, small = tmp / "big.txt", tmp / "small.txt"
        size = write_text(big, int(megabytes * 1e6), sentences)
        small_size = write_text(small, int(megabytes * 1e5), sentences)
        out = tmp / "out.conll"
        figures: dict = {
            "input_bytes": size,
            "small_input_bytes": small_size,
            "mode": "mean" if not args.samples else f"samples={args.samples}",
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
        }
        one = tmp / "one.txt"
        one.write_text(sentences[0] + "\n", encoding="utf-8")
        rows = []
        for batch_size in batch_sizes:
            common = [*mode, "--batch-size", str(batch_size), "-o", str(out)]
            # start-up alone (TF import, model load, first trace): one sentence
            seconds_one, rss_one, _ = run_measured([*cli, "tag", str(model), str(one), *common])
            seconds_small, rss_small, _ = run_measured([*cli, "tag", str(model), str(small), *common])
            seconds, rss, _ = run_measured([*cli, "tag", str(model), str(big), *common])
            tokens, n_sentences = count_tokens(out)
            net = tokens / max(1e-9, seconds - seconds_one)  # tokens/s net of start-up
            rows.append((batch_size, seconds_one, seconds, tokens / seconds, net, rss_one, rss_small, rss))
            figures[f"startup_s_b{batch_size}"] = round(seconds_one, 2)
            figures[f"peak_rss_mib_startup_b{batch_size}"] = round(rss_one, 1)
            figures[f"peak_rss_mib_small_b{batch_size}"] = round(rss_small, 1)
            figures[f"peak_rss_mib_b{batch_size}"] = round(rss, 1)
            figures[f"seconds_b{batch_size}"] = round(seconds, 2)
            figures[f"tokens_per_s_b{batch_size}"] = round(tokens / seconds, 1)
            figures[f"tokens_per_s_net_b{batch_size}"] = round(net, 1)
            figures["tokens"] = tokens
            figures["sentences"] = n_sentences

    print(f"\n`gpseq tag` on {size / 1e6:.2f} MB of raw text ({figures['tokens']:,} tokens, "
          f"{figures['sentences']:,} sentences; {figures['mode']}), beside a {small_size / 1e6:.2f} MB file")
    header = (f"{'batch':>6} {'start-up s':>10} {'total s':>8} {'tok/s':>8} {'tok/s net':>10} "
              f"{'RSS 1 sent.':>11} {'RSS 0.1x':>9} {'RSS 1x':>8}  (MiB)")
    print(header)
    print("-" * len(header))
    for batch_size, seconds_one, seconds, rate, net, rss_one, rss_small, rss in rows:
        print(f"{batch_size:>6} {seconds_one:>10.1f} {seconds:>8.1f} {rate:>8.0f} {net:>10.0f} "
              f"{rss_one:>11.0f} {rss_small:>9.0f} {rss:>8.0f}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"\nfigures → {args.json}")


if __name__ == "__main__":
    main()
