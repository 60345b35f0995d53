"""TensorFlow, imported only when needed (the default training runs without it), quietly when asked.

`gpseq.tagger` does not import TensorFlow: the weight-space model trained by default is plain
arrays until it predicts. The library's entry points into TensorFlow work (building a model,
the TensorFlow corpus objective, SVI) call `load()` first; the CLI sets `QUIET` (unless
--verbose) so that TensorFlow's C++ start-up chatter stays off stderr whenever that happens.
"""

from __future__ import annotations

import logging
import os
import sys

QUIET = False  # the CLI sets it unless --verbose
# whether this process was forked from one that had TensorFlow loaded: TensorFlow does not survive a
# fork, and its first operation in the child hangs (e.g. `nlp.pipe(n_process=2)` after the pipeline
# predicted in the parent, or a fork-started multiprocessing pool)
_FORKED_AFTER_TENSORFLOW = False


def _after_fork_in_child() -> None:
    global _FORKED_AFTER_TENSORFLOW
    _FORKED_AFTER_TENSORFLOW = "tensorflow" in sys.modules


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def check_not_forked() -> None:
    """GpseqError, before any TensorFlow operation, in a process forked after TensorFlow started in
    its parent (where the operation would hang forever)."""
    if _FORKED_AFTER_TENSORFLOW:
        from gpseq.errors import GpseqError

        raise GpseqError(
            "this process was forked from one where TensorFlow had already started, and TensorFlow cannot "
            "run after a fork (it would hang): start the worker processes before the model first predicts "
            "(nlp.pipe with n_process before the pipeline runs in this process), use the 'spawn' start "
            "method or a single process, or predict with a linear model's deterministic predictive, which "
            "needs no TensorFlow")


def load():
    """`import tensorflow`; with `QUIET`, with file descriptor 2 pointed at /dev/null meanwhile.

    TF_CPP_MIN_LOG_LEVEL=3 silences TensorFlow's logging after start-up, but a few lines (CUDA
    probing, CPU feature notes) are written to fd 2 while the shared libraries load, before that
    setting is read. Import errors still raise as Python exceptions."""
    if "tensorflow" in sys.modules or not QUIET:
        import tensorflow

        return tensorflow
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)  # e.g. retracing notices
    return tensorflow
