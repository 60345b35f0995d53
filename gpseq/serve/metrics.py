"""Prometheus metrics of one `gpseq serve` application (its own registry, so that several
applications in one process, e.g. in tests, count apart)."""

from __future__ import annotations

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest)

from gpseq.serve.batching import BatchStats

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    """Requests, latency, errors (HTTP side); sentences, tokens, batches, queue (model side)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        disable_created_metrics()  # no `_created` series beside each counter (process-wide; serving owns it)
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("gpseq_requests", "HTTP requests answered, by endpoint, method and status.",
                                ["endpoint", "method", "status"], registry=registry)
        self.errors = Counter("gpseq_request_errors", "HTTP requests answered with a 4xx or 5xx status.",
                              ["endpoint", "status"], registry=registry)
        self.latency = Histogram("gpseq_request_duration_seconds", "Time from request to the end of the response.",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=registry)
        self.sentences = Counter("gpseq_sentences_tagged", "Sentences tagged.", ["model"], registry=registry)
        self.tokens = Counter("gpseq_tokens_tagged", "Tokens tagged.", ["model"], registry=registry)
        self.batches = Counter("gpseq_batches", "Prediction calls (Tagger.tag) of merged requests.", ["model"],
                               registry=registry)
        self.batch_requests = Histogram("gpseq_batch_requests", "Requests merged into one prediction call.",
                                        ["model"], buckets=BATCH_BUCKETS, registry=registry)
        self.batch_seconds = Histogram("gpseq_batch_duration_seconds", "Time of one prediction call.", ["model"],
                                       buckets=LATENCY_BUCKETS, registry=registry)
        self.queue = Gauge("gpseq_queue_requests", "Requests waiting for a prediction call.", ["model"],
                           registry=registry)

    def observe_request(self, endpoint: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, method, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)
        if status >= 400:
            self.errors.labels(endpoint, str(status)).inc()

    def batch_observer(self, model: str):
        """The `on_batch` callback of a model's MicroBatcher."""
        sentences, tokens, batches = self.sentences.labels(model), self.tokens.labels(model), self.batches.labels(model)
        merged, seconds = self.batch_requests.labels(model), self.batch_seconds.labels(model)

        def observe(stats: BatchStats) -> None:
            sentences.inc(stats.sentences)
            tokens.inc(stats.tokens)
            batches.inc()
            merged.observe(stats.requests)
            seconds.observe(stats.seconds)

        return observe

    def render(self, queues: dict[str, int]) -> bytes:
        for model, waiting in queues.items():
            self.queue.labels(model).set(waiting)
        return generate_latest(self.registry)
