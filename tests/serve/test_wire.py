"""`gpseq serve`'s wire (gpseq/serve/wire.py): the fast request check equals FastAPI with the pydantic
model, with and without orjson; the fast path takes plain requests without pydantic; the records
equal the JSON Lines writer's; the response bytes with and without orjson. Skips when the serve
extra or httpx is absent."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
pytest.importorskip("httpx")

from helpers.serve import BAD_REQUESTS, test_sentences, trained  # noqa: E402,F401


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
