"""References for the GP tests: a dense RBF kernel, a 1-D regression data set, and q(u) set to random
values."""

from __future__ import annotations

import numpy as np


def rbf(X, Y, variance, lengthscale):
    d2 = ((X[:, None, :] - Y[None, :, :]) / lengthscale) ** 2
    return variance * np.exp(-0.5 * d2.sum(-1))


def regression(seed=0, N=30):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, (N, 1))
    return X, np.sin(2 * X) + 0.1 * rng.normal(size=(N, 1))


def random_q(q, rng):
    """Set a one-component `VariationalGaussian` q(u) to random values: means N(0, 1), a lower
    triangular scale with diagonal in [0.2, 0.9] (or diagonal standard deviations in that range)."""
    import tensorflow as tf

    M, P = q.num_inducing, q.num_latent
    q.q_mu.assign(rng.normal(size=(1, M, P)))
    if q.full_cov:
        L = np.tril(0.2 * rng.normal(size=(1, P, M, M)), -1) + np.eye(M) * rng.uniform(0.2, 0.9, (1, P, M, 1))
        q.q_sqrt.assign(tf.constant(L))
    else:
        q.q_sqrt.assign(tf.constant(rng.uniform(0.2, 0.9, size=(1, M, P))))
