"""Structured likelihoods log p(y | f) of labelled sequences given their potentials (the paper's eq. 1,
design notes `graybox-structured-gp.md`).

A likelihood is an object with `name`, `differentiable` (whether gradients may flow through it;
only the score-function estimator trains a likelihood that is not) and

    log_prob(labels [B, T], unary [..., B, T, V], pairwise [..., V, V], lengths [B]) → [..., B]

The inference engine (`gpseq.structured.model.StructuredGP`) only ever calls `log_prob`: a new
likelihood plugs in without touching it (the paper's §1, §5). `likelihood_by_name` maps the name saved in
`ModelConfig.likelihood` to an object: a built-in of `LIKELIHOODS`, a user's plain Python/NumPy
function named `package.module:function`, or a name registered under the entry-point group
`gpseq_likelihoods` (whose value is such a function); a function becomes a `BlackBoxLikelihood`.
TensorFlow is imported when a likelihood is evaluated, not with this module.

A model directory is data: the name saved in it is resolved by `saved_likelihood`, which imports
nothing the model names. A plug-in of a saved model comes from the user's side only: a name their
environment registers under `gpseq_likelihoods`, or a function they pass at load
(`Tagger.load(dir, likelihoods={name: function})`, `--allow-plugin NAME` on the command line).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from typing import Callable

import numpy as np

from gpseq.errors import ConfigError

ENTRY_POINT_GROUP = "gpseq_likelihoods"
_FUNCTION_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class ExactChain:
    """The linear-chain structured softmax: score of the path − log Z by the forward algorithm (the
    paper's eq. 1)."""

    name = "exact"
    differentiable = True

    def log_prob(self, labels, unary, pairwise, lengths):
        from gpseq.structured import chain

        return chain.log_likelihood(labels, unary, pairwise, lengths)


class PiecewisePseudoLikelihood:
    """The piecewise pseudo-likelihood of Sutton & McCallum (2007): a product of locally normalised
    factors, a training objective rather than a distribution over paths."""

    name = "pseudo"
    differentiable = True

    def log_prob(self, labels, unary, pairwise, lengths):
        from gpseq.structured import chain

        return chain.pseudo_log_likelihood(labels, unary, pairwise, lengths)


class BlackBoxLikelihood:
    """A log-likelihood given as a plain Python/NumPy `function(labels, unary, pairwise, lengths) →
    [..., B]` on NumPy arrays (the shapes of `log_prob`; its result is cast to the potentials'
    dtype): evaluated only, never differentiated (train it with the score-function estimator, the
    paper's §5.2)."""

    differentiable = False

    def __init__(self, function: Callable, name: str | None = None):
        self.function = function
        self.name = name or getattr(function, "__name__", "black-box")

    def log_prob(self, labels, unary, pairwise, lengths):
        import tensorflow as tf

        dtype = unary.dtype.as_numpy_dtype

        def evaluate(*arrays):
            return np.asarray(self.function(*arrays), dtype=dtype)

        out = tf.numpy_function(evaluate, [labels, unary, pairwise, lengths], unary.dtype, stateful=False)
        return tf.ensure_shape(out, unary.shape[:-2])


LIKELIHOODS = {"exact": ExactChain, "pseudo": PiecewisePseudoLikelihood}


def likelihood_by_name(name: str):
    """The likelihood called `name` by the user: a key of LIKELIHOODS, `package.module:function` or a
    name registered under the entry-point group `gpseq_likelihoods`; a plug-in function is wrapped in
    a `BlackBoxLikelihood` of that name. A one-line ConfigError when the name is none of these or its
    code cannot be imported. Imports the module a function path names: never call it on a name read
    from a model directory (`saved_likelihood` is for those)."""
    check_likelihood_name(name)
    if name in LIKELIHOODS:
        return LIKELIHOODS[name]()
    if _FUNCTION_PATH.fullmatch(name):
        return BlackBoxLikelihood(_import_function(name), name=name)
    return BlackBoxLikelihood(_import_function(_registered(name).value, name), name=name)


def saved_likelihood(name: str, plugins: dict[str, Callable] | None = None):
    """The likelihood a model directory names, resolved without importing anything the model names:
    a built-in, a function the user passed in `plugins` ({name: function}), or a name the user's own
    environment registers under `gpseq_likelihoods`. Anything else (a `package.module:function`
    written in the model) is a one-line ConfigError that says how to allow it."""
    check_likelihood_name(name)
    if name in LIKELIHOODS:
        return LIKELIHOODS[name]()
    if plugins and name in plugins:
        if not callable(plugins[name]):
            raise ConfigError(f"likelihood {name!r}: the plug-in given for it is not a function")
        return BlackBoxLikelihood(plugins[name], name=name)
    if _FUNCTION_PATH.fullmatch(name) or _registered(name) is None:
        raise ConfigError(f"the model names the plug-in likelihood {name!r}, which this environment does not "
                          f"register (entry-point group {ENTRY_POINT_GROUP}); loading a model never imports code "
                          f"it names: if you trust it, pass --allow-plugin {name} (Python: "
                          f"Tagger.load(directory, likelihoods={{{name!r}: function}}))")
    return BlackBoxLikelihood(_import_function(_registered(name).value, name), name=name)


def allowed_likelihoods(names) -> dict[str, Callable]:
    """{name: function} of the plug-in likelihoods a user allows by name (`--allow-plugin`): their
    own choice, so each is imported here (ConfigError if it cannot be)."""
    return {name: likelihood_by_name(name).function for name in names or () if name not in LIKELIHOODS}


def check_likelihood_name(name) -> None:
    """ConfigError unless `name` has the form of a likelihood name (imports nothing)."""
    if isinstance(name, str) and (name in LIKELIHOODS or _FUNCTION_PATH.fullmatch(name) or _registered(name)):
        return
    raise ConfigError(f"likelihood must be {', '.join(LIKELIHOODS)}, a 'package.module:function' or a name "
                      f"registered under the entry-point group {ENTRY_POINT_GROUP}; got {name!r}")


def is_differentiable(name: str) -> bool:
    """Whether the likelihood called `name` may be differentiated: only the built-ins (a plug-in is a
    black box), known from the name alone."""
    return name in LIKELIHOODS and LIKELIHOODS[name].differentiable


def check_estimator(likelihood, estimator: str) -> None:
    """ConfigError when the pathwise estimator would differentiate a likelihood that cannot be
    (`likelihood`: an object or its name)."""
    name = likelihood if isinstance(likelihood, str) else likelihood.name
    differentiable = is_differentiable(name) if isinstance(likelihood, str) else likelihood.differentiable
    if estimator == "pathwise" and not differentiable:
        raise ConfigError(f"likelihood {name!r} cannot be differentiated: train it with "
                          'estimator="score" (gpseq train --set model.estimator=score)')


def _registered(name: str):
    """The entry point called `name` in the group `gpseq_likelihoods`, or None."""
    if not isinstance(name, str):
        return None
    found = [entry for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if entry.name == name]
    return found[0] if found else None


def _import_function(path: str, name: str | None = None) -> Callable:
    """The callable at `package.module:function` (the likelihood `name`, default the path itself)."""
    name = name or path
    if not _FUNCTION_PATH.fullmatch(path):
        raise ConfigError(f"likelihood {name!r}: {path!r} is not of the form 'package.module:function'")
    module_name, attributes = path.split(":")
    try:
        target = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name in _parents(module_name):  # the module itself or a package above it is absent
            raise ConfigError(f"likelihood {name!r} needs the Python module {module_name!r}, which is not "
                              "installed: install the package that provides it or put it on PYTHONPATH") from None
        raise ConfigError(f"likelihood {name!r}: importing {module_name!r} failed: {error}") from None
    except Exception as error:  # the user's module raised while it was imported
        raise ConfigError(f"likelihood {name!r}: importing {module_name!r} failed: "
                          f"{type(error).__name__}: {error}") from None
    for attribute in attributes.split("."):
        if not hasattr(target, attribute):
            raise ConfigError(f"likelihood {name!r}: module {module_name!r} has no {attributes!r}")
        target = getattr(target, attribute)
    if not callable(target):
        raise ConfigError(f"likelihood {name!r}: {path!r} is not a function")
    return target


def _parents(module_name: str) -> set[str]:
    """"a.b.c" → {"a", "a.b", "a.b.c"}."""
    parts = module_name.split(".")
    return {".".join(parts[: i + 1]) for i in range(len(parts))}
