"""The FastAPI application of `gpseq serve`: endpoints, error replies, request guard, lifecycle.

Every error is a JSON object {"error": "<one line>"} with a 4xx/5xx status: 400 malformed JSON or
invalid UTF-8, 404 unknown model or path, 408 a body not received in time, 413 a request over a
size limit, 415 not JSON, 422 a well-formed request the model cannot take (wrong types, empty
text, unknown fields, ...), 503 queue full or shutting down, 504 not tagged within the request
timeout, 500 a bug (logged, its text not sent). The line is the service's own: at most
`MAX_ERROR_CHARS` characters, quoting at most a few dozen characters of any string of the request
(`models.shown`), never an exception's text other than a `GpseqError`'s (written for users).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpseq import __version__
from gpseq.errors import ConfigError, GpseqError
from gpseq.serve.batching import MicroBatcher, QueueFull, Stopped
from gpseq.serve.metrics import Metrics
from gpseq.serve.models import RequestError, ServedModel, shown
from gpseq.serve.process import rss_mib
from gpseq.serve.schemas import ErrorResponse, HealthResponse, ModelsResponse, TagRequest, TagResponse
from gpseq.serve.settings import ServeSettings
from gpseq.serve.wire import dumps, parse_tag_request, tag_records, validation_message

log = logging.getLogger("gpseq.serve")

ENDPOINTS = ("/tag", "/models", "/health", "/metrics", "/docs", "/redoc", "/openapi.json")
ERRORS = {status: {"model": ErrorResponse, "description": what} for status, what in (
    (400, "Malformed JSON or invalid UTF-8"),
    (404, "Unknown model"),
    (408, "Body not received within the body timeout"),
    (413, "Request over a size limit (bytes, characters, sentences, tokens, Monte Carlo draws × tokens)"),
    (415, "Body not JSON"),
    (422, "Wrong types, missing or unknown fields, empty text, input the model cannot take"),
    (503, "Queue full, or shutting down: retry later"),
    (504, "Not tagged within the request timeout"),
)}
DESCRIPTION = """Calibrated sequence labelling with gpseq: labels with per-token probabilities,
chunk spans with probabilities. POST /tag takes raw text or pre-tokenised sentences; concurrent
requests are tagged together in batches (results as if tagged alone). Errors are
`{"error": "<one line>"}`."""
# POST /tag reads its body itself (`wire.parse_tag_request`: a fast check of plain requests, the
# pydantic model for the rest), so the body's schema is documented here rather than inferred
TAG_REQUEST_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/TagRequest"}}}}}
MAX_ERROR_CHARS = 500  # characters of an error message, whatever built it
CLOSE = {"Connection": "close"}  # a refusal before the body is read: the rest of it is not read either


def error_reply(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    line = " ".join(str(message)[:2 * MAX_ERROR_CHARS].split())
    if len(line) > MAX_ERROR_CHARS:
        line = line[:MAX_ERROR_CHARS - 1] + "…"
    return JSONResponse({"error": line}, status_code=status, headers=headers)


if sys.version_info >= (3, 11):
    async def receive_by(receive, deadline: float):
        """`receive()`, or asyncio.TimeoutError at `deadline` (the event loop's clock)."""
        async with asyncio.timeout_at(deadline):
            return await receive()
else:  # Python 3.10: no asyncio.timeout_at
    async def receive_by(receive, deadline: float):
        """`receive()`, or asyncio.TimeoutError at `deadline` (the event loop's clock)."""
        return await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))


def require_utf8(value: str, where: str) -> None:
    """RequestError 422 for a string JSON could carry but UTF-8 cannot (an unpaired surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise RequestError(422, f"{where}: unpaired surrogate {value[error.start]!r} at character {error.start}") \
            from None


class RequestGuard:
    """ASGI middleware: times and counts every request (metrics); reads a body up to the byte
    limit (413 beyond, before the application sees it) within `body_timeout` seconds (408, a
    client sending slowly holds no connection for longer), refuses bodies that are not UTF-8
    JSON. A refusal before the whole body is read closes the connection."""

    def __init__(self, app, metrics: Metrics, max_body_bytes: int, body_timeout: float = 30.0):
        self.app, self.metrics, self.max_body_bytes, self.body_timeout = app, metrics, max_body_bytes, body_timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        endpoint = scope["path"] if scope["path"] in ENDPOINTS else "other"
        status = [500]
        self.metrics.request_started(endpoint)

        async def send_counted(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            if scope["method"] in ("POST", "PUT", "PATCH"):
                body, problem = await self._read_body(scope, receive)
                if problem is not None:
                    if problem[0] == 499:  # the client went away: nobody to answer
                        status[0] = 499
                        return
                    await error_reply(*problem)(scope, receive, send_counted)
                    return
                receive = _replay(body, receive)
            await self.app(scope, receive, send_counted)
        finally:
            self.metrics.observe_request(endpoint, scope["method"], status[0], time.perf_counter() - started)

    async def _read_body(self, scope, receive):
        """(body, None), or (None, (status, message, headers)) of the refusal."""
        headers = dict(scope.get("headers") or [])
        content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if content_type and content_type != b"application/json" and not content_type.endswith(b"+json"):
            return None, (415, f"Content-Type must be application/json, got {shown(content_type.decode('latin-1'))}",
                          CLOSE)
        declared = headers.get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                return None, (400, "invalid Content-Length header", CLOSE)
            if size > self.max_body_bytes:
                return None, (413, f"body of {size:,} bytes; the limit is {self.max_body_bytes:,}", CLOSE)
        chunks, size = [], 0
        deadline = asyncio.get_running_loop().time() + self.body_timeout
        while True:
            try:
                message = await receive_by(receive, deadline)
            except asyncio.TimeoutError:
                return None, (408, f"body not received within {self.body_timeout:g} s (the body timeout)", CLOSE)
            if message["type"] == "http.disconnect":
                return None, (499, "client disconnected", None)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None, (413, f"body over {self.max_body_bytes:,} bytes (the limit)", CLOSE)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as error:
            return None, (400, f"body is not valid UTF-8: byte 0x{body[error.start]:02x} at position {error.start}",
                          None)
        return body, None


def _replay(body: bytes, receive):
    """An ASGI receive that gives the body already read, then what the client sends next."""
    given = False

    async def replay():
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def create_app(models: dict[str, ServedModel], settings: ServeSettings | None = None, *,
               warm_up: bool = True) -> FastAPI:
    """The application serving `models` (the first is the default); batch workers start with it
    (after compiling each model's prediction once, when `warm_up`) and stop when it shuts down,
    after finishing every queued request."""
    settings = (settings or ServeSettings()).validate()
    if not models:
        raise ConfigError("no model to serve")
    models = dict(models)
    default = next(iter(models))
    metrics = Metrics()
    batchers: dict[str, MicroBatcher] = {}
    descriptions = [served.describe(default=name == default) for name, served in models.items()]

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        try:
            for name, served in models.items():
                if warm_up:
                    await run_in_threadpool(served.warm_up)
                batchers[name] = MicroBatcher(
                    served.tagger, name=name, max_batch_sentences=settings.max_batch_sentences,
                    max_batch_tokens=settings.max_batch_tokens, max_wait=settings.max_wait,
                    max_queue=settings.max_queue, on_batch=metrics.batch_observer(name),
                    on_queue=metrics.queue_observer(name)).start()
            # uvicorn's logger: each worker process of `gpseq serve` says what it holds
            logging.getLogger("uvicorn.error").info("Process [%d] serving %s: resident memory %.0f MiB",
                                                    os.getpid(), ", ".join(models), rss_mib())
            yield
        finally:  # uvicorn gets here after the in-flight requests are answered
            for batcher in batchers.values():
                await run_in_threadpool(batcher.stop)
            batchers.clear()
            metrics.close()

    app = FastAPI(title="gpseq", version=__version__, description=DESCRIPTION, lifespan=lifespan)
    app.state.settings, app.state.models, app.state.batchers, app.state.metrics = settings, models, batchers, metrics
    app.add_middleware(RequestGuard, metrics=metrics, max_body_bytes=settings.max_body_bytes,
                       body_timeout=settings.body_timeout)

    @app.exception_handler(RequestError)
    async def _refused(request: Request, error: RequestError):
        return error_reply(error.status, error.message)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError):
        return error_reply(*validation_message(list(error.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, error: StarletteHTTPException):
        return error_reply(error.status_code, error.detail, getattr(error, "headers", None))

    @app.exception_handler(Exception)
    async def _bug(request: Request, error: Exception):
        log.exception("internal error on %s %s", request.method, request.url.path)
        return error_reply(500, "internal error (logged by the server)")  # its text is for the log only

    def openapi() -> dict:
        """FastAPI's OpenAPI document, with the schema of POST /tag's body (`TagRequest`)."""
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            request = TagRequest.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas = schema.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(request.pop("$defs", {}))
            schemas["TagRequest"] = request
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi

    @app.post("/tag", response_model=TagResponse, responses=ERRORS, openapi_extra=TAG_REQUEST_BODY,
              summary="Tag raw text or pre-tokenised sentences")
    async def tag(request: Request) -> Response:
        """Labels, per-token probabilities and chunk spans with probabilities: one object per
        sentence, those of `gpseq tag --format jsonl` (`distributions` with full_distribution).
        The body is a `TagRequest`."""
        body = parse_tag_request(await request.body())
        name = default if body.model is None else body.model
        served = models.get(name)
        if served is None:
            raise RequestError(404, f"unknown model {shown(name)}; serving {', '.join(models)}")
        if body.samples is not None and body.samples > settings.max_samples:
            raise RequestError(422, f"samples: {body.samples} draws; the limit is {settings.max_samples}")
        if body.nbest > settings.max_nbest:
            raise RequestError(422, f"nbest: {body.nbest} sequences; the limit is {settings.max_nbest}")
        if body.decode == "span-f1" and served.scheme is None:
            raise RequestError(422, f"decode span-f1 needs chunk labels; model {served.name!r} has none")
        if body.text is not None:
            if len(body.text) > settings.max_chars:
                raise RequestError(413, f"text of {len(body.text):,} characters; the limit is {settings.max_chars:,}")
            if not body.text.strip():
                raise RequestError(422, "text: empty (nothing but whitespace)")
            require_utf8(body.text, "text")
            sentences = await run_in_threadpool(served.sentences_from_text, body.text, settings.max_sentences)
            if not sentences:
                raise RequestError(422, "text: no tokens")
        else:
            if len(body.sentences) > settings.max_sentences:
                raise RequestError(413, f"{len(body.sentences):,} sentences; the limit is {settings.max_sentences:,}")
            sentences = served.sentences_from_lists(body.sentences)  # tokens: valid UTF-8 (wire)
        if len(sentences) > settings.max_sentences:
            raise RequestError(413, f"text of more than {settings.max_sentences:,} sentences (the limit)")
        n_tokens = sum(len(sentence.tokens) for sentence in sentences)
        if n_tokens > settings.max_tokens:
            raise RequestError(413, f"{n_tokens:,} tokens; the limit is {settings.max_tokens:,}")
        if not served.deterministic(body.mean, body.samples):  # Monte Carlo: memory ∝ draws × tokens
            draws = body.samples if body.samples is not None else served.tagger.config.predict_samples
            if draws * n_tokens > settings.max_sample_tokens:
                raise RequestError(413, f"{draws:,} Monte Carlo draws × {n_tokens:,} tokens = {draws * n_tokens:,}; "
                                        f"the limit is {settings.max_sample_tokens:,} (fewer samples or tokens)")

        batcher = batchers.get(served.name)
        if batcher is None:
            raise RequestError(503, "not started or shutting down")
        options = {"samples": body.samples, "mean": True if body.mean else None,  # as `gpseq tag` passes them
                   "decode": body.decode, "spans": body.span_probs, "nbest": body.nbest,
                   "abstain_below": body.abstain_below}

        def reply(results: list) -> bytes:  # in the batch worker, right after tagging
            records = tag_records(sentences, results, served.scheme, body.full_distribution)
            return dumps({"model": served.name, "n_sentences": len(records), "n_tokens": n_tokens,
                          "sentences": records})

        try:
            future = batcher.submit(sentences, options, mergeable=served.deterministic(body.mean, body.samples),
                                    finish=reply)
        except (QueueFull, Stopped) as error:
            return error_reply(503, str(error), {"Retry-After": "1"})
        try:
            content = await asyncio.wait_for(asyncio.wrap_future(future), settings.request_timeout)
        except asyncio.TimeoutError:
            future.cancel()  # abandoned: the batch worker skips it, and stops a call that serves only abandoned ones
            raise RequestError(504, f"not tagged within {settings.request_timeout:g} s (the request timeout)") \
                from None
        except GpseqError as error:
            raise RequestError(422, str(error)) from None
        return Response(content, media_type="application/json")

    @app.get("/models", response_model=ModelsResponse, summary="The served models")
    async def list_models() -> Response:
        """Each model's labels, features, predictive, scores and the gpseq version that wrote it."""
        return JSONResponse({"gpseq_version": __version__, "models": descriptions})

    @app.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}},
             summary="Liveness")
    async def health() -> Response:
        """200 when every model's batch worker runs (with its queue length), 503 otherwise; the
        process that answered (one of the workers of `gpseq serve --workers N`) and its memory."""
        state = {name: {"ready": name in batchers and batchers[name].alive,
                        "queued": batchers[name].pending if name in batchers else 0} for name in models}
        ok = all(model["ready"] for model in state.values())
        return JSONResponse({"status": "ok" if ok else "unavailable", "models": state,
                             "process": {"pid": os.getpid(), "resident_mib": round(rss_mib(), 1)}},
                            status_code=200 if ok else 503)

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response,
             responses={200: {"content": {"text/plain": {}}}})
    async def prometheus() -> Response:
        """Requests, latency histogram, errors, sentences and tokens tagged, batches, queue: with
        several worker processes, summed over all of them, whichever answers."""
        body = metrics.render()
        return Response(body, media_type=metrics.content_type)

    return app
