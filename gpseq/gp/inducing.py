"""Inducing inputs by K-means (k-means++ start; mini-batch K-means for large N), seeded."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from sklearn.cluster import KMeans, MiniBatchKMeans

from gpseq.errors import ConfigError

MINIBATCH_ABOVE = 20_000  # rows: above this, `minibatch="auto"` uses mini-batch K-means


def kmeans_inducing(
    X,
    M: int,
    *,
    seed: int = 0,
    snap: bool = False,
    minibatch: bool | str | None = "auto",
    n_iter: int = 100,
    batch_size: int = 2048,
):
    """M K-means centroids of the rows of `X` (dense `[N, D]` array or scipy CSR) → `Z [M, D]` dense.

    k-means++ initialisation, one initialisation (`n_init=1`), `random_state=seed`: the same
    input and seed give the same centroids. `minibatch="auto"` switches to mini-batch K-means
    above `MINIBATCH_ABOVE` rows (True/False force it). With `snap=True` each centroid is replaced
    by its nearest distinct data row and `(X[row_ids], row_ids)` is returned (sparse stays sparse).
    """
    n_rows = X.shape[0]
    if not 1 <= M <= n_rows:
        raise ConfigError(f"number of inducing points M={M} must be between 1 and the number of rows ({n_rows})")
    is_sparse = sp.issparse(X)
    data = sp.csr_matrix(X, dtype=np.float64) if is_sparse else np.asarray(X, dtype=np.float64)
    use_minibatch = n_rows > MINIBATCH_ABOVE if minibatch in ("auto", None) else bool(minibatch)
    if use_minibatch:
        km = MiniBatchKMeans(n_clusters=M, init="k-means++", n_init=1, max_iter=n_iter,
                             batch_size=batch_size, random_state=seed)
    else:
        km = KMeans(n_clusters=M, init="k-means++", n_init=1, max_iter=n_iter, random_state=seed,
                    algorithm="lloyd")
    km.fit(data)
    centroids = np.asarray(km.cluster_centers_, dtype=np.float64)
    if not snap:
        return centroids
    row_ids = _nearest_distinct_rows(data, centroids)
    return data[row_ids], row_ids


def _nearest_distinct_rows(data, centroids, chunk: int = 4096) -> np.ndarray:
    """For each centroid the nearest data row, distinct rows (greedy, closest pairs first) `[M]`."""
    M = centroids.shape[0]
    c_norm = np.einsum("md,md->m", centroids, centroids)
    k = min(data.shape[0], 4 * M)  # candidates per centroid: enough to resolve collisions
    best_d = np.full((M, 0), np.inf)
    best_i = np.zeros((M, 0), dtype=np.int64)
    for start in range(0, data.shape[0], chunk):
        block = data[start:start + chunk]
        x_norm = np.asarray(block.multiply(block).sum(1)).ravel() if sp.issparse(block) else (block**2).sum(1)
        cross = np.asarray(block @ centroids.T).T  # [M, chunk]
        dist = c_norm[:, None] + x_norm[None, :] - 2.0 * cross
        cand_d = np.concatenate([best_d, dist], 1)
        cand_i = np.concatenate([best_i, np.broadcast_to(np.arange(start, start + block.shape[0]), dist.shape)], 1)
        keep = np.argsort(cand_d, axis=1, kind="stable")[:, :k]
        best_d = np.take_along_axis(cand_d, keep, 1)
        best_i = np.take_along_axis(cand_i, keep, 1)
    chosen = np.full(M, -1, dtype=np.int64)
    used: set[int] = set()
    order = np.argsort(best_d[:, 0], kind="stable")
    for m in order:  # greedy: centroids closest to the data pick first
        for row in best_i[m]:
            if int(row) not in used:
                chosen[m] = row
                used.add(int(row))
                break
        if chosen[m] < 0:  # all candidates taken (many duplicate rows): any unused row
            row = next(r for r in range(data.shape[0]) if r not in used)
            chosen[m] = row
            used.add(row)
    return chosen
