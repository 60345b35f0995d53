"""K-means inducing inputs: recovers separated clusters, deterministic, snapping, sparse input."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from gpseq.errors import ConfigError
from gpseq.gp.inducing import kmeans_inducing


def _blobs(seed=0, per=60):
    rng = np.random.default_rng(seed)
    centers = np.array([[0.0, 0.0, 5.0], [5.0, 0.0, 0.0], [0.0, 5.0, 0.0], [5.0, 5.0, 5.0]])
    X = np.concatenate([c + 0.1 * rng.normal(size=(per, 3)) for c in centers])
    return X, centers


@pytest.mark.parametrize("minibatch", [False, True])
def test_recovers_cluster_centres_and_is_deterministic(minibatch):
    X, centers = _blobs()
    Z = kmeans_inducing(X, 4, seed=3, minibatch=minibatch, batch_size=64)
    # each true centre has a centroid within a few noise standard deviations
    dist = np.linalg.norm(Z[:, None] - centers[None], axis=-1)
    assert np.all(dist.min(0) < 0.1)
    np.testing.assert_array_equal(Z, kmeans_inducing(X, 4, seed=3, minibatch=minibatch, batch_size=64))
    # same result on the CSR form of the same rows
    Zs = kmeans_inducing(sp.csr_matrix(X), 4, seed=3, minibatch=minibatch, batch_size=64)
    np.testing.assert_allclose(np.sort(Zs, 0), np.sort(Z, 0), atol=1e-8)


def test_different_seeds_give_different_starts_on_unstructured_data():
    X = np.random.default_rng(0).normal(size=(300, 4))
    a, b = kmeans_inducing(X, 10, seed=0), kmeans_inducing(X, 10, seed=1)
    assert a.shape == (10, 4) and not np.allclose(np.sort(a, 0), np.sort(b, 0))


def test_snap_returns_distinct_nearest_rows_and_keeps_sparsity():
    rng = np.random.default_rng(2)
    X = sp.random(200, 30, density=0.1, random_state=rng, format="csr")
    Z, ids = kmeans_inducing(X, 12, seed=0, snap=True)
    assert sp.issparse(Z) and Z.shape == (12, 30)
    assert len(set(ids.tolist())) == 12
    np.testing.assert_allclose(Z.toarray(), X[ids].toarray())
    centroids = kmeans_inducing(X, 12, seed=0)
    dense = X.toarray()
    d = ((centroids[:, None] - dense[None]) ** 2).sum(-1)  # brute force [M, N]
    # the closest centroid of all got its own nearest row
    m = int(np.argmin(d.min(1)))
    assert ids[m] == int(np.argmin(d[m]))
    # every snapped row is among the rows nearest to its centroid (ties/collisions resolved greedily)
    ranks = [int((d[i] < d[i, ids[i]] - 1e-12).sum()) for i in range(12)]
    assert max(ranks) < 12


def test_too_many_inducing_points_is_a_config_error():
    with pytest.raises(ConfigError):
        kmeans_inducing(np.ones((3, 2)), 5)
