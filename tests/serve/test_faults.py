"""`gpseq serve` against hostile clients and killed processes (gpseq/serve/).

- work of requests that timed out is skipped, and a running prediction call of such requests
  only stops (the batch worker, then a real server with a 1 s timeout and twelve heavy requests:
  nbest 20 on a 20,000-token sentence);
- clients that send their headers or body slowly, or headers without end, are answered 408 / 431
  and dropped after the stated timeout;
- error replies quote no more than a bound of what the client sent and no exception text (a
  5,000-digit number, a 900 KB model name or field name or Content-Type, a bug in the tagger);
  GET /models shows no server paths;
- a port some server listens on is refused with one line; a SIGKILLed supervisor's workers exit
  and the port is free again.

One tiny model (the default training on the bundled sample); servers on 127.0.0.1 only; every wait
has a deadline. Skips when the serve extra or httpx is absent.
"""

from __future__ import annotations

import json
import os
import re
import selectors
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

from fastapi.testclient import TestClient  # noqa: E402

from helpers import ROOT, SAMPLE  # noqa: E402

WAIT = 60.0  # seconds any test waits for a thread, a request or a server, at most
START = 240.0  # seconds a server may take to start (TensorFlow's import, the model's warm-up)
TIMEOUT = 1.0  # --timeout of the single-process server (seconds)
HEADER_TIMEOUT = 1.0  # --header-timeout of both servers
BODY_TIMEOUT = 2.0  # --body-timeout of the single-process server
SLACK = 1.5  # seconds a timeout may take beyond its value (a loaded machine)
WORDS = "The committee approved the new budget on Tuesday , and it will fund three small projects".split()
HEAVY = json.dumps({"sentences": [(WORDS * 1400)[:20_000]], "nbest": 20}).encode()  # in the default limits
SMALL = {"sentences": [["A", "small", "one", "."]]}
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


# ---- a model, servers -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(directory, Tagger) of a tokens-only model."""
    from gpseq.corpora import read_conll
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger, TaggerConfig
    from gpseq.training.config import TrainingConfig

    if not (SAMPLE / "train.conll").is_file():
        pytest.skip("the bundled sample corpus is absent")
    config = TaggerConfig(features=get_preset("ner"), training=TrainingConfig(max_steps=30, dev_fraction=0.0, seed=1))
    directory = Tagger.train(read_conll(SAMPLE / "train.conll"), config).save(tmp_path_factory.mktemp("faults") / "m")
    return directory, Tagger.load(directory)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(directory: Path, log: Path, *options: str):
    """`gpseq serve tiny=DIR --port P OPTIONS` with its output in `log` and its temporary files beside
    it (a SIGKILLed supervisor leaves its metrics directory): (process, port), once every worker has
    started."""
    port = free_port()
    workers = int(options[options.index("--workers") + 1])
    with open(log, "w") as handle:
        server = subprocess.Popen([sys.executable, "-m", "gpseq", "serve", f"tiny={directory}", "--port", str(port),
                                   *options], stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT,
                                  env={**ENV, "TMPDIR": str(log.parent)})
    deadline = time.monotonic() + START
    while log.read_text().count("Application startup complete") < workers:
        if server.poll() is not None or time.monotonic() > deadline:
            stop(server)
            pytest.fail(f"gpseq serve did not start:\n{log.read_text()}")
        time.sleep(0.2)
    return server, port


def stop(server) -> None:
    if server.poll() is None:
        server.kill()
        server.wait(WAIT)


@pytest.fixture(scope="module")
def single(trained, tmp_path_factory):
    """`gpseq serve --workers 1` with short timeouts, a batch waiting 500 ms for company (requests
    sent together are one batch, as those queued behind a running batch are): (process, url, log path)."""
    log = tmp_path_factory.mktemp("single") / "server.log"
    server, port = start_server(trained[0], log, "--workers", "1", "--timeout", str(TIMEOUT), "--max-wait-ms", "500",
                                "--header-timeout", str(HEADER_TIMEOUT), "--body-timeout", str(BODY_TIMEOUT))
    try:
        yield server, f"http://127.0.0.1:{port}", log
    finally:
        stop(server)


@pytest.fixture(scope="module")
def two_workers(trained, tmp_path_factory):
    """`gpseq serve --workers 2`: (process, port, log path); the last test of the file kills it."""
    log = tmp_path_factory.mktemp("two_workers") / "server.log"
    server, port = start_server(trained[0], log, "--workers", "2", "--header-timeout", str(HEADER_TIMEOUT))
    try:
        yield server, port, log
    finally:
        stop(server)


def metric(text: str, name: str) -> float:
    """The sum of a Prometheus series' samples."""
    return sum(float(value) for value in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


# ---- requests that timed out are abandoned --------------------------------------------------------------
class SlowTagger:
    """Tags each sentence with its length, taking `seconds_per_token` per token; records each call.
    Like `Tagger.tag` it asks `should_stop` along the way (every 10 ms) and raises `Cancelled` when
    told to; `stopped` holds the index of each call that stopped so."""

    def __init__(self, seconds_per_token: float = 0.0):
        self.seconds_per_token, self.calls, self.stopped = seconds_per_token, [], []
        self.entered = threading.Event()

    def tag(self, sentences, should_stop=None, **options):
        from gpseq.cancellation import Cancelled

        self.calls.append([len(s) for s in sentences])
        self.entered.set()
        end = time.monotonic() + self.seconds_per_token * sum(map(len, sentences))
        while (left := end - time.monotonic()) > 0:
            if should_stop is not None and should_stop():
                self.stopped.append(len(self.calls) - 1)
                raise Cancelled
            time.sleep(min(left, 0.01))
        return [len(s) for s in sentences]


def test_the_batch_worker_skips_requests_whose_caller_stopped_waiting():
    """Twelve requests of one 2,000-token sentence (0.3 s of tagging each) that all time out while
    the first is tagged: the next request waits for that call only, the eleven others are never
    tagged (merged, as before, the twelve were one call of 3.6 s)."""
    from gpseq.serve.batching import MicroBatcher

    tagger = SlowTagger(seconds_per_token=0.3 / 2000)
    batcher = MicroBatcher(tagger, max_batch_tokens=1000, max_wait=0.05).start()
    try:
        heavy = [batcher.submit([["w"] * 2000], {}, mergeable=True) for _ in range(12)]
        assert tagger.entered.wait(WAIT)
        for future in heavy:  # what the service does at its request timeout
            future.cancel()
        began = time.monotonic()
        small = batcher.submit([["a", "b"]], {}, mergeable=True)
        assert small.result(WAIT) == [2]
        waited = time.monotonic() - began
    finally:
        batcher.stop(WAIT)
    assert tagger.calls == [[2000], [2]]
    assert waited < 0.3 + 0.5, waited
    assert all(future.cancelled() for future in heavy)


def test_a_running_call_stops_once_every_request_it_serves_is_abandoned():
    """A call merging a request that timed out with one still waiting runs to its end and answers
    the waiting one; a call of abandoned requests only stops at its next check (not counted in the
    batch metrics) and the next request is answered at once, not after the 2 s that call had left."""
    from gpseq.serve.batching import MicroBatcher

    tagger, counted = SlowTagger(seconds_per_token=0.5 / 1000), []
    batcher = MicroBatcher(tagger, max_batch_tokens=10_000, max_wait=0.2, on_batch=counted.append).start()
    try:
        gone, waiting = (batcher.submit([["w"] * 1000], {}, mergeable=True) for _ in range(2))
        assert tagger.entered.wait(WAIT)
        gone.cancel()
        assert waiting.result(WAIT) == [1000]
        tagger.entered.clear()
        heavy = batcher.submit([["w"] * 4000], {}, mergeable=False)  # alone: 2 s
        assert tagger.entered.wait(WAIT)
        heavy.cancel()
        began = time.monotonic()
        assert batcher.submit([["a", "b"]], {}, mergeable=True).result(WAIT) == [2]
        waited = time.monotonic() - began
    finally:
        batcher.stop(WAIT)
    assert tagger.calls == [[1000, 1000], [4000], [2]] and tagger.stopped == [1]
    assert [stats.tokens for stats in counted] == [2000, 2]
    assert waited < 0.2 + 0.5, waited  # its batch's wait for company, and a loaded machine


def test_a_request_over_the_batch_limits_is_tagged_in_pieces_until_abandoned():
    from gpseq.serve.batching import MicroBatcher, pieces

    assert pieces([3, 3, 3, 9, 1, 1], max_sentences=2, max_tokens=6) == [slice(0, 2), slice(2, 3), slice(3, 4),
                                                                        slice(4, 6)]
    tagger = SlowTagger()
    batcher = MicroBatcher(tagger, max_batch_sentences=2, max_batch_tokens=6).start()
    try:
        sentences = [["w"] * n for n in (3, 3, 3, 9, 1, 1)]
        assert batcher.submit(sentences, {}, mergeable=True).result(WAIT) == [3, 3, 3, 9, 1, 1]  # in order
        assert tagger.calls == [[3, 3], [3], [9], [1, 1]]
        tagger.calls.clear()
        slow = SlowTagger(seconds_per_token=0.05)
        batcher.tagger = slow
        abandoned = batcher.submit(sentences, {}, mergeable=True)
        assert slow.entered.wait(WAIT)
        abandoned.cancel()
        assert batcher.submit([["x"]], {}, mergeable=True).result(WAIT) == [1]
    finally:
        batcher.stop(WAIT)
    assert slow.calls == [[3, 3], [1]]  # its first piece, then the next request


def test_heavy_requests_past_the_timeout_do_not_hold_up_the_next_one(single):
    """Twelve requests of nbest 20 on a 20,000-token sentence, each several times the 1 s timeout,
    sent together: 504 for each, the prediction call in progress stops once its request has timed
    out (no heavy one is tagged to its end), and a small request sent right after the 504s is
    answered within 1 s."""
    import httpx

    _, url, _ = single
    before = httpx.get(url + "/metrics", timeout=WAIT).text
    with ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(lambda _: httpx.post(url + "/tag", content=HEAVY, timeout=WAIT,
                                                     headers={"Content-Type": "application/json"}), range(12)))
    statuses = [reply.status_code for reply in replies]
    assert statuses.count(504) >= 10, statuses  # all of them, unless a machine tags one in less than 1 s
    sent = time.monotonic()
    reply = httpx.post(url + "/tag", json=SMALL, timeout=WAIT)
    waited = time.monotonic() - sent
    # 1 s: the bound, of which the batch's 500 ms wait for company (--max-wait-ms) is half;
    # 0.5 s for a loaded 2-core machine (a stopped call runs ~30 ms past its request's timeout). Its
    # own 1 s timeout makes a 504 of a small request held up by a heavy call also come within 1.5 s.
    assert reply.status_code == 200 and waited < 1.0 + 0.5, (reply.status_code, waited)
    after = httpx.get(url + "/metrics", timeout=WAIT).text
    tokens = metric(after, "gpseq_tokens_tagged_total") - metric(before, "gpseq_tokens_tagged_total")
    n_heavy = int(tokens // 20_000)  # (and the small one's 4 tokens)
    # a stopped call tags (and counts) nothing: the heavy ones tagged are those answered, and one more
    # where a call ends just as its request times out
    assert n_heavy <= 12 - statuses.count(504) + 1, tokens
    print(f"\n12 heavy requests: {statuses.count(504)} × 504; {n_heavy} tagged; "
          f"the small request sent after the 504s answered in {waited:.2f} s")


# ---- slow and endless clients -------------------------------------------------------------------------
def watch_connections(address: tuple, sends: list, seconds: float) -> list:
    """Open one connection per item of `sends` (a list of (first bytes, bytes sent every 0.2 s
    after them or b"")); for `seconds` at most: (seconds until the server closed it or None,
    everything it sent) of each."""
    selector = selectors.DefaultSelector()
    began = time.monotonic()
    state = []
    for first, trickle in sends:
        sock = socket.create_connection(address, timeout=WAIT)
        sock.setblocking(False)
        if first:
            sock.sendall(first)
        state.append({"sock": sock, "trickle": trickle, "closed": None, "got": b""})
        selector.register(sock, selectors.EVENT_READ, state[-1])
    next_trickle = began + 0.2
    try:
        while time.monotonic() - began < seconds and any(item["closed"] is None for item in state):
            for key, _ in selector.select(timeout=0.05):
                item = key.data
                try:
                    data = item["sock"].recv(65536)
                except ConnectionResetError:
                    data = b""
                item["got"] += data
                if not data:
                    item["closed"] = time.monotonic() - began
                    selector.unregister(item["sock"])
            if time.monotonic() >= next_trickle:
                next_trickle += 0.2
                for item in state:
                    if item["closed"] is None and item["trickle"]:
                        try:
                            item["sock"].send(item["trickle"])
                        except OSError:  # closed by the server: the read above will say when
                            pass
    finally:
        for item in state:
            item["sock"].close()
        selector.close()
    return [(item["closed"], item["got"]) for item in state]


def test_slow_header_clients_are_dropped_after_the_header_timeout(single):
    _, url, _ = single
    address = ("127.0.0.1", int(url.rsplit(":", 1)[1]))
    partial = b"POST /tag HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    sends = [(partial, b"X-Slow: a\r\n")] * 20 + [(b"", b"")] * 5  # trickling headers; silent
    results = watch_connections(address, sends, HEADER_TIMEOUT + 3 * SLACK)
    for (closed, got), (first, _) in zip(results, sends):
        assert closed is not None, "a slow client still connected"
        assert HEADER_TIMEOUT - 0.2 < closed < HEADER_TIMEOUT + SLACK, closed
        if first:  # part of a request: told why
            assert got.startswith(b"HTTP/1.1 408 ") and b"header timeout" in got, got
        else:
            assert got == b""
    print(f"\n{len(results)} slow-header connections closed after {min(c for c, _ in results):.2f}–"
          f"{max(c for c, _ in results):.2f} s (header timeout {HEADER_TIMEOUT:g} s)")


async def hello(scope, receive, send):
    """A minimal ASGI application: 200 "hello" to every HTTP request."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
    await send({"type": "http.response.body", "body": b"hello"})


def uvicorn_protocol(name: str):
    """uvicorn's HTTP protocol class `name` (h11, httptools), or a skip when it cannot be imported."""
    if name == "h11":
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol
    pytest.importorskip("httptools")
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    return HttpToolsProtocol


@pytest.mark.parametrize("base", ["h11", "httptools"])
def test_the_header_deadline_on_both_of_uvicorns_protocols(base):
    """In-process server of either protocol: requests (pipelined too) are answered; headers that do
    not come in time get 408, a silent connection is closed; both at the stated timeout, also after
    a response on a kept-alive connection."""
    import uvicorn

    from gpseq.serve.connections import HeaderDeadline, ServeConfig

    protocol = type("Connection", (HeaderDeadline, uvicorn_protocol(base)), {})
    port = free_port()
    server = uvicorn.Server(ServeConfig(hello, header_timeout=0.5, http=protocol, host="127.0.0.1", port=port,
                                        log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)  # not the main thread: no signal handlers
    thread.start()
    try:
        deadline = time.monotonic() + WAIT
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
            time.sleep(0.01)
        get = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
        results = watch_connections(("127.0.0.1", port), [
            (get + get, b""),  # two pipelined requests, then silence: two answers, closed 0.5 s later
            (get + b"GET / HTTP/1.1\r\nHost: x\r\n", b"X: y\r\n"),  # an answer, then headers that never end
            (b"GET / HT", b""),  # part of a request line, then silence
            (b"", b""),  # nothing
        ], 0.5 + 3 * SLACK)
    finally:
        server.should_exit = True
        thread.join(WAIT)
    (pipelined, got_pipelined), (slow, got_slow), (partial, got_partial), (silent, got_silent) = results
    assert got_pipelined.count(b"HTTP/1.1 200 ") == 2 and got_pipelined.endswith(b"hello"), got_pipelined
    assert got_slow.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 408 " in got_slow, got_slow
    assert got_partial.startswith(b"HTTP/1.1 408 ") and got_silent == b""
    for closed in (pipelined, slow, partial, silent):
        assert closed is not None and 0.3 < closed < 0.5 + SLACK, results


def test_a_slow_body_gets_408_after_the_body_timeout(single):
    _, url, _ = single
    address = ("127.0.0.1", int(url.rsplit(":", 1)[1]))
    head = (b"POST /tag HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n")
    [(closed, got)] = watch_connections(address, [(head + b'{"text": "', b"a")], BODY_TIMEOUT + 3 * SLACK)
    assert closed is not None and BODY_TIMEOUT - 0.2 < closed < BODY_TIMEOUT + SLACK, closed
    assert got.startswith(b"HTTP/1.1 408 ") and b"connection: close" in got.lower(), got
    assert json.loads(got.split(b"\r\n\r\n", 1)[1]) == {"error": f"body not received within {BODY_TIMEOUT:g} s "
                                                                 "(the body timeout)"}


def test_endless_headers_get_431(single):
    _, url, _ = single
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=WAIT) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + (b"X-Long: " + b"a" * 2040 + b"\r\n") * 35)
        got = b""  # 35 × 2 KB: over the limit of 64 KiB
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except ConnectionResetError:  # the server closed with bytes of ours unread
            pass
    assert got.startswith(b"HTTP/1.1 431 "), got[:200]


# ---- what an error reply may carry ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(trained):
    from gpseq.serve.app import create_app
    from gpseq.serve.models import ServedModel
    from gpseq.serve.settings import ServeSettings

    directory, tagger = trained
    with TestClient(create_app({"tiny": ServedModel("tiny", tagger, directory)}, ServeSettings())) as test_client:
        yield test_client


EXCEPTION_TEXT = ("Traceback", "Error:", "Exception", "set_int_max_str_digits", "integer string conversion")


@pytest.mark.parametrize("body, headers, status", [
    (b'{"sentences": [["a"]], "samples": ' + b"9" * 5000 + b"}", None, 422),
    (b'{"sentences": [["a"]], "samples": 1' + b"0" * 3000 + b"}", None, 422),  # in Python's limit, over ours
    (json.dumps({"model": "m" * 900_000, "text": "a"}).encode(), None, 404),
    (json.dumps({"x" * 900_000: 1, "text": "a"}).encode(), None, 422),
    (json.dumps({"text": "a", "decode": "d" * 900_000}).encode(), None, 422),
    (b'{"text": "a"}', {"Content-Type": "text/" + "p" * 60_000}, 415),
], ids=["5000-digit-samples", "3000-digit-samples", "huge-model-name", "huge-field-name", "huge-decoder",
        "huge-content-type"])
def test_error_replies_quote_little_of_the_request_and_no_exception(client, body, headers, status):
    reply = client.post("/tag", content=body, headers=headers or {"Content-Type": "application/json"})
    assert reply.status_code == status, reply.text[:300]
    error = reply.json()["error"]
    assert len(reply.content) < 600 and "\n" not in error, reply.text[:700]
    assert not any(text in error for text in EXCEPTION_TEXT), error
    if status == 404:
        assert error.startswith("unknown model 'mmmm") and "(900,000 characters)" in error, error


def test_the_5000_digit_number_on_a_real_server(single):
    """The same request through uvicorn (orjson refuses the number, the standard library reads it)."""
    import httpx

    _, url, _ = single
    reply = httpx.post(url + "/tag", content=b'{"sentences": [["a"]], "samples": ' + b"9" * 5000 + b"}",
                       headers={"Content-Type": "application/json"}, timeout=WAIT)
    assert reply.status_code == 422 and reply.json() == {"error": "a number of 5,000 digits; numbers here have at "
                                                                  "most 40"}


def test_a_bug_is_500_without_its_text(trained):
    from gpseq.serve.app import create_app
    from gpseq.serve.models import ServedModel
    from gpseq.serve.settings import ServeSettings

    class Broken:
        def __init__(self, tagger):
            self.inner = tagger

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def tag(self, sentences, **options):
            raise ValueError("/srv/secret/path: internal detail")

    directory, tagger = trained
    app = create_app({"tiny": ServedModel("tiny", Broken(tagger), directory)}, ServeSettings(), warm_up=False)
    with TestClient(app, raise_server_exceptions=False) as test_client:
        reply = test_client.post("/tag", json=SMALL)
    assert reply.status_code == 500 and "secret" not in reply.text and "ValueError" not in reply.text, reply.text


def test_models_shows_no_server_paths(client, trained):
    directory = trained[0]
    body = client.get("/models").json()
    [model] = body["models"]
    assert model["name"] == "tiny" and "path" not in model

    def strings(value):
        if isinstance(value, dict):
            for key, item in value.items():
                yield key
                yield from strings(item)
        elif isinstance(value, list):
            for item in value:
                yield from strings(item)
        elif isinstance(value, str):
            yield value

    found = [s for s in strings(body) if s.startswith("/") or str(directory) in s or directory.name == s]
    assert found == []


# ---- one address, one service; no orphaned workers ----------------------------------------------------
def refused(port: int, *options: str, directory: Path) -> subprocess.CompletedProcess:
    """`gpseq serve` on a port that is served: it must exit, not serve beside the other."""
    command = [sys.executable, "-m", "gpseq", "serve", f"other={directory}", "--port", str(port), *options]
    try:
        return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=WAIT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a second gpseq serve on port {port} is still running after {WAIT:g} s (serving beside the first)")


@pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="no SO_REUSEPORT on this system")
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_port_another_server_listens_on_is_refused(trained, workers):
    """A server of this user that listens with SO_REUSEPORT (which a second SO_REUSEPORT socket may
    join): the command says so in one line and exits 1."""
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        finished = refused(port, "--workers", workers, directory=trained[0])
    assert finished.returncode == 1, finished.stderr
    assert finished.stderr.strip().splitlines() == [
        f"error: cannot listen on 127.0.0.1:{port}: the address is in use (a server listens there)"]


def test_a_second_serve_on_the_same_port_is_refused(two_workers, trained):
    server, port, _ = two_workers
    finished = refused(port, "--workers", "2", directory=trained[0])
    assert finished.returncode == 1, finished.stderr
    [line] = finished.stderr.strip().splitlines()
    assert line.startswith(f"error: cannot listen on 127.0.0.1:{port}: "), line
    assert server.poll() is None  # the first one goes on


def test_two_workers_drop_slow_header_clients_too(two_workers):
    """The header timeout reaches the workers (uvicorn's configuration, sent to each)."""
    _, port, _ = two_workers
    results = watch_connections(("127.0.0.1", port), [(b"GET /health HTTP/1.1\r\n", b"X: y\r\n")] * 4,
                                HEADER_TIMEOUT + 3 * SLACK)
    assert all(closed is not None and closed < HEADER_TIMEOUT + SLACK for closed, _ in results), results


def test_a_worker_whose_supervisor_dies_shuts_down_without_prctl(tmp_path):
    """The portable half of `exit_with_supervisor` alone (the Linux kernel's signal left out): a
    process whose parent is SIGKILLed gets SIGTERM from its own watching thread within ~0.5 s."""
    child = ("import os, sys, time\n"
             "from gpseq.serve.process import exit_with_supervisor\n"
             "sys.platform = 'elsewhere'  # no prctl: the thread that watches the parent pid only\n"
             "exit_with_supervisor(os.getppid(), grace=30)\n"
             "print(os.getpid(), flush=True)\n"
             "time.sleep(60)\n")
    parent = ("import subprocess, sys, time\n"
              f"subprocess.Popen([sys.executable, '-c', {child!r}])\n"
              "time.sleep(60)\n")
    supervisor = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, cwd=ROOT, env=ENV,
                                  text=True)
    try:
        worker = int(supervisor.stdout.readline())
        assert alive(worker)
        killed = time.monotonic()
        supervisor.kill()
        supervisor.wait(WAIT)
        while alive(worker):
            assert time.monotonic() - killed < 3, "the worker outlived its parent"
            time.sleep(0.05)
    finally:
        stop(supervisor)


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead and not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killing_the_supervisor_ends_its_workers_and_frees_the_port(two_workers):
    """SIGKILL to the supervisor (no chance to stop its workers itself): each worker exits within
    5 s and the port can be listened on again. Kills the module's two-worker server: the file's last test."""
    server, port, log = two_workers
    workers = [int(pid) for pid in re.findall(r"Started server process \[(\d+)\]", log.read_text())]
    assert len(workers) == 2 and all(map(alive, workers)), workers
    killed = time.monotonic()
    server.send_signal(signal.SIGKILL)
    server.wait(WAIT)
    while any(map(alive, workers)):
        assert time.monotonic() - killed < 5, f"workers {[p for p in workers if alive(p)]} outlived their supervisor"
        time.sleep(0.05)
    gone = time.monotonic() - killed
    with socket.socket() as again:  # as a new server would (no SO_REUSEPORT: refused while anyone listens)
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
        again.listen()
    from gpseq.serve.process import claim_address

    claim = claim_address("127.0.0.1", port)  # the supervisor's claim died with it
    if claim is not None:
        claim.close()
    print(f"\nworkers gone {gone:.2f} s after SIGKILL to their supervisor")
