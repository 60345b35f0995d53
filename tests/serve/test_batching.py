"""`gpseq serve`'s batching (gpseq/serve/batching.py): concurrent requests tagged in one batch equal
to unbatched, Monte Carlo requests alone, a request not tagged in time (504), a full queue (503), a
failing batch failing only its own request, each request finished apart, and Monte Carlo draws ×
tokens over the limit refused (413) before tagging. Skips when the serve extra or httpx is absent."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from helpers.serve import (LIMITS, WAIT, GatedTagger, assert_record_equals, gated_app, test_sentences,  # noqa: E402,F401
                           trained, wait_until)


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
