"""A user's plug-in likelihood for the tests: the exact linear chain written in plain NumPy, with no
gpseq import (`gpseq train --likelihood numpy_chain_likelihood:log_likelihood`)."""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp


def log_likelihood(labels, unary, pairwise, lengths):
    """log p(y | f) = gold path score − log Z (forward algorithm) of each sequence.

    labels `[B, T]`, unary `[..., B, T, V]`, pairwise broadcastable to `[..., B, V, V]`, lengths `[B]`
    → `[..., B]`. Positions at or past a sequence's length are ignored.
    """
    B, T, V = unary.shape[-3:]
    pairwise = np.broadcast_to(pairwise, unary.shape[:-2] + (V, V))
    valid = np.arange(T) < np.asarray(lengths)[:, None]  # [B, T]
    gold = np.where(valid, labels, 0)
    picked = np.take_along_axis(unary, np.broadcast_to(gold[..., None], unary.shape[:-1] + (1,)), -1)[..., 0]
    score = (picked * valid).sum(-1)
    transitions = pairwise[..., np.arange(B)[:, None], gold[:, :-1], gold[:, 1:]]  # [..., B, T-1]
    score = score + (transitions * valid[:, 1:]).sum(-1)
    alpha = unary[..., 0, :]  # [..., B, V]
    for t in range(1, T):
        step = logsumexp(alpha[..., :, None] + pairwise, axis=-2) + unary[..., t, :]
        alpha = np.where(valid[:, t, None], step, alpha)
    return score - logsumexp(alpha, axis=-1)
