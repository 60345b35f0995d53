"""Micro-batching: the requests waiting for one model are merged into one `Tagger.tag` call.

One worker thread per model owns the tagger (the only caller of `tag`, so the model needs no
lock). Requests queue in a bounded queue; the worker takes the first, then whatever else is
waiting, up to `max_batch_sentences` sentences, waiting at most `max_wait` seconds for more once
the queue is empty (under load the queue is never empty, so a batch costs no extra latency).
`Tagger.tag` then cuts the merged sentences into compiled calls by length and padded tokens.

Which requests merge: those of one deterministic predictive (one call with the same options).
A Monte Carlo request (`samples`, or a model whose default predictive is Monte Carlo) is tagged
on its own: the draws of `Tagger.tag` are seeded per compiled call, so alone it gets exactly what
`Tagger.tag` on its sentences gives. A merged call that fails is retried request by request, so
one request's failure is only its own.

A request may come with `finish`, a function of its results that the worker calls right after
the batch (the service builds its response bytes there: the results are fresh in this thread's
cache, and the event loop is left with only the HTTP); the future then holds what it returns.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

log = logging.getLogger("gpseq.serve")


class QueueFull(Exception):
    """The model's queue holds `max_queue` requests already."""


class Stopped(Exception):
    """The batcher is shutting down and takes no new requests."""


@dataclass(eq=False)
class Job:
    """One request: its sentences, its `Tagger.tag` options and the future of its results."""

    sentences: list
    options: dict  # samples, mean
    mergeable: bool
    future: concurrent.futures.Future
    finish: Callable[[list], Any] | None = None  # of the results, in the worker; its value is the future's


@dataclass
class BatchStats:
    """What one call of `Tagger.tag` did (for metrics)."""

    requests: int
    sentences: int
    tokens: int
    seconds: float


_STOP = object()


class MicroBatcher:
    """Tags the requests of one model in merged batches, in a worker thread of its own."""

    def __init__(self, tagger, *, name: str = "model", max_batch_sentences: int = 256, max_wait: float = 0.005,
                 max_queue: int = 128, on_batch: Callable[[BatchStats], None] | None = None,
                 on_queue: Callable[[int], None] | None = None):
        self.tagger, self.name = tagger, name
        self.max_batch_sentences, self.max_wait, self.max_queue = max_batch_sentences, max_wait, max_queue
        self.on_batch = on_batch
        self.on_queue = on_queue  # of the requests waiting, whenever that changes (under the lock)
        self._queue: queue.Queue = queue.Queue()  # bounded by `max_queue` in `submit`
        self._pending = 0  # jobs submitted and not yet taken by the worker
        self._lock = threading.Lock()
        self._stopping = False
        self._thread: threading.Thread | None = None

    # ---- the request side -------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Requests waiting for a batch."""
        return self._pending

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, sentences: list, options: dict, mergeable: bool,
               finish: Callable[[list], Any] | None = None) -> concurrent.futures.Future:
        """Queue a request: a future of its `TaggedSentence`s, in order, or of `finish(them)`
        (QueueFull, Stopped)."""
        job = Job(list(sentences), dict(options), mergeable, concurrent.futures.Future(), finish)
        with self._lock:
            if self._stopping or not self.alive:
                raise Stopped(f"model {self.name!r} is not taking requests (shutting down)")
            if self._pending >= self.max_queue:
                raise QueueFull(f"model {self.name!r} has {self._pending} requests waiting (the limit); retry later")
            self._pending += 1
            self._queue.put(job)
            if self.on_queue is not None:
                self.on_queue(self._pending)
        return job.future

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> "MicroBatcher":
        self._thread = threading.Thread(target=self._run, name=f"gpseq-batcher-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Take no new requests, finish every queued one, end the worker."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            self._queue.put(_STOP)  # behind every queued job: those are tagged first
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- the worker ---------------------------------------------------------------------------
    def _take(self, block: bool, timeout: float | None = None):
        item = self._queue.get(block, timeout)
        if item is not _STOP:
            with self._lock:
                self._pending -= 1
                if self.on_queue is not None:
                    self.on_queue(self._pending)
        return item

    def _run(self) -> None:
        carried = None
        while True:
            job = carried if carried is not None else self._take(True)
            carried = None
            if job is _STOP:
                return
            batch, size = [job], len(job.sentences)
            deadline = time.monotonic() + self.max_wait
            while size < self.max_batch_sentences:
                remaining = deadline - time.monotonic()
                try:
                    item = self._take(remaining > 0, max(remaining, 0.0))
                except queue.Empty:
                    break
                if item is _STOP or size + len(item.sentences) > self.max_batch_sentences:
                    carried = item  # the next batch starts with it (or the worker stops)
                    break
                batch.append(item)
                size += len(item.sentences)
            try:
                self._process(batch)
            except Exception as error:  # noqa: BLE001  (a bug here must not leave requests hanging)
                log.exception("batch failed")
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(error)

    def _process(self, batch: list[Job]) -> None:
        started = [job for job in batch if job.future.set_running_or_notify_cancel()]  # not timed out
        groups: dict[tuple, list[Job]] = {}
        for job in started:
            if job.mergeable:
                groups.setdefault(tuple(sorted(job.options.items())), []).append(job)
            else:
                groups[("alone", id(job))] = [job]
        for jobs in groups.values():
            self._tag(jobs)

    def _tag(self, jobs: list[Job]) -> None:
        sentences = [sentence for job in jobs for sentence in job.sentences]
        began = time.perf_counter()
        try:
            results = self.tagger.tag(sentences, batch_size=self.max_batch_sentences, **jobs[0].options)
        except Exception as error:  # noqa: BLE001  (reported to the request, never kills the worker)
            if len(jobs) > 1:  # whose request was it? each alone
                for job in jobs:
                    self._tag([job])
                return
            jobs[0].future.set_exception(error)
            return
        seconds = time.perf_counter() - began
        if self.on_batch is not None:  # before the replies, so that a reply's metrics are already counted
            try:
                self.on_batch(BatchStats(len(jobs), len(sentences), sum(len(s.tokens) for s in sentences), seconds))
            except Exception:  # noqa: BLE001  (metrics never fail a request)
                log.exception("batch metrics failed")
        at = 0
        for job in jobs:
            value, at = results[at:at + len(job.sentences)], at + len(job.sentences)
            if job.finish is not None:
                try:
                    value = job.finish(value)
                except Exception as error:  # noqa: BLE001  (the request's own failure)
                    job.future.set_exception(error)
                    continue
            job.future.set_result(value)
