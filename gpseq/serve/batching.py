"""Micro-batching: the requests waiting for one model are merged into one `Tagger.tag` call.

One worker thread per model owns the tagger (the only caller of `tag`, so the model needs no
lock). Requests queue in a bounded queue; the worker takes the first, then whatever else is
waiting, up to `max_batch_sentences` sentences and `max_batch_tokens` tokens, waiting at most
`max_wait` seconds for more once the queue is empty (under load it never is, so a batch costs no
extra latency). `Tagger.tag` then cuts the merged sentences into compiled calls by length and
padded tokens.

Abandoned requests: a request whose caller stopped waiting (the service's request timeout)
cancels its future, which stays pending until the worker sets its result, so the cancel always
takes. The worker skips such a request when it takes it from the queue, before each group of a
batch, and before each piece of a request larger than the batch limits. A prediction call that
has started stops once every request it serves is abandoned: `Tagger.tag` gets a `should_stop`
that says so and raises `Cancelled` at its next check (`gpseq.cancellation`). So a heavy request
past its timeout delays the next one by the stretch to that check, not by the rest of its call:
at most CHECK_STEPS chain steps for the default model (its NumPy predictive checks within a batch
too), at most one compiled batch of `predict.predictor.PREDICT_TOKENS` tokens for the others.

Which requests merge: those of one deterministic predictive (one call with the same options).
A Monte Carlo request (`samples`, or a model whose default predictive is Monte Carlo) is tagged
on its own: the draws of `Tagger.tag` are seeded per compiled call, so alone it gets exactly what
`Tagger.tag` on its sentences gives. A merged call that fails is retried request by request.

A request may come with `finish`, a function of its results that the worker calls right after
the batch (the service builds its response bytes there, while the results are in this thread's
cache); the future then holds what it returns.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpseq.cancellation import Cancelled

log = logging.getLogger("gpseq.serve")


class QueueFull(Exception):
    """The model's queue holds `max_queue` requests already."""


class Stopped(Exception):
    """The batcher is shutting down and takes no new requests."""


def n_tokens(sentence) -> int:
    """The tokens of a `Sentence` (or of a plain list of tokens)."""
    return len(getattr(sentence, "tokens", sentence))


@dataclass(eq=False)
class Job:
    """One request: its sentences, its `Tagger.tag` options and the future of its results (pending
    until they are set: cancelled, the request is abandoned)."""

    sentences: list
    options: dict  # samples, mean
    mergeable: bool
    future: concurrent.futures.Future
    finish: Callable[[list], Any] | None = None  # of the results, in the worker; its value is the future's
    lengths: list[int] = field(init=False)  # tokens of each sentence

    def __post_init__(self) -> None:
        self.lengths = [n_tokens(sentence) for sentence in self.sentences]

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def abandoned(self) -> bool:
        """Whether its caller stopped waiting (cancelled the future): nothing more is done for it."""
        return self.future.cancelled()


def pieces(lengths: list[int], max_sentences: int, max_tokens: int) -> list[slice]:
    """Consecutive slices of sentences (of `lengths` tokens) of at most `max_sentences` sentences
    and `max_tokens` tokens each, a longer sentence alone in its slice."""
    out, start, tokens = [], 0, 0
    for index, length in enumerate(lengths):
        if index > start and (index - start >= max_sentences or tokens + length > max_tokens):
            out.append(slice(start, index))
            start, tokens = index, 0
        tokens += length
    out.append(slice(start, len(lengths)))
    return out


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

    def __init__(self, tagger, *, name: str = "model", max_batch_sentences: int = 256, max_batch_tokens: int = 8_192,
                 max_wait: float = 0.005, max_queue: int = 128, on_batch: Callable[[BatchStats], None] | None = None,
                 on_queue: Callable[[int], None] | None = None):
        self.tagger, self.name = tagger, name
        self.max_batch_sentences, self.max_batch_tokens = max_batch_sentences, max_batch_tokens
        self.max_wait, self.max_queue = max_wait, max_queue
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
        (QueueFull, Stopped). Cancelling the future abandons the request."""
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
            if job.abandoned:  # timed out in the queue
                continue
            batch, sentences, tokens = [job], len(job.sentences), job.tokens
            deadline = time.monotonic() + self.max_wait
            while sentences < self.max_batch_sentences and tokens < self.max_batch_tokens:
                remaining = deadline - time.monotonic()
                try:
                    item = self._take(remaining > 0, max(remaining, 0.0))
                except queue.Empty:
                    break
                if item is not _STOP and item.abandoned:
                    continue
                if (item is _STOP or sentences + len(item.sentences) > self.max_batch_sentences
                        or tokens + item.tokens > self.max_batch_tokens):
                    carried = item  # the next batch starts with it (or the worker stops)
                    break
                batch.append(item)
                sentences, tokens = sentences + len(item.sentences), tokens + item.tokens
            try:
                self._process(batch)
            except Exception as error:  # noqa: BLE001  (a bug here must not leave requests hanging)
                log.exception("batch failed")
                for job in batch:
                    self._resolve(job, error=error)

    def _process(self, batch: list[Job]) -> None:
        groups: dict[tuple, list[Job]] = {}
        for job in batch:
            if job.mergeable:
                groups.setdefault(tuple(sorted(job.options.items())), []).append(job)
            else:
                groups[("alone", id(job))] = [job]
        for jobs in groups.values():
            jobs = [job for job in jobs if not job.abandoned]  # timed out while an earlier group was tagged
            if len(jobs) == 1:
                self._tag_alone(jobs[0])
            elif jobs:
                self._tag_merged(jobs)

    def _tag_merged(self, jobs: list[Job]) -> None:
        """Requests of one group in one call (together within the batch limits); a failed call is
        retried request by request, so that one request's failure is only its own."""
        try:
            results = self._call(jobs, [sentence for job in jobs for sentence in job.sentences])
        except Cancelled:  # every one of them abandoned
            return
        except Exception:  # noqa: BLE001  (whose request was it? each alone)
            for job in jobs:
                if not job.abandoned:
                    self._tag_alone(job)
            return
        at = 0
        for job in jobs:
            self._finish(job, results[at:at + len(job.sentences)])
            at += len(job.sentences)

    def _tag_alone(self, job: Job) -> None:
        """One request: in pieces within the batch limits, stopping when it is abandoned; a Monte
        Carlo request in one call (its draws those of `Tagger.tag` on its sentences)."""
        if job.mergeable:
            parts = pieces(job.lengths, self.max_batch_sentences, self.max_batch_tokens)
        else:
            parts = [slice(0, len(job.sentences))]
        results = []
        for part in parts:
            if job.abandoned:
                return
            try:
                results += self._call([job], job.sentences[part])
            except Cancelled:  # abandoned during the call
                return
            except Exception as error:  # noqa: BLE001  (reported to the request, never kills the worker)
                self._resolve(job, error=error)
                return
        self._finish(job, results)

    def _call(self, jobs: list[Job], sentences: list) -> list:
        """`Tagger.tag` on the sentences of `jobs` (one group: the same options), counted; `Cancelled`
        (not counted) once every one of `jobs` is abandoned."""
        began = time.perf_counter()
        results = self.tagger.tag(sentences, batch_size=self.max_batch_sentences,
                                  should_stop=lambda: all(job.abandoned for job in jobs), **jobs[0].options)
        seconds = time.perf_counter() - began
        if self.on_batch is not None:  # before the replies, so that a reply's metrics are already counted
            try:
                self.on_batch(BatchStats(len(jobs), len(sentences), sum(map(n_tokens, sentences)), seconds))
            except Exception:  # noqa: BLE001  (metrics never fail a request)
                log.exception("batch metrics failed")
        return results

    def _finish(self, job: Job, results: list) -> None:
        """A request's results to its future, through its `finish` (skipped when it is abandoned)."""
        if job.abandoned:
            return
        if job.finish is not None:
            try:
                results = job.finish(results)
            except Exception as error:  # noqa: BLE001  (the request's own failure)
                self._resolve(job, error=error)
                return
        self._resolve(job, results)

    @staticmethod
    def _resolve(job: Job, value: Any = None, error: BaseException | None = None) -> None:
        """Set a request's result or error, unless it is done or abandoned (cancelled meanwhile)."""
        try:
            if error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(value)
        except concurrent.futures.InvalidStateError:
            pass
