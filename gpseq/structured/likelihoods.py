"""Structured likelihoods log p(y | f) of labelled sequences given their potentials (seed eq. 1).

A likelihood is an object with `name`, `differentiable` (whether gradients may flow through it;
only the score-function estimator trains a likelihood that is not) and

    log_prob(labels [B, T], unary [..., B, T, V], pairwise [..., V, V], lengths [B]) → [..., B]

The inference engine (`gpseq.structured.model.StructuredGP`) only ever calls `log_prob`: a new
likelihood plugs in without touching it (seed §1, §5). TensorFlow is imported when a likelihood is
evaluated, not with this module: `LIKELIHOODS` names the choices of the TensorFlow-free
`ModelConfig`.
"""

from __future__ import annotations

from typing import Callable

from gpseq.errors import ConfigError


class ExactChain:
    """The linear-chain structured softmax: score of the path − log Z by the forward algorithm (seed eq. 1)."""

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
    [..., B]` on NumPy arrays: evaluated only, never differentiated (train it with the score-function
    estimator, seed §5.2)."""

    differentiable = False

    def __init__(self, function: Callable, name: str | None = None):
        self.function = function
        self.name = name or getattr(function, "__name__", "black-box")

    def log_prob(self, labels, unary, pairwise, lengths):
        import tensorflow as tf

        out = tf.numpy_function(self.function, [labels, unary, pairwise, lengths], unary.dtype, stateful=False)
        return tf.ensure_shape(out, unary.shape[:-2])


LIKELIHOODS = {"exact": ExactChain, "pseudo": PiecewisePseudoLikelihood}


def likelihood_by_name(name: str):
    """The built-in likelihood called `name` (a key of LIKELIHOODS)."""
    if name not in LIKELIHOODS:
        raise ConfigError(f"likelihood must be one of {', '.join(LIKELIHOODS)}; got {name!r}")
    return LIKELIHOODS[name]()
