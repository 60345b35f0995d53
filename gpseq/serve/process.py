"""Running the service: one process, or `workers` processes that share the listening socket.

A `gpseq serve` process tags on about one core: its event loop and its batch worker share one
interpreter lock (benchmarks/RESULTS.md, "Serving"). So the command starts one worker per usable
CPU by default (at most `MAX_DEFAULT_WORKERS`). With more than one, uvicorn's supervisor
(`uvicorn.supervisors.Multiprocess`) holds the address and spawns the workers (restarting one that
dies); each loads its own read-only copy of the models (and logs its resident memory when ready),
runs its own micro-batcher and listens on its own SO_REUSEPORT socket of the address
(`ReusePortSocket`), the kernel spreading the connections over the workers. SIGTERM or Ctrl-C to
the supervisor reaches every worker, which answers its requests in flight before it exits.

A supervisor that dies without that (SIGKILL, a crash) takes its workers with it: each worker asks
for SIGTERM when its parent dies (Linux's PR_SET_PDEATHSIG) and, on every system, a thread watches
its parent pid (`exit_with_supervisor`), so no orphaned worker goes on serving the port.

One address, one service: SO_REUSEPORT would let a second `gpseq serve` on a served port start
without error and take half of its connections. So before binding anything the command claims the
address (`claim_address`): a probe socket with SO_REUSEADDR and without SO_REUSEPORT must bind it
(the kernel refuses that while any socket listens on the port, but not for TIME_WAIT connections),
and on Linux the command holds an abstract Unix socket named after the address for its whole run,
which refuses a second command started before the first one's workers listen. The probe is closed
before the supervisor binds its own (non-listening) socket.

Metrics across workers: prometheus-client's multiprocess mode, in a fresh directory per run
(`PROMETHEUS_MULTIPROC_DIR`, removed at exit); GET /metrics, whichever worker answers it, reports
the sums over all workers of the run (a replaced worker still counts), the queue gauge summed over
the live workers. One process serves /metrics from its own registry.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import json
import logging
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

from gpseq.errors import ConfigError, GpseqError
from gpseq.serve.settings import ServeSettings

log = logging.getLogger("gpseq.serve")

MAX_DEFAULT_WORKERS = 8  # each worker holds its own copy of the models
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # "QUOTA PERIOD" or "max PERIOD" (cgroup v2)
WORKER_ENV = "GPSEQ_SERVE_WORKER"  # what a spawned worker serves (JSON), set by the supervisor
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client's own switch to its multiprocess mode
WORKER_APP = "gpseq.serve.process:worker_app"
STARTUP_FAILURE = 3  # a worker's exit status when it cannot start (uvicorn.config.STARTUP_FAILURE)
# The garbage collector's generation thresholds while serving (Python's default: 700, 10, 10).
# Requests in flight keep thousands of young containers alive (rows, features, records), which
# every collection traverses, and promote them to older generations: at the default the collector
# takes a large share of the server's CPU; with the models frozen out of its sight and these
# thresholds it runs rarely (benchmarks/RESULTS.md, "Serving").
GC_THRESHOLDS = (50_000, 20, 100)
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent (thread) dies
PARENT_POLL_SECONDS = 0.5  # how often a worker checks that its supervisor is alive


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, within a cgroup v2 CPU quota if any."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        count = os.cpu_count() or 1
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()
        if quota != "max":
            count = min(count, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, count)


def default_workers() -> int:
    """One worker per usable CPU, at most `MAX_DEFAULT_WORKERS`."""
    return min(usable_cpus(), MAX_DEFAULT_WORKERS)


def rss_mib() -> float:
    """This process's resident memory, MiB (0 where /proc is absent)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        return 0.0


def limit_blas_threads() -> None:
    """One BLAS thread in a server process (threadpoolctl, of the serve extra; nothing without it).

    The batch worker's matrix products are small ([B, V] × [V, V] per chain step) and OpenBLAS's
    helper threads spin between them on the core the event loop needs (benchmarks/RESULTS.md,
    "Serving")."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(1, user_api="blas")  # process-wide for the pthreads OpenBLAS of NumPy's wheels


def tune_process() -> None:
    """What a serving process does once its models are loaded: the models and modules out of the
    garbage collector's sight (they live as long as the process), higher thresholds, one BLAS thread."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    limit_blas_threads()


def check_model_specs(specs: list[str]) -> None:
    """The errors `load_models` would raise on the command line, without loading: the command
    reports them before it claims the address, and the supervisor rather than each worker's
    start-up failure."""
    from gpseq.saved.meta import read_model_meta
    from gpseq.serve.models import checked_model_spec

    names = set()
    for spec in specs:
        name, paths = checked_model_spec(spec, names)
        names.add(name)
        for path in paths:
            read_model_meta(path)  # ModelFormatError: not a model directory, or of a newer format


def absolute_spec(spec: str) -> list:
    """A model spec as [name, [directories]] with the directories absolute (a worker must not depend
    on its working directory; a list, not a string, so that a `+` in a directory's path is not
    read as a chain)."""
    from gpseq.serve.models import parse_served_spec

    name, paths = parse_served_spec(spec)
    return [name, [str(path.resolve()) for path in paths]]


class ReusePortSocket(socket.socket):
    """The supervisor's listening address, bound with SO_REUSEPORT but never listening (it holds the
    port; a bind error shows here). Sent to a worker (pickled, as uvicorn's supervisor sends its
    sockets), it arrives as that worker's own socket bound to the same address, so that the kernel
    spreads new connections over the workers' accept queues by their addresses and ports. One
    shared socket gives a burst of connections to whichever worker wakes first: 12 bursts of 32
    connections to two idle workers split 0/32 three times, 4/28 twice, at best 15/17; with
    SO_REUSEPORT 11/21 at worst (keep-alive clients stay with their worker: an idle worker is
    a lost core)."""

    def __reduce__(self):
        return reuse_port_socket, (self.family, self.getsockname())


def reuse_port_socket(family: int, address: tuple) -> socket.socket:
    """A TCP socket bound to `address` with SO_REUSEPORT (to listen beside the other workers')."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    return sock


def address_family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def claim_address(host: str, port: int) -> socket.socket | None:
    """Refuse (GpseqError) an address that a server listens on or another `gpseq serve` holds;
    else the claim (on Linux, a socket to keep open for the whole run; None elsewhere)."""
    where = f"cannot listen on {host}:{port}"
    claim = None
    if sys.platform.startswith("linux"):  # abstract Unix socket names: freed by the kernel when the process dies
        claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            claim.bind(f"\0gpseq-serve {host}:{port}")
        except OSError:
            claim.close()
            raise GpseqError(f"{where}: another gpseq serve holds this address") from None
    probe = socket.socket(address_family(host), socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # not SO_REUSEPORT: any listener refuses it
        probe.bind((host, port))
    except OSError as error:
        if claim is not None:
            claim.close()
        if error.errno == errno.EADDRINUSE:
            raise GpseqError(f"{where}: the address is in use (a server listens there)") from None
        raise GpseqError(f"{where}: {error.strerror or error}") from None
    finally:
        probe.close()
    return claim


def listening_address(config) -> socket.socket:
    """What the supervisor hands the workers: a `ReusePortSocket` where the system has SO_REUSEPORT,
    else uvicorn's one shared socket."""
    if not hasattr(socket, "SO_REUSEPORT") or config.uds is not None or config.fd is not None:
        return config.bind_socket()
    sock = ReusePortSocket(address_family(config.host), socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as error:
        sock.close()
        raise GpseqError(f"cannot listen on {config.host}:{config.port}: {error.strerror or error}") from None
    return sock


def serve(models: list[str], settings: ServeSettings, *, host: str = "127.0.0.1", port: int = 8000,
          workers: int | None = None, log_level: str = "info", access_log: bool = False,
          on_start=None, allow_plugins: list[str] = ()) -> None:
    """Serve `models` (specs `DIR`, `NAME=DIR`, or a chain `[NAME=]DIR+DIR...`) until SIGTERM or
    Ctrl-C: in this process when `workers` is 1, else in `workers` spawned processes (None:
    `default_workers()`).
    `allow_plugins`: the plug-in likelihoods the models may use (`Tagger.load`'s `likelihoods`).
    `on_start(workers)` is called once the models are checked, before any worker starts.
    Refused before anything is loaded: GpseqError for an address that is served already
    (`claim_address`), the errors of `check_model_specs`."""
    settings = settings.validate()
    workers = default_workers() if workers is None else workers
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    check_model_specs(models)
    claim = claim_address(host, port)
    try:
        serve_claimed(models, settings, host, port, workers, log_level, access_log, on_start, allow_plugins)
    finally:
        if claim is not None:
            claim.close()


def serve_claimed(models, settings, host, port, workers, log_level, access_log, on_start, allow_plugins) -> None:
    """`serve`, once the address is claimed."""
    import uvicorn

    from gpseq.serve.connections import ServeConfig

    common = dict(host=host, port=port, log_level=log_level, access_log=access_log, lifespan="on",
                  timeout_graceful_shutdown=int(math.ceil(settings.request_timeout + 5)),
                  header_timeout=settings.header_timeout)
    if workers == 1:
        from gpseq.serve.app import create_app
        from gpseq.serve.models import load_models

        application = create_app(load_models(models, plugin_loader(allow_plugins)), settings)
        tune_process()
        if on_start is not None:
            on_start(workers)
        server = uvicorn.Server(ServeConfig(application, **common))
        try:
            server.run()
        except KeyboardInterrupt:  # Ctrl-C, raised again by uvicorn once it has shut down gracefully
            pass
        if not server.started:
            raise GpseqError("the server did not start (its error is logged above)")
        return

    from uvicorn.supervisors import Multiprocess

    metrics_dir = tempfile.mkdtemp(prefix="gpseq-serve-metrics-")
    saved = {name: os.environ.get(name) for name in (WORKER_ENV, METRICS_ENV)}
    from gpseq import _tensorflow

    os.environ[WORKER_ENV] = json.dumps({"models": [absolute_spec(spec) for spec in models],
                                         "settings": asdict(settings), "quiet_tensorflow": _tensorflow.QUIET,
                                         "allow_plugins": list(allow_plugins), "supervisor": os.getpid()})
    os.environ[METRICS_ENV] = metrics_dir  # inherited by the spawned workers
    try:
        config = ServeConfig(WORKER_APP, factory=True, workers=workers, **common)
        supervisor = Multiprocess(config, sockets=[listening_address(config)])
        if on_start is not None:
            on_start(workers)
        supervisor.run()
        if any(process.exitcode == STARTUP_FAILURE for process in supervisor.processes):
            raise GpseqError("a worker failed to start (its error is logged above)")
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(metrics_dir, ignore_errors=True)


def plugin_loader(allow_plugins):
    """`Tagger.load` with the plug-in likelihoods the user allowed by name."""
    from gpseq.structured.likelihoods import allowed_likelihoods
    from gpseq.tagger import Tagger

    likelihoods = allowed_likelihoods(allow_plugins)
    return lambda path: Tagger.load(path, likelihoods=likelihoods)


def exit_with_supervisor(supervisor: int, grace: float) -> None:
    """Have this worker shut down when its supervisor (pid `supervisor`, its parent) dies: SIGTERM
    from the kernel on Linux, and on every system from a thread that checks the parent pid every
    `PARENT_POLL_SECONDS` (the parent of an orphan is another process); SIGTERM is uvicorn's
    graceful shutdown, and a worker still there `grace` seconds later exits outright."""
    if sys.platform.startswith("linux"):
        try:
            # the signal comes when the parent *thread* that forked this process ends: the supervisor
            # spawns its workers from its main thread, which ends only with it
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl in this C library: the thread below does it
            pass
    if os.getppid() != supervisor:  # it died before the request above took effect
        logging.getLogger("uvicorn.error").error("Process [%d]: the supervisor [%d] is gone", os.getpid(), supervisor)
        sys.exit(1)

    def watch() -> None:
        while os.getppid() == supervisor:
            time.sleep(PARENT_POLL_SECONDS)
        logging.getLogger("uvicorn.error").info("Process [%d]: the supervisor [%d] is gone, shutting down",
                                                os.getpid(), supervisor)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace)
        os._exit(1)

    threading.Thread(target=watch, name="gpseq-supervisor-watch", daemon=True).start()


def worker_app():
    """The application of one spawned worker (uvicorn's factory): the models and settings the
    supervisor put in `GPSEQ_SERVE_WORKER`, metrics in the run's multiprocess directory. A worker
    that cannot load them exits with `STARTUP_FAILURE`, on which the supervisor stops (any other
    exit, it would start the worker again)."""
    logger = logging.getLogger("uvicorn.error")
    try:
        try:
            spec = json.loads(os.environ[WORKER_ENV])
        except (KeyError, ValueError) as error:
            raise ConfigError(f"{WORKER_ENV} is not set (a worker of `gpseq serve --workers N`)") from error
        exit_with_supervisor(spec["supervisor"], grace=spec["settings"]["request_timeout"] + 30)  # before the slow part
        if not os.environ.get(METRICS_ENV):
            raise ConfigError(f"{METRICS_ENV} is not set: the workers would count their metrics apart")
        from gpseq import _tensorflow
        from gpseq.serve.app import create_app
        from gpseq.serve.models import load_models

        _tensorflow.QUIET = spec["quiet_tensorflow"]  # as the command's (--verbose)
        application = create_app(load_models(spec["models"], plugin_loader(spec.get("allow_plugins", ()))),
                                 ServeSettings(**spec["settings"]))
    except GpseqError as error:
        logger.error("Process [%d] cannot serve: %s", os.getpid(), error)
        sys.exit(STARTUP_FAILURE)
    except Exception:  # a bug: its traceback
        logger.exception("Process [%d] cannot serve", os.getpid())
        sys.exit(STARTUP_FAILURE)
    tune_process()
    return application
