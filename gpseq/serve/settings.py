"""What a `gpseq serve` process is allowed to take on: request limits, batching, timeouts."""

from __future__ import annotations

from dataclasses import dataclass, fields

from gpseq.errors import ConfigError


@dataclass
class ServeSettings:
    """Limits and batching of the HTTP service (`gpseq serve --help` documents each option).

    A request larger than a limit is refused (413) before it is tagged; requests wait in a
    bounded queue per model (503 when full) and are tagged in batches of at most
    `max_batch_sentences` sentences and `max_batch_tokens` tokens (a larger request in pieces of
    that size), a batch waiting at most `max_wait` seconds for company. A connection that does not
    send a request's headers within `header_timeout` seconds, or its body within `body_timeout`
    seconds of its headers, is answered 408 (an idle one is not answered) and closed."""

    max_body_bytes: int = 1_048_576  # request body
    max_chars: int = 100_000  # characters of raw text per request
    max_sentences: int = 1_000  # sentences per request (given, or from raw text)
    max_tokens: int = 25_000  # tokens per request
    max_samples: int = 100  # Monte Carlo draws a request may ask for
    # Monte Carlo draws × tokens of a request: its memory grows with both (and with labels²), so one
    # request must not ask for the largest of each at once
    max_sample_tokens: int = 50_000
    max_nbest: int = 20  # label sequences a request may ask for (nbest)
    max_batch_sentences: int = 256  # sentences of one prediction call
    # tokens of one prediction call (a longer sentence is a call of its own); a call stops at its
    # next check once every request it serves has timed out, and the calls after it are skipped
    max_batch_tokens: int = 8_192
    max_wait: float = 0.005  # seconds a batch waits for more requests once the queue is empty
    max_queue: int = 128  # requests waiting for a prediction batch, per model
    request_timeout: float = 30.0  # seconds a request may wait for its tags (then 504)
    header_timeout: float = 10.0  # seconds a connection has to send a request's headers (then 408, closed)
    body_timeout: float = 30.0  # seconds a request's body may take to arrive after its headers (then 408, closed)

    def validate(self) -> "ServeSettings":
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{item.name} must be a number, got {value!r}")
            if item.name == "max_wait":
                if value < 0:
                    raise ConfigError(f"max_wait must be >= 0 seconds, got {value}")
            elif value <= 0:
                raise ConfigError(f"{item.name} must be > 0, got {value}")
        from gpseq.config import MAX_NBEST, MAX_SAMPLES

        for name, most in (("max_samples", MAX_SAMPLES), ("max_nbest", MAX_NBEST)):
            if getattr(self, name) > most:  # what one request may then ask for: gpseq tag's own caps
                raise ConfigError(f"{name} must be at most {most:,}, got {getattr(self, name):,}")
        return self
