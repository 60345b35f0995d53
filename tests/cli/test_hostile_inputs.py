"""Hostile inputs to the real command line: lines without end, NUL bytes, CR-only line ends,
codecs that are not text encodings, `-o -`, symbolic link loops, a closed standard output.

Every case runs `python -m gpseq` in a subprocess and asserts the exit code, that stderr is one
line `error: FILE[:LINE]: problem`, and the sha256 of the input and every file beside it before and
after. The memory cases measure the command's peak RSS from a small wrapper process (see WRAPPER)
and hold it under PEAK_BOUND_MB, with an address-space cap so that a regression fails quickly
instead of taking the machine's memory. One tiny linear model (no TensorFlow: about 60 MB to
start, a second to load) is trained once for the module.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT
from helpers.cli import invoke
from helpers.tiny_model import corpus  # noqa: F401  (a module fixture: 20 sentences of the sample)

from gpseq.corpora.lines import MAX_JSONL_LINE_BYTES, MAX_LINE_BYTES

LINEAR = ["--features", "ner", "--max-steps", "2", "--seed", "3", "--set", "training.dev_fraction=0",
          "--set", "model.kernel=linear"]
LONG_LINE_BYTES = 80_000_000
PEAK_BOUND_MB = 250  # measured: 62 MB (column formats), 122 MB (JSON Lines), 141 MB (raw text)
ADDRESS_SPACE_CAP = 4 << 30
WORDS = ["committee", "budget", "approved", "three", "small", "projects", "fund", "the", "on", "Tuesday"]

# Runs the command of the JSON spec in argv[1]: {"args", "stdin" (a path or null), "read" (bytes of
# stdout to read before closing it, or null: stdout to /dev/null)}, under an address-space cap, and
# prints {"code", "peak_mb", "head" (what it read)}. The test process cannot measure its own child:
# Linux carries the RSS high-water mark of the memory a child starts from into its ru_maxrss, and
# this process holds models; the wrapper is a small process, so its child's peak is the command's.
WRAPPER = """
import json, resource, subprocess, sys
spec = json.loads(sys.argv[1])
def cap():
    resource.setrlimit(resource.RLIMIT_AS, (spec["cap"], spec["cap"]))
stdin = open(spec["stdin"], "rb") if spec["stdin"] else subprocess.DEVNULL
out = subprocess.PIPE if spec["read"] else subprocess.DEVNULL
child = subprocess.Popen(spec["args"], stdin=stdin, stdout=out, preexec_fn=cap, cwd=spec["cwd"])
head = b""
if spec["read"]:
    head = child.stdout.read(spec["read"])
    child.stdout.close()
child.wait()
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"code": child.returncode, "peak_mb": peak, "head": head.decode("utf-8", "replace")}))
"""


def env() -> dict[str, str]:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}


def gpseq(*args, cwd: Path | None = None, stdin=None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m gpseq ARGS` in a subprocess: its exit code, stdout and stderr."""
    return subprocess.run([sys.executable, "-m", "gpseq", *map(str, args)], cwd=cwd, stdin=stdin,
                          capture_output=True, text=True, env=env(), timeout=timeout)


def gpseq_peak(*args, cwd: Path, stdin: str | None = None, read: int | None = None,
               timeout: float = 300) -> tuple[int, float, str, str]:
    """`python -m gpseq ARGS` under WRAPPER: (exit code, peak RSS in MB, stdout read, stderr)."""
    spec = {"args": [sys.executable, "-m", "gpseq", *map(str, args)], "stdin": stdin, "read": read,
            "cap": ADDRESS_SPACE_CAP, "cwd": str(cwd)}
    done = subprocess.run([sys.executable, "-c", WRAPPER, json.dumps(spec)], capture_output=True, text=True,
                          env=env(), timeout=timeout)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["code"], result["peak_mb"], result["head"], done.stderr


def sha(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def zeros_sha(size: int) -> str:
    """sha256 of `size` NUL bytes: what a sparse file of that size that nothing wrote to hashes to."""
    digest, block = hashlib.sha256(), bytes(1 << 22)
    for start in range(0, size, len(block)):
        digest.update(block[:size - start])
    return digest.hexdigest()


def snapshot(*roots: Path) -> dict[str, str]:
    """sha256 of every file under `roots` (read in blocks: a 2 GB sparse file is hashed, not held),
    and every directory (as "dir")."""
    out = {}
    for root in roots:
        for folder, dirs, files in os.walk(root):
            for name in dirs:
                out[os.path.join(folder, name)] = "dir"
            for name in files:
                out[os.path.join(folder, name)] = sha(Path(folder, name))
    return out


def refused(result_code: int, stderr: str, where: str, problem: str, exit_code: int = 2) -> None:
    """Assert exit `exit_code` and one stderr line `error: WHERE: PROBLEM…`."""
    lines = stderr.strip().splitlines()
    assert result_code == exit_code, stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: {where}: {problem}"), lines


@pytest.fixture(scope="module")
def model(corpus, tmp_path_factory) -> Path:  # noqa: F811
    """A tiny linear model directory (tags without TensorFlow); do not modify."""
    model_dir = tmp_path_factory.mktemp("linear") / "model"
    result = invoke("train", corpus, "-o", model_dir, *LINEAR)
    assert result.exit_code == 0, result.stderr
    return model_dir


@pytest.fixture(scope="module")
def long_line(tmp_path_factory) -> Path:
    """A file of one 80 MB line of words (its only line break at the end); removed afterwards."""
    path = tmp_path_factory.mktemp("long") / "line.txt"
    rng = random.Random(0)
    block = " ".join(rng.choice(WORDS) for _ in range(200_000)) + " "
    with open(path, "w", encoding="utf-8") as handle:
        for _ in range(LONG_LINE_BYTES // len(block)):
            handle.write(block)
        handle.write(block[:LONG_LINE_BYTES % len(block)] + "\n")
    yield path
    path.unlink()


@pytest.fixture()
def notes(tmp_path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("The committee approved the budget. It funds three projects.\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# lines of any length: read in bounded pieces, refused past the limit of column formats
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command, format_", [(command, format_) for command in ("tag", "train")
                                              for format_ in ("conll", "crfpp", "conllu", "jsonl")])
def test_an_80mb_line_of_a_column_format_is_refused_in_bounded_memory(model, long_line, tmp_path, command,
                                                                       format_):
    """The line is refused once MAX_LINE_BYTES (JSON Lines: MAX_JSONL_LINE_BYTES) are read: exit 2,
    one line naming FILE:1, peak RSS under the bound. (Read whole and split, the line is a CoNLL
    token with 13 million columns: 1.1 GB to tag, 1.35 GB to train on.)"""
    out = tmp_path / ("model" if command == "train" else "out.conll")
    args = (["train", long_line, "-o", out, "--format", format_, *LINEAR] if command == "train"
            else ["tag", model, long_line, "-o", out, "--input-format", format_])
    before = snapshot(long_line.parent, tmp_path)
    code, peak, _, stderr = gpseq_peak(*args, cwd=tmp_path)
    limit = MAX_JSONL_LINE_BYTES if format_ == "jsonl" else MAX_LINE_BYTES
    refused(code, stderr, f"{long_line}:1", f"line longer than {limit:,} bytes")
    print(f"peak RSS, {command} --format {format_} on an 80 MB line: {peak:.0f} MB")
    assert peak < PEAK_BOUND_MB
    assert snapshot(long_line.parent, tmp_path) == before


def test_an_80mb_line_of_raw_text_is_read_in_bounded_pieces(model, long_line, tmp_path):
    """Raw text has no line limit: the line is read in pieces, so the first sentences are tagged
    and written before the rest is read. Stdout is closed after the first 64 KiB (exit 141, as a
    reader going away ends it); the peak is what reading so far cost (reading the whole line, then
    splitting it, costs 1.1 GB)."""
    before = snapshot(long_line.parent, tmp_path)
    code, peak, head, stderr = gpseq_peak("tag", model, long_line, "--batch-size", "16", cwd=tmp_path,
                                          read=1 << 16)
    assert code == 141, stderr
    assert "Traceback" not in stderr and "error" not in stderr, stderr
    tokens = [row.split("\t")[0] for row in head.splitlines()[:-1] if row]  # the last row may be cut
    with open(long_line, encoding="utf-8") as handle:
        words = handle.read(1 << 16).split()
    assert len(tokens) > 1000 and tokens == words[:len(tokens)]
    print(f"peak RSS, tag of an 80 MB text line (first 64 KiB of output): {peak:.0f} MB")
    assert peak < PEAK_BOUND_MB
    assert snapshot(long_line.parent, tmp_path) == before


@pytest.mark.parametrize("extra", [0, 1])
def test_a_line_of_the_limit_is_read_and_one_byte_more_is_refused(model, tmp_path, extra):
    """A CoNLL line of exactly MAX_LINE_BYTES, its line end included, is one token; a byte more is
    refused, naming the line."""
    path = tmp_path / "edge.conll"
    token = "a" * (MAX_LINE_BYTES - len(" B\n") + extra)
    path.write_text(f"first B\n\n{token} B\n\nlast B\n", encoding="utf-8")
    before = snapshot(tmp_path)
    out = tmp_path / "out.conll"
    result = gpseq("tag", model, path, "-o", out)
    if extra:
        refused(result.returncode, result.stderr, f"{path}:3", f"line longer than {MAX_LINE_BYTES:,} bytes")
        assert snapshot(tmp_path) == before
        return
    assert result.returncode == 0, result.stderr
    rows = [row.split("\t") for row in out.read_text(encoding="utf-8").splitlines() if row]
    assert [row[0] for row in rows] == ["first", token, "last"]
    assert sha(path) == before[str(path)]


# ---------------------------------------------------------------------------------------------
# NUL bytes (/dev/zero, a sparse file): binary data, refused at the first piece read
# ---------------------------------------------------------------------------------------------

NUL_CASES = ["tag /dev/zero", "tag - < /dev/zero", "tag sparse.txt", "tag sparse.conll", "train /dev/zero",
             "train sparse.conll", "evaluate sparse.conll"]


@pytest.mark.parametrize("case", NUL_CASES)
def test_nul_bytes_are_refused_at_once_in_bounded_memory(model, tmp_path, case):
    """/dev/zero (endless NUL bytes, no line end) and a 2 GB sparse file (os.truncate: no disk):
    exit 2 naming FILE:1 within seconds and under the bound. (Read as lines, /dev/zero grows until
    the process is killed, 23 GB on a 23 GB machine, and the sparse file takes 4.2 GB.)"""
    command, name = case.split()[:2]
    stdin = "/dev/zero" if "<" in case else None
    if name.startswith("sparse"):
        path = tmp_path / name
        with open(path, "wb"):
            pass
        os.truncate(path, 2 << 30)
    else:
        path = Path(name)
    out = tmp_path / ("model" if command == "train" else "out.conll")
    args = {"tag": ["tag", model, path, "-o", out], "train": ["train", path, "-o", out, *LINEAR],
            "evaluate": ["evaluate", model, path]}[command]
    before = {str(path): zeros_sha(2 << 30)} if name.startswith("sparse") else {}  # hashed once, not per test
    code, peak, _, stderr = gpseq_peak(*args, cwd=tmp_path, stdin=stdin, timeout=120)
    where = "<stdin>" if name == "-" else str(path)
    refused(code, stderr, f"{where}:1", "a NUL byte: binary data, not text")
    print(f"peak RSS, {case}: {peak:.0f} MB")
    assert peak < PEAK_BOUND_MB
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------------
# line ends: CR alone is refused (CRLF is read as LF: tests/cli/test_bad_input_files.py)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["train", "tag", "evaluate"])
@pytest.mark.parametrize("ends", ["CR", "CR CR LF"])
def test_lines_ending_in_cr_are_refused(model, corpus, tmp_path, command, ends):  # noqa: F811
    """`tr '\\n' '\\r' < corpus`: one line holding the whole corpus (read as such, it trains a
    one-token model); and a CR before CRLF (labels would end in CR). Exit 2 naming FILE:1."""
    path = tmp_path / "mac.conll"
    text = corpus.read_bytes()
    path.write_bytes(text.replace(b"\n", b"\r") if ends == "CR" else text.replace(b"\n", b"\r\r\n"))
    out = tmp_path / ("model" if command == "train" else "out.conll")
    args = {"train": ["train", path, "-o", out, *LINEAR], "tag": ["tag", model, path, "-o", out],
            "evaluate": ["evaluate", model, path]}[command]
    before = snapshot(tmp_path)
    result = gpseq(*args)
    refused(result.returncode, result.stderr, f"{path}:1", "carriage return (CR) inside the line")
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------------
# encodings: a codec that is not a text encoding, a UTF-16 reading of a UTF-8 file
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["train", "tag"])
@pytest.mark.parametrize("codec", ["rot13", "base64", "zlib"])
def test_a_codec_that_is_not_a_text_encoding_is_one_line(model, corpus, notes, tmp_path, command, codec):  # noqa: F811
    """`--encoding rot13` (str to str), base64 and zlib (bytes to bytes): exit 2 naming the file."""
    path = corpus if command == "train" else notes
    args = (["train", path, "-o", tmp_path / "model", "--encoding", codec, *LINEAR] if command == "train"
            else ["tag", model, path, "-o", tmp_path / "out.conll", "--encoding", codec])
    before = snapshot(tmp_path, path.parent)
    result = gpseq(*args)
    refused(result.returncode, result.stderr, str(path), f"{codec!r} is not a text encoding")
    assert snapshot(tmp_path, path.parent) == before


@pytest.mark.parametrize("command", ["train", "tag", "evaluate"])
def test_utf16_given_for_a_utf8_file_is_one_line(model, corpus, notes, tmp_path, command):  # noqa: F811
    """`--encoding utf-16` on a UTF-8 file (no byte-order mark): exit 2 naming FILE:1."""
    path = notes if command == "tag" else corpus
    args = {"train": ["train", path, "-o", tmp_path / "model", "--encoding", "utf-16", *LINEAR],
            "tag": ["tag", model, path, "-o", tmp_path / "out.conll", "--encoding", "utf-16"],
            "evaluate": ["evaluate", model, path, "--encoding", "utf-16"]}[command]
    before = snapshot(tmp_path, path.parent)
    result = gpseq(*args)
    refused(result.returncode, result.stderr, f"{path}:1", "not valid utf-16")
    assert snapshot(tmp_path, path.parent) == before


# ---------------------------------------------------------------------------------------------
# outputs: `-o -`, a closed standard output; inputs: a symbolic link loop
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["tag", "select"])
def test_dash_output_is_standard_output(model, notes, tmp_path, command):
    """`-o -` writes to standard output, as an input `-` reads standard input: no file named `-`."""
    before = snapshot(tmp_path)
    extra = ["-n", "1"] if command == "select" else []
    result = gpseq(command, model, notes, "-o", "-", *extra, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "committee" in result.stdout
    assert snapshot(tmp_path) == before  # no file named -


def test_dash_output_of_a_spacy_docbin_is_refused(model, notes, tmp_path):
    """A DocBin is binary: `--format spacy -o -` is a usage error (exit 4), nothing written."""
    before = snapshot(tmp_path)
    result = gpseq("tag", model, notes, "--format", "spacy", "-o", "-", cwd=tmp_path)
    assert result.returncode == 4, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == ["error: --format spacy writes a binary DocBin, not to standard output: give -o FILE, not -"]
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", ["tag", "select"])
def test_closed_standard_output_is_one_line(model, notes, tmp_path, command):
    """`gpseq tag MODEL notes.txt >&-` (Python has no sys.stdout then): exit 2 and one line; with
    -o the output is written as usual."""
    extra = ["-n", "1"] if command == "select" else []
    closed = ["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "gpseq"]
    before = snapshot(tmp_path)
    result = subprocess.run([*closed, command, str(model), str(notes), *extra], capture_output=True, text=True,
                            env=env(), timeout=300)
    refused(result.returncode, result.stderr, "<stdout>", "standard output is closed; give -o FILE")
    assert snapshot(tmp_path) == before
    out = tmp_path / "out.conll"
    result = subprocess.run([*closed, command, str(model), str(notes), *extra, "-o", str(out)],
                            capture_output=True, text=True, env=env(), timeout=300)
    assert result.returncode == 0, result.stderr
    assert "committee" in out.read_text(encoding="utf-8")


@pytest.mark.parametrize("command", ["train", "tag", "evaluate", "select"])
def test_a_symbolic_link_loop_is_named_as_such(model, tmp_path, command):
    """An input that is a symbolic link loop: exit 2 saying so (it exists: not "no such file")."""
    loop = tmp_path / "loop.conll"
    loop.symlink_to(loop.name)
    args = {"train": ["train", loop, "-o", tmp_path / "model", *LINEAR],
            "tag": ["tag", model, loop, "-o", tmp_path / "out.conll"],
            "evaluate": ["evaluate", model, loop],
            "select": ["select", model, loop, "-n", "1"]}[command]
    before = sorted(os.listdir(tmp_path))
    result = gpseq(*args)
    refused(result.returncode, result.stderr, str(loop), "symbolic link loop")
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize("command", ["info", "evaluate"])
def test_closed_standard_output_of_a_report_is_one_line(model, tmp_path, command):
    """`gpseq info|evaluate … >&-`: the report has nowhere to go; one line, exit 2, before any work
    (before, both exited 0 and the report was lost)."""
    corpus = tmp_path / "gold.conll"
    corpus.write_text("The\tO\ncommittee\tO\n\n")
    args = [command, str(model)] + ([str(corpus)] if command == "evaluate" else [])
    result = subprocess.run([sys.executable, "-m", "gpseq", *args], stdout=subprocess.DEVNULL, capture_output=False,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                            preexec_fn=lambda: os.close(1), timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == ("error: <stdout>: standard output is closed; the report is "
                                                      "written there")


@pytest.mark.parametrize("args, problem", [
    (["evaluate", "--samples", "100000"], "--samples must be in [1, 1,000]"),
    (["evaluate", "--bins", "1000000000"], "--bins must be in [1, 10,000]"),
    (["select", "--samples", "100000", "-n", "1"], "samples must be in [1, 1,000]"),
])
def test_sample_counts_are_capped_before_work(model, tmp_path, args, problem):
    corpus = tmp_path / "gold.conll"
    corpus.write_text("The\tO\ncommittee\tO\n\n")
    command, *options = args
    result = subprocess.run([sys.executable, "-m", "gpseq", command, str(model), str(corpus), *options],
                            capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), timeout=300)
    assert result.returncode == 4, result.stderr
    assert problem in result.stderr.strip().splitlines()[-1]
