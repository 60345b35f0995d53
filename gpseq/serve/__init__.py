"""`gpseq serve`: tagging over HTTP (FastAPI + uvicorn, the optional extra `gpseq[serve]`).

    POST /tag      raw text or pre-tokenised sentences → the records of `gpseq tag --format jsonl`
    GET  /models   what each served model is: name, labels, features, scores, version (no paths)
    GET  /health   liveness
    GET  /metrics  Prometheus text: requests, latency histogram, tokens tagged, errors, batches
    GET  /docs     OpenAPI documentation (/openapi.json)

Layout: `settings` (limits, batching, timeouts: one dataclass the CLI builds), `models` (a model
directory loaded once, read-only, with what a request needs from it), `batching` (concurrent
requests merged into one `Tagger.tag` call in one worker thread per model), `metrics`
(Prometheus), `schemas` (the request and response bodies, documented), `wire` (POST /tag's
body to a request and its results to JSON bytes, with little Python per token: a fast check of
plain requests, records built per request, orjson), `app` (the FastAPI application),
`connections` (uvicorn's HTTP protocol with a deadline and a size limit on request headers),
`process` (running it: in one process, or in one worker process per usable CPU under uvicorn's
supervisor, with the metrics summed over the workers; one command per address, no worker
outliving its supervisor).
`settings`, `models` and `batching` need nothing beyond gpseq; the others need the extra
(its httptools, uvloop and orjson are for speed: without them uvicorn and `wire` use pure Python).
"""

from __future__ import annotations

INSTALL_HINT = "gpseq serve needs the serve extra: pip install 'gpseq[serve]' (FastAPI, uvicorn, prometheus-client)"


def missing_extra() -> list[str]:
    """The distributions of the serve extra that cannot be imported ([] when all are there)."""
    missing = []
    for module, distribution in (("fastapi", "fastapi"), ("uvicorn", "uvicorn"),
                                 ("prometheus_client", "prometheus-client")):
        try:
            __import__(module)
        except ImportError:
            missing.append(distribution)
    return missing
