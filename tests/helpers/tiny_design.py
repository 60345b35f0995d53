"""A tiny structured GP over a hand-made sparse design (float64), and the exact per-sequence Gaussian
of its unaries computed densely in NumPy (seed eqs. 15–18): the independent references of the
model's ELBO pieces and estimators."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from gpseq.structured.model import ModelConfig, build_structured_gp
from gpseq.training.batching import SequenceData, make_batch


def tiny_data(seed=0, n_seq=4, max_len=3, n_features=6, n_labels=2):
    rng = np.random.default_rng(seed)
    import scipy.sparse as sp

    lengths = rng.integers(1, max_len + 1, size=n_seq)
    n_tok = int(lengths.sum())
    dense = (rng.random((n_tok, n_features)) < 0.4).astype(np.float64)
    dense[:, 0] = 0.0  # column 0 is the padding column
    dense[np.arange(n_tok), 1 + rng.integers(0, n_features - 1, n_tok)] = 1.0  # ≥ 1 feature each
    rows = sp.csr_matrix(dense)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    labels = rng.integers(0, n_labels, size=n_tok).astype(np.int32)
    return SequenceData(rows, offsets, labels), dense


def tiny_model(kernel="linear+rbf", n_features=6, n_labels=2, seed=0, likelihood=None, **overrides):
    rng = np.random.default_rng(seed + 100)
    config = ModelConfig(kernel=kernel, num_inducing=3, **{"rbf_conditional": "full", **overrides})
    Z = (rng.random((3, n_features)) < 0.5).astype(np.float64)
    Z[:, 0] = 0.0
    model = build_structured_gp(config, n_features, n_labels, Z if config.has_inducing else None, tf.float64,
                                likelihood=likelihood)
    # move the variational parameters away from their initial values
    for variable in model.trainable_variables:
        variable.assign(variable + 0.3 * rng.standard_normal(variable.shape))
    return model, Z


def tiny_batch(data):
    return {k: tf.convert_to_tensor(v) for k, v in make_batch(data, np.arange(len(data)), dtype=np.float64).items()}


def unary_gaussians(model, Z, dense, data, conditional="full", component=0, drop_k_tilde=False):
    """Exact per-sequence Gaussian of the unaries of mixture `component`, computed densely in NumPy
    (seed eqs. 15–18): [(means [V, T], covariances [V, T, T]) per sequence]. `conditional="diag"`:
    K̃_n replaced by its diagonal; `drop_k_tilde`: without K̃_n (the reference of a known bug)."""
    import scipy.linalg

    mu = model.unaries.linear.q_mu.numpy()
    s = np.asarray(model.unaries.linear.q_variance)
    bias = model.unaries.label_bias.numpy()
    sparse = model.unaries.sparse
    if sparse is not None:
        variance = float(tf.convert_to_tensor(sparse.kernel.variance))
        lengthscale = float(np.squeeze(tf.convert_to_tensor(sparse.kernel.lengthscales)))

        def rbf(a, b):
            d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
            return variance * np.exp(-0.5 * d2 / lengthscale**2)

        kzz = rbf(Z, Z) + ModelConfig().jitter * np.eye(len(Z))
        L = np.linalg.cholesky(kzz)
        q_mu = sparse.q.q_mu.numpy()[component]  # [M, V] (of v when whitened)
        q_scale = tf.convert_to_tensor(sparse.q.q_sqrt).numpy()[component]  # [V, M, M] or [M, V]
    out = []
    for b in range(len(data)):
        X = dense[data.offsets[b] : data.offsets[b + 1]]
        means, covs = [], []
        for j in range(model.num_labels):
            means.append(bias[j] + X @ mu[:, j])
            covs.append(X @ np.diag(s[:, j]) @ X.T)
        if sparse is not None:
            kxz = rbf(X, Z)
            A_w = scipy.linalg.solve_triangular(L, kxz.T, lower=True).T  # K_xz L^-T
            A = A_w if sparse.whiten else kxz @ np.linalg.inv(kzz)  # the projection of q(u)
            cond = rbf(X, X) - A_w @ A_w.T
            if conditional == "diag":
                cond = np.diag(np.diag(cond))
            for j in range(model.num_labels):
                Sj = q_scale[j] @ q_scale[j].T if sparse.q.full_cov else np.diag(q_scale[:, j] ** 2)
                means[j] = means[j] + A @ q_mu[:, j]
                covs[j] = covs[j] + A @ Sj @ A.T + (0.0 if drop_k_tilde else cond)
        out.append((np.array(means), np.array(covs)))
    return out
