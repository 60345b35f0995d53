"""Prometheus metrics of one `gpseq serve` application.

One process: the application's own registry (so that several applications in one process, e.g. in
tests, count apart). Several worker processes (`gpseq serve --workers N`, `gpseq.serve.process`):
prometheus-client's multiprocess mode, switched on by `PROMETHEUS_MULTIPROC_DIR` in the
environment before prometheus-client is imported; each process writes its values to files in that
directory and `render` reports them summed over every process of the run (the queue gauge over
the live ones)."""

from __future__ import annotations

import os

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest)
from prometheus_client import multiprocess, values

from gpseq.serve.batching import BatchStats

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    """Requests, in progress, latency, errors (HTTP side); sentences, tokens, batches, queue (model side)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        # the values are in the directory's files when prometheus-client found it set at its import
        mmapped = values.ValueClass is not values.MutexValue
        self.multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") if mmapped else None
        disable_created_metrics()  # no `_created` series beside each counter (process-wide; serving owns it)
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("gpseq_requests", "HTTP requests answered, by endpoint, method and status.",
                                ["endpoint", "method", "status"], registry=registry)
        self.errors = Counter("gpseq_request_errors", "HTTP requests answered with a 4xx or 5xx status.",
                              ["endpoint", "status"], registry=registry)
        self.in_progress = Gauge("gpseq_requests_in_progress", "HTTP requests received and not yet answered.",
                                 ["endpoint"], registry=registry, multiprocess_mode="livesum")
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
                           registry=registry, multiprocess_mode="livesum")

    def request_started(self, endpoint: str) -> None:
        self.in_progress.labels(endpoint).inc()

    def observe_request(self, endpoint: str, method: str, status: int, seconds: float) -> None:
        self.in_progress.labels(endpoint).dec()
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

    def queue_observer(self, model: str):
        """The `on_queue` callback of a model's MicroBatcher (the number of requests waiting)."""
        return self.queue.labels(model).set

    def render(self) -> bytes:
        """The Prometheus text: this application's, or that of every process of the run."""
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=self.multiprocess_dir)
        return generate_latest(registry)

    def close(self) -> None:
        """At the process's end: its live gauges (the queue) leave the multiprocess sums."""
        if self.multiprocess_dir is not None:
            multiprocess.mark_process_dead(os.getpid(), self.multiprocess_dir)
