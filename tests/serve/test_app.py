"""`gpseq serve` (gpseq/serve/): every endpoint, every error path, the response schema, equality
with `Tagger.tag`, batching of concurrent requests, timeouts, a full queue, graceful shutdown.

Two tiny models of the default training on the bundled sample (a tokens-only one that takes raw
text, and one whose features read the POS column, which takes rows). Answers are checked against
`Tagger.tag` called directly on the same sentences, spans against a hand reading of the IOB2
labels, raw-text sentences against spaCy's sentencizer called here. Only 127.0.0.1 is contacted,
every wait is bounded. Skips when the serve extra (FastAPI, uvicorn, prometheus-client) or httpx
is absent; .ci/run installs them.
"""

from __future__ import annotations

import json
import math
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

from fastapi.testclient import TestClient  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "corpora" / "sample"
TEXT = "The committee approved the new budget on Tuesday. It will fund three small projects.\n\nA second paragraph."
LIMITS = dict(max_chars=3_000, max_sentences=20, max_tokens=400, max_body_bytes=30_000, max_samples=8,
              request_timeout=120.0)
WAIT = 60.0  # seconds any test waits for a thread or a server, at most


# ---- models and clients --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """{"text": (dir, Tagger) of a tokens-only model, "rows": one reading the POS column}."""
    from gpseq.corpora import read_conll
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger, TaggerConfig
    from gpseq.training.config import TrainingConfig

    if not (SAMPLE / "train.conll").is_file():
        pytest.skip("the bundled sample corpus is absent")
    train = read_conll(SAMPLE / "train.conll")
    base = tmp_path_factory.mktemp("serve_models")
    out = {}
    for name, preset in (("text", "ner"), ("rows", "chunking")):
        config = TaggerConfig(features=get_preset(preset), training=TrainingConfig(max_steps=30, dev_fraction=0.0,
                                                                                   seed=1))
        directory = Tagger.train(train, config).save(base / name)
        out[name] = (directory, Tagger.load(directory))
    return out


@pytest.fixture(scope="module")
def served(trained):
    from gpseq.saved.meta import read_model_meta
    from gpseq.serve.models import ServedModel

    return {name: ServedModel(name, tagger, directory, read_model_meta(directory))
            for name, (directory, tagger) in trained.items()}


@pytest.fixture(scope="module")
def client(served):
    from gpseq.serve.app import create_app
    from gpseq.serve.settings import ServeSettings

    with TestClient(create_app(served, ServeSettings(**LIMITS))) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def test_sentences():
    from gpseq.corpora import read_conll

    return read_conll(SAMPLE / "test.conll")


class GatedTagger:
    """A Tagger whose `tag` records its calls and waits for `release` (a batch held in flight)."""

    def __init__(self, tagger):
        self.inner, self.calls = tagger, []
        self.entered, self.release = threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def tag(self, sentences, **options):
        self.calls.append((len(sentences), options))
        self.entered.set()
        assert self.release.wait(WAIT), "the test never released the gate"
        return self.inner.tag(sentences, **options)


def gated_app(trained, name="text", **settings):
    from gpseq.serve.app import create_app
    from gpseq.serve.models import ServedModel
    from gpseq.serve.settings import ServeSettings

    directory, tagger = trained[name]
    gate = GatedTagger(tagger)
    return create_app({name: ServedModel(name, gate, directory)}, ServeSettings(**{**LIMITS, **settings}),
                      warm_up=False), gate


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# ---- independent references ----------------------------------------------------------------------
def iob2_chunks(labels: list[str]) -> list[tuple[str, int, int]]:
    """(type, start, end_exclusive) of IOB2 labels, read by hand (conlleval: an I- after O or
    another type starts a chunk)."""
    chunks, start, kind = [], None, None
    for t, label in enumerate(labels + ["O"]):
        prefix, _, this = label.partition("-")
        if start is not None and (prefix in ("B", "O") or this != kind):
            chunks.append((kind, start, t))
            start = kind = None
        if prefix in ("B", "I") and start is None:
            start, kind = t, this
    return chunks


def assert_record_equals(record: dict, reference, *, exact: bool = True) -> None:
    """A served sentence against `Tagger.tag`'s TaggedSentence for the same tokens."""
    assert record["tokens"] == reference.tokens
    assert record["labels"] == reference.labels
    tolerance = 1e-6 if exact else 1e-4  # merged batches: float32 sums in another order
    assert record["confidences"] == pytest.approx(reference.confidences, abs=tolerance)
    assert record["sequence_log_prob"] == pytest.approx(reference.sequence_log_prob, rel=1e-4, abs=1e-4)
    assert [tuple(s[:3]) for s in record["spans"]] == iob2_chunks(reference.labels)
    assert [s[3] for s in record["spans"]] == pytest.approx([float(s[3]) for s in reference.spans], abs=tolerance)


def spacy_sentences(text: str) -> list[list[str]]:
    import spacy

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    return [[t.text for t in sent if not t.is_space] for paragraph in text.split("\n\n")
            for sent in nlp(paragraph).sents if any(not t.is_space for t in sent)]


def metric(text: str, name: str, **labels) -> float:
    """The sum of a Prometheus series' samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{name}(?:{{(.*)}})? (\S+)$", line)
        if match:
            found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
            if all(found.get(k) == v for k, v in labels.items()):
                total += float(match.group(2))
    return total


# ---- POST /tag: equal to Tagger.tag --------------------------------------------------------------
def test_tag_sentences_equal_tagger_tag(client, trained, test_sentences):
    tagger = trained["text"][1]
    sentences = [s.tokens for s in test_sentences[:6]]
    reply = client.post("/tag", json={"model": "text", "sentences": sentences})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["model"] == "text"
    assert body["n_sentences"] == 6 and body["n_tokens"] == sum(map(len, sentences))
    for record, reference in zip(body["sentences"], tagger.tag(sentences), strict=True):
        assert_record_equals(record, reference)
        assert "distributions" not in record


def test_the_first_model_is_the_default(client, trained):
    reply = client.post("/tag", json={"sentences": [["A", "small", "test", "."]]})
    assert reply.status_code == 200 and reply.json()["model"] == "text"


def test_tag_rows_for_a_model_that_reads_the_pos_column(client, trained, test_sentences):
    from gpseq.corpora import Sentence

    tagger = trained["rows"][1]
    rows = [[[token, columns[1]] for token, columns in zip(s.tokens, s.columns)] for s in test_sentences[:5]]
    reply = client.post("/tag", json={"model": "rows", "sentences": rows})
    assert reply.status_code == 200, reply.text
    references = tagger.tag([Sentence(tokens=[r[0] for r in s], columns=s) for s in rows])
    for record, reference in zip(reply.json()["sentences"], references, strict=True):
        assert_record_equals(record, reference)


def test_tag_raw_text_as_gpseq_tag_reads_it(client, trained):
    tagger = trained["text"][1]
    reply = client.post("/tag", json={"text": TEXT})
    assert reply.status_code == 200, reply.text
    records = reply.json()["sentences"]
    expected = spacy_sentences(TEXT)
    assert [r["tokens"] for r in records] == expected
    assert [r["line"] for r in records] == [1, 1, 3] and {r["source"] for r in records} == {"text"}
    for record, reference in zip(records, tagger.tag(expected), strict=True):
        assert_record_equals(record, reference)


def test_raw_text_lines_split_as_a_text_file_reads_them(client, tmp_path):
    """A text's lines end where a text file's do for `gpseq tag` (at LF, a CR before it dropped), not
    at the other line ends of `str.splitlines` (a lone CR, U+2028, form feed, U+0085 ...): the same
    sentences and line numbers as `gpseq tag` reading the text from a file."""
    from gpseq.corpora.text import blank_nlp, iter_text

    text = "Ducks swim.\u2028Geese fly.\x0cOwls hunt.\x85Cats nap.\r\nDogs bark.\rCows moo.\n\nBirds sing."
    path = tmp_path / "text.txt"
    path.write_bytes(text.encode("utf-8"))
    expected = [(s.tokens, s.line) for s in iter_text(path, blank_nlp("en"), name="text")]
    reply = client.post("/tag", json={"text": text})
    assert reply.status_code == 200, reply.text
    assert [(r["tokens"], r["line"]) for r in reply.json()["sentences"]] == expected
    assert [line for _, line in expected][-3:] == [2, 2, 4]  # Dogs (after CR LF), Cows (a lone CR), Birds


def test_full_distribution(client, trained):
    tagger = trained["text"][1]
    reply = client.post("/tag", json={"sentences": [["Prices", "rose", "."]], "full_distribution": True})
    record = reply.json()["sentences"][0]
    reference = tagger.tag([["Prices", "rose", "."]])[0]
    assert len(record["distributions"]) == 3
    for t, distribution in enumerate(record["distributions"]):
        assert list(distribution) == tagger.labels
        assert sum(distribution.values()) == pytest.approx(1.0, abs=1e-4)
        assert distribution == pytest.approx(reference.distribution(t), abs=1e-6)
        assert distribution[record["labels"][t]] == record["confidences"][t]


def test_mean_and_samples_options_equal_tagger_tag(client, trained, test_sentences):
    tagger = trained["text"][1]
    sentences = [s.tokens for s in test_sentences[6:9]]
    for options, reference in (({"samples": 4}, tagger.tag(sentences, samples=4)),
                               ({"mean": True}, tagger.tag(sentences, mean=True)),
                               ({"samples": 3, "mean": True}, tagger.tag(sentences, samples=3, mean=True))):
        reply = client.post("/tag", json={"sentences": sentences, **options})
        assert reply.status_code == 200, reply.text
        for record, expected in zip(reply.json()["sentences"], reference, strict=True):
            assert_record_equals(record, expected)


def test_abstention_nbest_span_probs_and_decode_equal_tagger_tag(client, trained, test_sentences):
    tagger = trained["text"][1]
    sentences = [s.tokens for s in test_sentences[9:12]]
    options = {"abstain_below": 0.9, "nbest": 3, "span_probs": "product", "decode": "max-marginal"}
    reply = client.post("/tag", json={"sentences": sentences, **options})
    assert reply.status_code == 200, reply.text
    references = tagger.tag(sentences, abstain_below=0.9, nbest=3, spans="product", decode="max-marginal")
    for record, reference in zip(reply.json()["sentences"], references, strict=True):
        assert_record_equals(record, reference)
        assert record["span_probability"] == "product" or not record["spans"]
        for kind, start, end, probability in record["spans"]:  # the product of the token marginals
            assert probability == pytest.approx(math.prod(reference.confidences[start:end]), abs=1e-6)
        assert record["abstain_below"] == 0.9
        assert record["abstain"] == [p < 0.9 for p in reference.confidences]
        assert record["span_abstain"] == [s[3] < 0.9 for s in record["spans"]]
        assert [n["labels"] for n in record["nbest"]] == [labels for labels, _ in reference.nbest]
        assert [n["probability"] for n in record["nbest"]] == pytest.approx([p for _, p in reference.nbest], abs=1e-6)
        assert len(record["nbest"]) == 3 or len(record["tokens"]) == 1


def test_response_schema(client, trained):
    import io

    from gpseq.corpora import Sentence
    from gpseq.predict.writers import JsonlWriter

    tokens = ["Stocks", "fell", "sharply", "."]
    reply = client.post("/tag", json={"sentences": [tokens], "full_distribution": True})
    assert reply.headers["content-type"] == "application/json"
    body = reply.json()
    assert set(body) == {"model", "n_sentences", "n_tokens", "sentences"}
    record = body["sentences"][0]
    line = io.StringIO()  # what `gpseq tag --format jsonl` writes for the same sentence
    JsonlWriter(line, True).write(Sentence(tokens=tokens), trained["text"][1].tag([tokens])[0], "iob2")
    expected = json.loads(line.getvalue())
    assert list(record) == list(expected) and record == expected
    assert {"tokens", "labels", "confidences", "distributions", "spans", "sequence_log_prob"} <= set(record)
    assert record["source"] is None and record["line"] is None
    assert all(isinstance(p, float) and 0 <= p <= 1 for p in record["confidences"])
    for kind, start, end, probability in record["spans"]:
        assert isinstance(kind, str) and 0 <= start < end <= 4 and 0 <= probability <= 1
    assert isinstance(record["sequence_log_prob"], float) and record["sequence_log_prob"] <= 0


# ---- the other endpoints ---------------------------------------------------------------------------
def test_models_endpoint(client, trained):
    reply = client.get("/models")
    assert reply.status_code == 200
    body = reply.json()
    from gpseq import __version__

    assert body["gpseq_version"] == __version__
    assert [m["name"] for m in body["models"]] == ["text", "rows"]
    assert [m["default"] for m in body["models"]] == [True, False]
    for model in body["models"]:
        directory, tagger = trained[model["name"]]
        meta = json.loads((directory / "tagger.json").read_text())
        assert model["labels"] == meta["labels"]
        assert model["version"] == {"gpseq": meta["gpseq_version"], "format_version": meta["format_version"]}
        assert model["features"]["n_features"] == meta["num_features"]
        assert "path" not in model and str(directory) not in json.dumps(model)  # no server paths
        assert model["span_scheme"] == "iob2"
        assert model["scores"]["method"] == meta["scores"]["method"]
    text, rows = body["models"]
    assert text["input"] == {"text": True, "row_fields": 1, "columns": []}
    assert rows["input"] == {"text": False, "row_fields": 2, "columns": [1]}


def test_health(client):
    reply = client.get("/health")
    assert reply.status_code == 200
    body = reply.json()
    process = body.pop("process")
    assert body == {"status": "ok", "models": {"text": {"ready": True, "queued": 0},
                                               "rows": {"ready": True, "queued": 0}}}
    assert process["pid"] == os.getpid()  # the test client serves in this process
    statm = Path("/proc/self/statm").read_text().split()  # resident pages, read here
    assert process["resident_mib"] == pytest.approx(int(statm[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, rel=0.1)


def test_metrics_count_requests_tokens_and_errors(client):
    before = client.get("/metrics").text
    tokens = [["One", "two", "three", "."], ["Four", "five", "."]]
    assert client.post("/tag", json={"sentences": tokens}).status_code == 200
    assert client.post("/tag", json={"text": ""}).status_code == 422
    reply = client.get("/metrics")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    after = reply.text
    delta = [metric(after, name, **labels) - metric(before, name, **labels) for name, labels in (
        ("gpseq_requests_total", {"endpoint": "/tag", "status": "200"}),
        ("gpseq_requests_total", {"endpoint": "/tag", "status": "422"}),
        ("gpseq_request_errors_total", {"endpoint": "/tag", "status": "422"}),
        ("gpseq_tokens_tagged_total", {"model": "text"}),
        ("gpseq_sentences_tagged_total", {"model": "text"}),
        ("gpseq_request_duration_seconds_count", {"endpoint": "/tag"}),
    )]
    assert delta == [1, 1, 1, 7, 2, 2]
    assert 'gpseq_request_duration_seconds_bucket{endpoint="/tag",le="0.005"}' in after
    assert "# TYPE gpseq_request_duration_seconds histogram" in after
    assert metric(after, "gpseq_queue_requests", model="text") == 0
    assert metric(after, "gpseq_requests_in_progress", endpoint="/tag") == 0
    assert metric(after, "gpseq_requests_in_progress", endpoint="/metrics") == 1  # this one
    assert metric(after, "gpseq_batches_total", model="text") >= 1


def test_openapi_documentation(client):
    schema = client.get("/openapi.json").json()
    assert {"/tag", "/models", "/health", "/metrics"} <= set(schema["paths"])
    tag = schema["paths"]["/tag"]["post"]
    assert tag["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/TagRequest")
    assert {"200", "400", "404", "413", "422", "503", "504"} <= set(tag["responses"])
    request = schema["components"]["schemas"]["TagRequest"]
    assert {"model", "text", "sentences", "samples", "mean", "full_distribution", "abstain_below", "nbest",
            "span_probs", "decode"} == set(request["properties"])
    docs = client.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


# ---- every error path: a 4xx with one line, and the service still answers -------------------------
BAD_REQUESTS = [
    # (id, body bytes, headers, status, a fragment of the reason)
    ("malformed-json", b'{"text": ', None, 400, "malformed JSON"),
    ("invalid-utf8", b'{"text": "caf\xe9"}', None, 400, "not valid UTF-8"),
    ("empty-body", b"", None, 422, "empty body"),
    ("not-an-object", b'["a", "b"]', None, 422, "JSON object"),
    ("null", b"null", None, 422, "JSON object"),
    ("neither-input", b'{"mean": true}', None, 422, "exactly one"),
    ("both-inputs", b'{"text": "a", "sentences": [["a"]]}', None, 422, "exactly one"),
    ("text-wrong-type", b'{"text": 3}', None, 422, "text"),
    ("empty-text", b'{"text": ""}', None, 422, "empty"),
    ("whitespace-text", b'{"text": " \\n\\t "}', None, 422, "empty"),
    ("sentences-wrong-type", b'{"sentences": "a b c"}', None, 422, "sentences"),
    ("token-wrong-type", b'{"sentences": [["a", 1]]}', None, 422, "sentences.0"),
    ("no-sentences", b'{"sentences": []}', None, 422, "sentences"),
    ("empty-sentence", b'{"sentences": [["a"], []]}', None, 422, "sentences.1"),
    ("empty-token", b'{"sentences": [["a", ""]]}', None, 422, "sentences.0"),
    ("unknown-field", b'{"text": "a", "sample": 3}', None, 422, "sample: unknown field"),
    ("samples-as-string", b'{"text": "a", "samples": "3"}', None, 422, "samples"),
    ("samples-zero", b'{"text": "a", "samples": 0}', None, 422, "samples"),
    ("samples-over-limit", b'{"text": "a", "samples": 9}', None, 422, "limit is 8"),
    ("mean-as-string", b'{"text": "a", "mean": "yes"}', None, 422, "mean"),
    ("abstain-below-over-1", b'{"text": "a", "abstain_below": 1.5}', None, 422, "abstain_below"),
    ("nbest-negative", b'{"text": "a", "nbest": -1}', None, 422, "nbest"),
    ("nbest-over-limit", b'{"text": "a", "nbest": 21}', None, 422, "limit is 20"),
    ("unknown-span-probs", b'{"text": "a", "span_probs": "max"}', None, 422, "span_probs"),
    ("unknown-decoder", b'{"text": "a", "decode": "greedy"}', None, 422, "decode"),
    ("unpaired-surrogate-text", b'{"text": "a \\ud800 b"}', None, 422, "surrogate"),
    ("unpaired-surrogate-token", b'{"sentences": [["a", "\\udfff"]]}', None, 422, "unicode string"),
    ("unknown-model", b'{"model": "nope", "text": "a"}', None, 404, "unknown model 'nope'"),
    ("text-for-a-rows-model", b'{"model": "rows", "text": "a b"}', None, 422, "rows"),
    ("tokens-for-a-rows-model", b'{"model": "rows", "sentences": [["a", "b"]]}', None, 422, "row"),
    ("short-row", b'{"model": "rows", "sentences": [[["a", "DT"], ["b"]]]}', None, 422, "sentences[0][1]"),
    ("mixed-rows-and-tokens", b'{"model": "rows", "sentences": [[["a", "DT"], "b"]]}', None, 422, "sentences.0"),
    ("not-json", b"text=a", {"Content-Type": "application/x-www-form-urlencoded"}, 415, "application/json"),
    ("too-many-chars", json.dumps({"text": "word " * 700}).encode(), None, 413, "3,000"),
    ("too-many-sentences", json.dumps({"sentences": [["a"]] * 21}).encode(), None, 413, "sentences"),
    ("too-many-tokens", json.dumps({"sentences": [["a"] * 401]}).encode(), None, 413, "tokens"),
    ("text-with-too-many-sentences", json.dumps({"text": "Go. " * 25}).encode(), None, 413, "sentences"),
    ("body-too-large", json.dumps({"text": "a" * 40_000}).encode(), None, 413, "bytes"),
]


@pytest.mark.parametrize("body, headers, status, reason", [case[1:] for case in BAD_REQUESTS],
                         ids=[case[0] for case in BAD_REQUESTS])
def test_bad_requests_get_a_one_line_reason(client, body, headers, status, reason):
    reply = client.post("/tag", content=body, headers=headers or {"Content-Type": "application/json"})
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/json"
    error = reply.json()
    assert list(error) == ["error"] and "\n" not in error["error"] and error["error"]
    assert reason in error["error"]
    assert client.get("/health").status_code == 200


def test_a_chunked_body_over_the_limit_is_refused(client):
    def chunks():
        yield b'{"text": "'
        for _ in range(40):
            yield b"a" * 1000
        yield b'"}'

    reply = client.post("/tag", content=chunks(), headers={"Content-Type": "application/json"})
    assert reply.status_code == 413 and "limit" in reply.json()["error"]


def test_wrong_method_and_unknown_path(client):
    assert client.get("/tag").status_code == 405
    assert client.get("/tag").json() == {"error": "Method Not Allowed"}
    assert client.get("/nothing").status_code == 404
    assert client.get("/nothing").json() == {"error": "Not Found"}


# ---- batching, timeouts, a full queue ------------------------------------------------------------------
def test_concurrent_requests_are_tagged_in_one_batch_equal_to_unbatched(trained, test_sentences):
    app, gate = gated_app(trained)
    requests = [[s.tokens for s in test_sentences[i:i + 3]] for i in range(0, 18, 3)]  # 6 requests of 3
    with TestClient(app) as client, ThreadPoolExecutor(len(requests)) as pool:
        batcher = app.state.batchers["text"]
        first = pool.submit(client.post, "/tag", json={"sentences": requests[0]})
        wait_until(gate.entered.is_set, "the first batch")
        rest = [pool.submit(client.post, "/tag", json={"sentences": r}) for r in requests[1:]]
        wait_until(lambda: batcher.pending == len(rest), "the other requests to queue")
        gate.release.set()
        replies = [first.result(WAIT)] + [future.result(WAIT) for future in rest]
    assert [n for n, _ in gate.calls] == [3, 15]  # the first alone, the five others merged into one call
    tagger = trained["text"][1]
    for sentences, reply in zip(requests, replies):
        assert reply.status_code == 200, reply.text
        unbatched = tagger.tag(sentences)  # each request alone
        for record, reference in zip(reply.json()["sentences"], unbatched, strict=True):
            assert_record_equals(record, reference, exact=False)


def test_monte_carlo_requests_are_tagged_alone(trained, test_sentences):
    app, gate = gated_app(trained)
    requests = [[s.tokens for s in test_sentences[i:i + 2]] for i in range(0, 8, 2)]
    with TestClient(app) as client, ThreadPoolExecutor(len(requests)) as pool:
        first = pool.submit(client.post, "/tag", json={"sentences": requests[0], "samples": 4})
        wait_until(gate.entered.is_set, "the first batch")
        rest = [pool.submit(client.post, "/tag", json={"sentences": r, "samples": 4}) for r in requests[1:]]
        wait_until(lambda: app.state.batchers["text"].pending == len(rest), "the other requests to queue")
        gate.release.set()
        replies = [first.result(WAIT)] + [future.result(WAIT) for future in rest]
    assert [n for n, _ in gate.calls] == [2, 2, 2, 2]
    tagger = trained["text"][1]
    for sentences, reply in zip(requests, replies):
        for record, reference in zip(reply.json()["sentences"], tagger.tag(sentences, samples=4), strict=True):
            assert_record_equals(record, reference)  # the same draws as Tagger.tag on the request alone


def test_a_request_not_tagged_in_time_gets_504_and_the_service_goes_on(trained):
    app, gate = gated_app(trained, request_timeout=0.3)
    with TestClient(app) as client:
        reply = client.post("/tag", json={"sentences": [["Slow", "one", "."]]})
        assert reply.status_code == 504 and "0.3 s" in reply.json()["error"]
        gate.release.set()
        app.state.settings.request_timeout = WAIT
        reply = client.post("/tag", json={"sentences": [["Fast", "one", "."]]})
        assert reply.status_code == 200
        assert reply.json()["sentences"][0]["labels"] == trained["text"][1].tag([["Fast", "one", "."]])[0].labels


def test_a_full_queue_gets_503(trained):
    app, gate = gated_app(trained, max_queue=1)
    with TestClient(app) as client, ThreadPoolExecutor(2) as pool:
        held = pool.submit(client.post, "/tag", json={"sentences": [["In", "flight"]]})
        wait_until(gate.entered.is_set, "the first batch")
        queued = pool.submit(client.post, "/tag", json={"sentences": [["Queued"]]})
        wait_until(lambda: app.state.batchers["text"].pending == 1, "the second request to queue")
        refused = client.post("/tag", json={"sentences": [["Refused"]]})
        assert refused.status_code == 503 and "retry" in refused.json()["error"]
        assert refused.headers["retry-after"] == "1"
        gate.release.set()
        assert held.result(WAIT).status_code == 200 and queued.result(WAIT).status_code == 200


def test_a_failing_batch_fails_only_its_own_request(trained):
    from gpseq.errors import GpseqError

    class Picky(GatedTagger):
        def tag(self, sentences, **options):
            if any("poison" in s.tokens for s in sentences):
                raise GpseqError("cannot tag 'poison'")
            return super().tag(sentences, **options)

    app, gate = gated_app(trained)
    picky = Picky(gate.inner)
    app.state.models["text"].tagger = picky
    with TestClient(app) as client, ThreadPoolExecutor(3) as pool:
        picky.release.set()
        futures = [pool.submit(client.post, "/tag", json={"sentences": [tokens]})
                   for tokens in (["good", "one"], ["poison"], ["good", "two"])]
        replies = [f.result(WAIT) for f in futures]
    assert [r.status_code for r in replies] == [200, 422, 200]
    assert replies[1].json() == {"error": "cannot tag 'poison'"}


# ---- a real server: graceful shutdown, the command -----------------------------------------------------
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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


# ---- the wire: fast request check, records, JSON (gpseq/serve/wire.py) ----------------------------
def pydantic_reference(body: bytes):
    """What FastAPI made of a body before the fast path: the standard library's JSON, then the
    strict `TagRequest` (a dict of its fields), or (status, one line) for a refused body."""
    from pydantic import ValidationError

    from gpseq.serve.schemas import TagRequest
    from gpseq.serve.wire import validation_message

    try:
        value = json.loads(body)
    except json.JSONDecodeError as error:
        return 400, f"malformed JSON: {error.msg} at character {error.pos}"
    try:
        return TagRequest.model_validate(value).model_dump()
    except ValidationError as error:
        return validation_message(error.errors())


def utf8(body: bytes) -> bool:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# the 400/422 bodies of BAD_REQUESTS that reach the route (RequestGuard refuses invalid UTF-8 before)
WIRE_BODIES = [case[1] for case in BAD_REQUESTS if case[3] in (400, 422) and case[1] and utf8(case[1])] + [
    b'{"sentences": [["a", "b"], ["c"]]}',
    b'{"model": "rows", "sentences": [[["a", "DT"], ["b", "NN", "x"]]], "nbest": 2, "mean": false}',
    b'{"text": "Hello there.", "samples": 3, "abstain_below": 0.5, "span_probs": "product", "decode": "span-f1"}',
    b'{"text": "a", "model": null, "samples": null, "abstain_below": null, "decode": null, "full_distribution": true}',
    b'{"text": "a", "abstain_below": 1}',  # an int where a float goes: strict pydantic takes it
    b'{"text": "a", "abstain_below": true}',
    b'{"text": "a", "samples": true}',
    b'{"text": "a", "samples": 3.0}',
    b'{"text": "a", "samples": 99999999999999999999999}',  # beyond 64 bits: orjson would make it a float
    b'{"text": "a", "nbest": 99999999999999999999999}',
    b'{"text": "a", "abstain_below": NaN}',
    b'{"text": "a", "text": 3}',  # a repeated key: the last one counts
    b'{"sentences": [["a"], "b"]}',
    b'{"sentences": [[["a"], "b"]]}',
    b'{"sentences": [[["a", 3]]]}',
    b'{"sentences": [[[]]]}',
    b'{"sentences": [[["a", ""]]]}',
    b'{"sentences": [[["a", "\\ud800"]]]}',
    b'{"sentences": [[null]]}',
    b'{"sentences": null, "text": null}',
    b'{"text": null}',
    b'{"text": "a", "mean": 1}',
    b'{"text": "a", "decode": ["viterbi"]}',
    b'{"text": "a", "span_probs": null}',
    b'{"text": "\\u00e9t\\u00e9 \\ud83d\\ude00"}',  # escaped non-ASCII and a surrogate pair: fine
    b' {"text": "a"} ',
    b'[' * 1500 + b']' * 1500,
    b"  ",
]


@pytest.mark.parametrize("body", WIRE_BODIES, ids=range(len(WIRE_BODIES)))
@pytest.mark.parametrize("with_orjson", [True, False], ids=["orjson", "stdlib"])
def test_request_parsing_equals_fastapi_with_the_pydantic_model(body, with_orjson, monkeypatch):
    """The fast path accepts exactly what strict `TagRequest` accepts, with the same values, and
    every refused body gets pydantic's reason, with or without orjson."""
    from gpseq.serve import wire
    from gpseq.serve.models import RequestError

    if not with_orjson:
        monkeypatch.setattr(wire, "orjson", None)
    elif wire.orjson is None:
        pytest.skip("orjson is not installed")
    if body.startswith(b"[" * 1500):  # deeper than the standard library's recursion limit
        expected = (400, "malformed JSON: nested too deeply")
    else:
        expected = pydantic_reference(body)
    try:
        got = wire.parse_tag_request(body).model_dump()
    except RequestError as error:
        got = (error.status, error.message)
    assert got == expected


def test_the_fast_path_takes_plain_requests_without_pydantic(monkeypatch):
    from gpseq.serve import wire
    from gpseq.serve.schemas import TagRequest

    if wire.orjson is None:
        pytest.skip("orjson is not installed")

    def refuse(*args, **kwargs):
        raise AssertionError("a plain request went through pydantic validation")

    monkeypatch.setattr(TagRequest, "model_validate", refuse)
    body = b'{"sentences": [[["He", "PRP"], ["left", "VBD"]], [["Go", "VB"]]], "full_distribution": true}'
    request = wire.parse_tag_request(body)
    assert request.sentences == [[["He", "PRP"], ["left", "VBD"]], [["Go", "VB"]]]
    assert request.full_distribution is True and request.nbest == 0 and request.span_probs == "exact"


def test_round6_equals_round():
    """NumPy's rounding of many values against Python's `round(v, 6)`, decimal ties and their
    neighbours included."""
    import numpy as np

    from gpseq.serve.wire import round6

    rng = np.random.default_rng(5)
    special = [0.0, 1.0, 0.5, 2.0 ** -7, 1e-7, 5e-7, 0.1234565, 0.9999995, -0.25, 123.4567895, 1e300,
               123456789012.3456789]
    ties = (np.arange(1000) + 0.5) / 1e6  # decimal ties, as near as doubles get to them
    values = np.concatenate([rng.random(20_000), rng.random(2_000) ** 8, special, ties, np.nextafter(ties, 0),
                             np.nextafter(ties, 1)])
    assert round6(values) == [round(float(v), 6) for v in values]
    assert round6(np.array(special)) == [round(v, 6) for v in special]  # a few values: `round` itself
    assert round6(np.array([np.inf, -np.inf])) == [math.inf, -math.inf]
    assert math.isnan(round6(np.array([np.nan]))[0])


@pytest.mark.parametrize("options", [
    {},
    {"full_distribution": True},
    {"abstain_below": 0.9, "nbest": 3, "spans": "product", "decode": "max-marginal"},
    {"abstain_below": 0.5, "nbest": 2, "full_distribution": True},
])
@pytest.mark.parametrize("name", ["text", "rows"])
def test_tag_records_equal_the_jsonl_writer(trained, test_sentences, name, options):
    """`tag_records` (all of a request's sentences at once) gives, sentence by sentence, what
    `gpseq tag --format jsonl` writes (`predict.writers.sentence_record`)."""
    from gpseq.predict.writers import sentence_record
    from gpseq.serve.models import ServedModel
    from gpseq.serve.wire import tag_records

    directory, tagger = trained[name]
    served = ServedModel(name, tagger, directory)
    options = dict(options)
    distributions = options.pop("full_distribution", False)
    sentences = test_sentences[:12]
    results = tagger.tag(sentences, **options)
    records = tag_records(sentences, results, served.scheme, distributions)
    expected = [sentence_record(s, r, served.scheme, distributions=distributions) for s, r in zip(sentences, results)]
    assert [list(r) for r in records] == [list(e) for e in expected]
    assert records == expected
    assert json.loads(json.dumps(records)) == records
    assert tag_records([], [], served.scheme, distributions) == []


def test_the_response_bytes_with_and_without_orjson(monkeypatch):
    """Both encoders write compact JSON that reads back to the same value (non-ASCII kept)."""
    from gpseq.serve import wire

    value = {"model": "m", "sentences": [{"tokens": ["Café", "\u00e9", "\"q\"", "\\"], "confidences": [0.1, 1.0,
                                                                                                     1e-06],
                                           "sequence_log_prob": None, "spans": [["NP", 0, 2, 0.5]]}]}
    encoded = wire.dumps(value)
    monkeypatch.setattr(wire, "orjson", None)
    standard = wire.dumps(value)
    assert json.loads(encoded) == json.loads(standard) == value
    assert standard == json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    assert "Café".encode() in encoded and b" " not in encoded.replace(b'"\\\\"', b"")


def test_the_batch_worker_finishes_each_request_apart():
    """`finish` runs on a request's own results in the worker; when it raises, only that request fails."""
    from gpseq.serve.batching import MicroBatcher

    class Echo:  # tags each sentence with its length, records the calls
        calls = []

        def tag(self, sentences, **options):
            self.calls.append(list(sentences))
            return [len(s) for s in sentences]

    def finish(results):
        if 0 in results:
            raise ValueError("an empty sentence")
        return sum(results)

    batcher = MicroBatcher(Echo(), max_wait=0.5).start()
    try:
        futures = [batcher.submit(sentences, {}, mergeable=True, finish=f) for sentences, f in (
            (["ab", "c"], finish), ([""], finish), (["xyz"], None), (["d", "ef"], finish))]
        assert futures[0].result(WAIT) == 3 and futures[2].result(WAIT) == [3] and futures[3].result(WAIT) == 3
        with pytest.raises(ValueError, match="an empty sentence"):
            futures[1].result(WAIT)
    finally:
        batcher.stop(WAIT)
    assert sum(map(len, Echo.calls)) == 6  # every sentence tagged once


# ---- several worker processes (gpseq/serve/process.py) -------------------------------------------------
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


class MonteCarloByDefault(GatedTagger):
    """The gated tagger with a configuration whose predictive is Monte Carlo (`predict_samples` 8)."""

    def __init__(self, tagger):
        import dataclasses

        super().__init__(tagger)
        self.config = dataclasses.replace(tagger.config, predictive="mc", predict_samples=8)


def test_monte_carlo_draws_times_tokens_over_the_limit_is_413_before_tagging(trained, test_sentences):
    """A Monte Carlo request's memory grows with draws × tokens (× labels²: 100 draws of a 5,000-token
    sentence took 12 GB with the 44-label POS model, within the default limits of samples and
    tokens): over `max_sample_tokens` it is refused (413) before it reaches the tagger, whether the
    draws are asked for (samples) or the model's default predictive (predict_samples)."""
    from gpseq.serve.app import create_app
    from gpseq.serve.models import ServedModel
    from gpseq.serve.settings import ServeSettings

    assert ServeSettings().max_sample_tokens * 44 ** 2 * 13 < 2 * 2 ** 30  # the default: ~1.2 GB for 44 labels
    sentence = test_sentences[0].tokens  # 8 draws × len(sentence) tokens
    n = len(sentence)
    app, gate = gated_app(trained, max_sample_tokens=8 * n - 1)
    gate.release.set()
    with TestClient(app) as client:
        refused = client.post("/tag", json={"sentences": [sentence], "samples": 8})
        assert refused.status_code == 413, refused.text
        assert refused.json()["error"] == (f"8 Monte Carlo draws × {n} tokens = {8 * n:,}; the limit is "
                                           f"{8 * n - 1:,} (fewer samples or tokens)")
        assert gate.calls == []
        assert client.post("/tag", json={"sentences": [sentence], "samples": 7}).status_code == 200
        assert client.post("/tag", json={"sentences": [sentence], "samples": 8, "mean": True}).status_code == 200
        assert client.post("/tag", json={"sentences": [sentence, sentence]}).status_code == 200  # deterministic
    directory, tagger = trained["text"]
    mc = MonteCarloByDefault(tagger)
    mc.release.set()
    app = create_app({"text": ServedModel("text", mc, directory)},
                     ServeSettings(**{**LIMITS, "max_sample_tokens": 8 * n - 1}), warm_up=False)
    with TestClient(app) as client:
        refused = client.post("/tag", json={"sentences": [sentence]})  # the model's 8 draws
        assert refused.status_code == 413 and "8 Monte Carlo draws" in refused.json()["error"], refused.text
        assert mc.calls == []
        assert client.post("/tag", json={"sentences": [sentence], "mean": True}).status_code == 200
        assert [options.get("mean") for _, options in mc.calls] == [True]
