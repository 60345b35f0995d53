"""`gpseq serve`: tag over HTTP (FastAPI + uvicorn, the `serve` extra; `gpseq.serve`)."""

from __future__ import annotations

from typing import Annotated

import typer

from gpseq.cli.common import EXIT_CODES, AllowPlugin, Verbose, app, command, state, stderr
from gpseq.errors import GpseqError
from gpseq.serve import INSTALL_HINT, missing_extra
from gpseq.serve.settings import ServeSettings

DEFAULTS = ServeSettings()


SERVE_EXAMPLES = """[b]Examples[/b]

  gpseq serve models/en_pos_conll2000
  gpseq serve pos=models/en_pos_conll2000 chunk=models/en_chunk_conll2000 --port 8080
  gpseq serve models/en_pos_conll2000 --workers 1
  gpseq serve chunk=models/en_pos_conll2000+models/en_chunk_conll2000

  curl -s localhost:8000/tag -H 'Content-Type: application/json' \\
       -d '{"text": "The cat sat on the mat."}'

[b]Endpoints[/b]

  POST /tag      {"text": ...} or {"sentences": [[tokens] | [[token, col1, ...] rows]]},
                 options model, samples, mean, full_distribution, abstain_below,
                 nbest, span_probs, decode (those of gpseq tag); replies with
                 the objects of `gpseq tag --format jsonl`
  GET  /models   name, labels, features, scores and version of each model
  GET  /health   200 when every model's batch worker runs
  GET  /metrics  Prometheus text
  GET  /docs     OpenAPI documentation

Chains: DIR+DIR+... serves models that feed one another (named after the last
directory unless NAME= names it): each model's labels become the next column
of the tokens the later models read, so the chain above takes raw text; the
reply is the last model's, with "chain": \\[{model, labels}] of the others.

Workers: one process tags on about one core, so by default the command starts
one worker process per usable CPU (at most 8), each with its own copy of the
models (each logs its resident memory when ready); /metrics sums them all.
Workers end with the command, even when it is killed. An address that a
server listens on already is refused (exit 1).

Timeouts: a request not tagged within --timeout gets 504 and is dropped from
the work still to do (the prediction call it is in stops at its next check
unless it also serves requests still waiting). A connection that does not send a
request's headers within --header-timeout, or its body within --body-timeout,
gets 408 and is closed.

Needs the serve extra: pip install 'gpseq\\[serve]'. Stop with Ctrl-C or SIGTERM:
requests in flight are answered first.

""" + EXIT_CODES


@app.command(epilog=SERVE_EXAMPLES)
@command(signals=False)  # uvicorn's own handlers: a graceful shutdown
def serve(
    models: Annotated[list[str], typer.Argument(help="Model directories (gpseq train -o); NAME=DIR names one in "
                                                     "requests (default: the directory's name); DIR+DIR+... "
                                                     "chains models, each one's labels a column for the next "
                                                     "(named after the last). The first is the default model.",
                                                show_default=False)],
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    max_batch_sentences: Annotated[int, typer.Option(help="Sentences of concurrent requests tagged in one "
                                                          "prediction call, at most.")] = DEFAULTS.max_batch_sentences,
    max_batch_tokens: Annotated[int, typer.Option(help="Tokens of one prediction call, at most (a larger request "
                                                       "is tagged in pieces; a longer sentence alone).")]
    = DEFAULTS.max_batch_tokens,
    max_wait_ms: Annotated[float, typer.Option(help="Milliseconds a batch waits for more requests once none is "
                                                    "queued.")] = DEFAULTS.max_wait * 1000,
    max_queue: Annotated[int, typer.Option(help="Requests waiting per model; more get 503.")] = DEFAULTS.max_queue,
    max_body_bytes: Annotated[int, typer.Option(help="Request body limit (413).")] = DEFAULTS.max_body_bytes,
    max_chars: Annotated[int, typer.Option(help="Characters of raw text per request (413).")] = DEFAULTS.max_chars,
    max_sentences: Annotated[int, typer.Option(help="Sentences per request (413).")] = DEFAULTS.max_sentences,
    max_tokens: Annotated[int, typer.Option(help="Tokens per request (413).")] = DEFAULTS.max_tokens,
    max_samples: Annotated[int, typer.Option(help="Monte Carlo draws a request may ask for (422).")]
    = DEFAULTS.max_samples,
    max_nbest: Annotated[int, typer.Option(help="Label sequences (nbest) a request may ask for (422).")]
    = DEFAULTS.max_nbest,
    max_sample_tokens: Annotated[int, typer.Option(help="Monte Carlo draws × tokens of a request (413): its memory "
                                                        "grows with both, and with the labels squared.")]
    = DEFAULTS.max_sample_tokens,
    timeout: Annotated[float, typer.Option(help="Seconds a request may wait for its tags (504).")]
    = DEFAULTS.request_timeout,
    header_timeout: Annotated[float, typer.Option(help="Seconds a connection has to send a request's headers "
                                                       "(408, closed).")] = DEFAULTS.header_timeout,
    body_timeout: Annotated[float, typer.Option(help="Seconds a request's body may take after its headers "
                                                     "(408, closed).")] = DEFAULTS.body_timeout,
    workers: Annotated[int | None, typer.Option(help="Worker processes, each with its own copy of the models "
                                                     "[default: one per usable CPU, at most 8].",
                                                show_default=False)] = None,
    access_log: Annotated[bool, typer.Option("--access-log", help="Log every request (uvicorn's access log).")]
    = False,
    allow_plugin: AllowPlugin = None,
    verbose: Verbose = False,
) -> None:
    """Serve models over HTTP: POST /tag, GET /models, /health, /metrics, /docs."""
    missing = missing_extra()
    if missing:
        raise GpseqError(f"{INSTALL_HINT} ({', '.join(missing)} missing)")
    from gpseq import _tensorflow
    from gpseq.serve.process import MAX_DEFAULT_WORKERS, default_workers, serve as run_service, usable_cpus

    _tensorflow.QUIET = not state["verbose"]  # as `tagger_module` sets it, without importing the tagger here
    settings = ServeSettings(max_body_bytes=max_body_bytes, max_chars=max_chars, max_sentences=max_sentences,
                             max_tokens=max_tokens, max_samples=max_samples, max_nbest=max_nbest,
                             max_sample_tokens=max_sample_tokens,
                             max_batch_sentences=max_batch_sentences, max_batch_tokens=max_batch_tokens,
                             max_wait=max_wait_ms / 1000, max_queue=max_queue, request_timeout=timeout,
                             header_timeout=header_timeout, body_timeout=body_timeout).validate()

    def started(n_workers: int) -> None:
        why = "" if workers is not None else f" (default: {usable_cpus()} usable CPUs, at most {MAX_DEFAULT_WORKERS})"
        stderr().print(f"serving {', '.join(models)} on http://{host}:{port} with {n_workers} worker "
                       f"process{'es' if n_workers > 1 else ''}{why} (API documentation: /docs)")

    run_service(models, settings, host=host, port=port, workers=default_workers() if workers is None else workers,
                log_level="debug" if state["verbose"] else "info", access_log=access_log, on_start=started,
                allow_plugins=allow_plugin or [])
