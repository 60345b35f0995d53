"""`gpseq serve`'s app (gpseq/serve/app.py): POST /tag equal to `Tagger.tag` (tokens, rows, raw text,
distributions, options), the response schema, GET /models, /health, /metrics and the OpenAPI
documentation, and every error path: a 4xx with one line, and the service still answers.

Answers are checked against `Tagger.tag` called directly on the same sentences, spans against a hand
reading of the IOB2 labels, raw-text sentences against spaCy's sentencizer called here. Skips when
the serve extra (FastAPI, uvicorn, prometheus-client) or httpx is absent; .ci/run installs them."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
pytest.importorskip("httpx")

from helpers.serve import (BAD_REQUESTS, TEXT, assert_record_equals, client, metric, served,  # noqa: E402,F401
                           spacy_sentences, test_sentences, trained)


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


# ---- every error path: a 4xx with one line, and the service still answers


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
