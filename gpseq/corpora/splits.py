"""Deterministic splits of a corpus by sentence index: k folds and train/dev (runs of sentences)."""

from __future__ import annotations

import numpy as np

from gpseq.errors import ConfigError


def kfold_indices(n: int, k: int, seed: int = 0,
                  labelled: np.ndarray | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """k (train_idx, test_idx) pairs over range(n): a seeded shuffle cut into k folds (sizes differ ≤ 1).

    Every index is in exactly one test fold; both arrays are sorted int64. Same (n, k, seed), same folds.
    `labelled` `[n]` bool (a partially annotated corpus: the sentences with a labelled token): those
    and the others are cut into the k folds apart (each fold gets ⌊m/k⌋ or ⌈m/k⌉ of the m labelled
    ones), so that with two or more labelled, every fold's train_idx has one; all True: the same
    folds as without.
    """
    if not 2 <= k <= n:
        raise ConfigError(f"k-fold needs 2 <= k <= n, got k={k}, n={n}")
    order = np.random.default_rng(seed).permutation(n)
    if labelled is None:
        folds = np.array_split(order, k)
    else:
        first = np.asarray(labelled, bool)[order]
        # the others' larger blocks go to the folds with the labelled ones' smaller: sizes within 1
        folds = [np.concatenate(pair) for pair in zip(np.array_split(order[first], k),
                                                      np.array_split(order[~first], k)[::-1])]
    out = []
    for test in folds:
        mask = np.ones(n, dtype=bool)
        mask[test] = False
        out.append((np.flatnonzero(mask).astype(np.int64), np.sort(test).astype(np.int64)))
    return out


# sentences per run of the dev split: consecutive sentences of a corpus mostly come from one
# document and share its rare words, so a dev split of whole runs meets new word forms at about the
# rate new text does, where single sentences drawn at random (their neighbours training) meet fewer
DEV_BLOCK = 50
BLOCKS_IN_DEV = 10  # runs shrink until the dev split has at least this many


def train_dev_split(n: int, dev_fraction: float, seed: int = 0,
                    max_dev: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(train_idx, dev_idx) over range(n): round(n · dev_fraction) indices (≥ 1, at most `max_dev`)
    go to dev, as runs of consecutive sentences drawn at random: `DEV_BLOCK` sentences each, fewer where
    the dev split would hold fewer than `BLOCKS_IN_DEV` runs (down to single sentences, a plain
    random draw)."""
    if not 0.0 < dev_fraction < 1.0:
        raise ConfigError(f"dev_fraction must be in (0, 1), got {dev_fraction}")
    if n < 2:
        raise ConfigError(f"a train/dev split needs at least 2 sentences, got {n}")
    n_dev = min(max(1, round(n * dev_fraction)), n - 1, max_dev if max_dev is not None else n)
    size = max(1, min(DEV_BLOCK, n_dev // BLOCKS_IN_DEV))
    starts = np.random.default_rng(seed).permutation(-(-n // size)) * size
    drawn = (starts[:, None] + np.arange(size)).ravel()
    order = drawn[drawn < n]
    return np.sort(order[n_dev:]).astype(np.int64), np.sort(order[:n_dev]).astype(np.int64)
