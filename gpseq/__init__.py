"""gpseq: sequence labelling with sparse structured Gaussian processes."""

__version__ = "0.1.0"

import importlib

# registers the check for processes forked after TensorFlow started, before any fork (no TensorFlow import)
importlib.import_module("gpseq._tensorflow")

__all__ = ["__version__", "Tagger", "ModelChain"]


def __getattr__(name):
    # Lazy so that `import gpseq` (e.g. for the corpus readers) does not pay for TensorFlow.
    if name == "Tagger":
        from gpseq.tagger import Tagger

        return Tagger
    if name == "ModelChain":
        from gpseq.chain_models import ModelChain

        return ModelChain
    raise AttributeError(f"module 'gpseq' has no attribute {name!r}")
