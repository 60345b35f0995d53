"""`gpseq serve` under load on 127.0.0.1, against `Tagger.tag` in-process on the same sentences.

    python benchmarks/serve.py [--quick] [--json PATH] [--model DIR] [--clients 32] [--seconds 60]
                               [--sentences-per-request 8 1 32] [--workers N]

Sentences: CoNLL-2000 test (`$GPSEQ_CORPORA/conll2000/test.txt`, 2,012 sentences, 47,377
tokens), sent pre-tokenised as rows [word, POS] (the chunker's features read the POS column).
A request holds k consecutive sentences (a paragraph; `--sentences-per-request`, each k a load
phase of its own on the same server).

1. In-process peer: this process loads the model and times `Tagger.tag(all sentences,
   batch_size=256)` (best of 3, after a warm-up call), before and after the load phases; the
   ratio uses their mean. After the phases the same measurement runs once more in a child process
   with `OPENBLAS_NUM_THREADS=1`, as the server runs (`gpseq serve` limits OpenBLAS to one thread),
   and is reported beside it; and, since the server runs one worker process per usable CPU, the
   same call in one child process per usable CPU at once (one OpenBLAS thread each, started
   together), their tokens/s summed: in-process throughput on the cores the server has.
2. The service: `python -m gpseq serve MODEL --host 127.0.0.1 --port P` in a subprocess (the real
   command, default settings: one worker process per usable CPU; `--workers` passes one), ready when every worker has
   started and GET /health answers 200.
3. Each load phase: `--clients` concurrent clients (asyncio tasks, one keep-alive HTTP/1.1
   connection each, a minimal client of asyncio streams), each POSTing its next request as soon as the previous one is answered, for
   `--seconds`. Recorded: status of every request (anything but 200, or a client exception, is an
   error), latency, tokens. Every response's labels are compared with the in-process labels of
   the same sentences. The server's RSS (summed over its processes: the supervisor and the
   workers) is sampled every 0.5 s from /proc/PID/status; its CPU time (all its processes) and
   this process's (the clients) are read before and after.
4. GET /metrics for the mean batch size, then SIGTERM: the server must exit 0.

Only 127.0.0.1 is contacted. The JSON (`--json`) is flat: the first request size's figures under
plain names, every size's under `k{size}_...`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from _common import ROOT, corpora_root, machine

DEFAULT_MODEL = ROOT / "models" / "en_chunk_conll2000"


def read_test() -> list:
    from gpseq.corpora import read_corpus

    path = corpora_root() / "conll2000" / "test.txt"
    if not path.is_file():
        sys.exit(f"error: {path} not found (set GPSEQ_CORPORA; see ../shared/corpora/README.md)")
    return read_corpus(path, "conll")


def unlabelled(sentences) -> list:
    """The sentences as a client sends them: rows [word, POS], no label."""
    from gpseq.corpora.types import Sentence

    return [Sentence(tokens=list(s.tokens), columns=[row[:2] for row in s.columns]) for s in sentences]


def in_process(model_dir: Path, sentences: list, repeats: int) -> tuple[object, list[tuple[float, float]]]:
    """(tagger, (tokens/s, tokens per CPU second) of each timed `Tagger.tag(sentences, batch_size=256)`)."""
    from gpseq.tagger import Tagger

    tagger = Tagger.load(model_dir)
    tagger.tag(sentences[:8])  # trace the compiled prediction
    return tagger, time_in_process(tagger, sentences, repeats)


def time_in_process(tagger, sentences: list, repeats: int) -> list[tuple[float, float]]:
    n_tokens = sum(len(s.tokens) for s in sentences)
    rates = []
    for _ in range(repeats):
        began, cpu = time.perf_counter(), time.process_time()
        tagger.tag(sentences, batch_size=256)
        rates.append((n_tokens / (time.perf_counter() - began), n_tokens / (time.process_time() - cpu)))
    return rates


def server_stack() -> str:
    """The HTTP stack the server runs on (the serve extra's packages in this environment, which the
    server subprocess shares): uvicorn takes httptools and uvloop, gpseq.serve.wire orjson, when present."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ("fastapi", "uvicorn", "httptools", "uvloop", "orjson"):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} absent")
    return ", ".join(found)


def in_process_one_blas_thread(model_dir: Path, repeats: int) -> tuple[float, float]:
    """(best tokens/s, its tokens per CPU second) of the same in-process measurement in a child
    process whose OpenBLAS has one thread, as the server's has (`gpseq serve` limits it): the
    reference above keeps the library's default, whose helper threads spin on the other core
    between small products."""
    child = subprocess.run([sys.executable, __file__, "--model", str(model_dir), "--inprocess-only", str(repeats)],
                           env={**os.environ, "OPENBLAS_NUM_THREADS": "1"}, cwd=ROOT, capture_output=True, text=True,
                           check=True)
    rate, per_cpu = child.stdout.strip().splitlines()[-1].split()
    return float(rate), float(per_cpu)


def in_process_parallel(model_dir: Path, processes: int, repeats: int) -> float:
    """Summed tokens/s of `processes` child processes (one OpenBLAS thread each) timing
    `Tagger.tag(all sentences, batch_size=256)` `repeats` times at once: each loads the model and
    warms up, then all start together."""
    children = [subprocess.Popen([sys.executable, __file__, "--model", str(model_dir), "--parallel-child",
                                  str(repeats)], env={**os.environ, "OPENBLAS_NUM_THREADS": "1"}, cwd=ROOT,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    for child in children:
        assert child.stdout.readline().strip() == "ready"
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    rates = [float(child.communicate(timeout=600)[0].strip().splitlines()[-1]) for child in children]
    return sum(rates)


def parallel_child(model_dir: Path, repeats: int) -> None:
    """The child of `in_process_parallel`: ready, waits for "go", prints tokens/s over its calls."""
    from gpseq.tagger import Tagger

    sentences = unlabelled(read_test())
    tagger = Tagger.load(model_dir)
    tagger.tag(sentences, batch_size=256)  # warm-up: compiled shapes, caches
    print("ready", flush=True)
    sys.stdin.readline()
    began = time.perf_counter()
    for _ in range(repeats):
        tagger.tag(sentences, batch_size=256)
    print(repeats * sum(len(s.tokens) for s in sentences) / (time.perf_counter() - began), flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rss_mb(pid: int) -> float | None:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (its threads included), seconds."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (the server's supervisor, its workers and helpers)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                todo += [int(c) for c in open(f"/proc/{current}/task/{task}/children").read().split()]
        except OSError:
            pass
    return found


def tree_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds of each live process of the server's tree."""
    out = {}
    for member in process_tree(pid):
        try:
            out[member] = cpu_seconds(member)
        except OSError:
            pass
    return out


def tree_rss_mb(pid: int) -> dict[int, float]:
    """Resident MiB of each live process of the server's tree."""
    return {member: value for member in process_tree(pid) if (value := rss_mb(member)) is not None}


class RssSampler(threading.Thread):
    """The server tree's summed RSS every `every` seconds (and each process's peak)."""

    def __init__(self, pid: int, every: float = 0.5):
        super().__init__(daemon=True)
        self.pid, self.every, self.samples, self._stop_event = pid, every, [], threading.Event()
        self.peaks: dict[int, float] = {}

    def run(self):
        began = time.monotonic()
        while not self._stop_event.wait(self.every):
            values = tree_rss_mb(self.pid)
            if values:
                self.samples.append((time.monotonic() - began, sum(values.values())))
                for member, value in values.items():
                    self.peaks[member] = max(value, self.peaks.get(member, 0.0))

    def stop(self) -> list[tuple[float, float]]:
        self._stop_event.set()
        self.join()
        return self.samples


def start_server(model_dir: Path, port: int, log_path: Path, workers: int | None) -> subprocess.Popen:
    log = open(log_path, "w")
    command = [sys.executable, "-m", "gpseq", "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port)]
    if workers is not None:
        command += ["--workers", str(workers)]
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def started_workers(log_path: Path) -> int:
    """Server processes that have finished starting (uvicorn logs it once per worker)."""
    return log_path.read_text().count("Application startup complete")


def planned_workers(log_path: Path) -> int | None:
    """The worker processes `gpseq serve` said it starts."""
    match = re.search(r"with (\d+) worker process", " ".join(log_path.read_text().split()))
    return int(match.group(1)) if match else None


def wait_ready(url: str, server: subprocess.Popen, log_path: Path, limit: float = 300.0) -> float:
    began = time.monotonic()
    while time.monotonic() - began < limit:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before answering")
        try:
            workers = planned_workers(log_path)
            if workers and started_workers(log_path) >= workers and http_get(url + "/health")[0] == 200:
                return time.monotonic() - began
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server did not answer /health within {limit:.0f} s")


class Connection:
    """A minimal HTTP/1.1 keep-alive client connection (asyncio streams): the load generator
    shares the cores with the server, so it should cost as little CPU per request as it can."""

    def __init__(self, host: str, port: int):
        self.host, self.port, self.reader, self.writer = host, port, None, None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        await self.writer.drain()
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("connection closed by the server")
        status, length, close = int(status_line.split()[1]), None, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        if length is None:
            raise ConnectionError("reply without Content-Length")
        payload = await self.reader.readexactly(length)
        if close:
            self.close()
        return status, payload

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def load_phase(port: int, requests: list[tuple[bytes, int, list]], clients: int, seconds: float) -> dict:
    """`clients` concurrent clients for `seconds`: latencies, tokens, errors, label mismatches."""
    order = itertools.cycle(range(len(requests)))
    latencies, tokens, errors, mismatched, error_kinds = [], 0, 0, 0, {}
    deadline = time.perf_counter() + seconds

    async def one_client():
        nonlocal tokens, errors, mismatched
        connection = Connection("127.0.0.1", port)
        try:
            while time.perf_counter() < deadline:
                body, n_tokens, expected = requests[next(order)]
                began = time.perf_counter()
                try:
                    status, payload = await connection.post("/tag", body)
                    data = json.loads(payload) if status == 200 else None
                except Exception as error:  # noqa: BLE001  (counted, not raised)
                    status, data = type(error).__name__, None
                    connection.close()
                latencies.append(time.perf_counter() - began)
                if status != 200:
                    errors += 1
                    error_kinds[str(status)] = error_kinds.get(str(status), 0) + 1
                    continue
                tokens += n_tokens
                mismatched += sum(s["labels"] != labels for s, labels in zip(data["sentences"], expected))
        finally:
            connection.close()

    began = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(clients)))
    wall = time.perf_counter() - began
    lat = np.asarray(latencies) * 1000
    return {
        "requests": len(latencies), "errors": errors, "error_kinds": error_kinds, "tokens": tokens, "wall_s": wall,
        "tokens_per_s": tokens / wall, "requests_per_s": (len(latencies) - errors) / wall,
        "latency_p50_ms": float(np.percentile(lat, 50)), "latency_p95_ms": float(np.percentile(lat, 95)),
        "latency_p99_ms": float(np.percentile(lat, 99)), "latency_max_ms": float(lat.max()),
        "label_mismatched_sentences": mismatched,
    }


def batch_figures(metrics_text: str) -> tuple[float, float, float]:
    """(batches, requests, sentences) tagged so far, from the server's Prometheus text."""
    def total(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", metrics_text, re.M))

    return total("gpseq_batches_total"), total("gpseq_batch_requests_sum"), total("gpseq_sentences_tagged_total")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--sentences-per-request", type=int, nargs="+", default=[8, 1, 32])
    parser.add_argument("--workers", type=int, help="the server's --workers (default: the command's default)")
    parser.add_argument("--quick", action="store_true", help="10 s, one request size (8), in-process timed once")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--inprocess-only", type=int, metavar="REPEATS", help=argparse.SUPPRESS)
    parser.add_argument("--parallel-child", type=int, metavar="REPEATS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inprocess_only:  # the child of in_process_one_blas_thread: its best tokens/s and per CPU s
        print(*max(in_process(args.model, unlabelled(read_test()), args.inprocess_only)[1]))
        return
    if args.parallel_child:
        parallel_child(args.model, args.parallel_child)
        return
    if args.quick:
        args.seconds, args.sentences_per_request = min(args.seconds, 10.0), args.sentences_per_request[:1]
    repeats = 1 if args.quick else 3

    started_at = datetime.datetime.now(datetime.timezone.utc)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    sentences = unlabelled(read_test())
    n_tokens = sum(len(s.tokens) for s in sentences)
    print(f"CoNLL-2000 test: {len(sentences):,} sentences, {n_tokens:,} tokens; model {args.model}", flush=True)

    tagger, before = in_process(args.model, sentences, repeats)
    expected = [r.labels for r in tagger.tag(sentences, batch_size=256)]
    print(f"in-process Tagger.tag (batch_size 256): {max(before)[0]:,.0f} tokens/s (best of {repeats})", flush=True)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = Path(tempfile.mkdtemp(prefix="gpseq-serve-bench-")) / "server.log"
    server = start_server(args.model, port, log_path, args.workers)
    result: dict = {}
    try:
        ready_s = wait_ready(url, server, log_path)
        workers = planned_workers(log_path)
        print(f"server ready after {ready_s:.1f} s (pid {server.pid}, {workers} worker process(es), "
              f"log {log_path})", flush=True)
        phases = {}
        for k in args.sentences_per_request:
            requests = []
            for start in range(0, len(sentences), k):
                chunk = sentences[start:start + k]
                body = json.dumps({"sentences": [s.columns for s in chunk]}).encode()
                requests.append((body, sum(len(s.tokens) for s in chunk), expected[start:start + k]))
            metrics_before = batch_figures(http_get(url + "/metrics")[1])
            sampler = RssSampler(server.pid)
            sampler.start()
            server_cpu, client_cpu, load_before = tree_cpu_seconds(server.pid), time.process_time(), os.getloadavg()[0]
            phase = asyncio.run(load_phase(port, requests, args.clients, args.seconds))
            server_cpu_after = tree_cpu_seconds(server.pid)
            per_process = {pid: value - server_cpu.get(pid, 0.0) for pid, value in server_cpu_after.items()}
            phase["server_cpu_s"] = sum(per_process.values())
            phase["server_cpu_s_per_process"] = sorted((round(v, 1) for v in per_process.values()), reverse=True)
            phase["server_cores_used"] = phase["server_cpu_s"] / phase["wall_s"]
            phase["client_cpu_s"] = time.process_time() - client_cpu
            phase["load_average_1min"] = round((load_before + os.getloadavg()[0]) / 2, 2)
            samples = sampler.stop()
            metrics_after = batch_figures(http_get(url + "/metrics")[1])
            batches, merged, tagged = (a - b for a, b in zip(metrics_after, metrics_before))
            rss = [v for _, v in samples]
            half = len(rss) // 2
            phase.update({
                "sentences_per_request": k,
                "mean_requests_per_batch": merged / max(batches, 1),
                "mean_sentences_per_batch": tagged / max(batches, 1),
                "rss_start_mb": rss[0], "rss_peak_mb": max(rss), "rss_end_mb": rss[-1],
                "rss_peak_first_half_mb": max(rss[:half] or rss), "rss_peak_second_half_mb": max(rss[half:]),
                "rss_samples": len(rss),
                "rss_peak_mb_per_process": sorted((round(v) for v in sampler.peaks.values()), reverse=True),
            })
            phases[k] = phase
            print(f"{args.clients} clients × {k} sentence(s)/request, {phase['wall_s']:.0f} s: "
                  f"{phase['tokens_per_s']:,.0f} tokens/s, {phase['requests_per_s']:,.1f} requests/s, "
                  f"p50/p95/p99 {phase['latency_p50_ms']:.0f}/{phase['latency_p95_ms']:.0f}/"
                  f"{phase['latency_p99_ms']:.0f} ms, errors {phase['errors']}, "
                  f"{phase['mean_sentences_per_batch']:.0f} sentences/batch, RSS {rss[0]:.0f} → peak "
                  f"{max(rss):.0f} → {rss[-1]:.0f} MiB (summed over {len(sampler.peaks)} processes), "
                  f"server CPU {phase['server_cpu_s']:.0f} s ({phase['server_cpu_s_per_process']})", flush=True)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            exit_code = server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            exit_code = "killed after 60 s"
    after = time_in_process(tagger, sentences, repeats)
    graceful = log_path.read_text().count("Application shutdown complete") == workers
    print(f"in-process again: {max(after)[0]:,.0f} tokens/s; server exit code after SIGTERM: {exit_code} "
          f"(graceful shutdown logged: {graceful})", flush=True)
    one_blas_thread, one_blas_thread_per_cpu = in_process_one_blas_thread(args.model, repeats)
    print(f"in-process with one OpenBLAS thread (child process): {one_blas_thread:,.0f} tokens/s "
          f"({one_blas_thread_per_cpu:,.0f} per CPU second)", flush=True)
    parallel = in_process_parallel(args.model, workers, 5) if workers > 1 else one_blas_thread
    print(f"in-process in {workers} processes at once (one OpenBLAS thread each): {parallel:,.0f} tokens/s",
          flush=True)

    inprocess = (max(before)[0] + max(after)[0]) / 2
    inprocess_cpu = (max(r[1] for r in before) + max(r[1] for r in after)) / 2
    first = phases[args.sentences_per_request[0]]
    result = {
        "benchmark": "serve", "date": started_at.strftime("%Y-%m-%d %H:%M UTC"), "git": commit,
        "machine": machine(), "server_stack": server_stack(), "model": str(args.model), "clients": args.clients,
        "seconds": args.seconds,
        "corpus": "CoNLL-2000 test", "corpus_sentences": len(sentences), "corpus_tokens": n_tokens,
        "server_workers": workers,
        "server_ready_s": round(ready_s, 1), "server_exit_code_after_sigterm": exit_code,
        "server_graceful_shutdown": graceful,
        "inprocess_tokens_per_s": inprocess, "inprocess_tokens_per_s_before": max(before)[0],
        "inprocess_tokens_per_s_after": max(after)[0], "inprocess_tokens_per_cpu_s": inprocess_cpu,
        "inprocess_one_blas_thread_tokens_per_s": one_blas_thread,
        "inprocess_one_blas_thread_tokens_per_cpu_s": one_blas_thread_per_cpu,
        "served_vs_inprocess_one_blas_thread": first["tokens_per_s"] / one_blas_thread,
        "inprocess_parallel_processes": workers, "inprocess_parallel_tokens_per_s": parallel,
        "served_vs_inprocess_parallel": first["tokens_per_s"] / parallel,
        "served_tokens_per_s": first["tokens_per_s"], "served_requests_per_s": first["requests_per_s"],
        "served_vs_inprocess": first["tokens_per_s"] / inprocess,
        "latency_p50_ms": first["latency_p50_ms"], "latency_p95_ms": first["latency_p95_ms"],
        "latency_p99_ms": first["latency_p99_ms"], "errors": first["errors"],
        "rss_peak_mb": first["rss_peak_mb"], "sentences_per_request": first["sentences_per_request"],
    }
    for k, phase in phases.items():
        for key, value in phase.items():
            result[f"k{k}_{key}"] = value
        result[f"k{k}_served_vs_inprocess"] = phase["tokens_per_s"] / inprocess
        result[f"k{k}_served_vs_inprocess_one_blas_thread"] = phase["tokens_per_s"] / one_blas_thread
        result[f"k{k}_served_tokens_per_server_cpu_s"] = phase["tokens"] / max(phase["server_cpu_s"], 1e-9)
        result[f"k{k}_served_vs_inprocess_per_cpu_s"] = phase["tokens"] / max(phase["server_cpu_s"], 1e-9) / inprocess_cpu
        result[f"k{k}_served_vs_inprocess_parallel"] = phase["tokens_per_s"] / parallel
        result[f"k{k}_served_vs_inprocess_one_blas_thread_per_cpu_s"] = (
            phase["tokens"] / max(phase["server_cpu_s"], 1e-9) / one_blas_thread_per_cpu)
    table = report(result, phases)
    print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        args.json.with_suffix(".txt").write_text(table + "\n")


def report(result: dict, phases: dict) -> str:
    workers = result["server_workers"]
    lines = [
        f"gpseq serve load test, {result['date']}, git {result['git']}, {result['machine']}",
        f"server stack: {result['server_stack']}; {workers} worker process(es) (the command's default)",
        f"model {result['model']}; {result['corpus']}: {result['corpus_sentences']:,} sentences, "
        f"{result['corpus_tokens']:,} tokens; {result['clients']} clients, {result['seconds']:.0f} s per phase",
        f"in-process Tagger.tag(batch_size=256), one process: {result['inprocess_tokens_per_s_before']:,.0f} "
        f"tokens/s before, {result['inprocess_tokens_per_s_after']:,.0f} after (mean "
        f"{result['inprocess_tokens_per_s']:,.0f}); {result['inprocess_tokens_per_cpu_s']:,.0f} tokens per CPU second",
        f"in-process with one OpenBLAS thread, as the server runs (a child process, after the phases): "
        f"{result['inprocess_one_blas_thread_tokens_per_s']:,.0f} tokens/s, "
        f"{result['inprocess_one_blas_thread_tokens_per_cpu_s']:,.0f} per CPU second; served "
        + ", ".join(f"{result[f'k{k}_served_vs_inprocess_one_blas_thread']:.0%} of it at {k}/request" for k in phases),
        f"in-process in {result['inprocess_parallel_processes']} processes at once (one OpenBLAS thread each, "
        f"as many as the server's workers): {result['inprocess_parallel_tokens_per_s']:,.0f} tokens/s; served "
        + ", ".join(f"{result[f'k{k}_served_vs_inprocess_parallel']:.0%} of it at {k}/request" for k in phases),
        "",
        f"| sentences/request | tokens/s | vs in-process (1 process) | vs in-process ({workers} processes) | "
        "requests/s | p50 ms | p95 ms | p99 ms | errors | sentences/batch | RSS start → peak → end MiB (all "
        "server processes) | server CPU s (cores) | tokens per server CPU s (vs in-process, one thread) | "
        "client CPU s | load avg |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for k, p in phases.items():
        lines.append(
            f"| {k} | {p['tokens_per_s']:,.0f} | {p['tokens_per_s'] / result['inprocess_tokens_per_s']:.0%} | "
            f"{result[f'k{k}_served_vs_inprocess_parallel']:.0%} | "
            f"{p['requests_per_s']:,.1f} | {p['latency_p50_ms']:.0f} | {p['latency_p95_ms']:.0f} | "
            f"{p['latency_p99_ms']:.0f} | {p['errors']} | {p['mean_sentences_per_batch']:.0f} | "
            f"{p['rss_start_mb']:.0f} → {p['rss_peak_mb']:.0f} → {p['rss_end_mb']:.0f} | "
            f"{p['server_cpu_s']:.0f} ({p['server_cores_used']:.2f}) | "
            f"{result[f'k{k}_served_tokens_per_server_cpu_s']:,.0f} "
            f"({result[f'k{k}_served_vs_inprocess_one_blas_thread_per_cpu_s']:.0%}) | {p['client_cpu_s']:.0f} | "
            f"{p['load_average_1min']} |")
    mismatched = sum(p["label_mismatched_sentences"] for p in phases.values())
    lines += ["", "per process: " + "; ".join(
        f"{k}/request: CPU s {p['server_cpu_s_per_process']}, peak RSS MiB {p['rss_peak_mb_per_process']}"
        for k, p in phases.items()),
        f"responses whose labels differ from in-process Tagger.tag: {mismatched} sentences; "
        f"server exit code after SIGTERM: {result['server_exit_code_after_sigterm']} (with one process uvicorn "
        f"re-raises the signal after its graceful shutdown: -15), graceful shutdown logged by every worker: "
        f"{result['server_graceful_shutdown']}"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
