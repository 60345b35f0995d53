"""TensorFlow Probability, importable without the `tf-keras` package.

TFP 0.25 imports `tf_keras` when it loads (its bijectors and layers subclass Keras 2 classes at
import time) although nothing gpseq uses from TFP (bijectors, distributions, TransformedVariable,
stateless seeds, associative scan) needs Keras. `tf-keras` is not a gpseq dependency (it drags
a second TensorFlow wheel next to `tensorflow-cpu`), so when it is absent a placeholder module
stands in for it *only while TFP loads*: its Keras names point at Keras 3 and its Keras-2
internals are inert. The placeholder is then removed from `sys.modules`, so a later
`import tf_keras` by other code fails (or finds the real package) exactly as without gpseq.
Every gpseq module imports TFP as `from gpseq._tfp import tfp`.
"""

from __future__ import annotations

import importlib.util
import sys
import types

_USED = ("bijectors", "distributions", "math", "random", "util")


class _Inert(types.ModuleType):
    """A module whose every attribute is another inert module and whose calls return None."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        child = _Inert(f"{self.__name__}.{name}")
        child.__path__ = []
        setattr(self, name, child)
        return child

    def __call__(self, *args, **kwargs):
        return None


def _placeholder() -> dict[str, types.ModuleType]:
    import keras

    root = types.ModuleType("tf_keras")
    root.__path__ = []
    names = [name for name in dir(keras) if not name.startswith("_")]
    for name in names:
        setattr(root, name, getattr(keras, name))
    root.__all__ = names
    modules = {"tf_keras": root}
    for name in ("__internal__", "api"):
        module = _Inert(f"tf_keras.{name}")
        module.__path__ = []
        setattr(root, name, module)
        modules[module.__name__] = module
    parent = modules["tf_keras.api"]
    for part in ("_v1", "keras", "__internal__", "legacy", "layers"):
        child = _Inert(f"{parent.__name__}.{part}")
        child.__path__ = []
        setattr(parent, part, child)
        modules[child.__name__] = parent = child
    return modules


def _has_tf_keras() -> bool:
    if "tf_keras" in sys.modules:
        return sys.modules["tf_keras"] is not None
    try:
        return importlib.util.find_spec("tf_keras") is not None
    except (ImportError, ValueError):
        return False


def _load():
    if "tensorflow_probability" in sys.modules or _has_tf_keras():
        import tensorflow_probability

        return tensorflow_probability
    placeholder = _placeholder()
    saved = {name: sys.modules.get(name) for name in placeholder}
    sys.modules.update(placeholder)
    try:
        import tensorflow_probability

        for name in _USED:  # resolve TFP's lazy sub-packages while the placeholder is present
            dir(getattr(tensorflow_probability, name))
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return tensorflow_probability


tfp = _load()
