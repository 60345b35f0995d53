"""`gpseq serve` as a real server (gpseq/serve/process.py, gpseq/cli/serve.py): graceful shutdown
answers the request in flight, the command end to end and on SIGTERM, its errors, model names, the
serve extra optional; several worker processes on one port (their sockets, a worker that cannot load
its model, metrics counting both, requests in flight on SIGTERM). Only 127.0.0.1 is contacted,
every wait is bounded. Skips when the serve extra or httpx is absent."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
pytest.importorskip("httpx")

from helpers import ROOT  # noqa: E402
from helpers.serve import (TEXT, WAIT, free_port, gated_app, metric, spacy_sentences, test_sentences,  # noqa: E402,F401
                           trained, wait_until)


def test_graceful_shutdown_answers_the_request_in_flight(trained):
    import httpx
    import uvicorn

    app, gate = gated_app(trained)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)  # not the main thread: no signal handlers
    thread.start()
    wait_until(lambda: server.started, "the server to start")
    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(httpx.post, f"http://127.0.0.1:{port}/tag",
                                json={"sentences": [["Still", "answered", "."]]}, timeout=WAIT)
        wait_until(gate.entered.is_set, "the request to reach the model")
        server.should_exit = True  # what SIGTERM / Ctrl-C set
        time.sleep(0.3)
        assert thread.is_alive()  # waiting for the request in flight
        gate.release.set()
        reply = in_flight.result(WAIT)
    thread.join(WAIT)
    assert not thread.is_alive()
    assert reply.status_code == 200
    assert reply.json()["sentences"][0]["labels"] == trained["text"][1].tag([["Still", "answered", "."]])[0].labels
    assert not app.state.batchers  # stopped at shutdown
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)


def test_serve_command_end_to_end_and_sigterm(trained, tmp_path):
    import httpx

    directory, tagger = trained["text"]
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "w") as handle:
        server = subprocess.Popen([sys.executable, "-m", "gpseq", "serve", f"tiny={directory}", "--port", str(port)],
                                  stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT,
                                  env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    try:
        deadline = time.monotonic() + 240
        while True:
            assert server.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "gpseq serve did not answer /health in 240 s"
            time.sleep(0.5)
        reply = httpx.post(f"http://127.0.0.1:{port}/tag", json={"text": TEXT}, timeout=WAIT)
        assert reply.status_code == 200 and reply.json()["model"] == "tiny"
        expected = tagger.tag(spacy_sentences(TEXT))
        assert [r["labels"] for r in reply.json()["sentences"]] == [r.labels for r in expected]
        server.send_signal(signal.SIGTERM)
        server.wait(WAIT)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(WAIT)
    output = log.read_text()
    assert "Application shutdown complete" in output and "Traceback" not in output
    assert "serving tiny" in output


def test_serve_command_without_the_extra_says_how_to_install_it(monkeypatch, trained):
    from typer.testing import CliRunner

    from gpseq.cli import app

    monkeypatch.setitem(sys.modules, "fastapi", None)  # `import fastapi` raises ImportError
    result = CliRunner().invoke(app, ["serve", str(trained["text"][0])])
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'gpseq[serve]'" in lines[0] and "fastapi" in lines[0]


@pytest.mark.parametrize("arguments, code, reason", [
    (["no/such/model"], 2, "no such model directory"),
    (["TEXT", "TEXT"], 4, "two models named"),
    (["TEXT", "--max-chars", "0"], 4, "max_chars"),
    (["TEXT", "--workers", "0"], 4, "workers must be >= 1"),
    (["TEXT", "TEXT", "--workers", "2"], 4, "two models named"),  # checked by the supervisor, before any worker
])
def test_serve_command_errors(trained, arguments, code, reason):
    from typer.testing import CliRunner

    from gpseq.cli import app

    arguments = [str(trained["text"][0]) if a == "TEXT" else a for a in arguments]
    result = CliRunner().invoke(app, ["serve", *arguments])
    assert result.exit_code == code, result.output
    assert reason in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_model_names_on_the_command_line(tmp_path):
    from gpseq.serve.models import parse_model_spec

    assert parse_model_spec("models/en_pos") == ("en_pos", Path("models/en_pos"))
    assert parse_model_spec("pos=models/en_pos") == ("pos", Path("models/en_pos"))
    odd = tmp_path / "a=b"
    odd.mkdir()
    assert parse_model_spec(str(odd)) == ("a=b", odd)  # an existing directory wins over NAME=DIR


def test_the_serve_extra_is_optional():
    """`pip install gpseq` does not bring the ASGI stack; `gpseq[serve]` does."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    required = " ".join(project["dependencies"]).lower()
    for name in ("fastapi", "uvicorn", "prometheus"):
        assert name not in required
        assert any(d.lower().startswith(name) for d in project["optional-dependencies"]["serve"])


# ---- several worker processes (gpseq/serve/process.py)


def test_default_workers_one_per_usable_cpu_within_the_cgroup_quota(monkeypatch, tmp_path):
    from gpseq.serve import process

    cpu_max = tmp_path / "cpu.max"
    monkeypatch.setattr(process, "CGROUP_CPU_MAX", cpu_max)  # absent: no quota
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert process.usable_cpus() == 16 and process.default_workers() == process.MAX_DEFAULT_WORKERS == 8
    cpu_max.write_text("max 100000\n")
    assert process.usable_cpus() == 16
    cpu_max.write_text("150000 100000\n")  # 1.5 CPUs of quota
    assert process.usable_cpus() == 2 and process.default_workers() == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert process.usable_cpus() == 1 and process.default_workers() == 1


@pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="no SO_REUSEPORT on this system")
def test_each_worker_gets_its_own_socket_on_the_supervisors_address():
    """Sent to a worker, the supervisor's address becomes a socket of its own on the same port (the
    kernel then spreads connections over the workers), while the supervisor's holds the port."""
    import pickle

    from gpseq.serve.process import listening_address

    class Config:  # the fields of uvicorn.Config the supervisor reads
        host, port, uds, fd = "127.0.0.1", 0, None, None

    held = listening_address(Config())
    try:
        address = held.getsockname()
        worker_sockets = [pickle.loads(pickle.dumps(held)) for _ in range(2)]  # as multiprocessing sends it
        for sock in worker_sockets:
            assert type(sock) is socket.socket and sock.fileno() != held.fileno()
            assert sock.getsockname() == address
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
            sock.listen()
        with socket.create_connection(address, timeout=WAIT):  # someone listens there now
            pass
        with socket.socket() as other, pytest.raises(OSError):  # a socket without SO_REUSEPORT may not
            other.bind(address)
    finally:
        held.close()
        for sock in worker_sockets:
            sock.close()


@pytest.fixture(scope="module")
def two_workers(trained, tmp_path_factory):
    """`gpseq serve tiny=DIR --workers 2` on 127.0.0.1: (process, port, log path, its TMPDIR), once
    both workers have started."""
    directory, _ = trained["text"]
    temporary = tmp_path_factory.mktemp("two_workers")  # the run's metrics directory goes here
    log, port = temporary / "server.log", free_port()
    with open(log, "w") as handle:
        server = subprocess.Popen([sys.executable, "-m", "gpseq", "serve", f"tiny={directory}", "--port", str(port),
                                   "--workers", "2"], stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT,
                                  env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TMPDIR": str(temporary)})
    try:
        deadline = time.monotonic() + 240
        while log.read_text().count("Application startup complete") < 2:
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "two workers did not start in 240 s:\n" + log.read_text()
            time.sleep(0.2)
        yield server, port, log, temporary
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(WAIT)


def test_a_worker_that_cannot_load_its_model_stops_the_command(trained, tmp_path):
    """Not a restart loop: uvicorn's supervisor starts a worker that exits again, except on startup failure."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(trained["text"][0], broken)
    arrays = broken / "arrays.npz"
    arrays.write_bytes(arrays.read_bytes()[:1000])  # truncated
    command = [sys.executable, "-m", "gpseq", "serve", str(broken), "--port", str(free_port()), "--workers", "2"]
    finished = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=240,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert finished.returncode == 1
    assert finished.stderr.count("cannot serve") in (1, 2) and "truncated" in finished.stderr  # no worker again
    assert finished.stderr.strip().splitlines()[-1] == "error: a worker failed to start (its error is logged above)"


def test_two_workers_serve_one_port_and_metrics_count_both(two_workers, trained, test_sentences):
    import httpx

    server, port, log, temporary = two_workers
    url = f"http://127.0.0.1:{port}"
    sentences = [s.tokens for s in test_sentences[:6]]
    expected = [r.labels for r in trained["text"][1].tag(sentences)]
    n_tokens = sum(map(len, sentences))

    def session(_):  # one connection: which worker accepted it, then three requests on it
        with httpx.Client(base_url=url, timeout=WAIT) as client:
            pid = client.get("/health").json()["process"]["pid"]
            return pid, [client.post("/tag", json={"sentences": sentences}) for _ in range(3)]

    pids, n_tag = set(), 0
    for _ in range(5):  # rounds of 8 concurrent connections, until both workers have taken some
        with ThreadPoolExecutor(8) as pool:
            for pid, replies in pool.map(session, range(8)):
                pids.add(pid)
                n_tag += len(replies)
                assert [r.status_code for r in replies] == [200] * 3
                assert all([s["labels"] for s in r.json()["sentences"]] == expected for r in replies)
        if len(pids) == 2:
            break
    assert len(pids) == 2 and server.pid not in pids, pids
    for line in log.read_text().splitlines():  # each worker says what it holds
        if "serving tiny: resident memory" in line:
            assert float(re.search(r"resident memory (\d+) MiB", line).group(1)) > 0
    assert sum("serving tiny: resident memory" in line for line in log.read_text().splitlines()) == 2

    for _ in range(4):  # fresh connections: whichever worker answers, the sums over both
        text = httpx.get(url + "/metrics", timeout=WAIT).text
        assert metric(text, "gpseq_requests_total", endpoint="/tag", status="200") == n_tag
        assert metric(text, "gpseq_request_duration_seconds_count", endpoint="/tag") == n_tag
        assert metric(text, "gpseq_request_duration_seconds_bucket", endpoint="/tag", le="+Inf") == n_tag
        assert metric(text, "gpseq_tokens_tagged_total", model="tiny") == n_tag * n_tokens
        assert metric(text, "gpseq_sentences_tagged_total", model="tiny") == n_tag * len(sentences)
        assert metric(text, "gpseq_requests_in_progress", endpoint="/tag") == 0
        assert metric(text, "gpseq_requests_in_progress", endpoint="/metrics") == 1  # this one
        assert metric(text, "gpseq_queue_requests", model="tiny") == 0
    files = {path.name for path in next(temporary.glob("gpseq-serve-metrics-*")).iterdir()}
    assert {f"counter_{pid}.db" for pid in pids} <= files  # both wrote their own counts


def test_two_workers_answer_their_requests_in_flight_on_sigterm(two_workers, trained):
    import httpx

    server, port, log, temporary = two_workers
    url = f"http://127.0.0.1:{port}"
    words = "The committee approved the new budget on Tuesday , and it will fund three small projects".split()
    sentences = [words + [str(i)] for i in range(600)]  # 600 sentences, 9,600 tokens
    expected = [r.labels for r in trained["text"][1].tag(sentences)]
    answered = []

    def post(_):
        reply = httpx.post(url + "/tag", json={"sentences": sentences}, timeout=WAIT)
        answered.append(time.monotonic())
        return reply

    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(post, i) for i in range(16)]
        wait_until(lambda: futures[0].done() or metric(httpx.get(url + "/metrics", timeout=WAIT).text,
                                                       "gpseq_requests_in_progress", endpoint="/tag") == 16,
                   "the 16 requests to reach the workers")
        signalled = time.monotonic()
        server.send_signal(signal.SIGTERM)
        replies = [future.result(WAIT) for future in futures]
    assert server.wait(WAIT) == 0
    assert [r.status_code for r in replies] == [200] * 16
    assert all([s["labels"] for s in r.json()["sentences"]] == expected for r in replies)
    assert sum(t > signalled for t in answered) >= 1  # in flight when the signal came, answered after it
    output = log.read_text()
    assert output.count("Application shutdown complete") == 2 and "Traceback" not in output
    assert not list(temporary.glob("gpseq-serve-metrics-*"))  # the run's metrics directory is removed
