"""`gpseq serve`: tag over HTTP (FastAPI + uvicorn, the `serve` extra; `gpseq.serve`)."""

from __future__ import annotations

import gc
from typing import Annotated

import typer

from gpseq.cli.common import EXIT_CODES, Verbose, app, command, load_tagger, stderr
from gpseq.errors import GpseqError
from gpseq.serve import INSTALL_HINT, missing_extra
from gpseq.serve.settings import ServeSettings

DEFAULTS = ServeSettings()
# The garbage collector's generation thresholds while serving (Python's default: 700, 10, 10).
# Requests in flight keep thousands of young containers alive (rows, features, records), which
# every collection traverses, and promote them to older generations: in a 15 s trial of
# benchmarks/serve.py (8 sentences per request) the collector ran ~1,150 times for ~2.4 s at the
# default, about a quarter of the server's CPU (Tagger.tag over the corpus in one call: ~3 %);
# with the models frozen out of its sight and these thresholds, 11 times for 0.1 s.
GC_THRESHOLDS = (50_000, 20, 100)


def limit_blas_threads() -> None:
    """One BLAS thread in the server process (threadpoolctl, of the serve extra; nothing without it).

    The batch worker's matrix products are small ([B, V] × [V, V] per chain step) and OpenBLAS's
    helper threads spin between them on the core the event loop needs: in 15 s trials of
    benchmarks/serve.py (8 sentences per request, load average ~6) the server took 3.3 ms of CPU per
    request with them and 2.3 ms without, for 30–34k and 45–47k tokens/s."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(1, user_api="blas")  # process-wide for the pthreads OpenBLAS of NumPy's wheels


SERVE_EXAMPLES = """[b]Examples[/b]

  gpseq serve models/en_pos_conll2000
  gpseq serve pos=models/en_pos_conll2000 chunk=models/en_chunk_conll2000 --port 8080

  curl -s localhost:8000/tag -H 'Content-Type: application/json' \\
       -d '{"text": "The cat sat on the mat."}'

[b]Endpoints[/b]

  POST /tag      {"text": ...} or {"sentences": [[tokens] | [[token, col1, ...] rows]]},
                 options model, samples, mean, full_distribution, abstain_below,
                 nbest, span_probs, decode (those of gpseq tag); replies with
                 the objects of `gpseq tag --format jsonl`
  GET  /models   labels, features, scores and version of each model
  GET  /health   200 when every model's batch worker runs
  GET  /metrics  Prometheus text
  GET  /docs     OpenAPI documentation

Needs the serve extra: pip install 'gpseq[serve]'. Stop with Ctrl-C or SIGTERM:
requests in flight are answered first.

""" + EXIT_CODES


@app.command(epilog=SERVE_EXAMPLES)
@command
def serve(
    models: Annotated[list[str], typer.Argument(help="Model directories (gpseq train -o); NAME=DIR names one in "
                                                     "requests (default: the directory's name). The first is the "
                                                     "default model.", show_default=False)],
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    max_batch_sentences: Annotated[int, typer.Option(help="Sentences of concurrent requests tagged in one "
                                                          "prediction call, at most.")] = DEFAULTS.max_batch_sentences,
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
    timeout: Annotated[float, typer.Option(help="Seconds a request may wait for its tags (504).")]
    = DEFAULTS.request_timeout,
    access_log: Annotated[bool, typer.Option("--access-log", help="Log every request (uvicorn's access log).")]
    = False,
    verbose: Verbose = False,
) -> None:
    """Serve models over HTTP: POST /tag, GET /models, /health, /metrics, /docs."""
    missing = missing_extra()
    if missing:
        raise GpseqError(f"{INSTALL_HINT} ({', '.join(missing)} missing)")
    import uvicorn

    from gpseq.serve.app import create_app
    from gpseq.serve.models import load_models

    settings = ServeSettings(max_body_bytes=max_body_bytes, max_chars=max_chars, max_sentences=max_sentences,
                             max_tokens=max_tokens, max_samples=max_samples, max_nbest=max_nbest,
                             max_batch_sentences=max_batch_sentences, max_wait=max_wait_ms / 1000,
                             max_queue=max_queue, request_timeout=timeout).validate()
    served = load_models(models, load_tagger)
    application = create_app(served, settings)
    gc.collect()
    gc.freeze()  # the models and modules live as long as the process: out of the collector's sight
    gc.set_threshold(*GC_THRESHOLDS)
    limit_blas_threads()
    names = ", ".join(f"{name} ({model.path})" for name, model in served.items())
    stderr().print(f"serving {names} on http://{host}:{port} (API documentation: /docs)")
    uvicorn.run(application, host=host, port=port, log_level="debug" if verbose else "info",
                access_log=access_log, timeout_graceful_shutdown=timeout + 5, lifespan="on")
