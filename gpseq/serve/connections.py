"""The HTTP connections of `gpseq serve`: uvicorn's protocol, with a deadline and a size limit on
each request's headers.

uvicorn times a connection out only when it is idle after a response (`timeout_keep_alive`): a
client that connects and sends nothing, or sends a request's headers a byte at a time, holds its
connection (and the memory of the headers so far: httptools has no limit on their size) for as
long as it likes. Here a connection waiting for a request's headers — from its start, and again
from the end of each response — has `header_timeout` seconds and `MAX_HEADER_BYTES` bytes to
send them; past either it is answered 408 or 431 (when it sent part of a request; silently closed
when it sent nothing) and closed. The body has its own deadline in the application
(`app.RequestGuard`, `body_timeout`): the protocol only tells when a request's headers are in.
"""

from __future__ import annotations

import json

import uvicorn

try:  # uvicorn's own choice for http="auto": httptools when installed, else h11
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as UvicornProtocol
except ImportError:
    from uvicorn.protocols.http.h11_impl import H11Protocol as UvicornProtocol

# bytes a connection may send while a request's headers are incomplete (what one read completes them
# with is not counted: a read is at most 256 KiB, asyncio's)
MAX_HEADER_BYTES = 65_536


def refusal(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 response that closes the connection, with the service's error body."""
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode() + body


class HeaderDeadline:
    """For a uvicorn HTTP protocol (a base class after this one): a request's headers must arrive
    within `config.header_timeout` seconds and `config.max_header_bytes` bytes.

    Armed when the connection is made and when a response is complete with no request of the
    connection in progress; disarmed when the protocol starts a new request (its `cycle` changes,
    which both of uvicorn's protocols do exactly when a request's headers are parsed)."""

    _deadline = None  # the timer while the connection waits for headers, else None
    _waiting_after = None  # the protocol's `cycle` when the wait began
    _header_bytes = 0  # bytes received since the wait began

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._await_headers()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._deadline is None:
            return
        if self.cycle is not self._waiting_after:  # a request has begun (its body may be in `data` too)
            self._stop_waiting()
            return
        self._header_bytes += len(data)
        if self._header_bytes > self.config.max_header_bytes:
            self._refuse(431, "Request Header Fields Too Large",
                         f"request headers over {self.config.max_header_bytes:,} bytes (the limit)")

    def on_response_complete(self) -> None:
        super().on_response_complete()  # h11 may start a pipelined request here
        if self.cycle is None or self.cycle.response_complete:
            self._await_headers()

    def connection_lost(self, exc) -> None:
        self._stop_waiting()
        super().connection_lost(exc)

    def _await_headers(self) -> None:
        self._stop_waiting()
        if self.transport.is_closing():
            return
        self._waiting_after, self._header_bytes = self.cycle, 0
        self._deadline = self.loop.call_later(self.config.header_timeout, self._headers_late)

    def _stop_waiting(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_late(self) -> None:
        self._deadline = None
        if self._header_bytes:  # part of a request: say why
            self._refuse(408, "Request Timeout",
                         f"request headers not received within {self.config.header_timeout:g} s (the header timeout)")
        elif not self.transport.is_closing():
            self.transport.close()

    def _refuse(self, status: int, reason: str, message: str) -> None:
        self._stop_waiting()
        if not self.transport.is_closing():
            self.transport.write(refusal(status, reason, message))
            self.transport.close()


class Connection(HeaderDeadline, UvicornProtocol):
    """The protocol of `gpseq serve`'s connections (`ServeConfig`'s default)."""


class ServeConfig(uvicorn.Config):
    """uvicorn's configuration with `header_timeout` and `max_header_bytes` for `HeaderDeadline`,
    `Connection` as the HTTP protocol and no WebSocket (the service has no such endpoint).
    Picklable as uvicorn's (the supervisor sends it to each worker)."""

    def __init__(self, app, *, header_timeout: float, max_header_bytes: int = MAX_HEADER_BYTES,
                 http: type = Connection, **options):
        super().__init__(app, http=http, ws="none", **options)
        self.header_timeout, self.max_header_bytes = header_timeout, max_header_bytes
