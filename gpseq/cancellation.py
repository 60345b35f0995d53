"""Cooperative cancellation of a prediction in progress.

`Tagger.tag(should_stop=f)` runs its work under `stopping_when(f)`; the long loops of the
prediction path (the batches and windows of `Predictor.predict`, the chain steps of the NumPy
forward–backward and k-best Viterbi, the span passes of `ChainPosterior`) call `check_cancelled`
before each batch and every CHECK_STEPS chain steps, and it raises `Cancelled` once `f()` is true.

`f` is held in a context variable rather than passed down every numeric function: the chain code
stays free of bookkeeping, and without a `should_stop` a check costs one lookup. A thread sees
only what it set itself (the service's batch worker stops its own call and no other thread's).
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Callable, Iterator

__all__ = ["CHECK_STEPS", "Cancelled", "check_cancelled", "stopping_when"]

# chain steps between two checks: few enough that the slowest loop (k-best Viterbi) stops soon
# after a stop, rare enough to cost nothing measurable in the fastest (forward–backward)
CHECK_STEPS = 256

_should_stop: ContextVar[Callable[[], bool] | None] = ContextVar("gpseq_should_stop", default=None)


class Cancelled(Exception):
    """The prediction was stopped: its `should_stop` said so at a check. Nothing of it is returned."""


@contextlib.contextmanager
def stopping_when(should_stop: Callable[[], bool] | None) -> Iterator[None]:
    """Within the block, `check_cancelled` raises `Cancelled` once `should_stop()` is true (None: as
    outside the block, so that a call nested in a stoppable one stays stoppable; outside any: never)."""
    if should_stop is None:
        yield
        return
    token = _should_stop.set(should_stop)
    try:
        yield
    finally:
        _should_stop.reset(token)


def check_cancelled() -> None:
    """Raise `Cancelled` if the prediction running in this context is to stop."""
    should_stop = _should_stop.get()
    if should_stop is not None and should_stop():
        raise Cancelled("the prediction was stopped by its caller")
