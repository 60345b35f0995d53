"""`gpseq serve`'s tests: two tiny models of the default training on the bundled sample (a
tokens-only one that takes raw text, and one whose features read the POS column, which takes rows),
trained once per test module that imports `trained`; an app under FastAPI's test client; a tagger
that holds a batch in flight; independent references (a hand reading of IOB2 chunks, spaCy's
sentencizer, Prometheus samples); and the bad requests every error path is checked with.

A test module importing this skips first when the serve extra or httpx is absent
(`pytest.importorskip`)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import pytest

from helpers import SAMPLE


TEXT = "The committee approved the new budget on Tuesday. It will fund three small projects.\n\nA second paragraph."


LIMITS = dict(max_chars=3_000, max_sentences=20, max_tokens=400, max_body_bytes=30_000, max_samples=8,
              request_timeout=120.0)


WAIT = 60.0  # seconds any test waits for a thread or a server, at most


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
    from fastapi.testclient import TestClient

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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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
