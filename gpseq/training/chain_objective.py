"""The corpus objective of the MAP fit: −log-likelihood of a labelled corpus under point potentials
(b, W, P) of the linear chain, its gradient and the Fisher diagonal, over the free weights only.

unary u_t = b + x_tᵀ W  (W `[D, V]`, nonzero only on the `support`: the (feature, label) pairs seen
in training, CRFsuite's feature set), pairwise P `[V, V]`;
−log p(y | x) = Σ_n log Z_n − Σ_t u_t[y_t] − Σ_t P[y_t, y_{t+1}];
∂/∂W = Xᵀ (p − y) on the support, ∂/∂b = Σ_t (p_t − y_t), ∂/∂P = Σ_t ξ_t − transition counts;
Fisher diagonal F[f, v] = Σ_t x_tf² p_t(v) (1 − p_t(v)), F_b = Σ_t p_t (1 − p_t), F_P ≈ Σ_t ξ_t.

Partial annotation: a token labelled `UNLABELLED_ID` (`?` in the corpus) is marginalised. A
sentence with such tokens contributes −log p(observed labels | x) = log Z_n − log Z_n^c, Z_n^c the
chain restricted to the paths through its observed labels (`TimeMajor.constrained_forward_backward`),
and its gradient is E_p[φ] − E_{p|observed}[φ]: the constrained marginals and pair sums stand in for
the gold indicators and transition counts. Fully labelled sentences are scored by their gold path
directly (what the constrained chain of a one-hot mask gives, without its cost); sentences with no
labelled token contribute 0 and are left out. The support is the pairs of the labelled tokens only. The Fisher
diagonal stays that of the model marginals over every token, the expected information of fully
labelled sentences: a partial label carries less (Var_p[φ] − E Var_{p|observed}[φ]), so the
Laplace variances of weights seen mostly on unlabelled tokens come out too small — calibration's
variance scale α and temperature, fitted on labelled dev tokens, are what correct the predictive.

`NumpyChainObjective` runs on SciPy sparse products and the time-major NumPy chain, without
TensorFlow: a small corpus trains in seconds instead of TensorFlow's import and tracing time, and
on CoNLL-2000 an evaluation took 0.51 s against 0.61 s for the same objective compiled in
TensorFlow (chunking; POS tagging, 44 labels: 1.5 s against 3.4 s; same process, alternating,
on this 2-core machine), which was removed.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from gpseq.features.padded import ranges
from gpseq.structured.numpy_chain import TimeMajor
from gpseq.training.batching import UNLABELLED_ID, SequenceData


PARALLEL_NONZEROS = 1_000_000  # below this a product runs on one thread (a hand-off costs more)
_POOL: list = []


def _threads() -> ThreadPoolExecutor:
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="gpseq-spmm"))
    return _POOL[0]


class RowBlocks:
    """A CSR matrix cut into row blocks of about equal nonzeros, whose product with a dense matrix
    runs one block per thread: SciPy's sparse products release the GIL, and they are most of a
    large corpus's evaluation (on CoNLL-2000 chunking, X·W and Xᵀ·R took ≈ 80 % of it, the
    forward–backward the rest). One block below `PARALLEL_NONZEROS` or on one core."""

    def __init__(self, matrix):
        matrix = matrix.tocsr()
        self.shape, self.dtype = matrix.shape, matrix.dtype
        blocks = min(os.cpu_count() or 1, 4) if matrix.nnz >= PARALLEL_NONZEROS else 1
        cuts = np.searchsorted(matrix.indptr, np.linspace(0, matrix.nnz, blocks + 1)[1:-1]).tolist()
        bounds = sorted({0, *cuts, matrix.shape[0]})
        self.blocks = [(low, high, _row_view(matrix, low, high)) for low, high in zip(bounds[:-1], bounds[1:])] \
            if blocks > 1 else [(0, matrix.shape[0], matrix)]

    def __matmul__(self, dense: np.ndarray) -> np.ndarray:
        out = np.empty((self.shape[0], dense.shape[1]), np.result_type(self.dtype, dense.dtype))

        def run(block):
            low, high, rows = block
            out[low:high] = rows @ dense

        if len(self.blocks) == 1:
            run(self.blocks[0])
        else:
            list(_threads().map(run, self.blocks))
        return out


def _row_view(matrix, low: int, high: int):
    """Rows low:high of a CSR matrix sharing its data and indices: slicing would copy them, and so
    would SciPy's constructor (it copies a view of less than half its base), so the arrays are
    set on an empty matrix of the block's shape."""
    import scipy.sparse as sp

    start, stop = matrix.indptr[low], matrix.indptr[high]
    view = sp.csr_matrix((high - low, matrix.shape[1]), dtype=matrix.dtype)
    view.data, view.indices = matrix.data[start:stop], matrix.indices[start:stop]
    view.indptr = (matrix.indptr[low:high + 1] - start).astype(matrix.indptr.dtype)
    return view


def observed_pairs(data: SequenceData, num_labels: int) -> np.ndarray:
    """Flat indices f · V + v `[P]` (sorted) of the (feature, label) pairs that occur in the
    labelled `data`: the weights the MAP fit estimates (CRFsuite's feature set); every other
    weight is structurally 0. Column 0 (padding) never occurs."""
    known = data.label_ids >= 0
    token_of = np.repeat(np.arange(data.rows.shape[0]), np.diff(data.rows.indptr))
    keep = known[token_of]
    flat = data.rows.indices[keep].astype(np.int64) * num_labels + data.label_ids[token_of[keep]]
    return np.unique(flat)


class NumpyChainObjective:
    """The corpus objective on NumPy/SciPy in `dtype` (sums in float64), tokens in time-major order;
    `data` may be partially labelled (`UNLABELLED_ID`). Small products: run it with BLAS on one
    thread (`train_laplace` does), faster than several."""

    def __init__(self, data: SequenceData, num_labels: int, *, dtype="float32"):
        self.num_labels = V = int(num_labels)
        self.num_features = D = int(data.rows.shape[1])
        self.dtype = dtype = np.dtype(dtype)
        known = data.label_ids >= 0
        if np.any(~known & (data.label_ids != UNLABELLED_ID)):
            raise ValueError("the corpus objective needs every token's label known or marked unlabelled")
        labelled = np.add.reduceat(known.astype(np.int64), data.offsets[:-1]) if len(data) else np.zeros(0)
        if not labelled.any():
            raise ValueError("the corpus objective needs at least one labelled token")
        if not labelled.all():  # no labelled token: no evidence, a term of 0
            data = data.subset(np.flatnonzero(labelled))
            known = data.label_ids >= 0
        self.layout = layout = TimeMajor(data.offsets)
        rows = data.rows[layout.order].astype(dtype)
        self.rows = RowBlocks(rows)
        self.rows_t = RowBlocks(rows.T)  # Xᵀ as CSR: the gradient product reads it row by row
        # X∘X for the Fisher diagonal: X itself when every value is 1 (indicator features, the
        # presets), which spares a third copy of the corpus matrix
        self.rows_squared_t = self.rows_t if np.all(rows.data == 1) else RowBlocks(rows.multiply(rows).T)
        self.labels = data.label_ids[layout.order].astype(np.int64)
        partial = np.add.reduceat((~known).astype(np.int64), data.offsets[:-1]) > 0  # [B] corpus order
        in_full = ~partial[layout.sentences][layout.sentence_of]  # [N] time-major
        self.token = np.flatnonzero(in_full)  # the tokens of fully labelled sentences, scored by their gold path
        self.gold = self.labels[self.token]
        self.transitions = layout.transition_counts(self.labels, V, where=in_full)
        self.n_tokens = int(known.sum())  # the labelled tokens: the evidence (per-token figures)
        self.support = observed_pairs(data, V)
        self._dense = np.zeros(D * V, dtype)
        self.partial_layout = None
        if partial.any():  # a layout of their own: the constrained chain runs on these sentences only
            sentences = np.flatnonzero(partial)
            self.partial_layout = TimeMajor(data.subset(sentences).offsets)
            corpus_token = ranges(data.offsets[sentences], data.offsets[sentences + 1])
            time_major_row = np.empty(len(layout.order), np.int64)
            time_major_row[layout.order] = np.arange(len(layout.order))
            self.partial_rows = time_major_row[corpus_token[self.partial_layout.order]]  # [N_p] rows of `rows`
            labels = self.labels[self.partial_rows]
            self.allowed = (labels[:, None] == np.arange(V)) | (labels[:, None] < 0)  # [N_p, V]

    def _unary(self, b, w_support):
        self._dense[self.support] = w_support
        return self.rows @ self._dense.reshape(self.num_features, self.num_labels) + b.astype(self.dtype)

    def value_and_grad(self, b, w_support, p):
        """(−log-likelihood, ∂/∂b [V], ∂/∂w on the support [P], ∂/∂P [V, V]), float64."""
        unary = self._unary(b, w_support)
        pairwise = np.asarray(p, self.dtype)
        marg, pair_sum, log_z = self.layout.forward_backward(unary, pairwise)
        gold = unary[self.token, self.gold]
        score = gold.sum(dtype=np.float64) + np.sum(self.transitions * p)
        resid = marg
        resid[self.token, self.gold] -= 1.0
        target_pair_sum = self.transitions
        if self.partial_layout is not None:  # E_{p|observed} in place of the gold path
            observed_marg, observed_pair_sum, log_z_observed = self.partial_layout.constrained_forward_backward(
                unary[self.partial_rows], pairwise, self.allowed)
            score += log_z_observed.sum()
            resid[self.partial_rows] -= observed_marg
            target_pair_sum = self.transitions + observed_pair_sum
        g_w = (self.rows_t @ resid).ravel()[self.support]
        return (float(log_z.sum() - score), resid.sum(0, dtype=np.float64), g_w.astype(np.float64),
                pair_sum.astype(np.float64) - target_pair_sum)

    def fisher(self, b, w_support, p):
        """Fisher diagonals of (b [V], w on the support [P], P [V, V]), float64: the model marginals'
        over every token, labelled or not (module docstring)."""
        marg, pair_sum, _ = self.layout.forward_backward(self._unary(b, w_support), np.asarray(p, self.dtype))
        curvature = marg * (1.0 - marg)
        f_w = (self.rows_squared_t @ curvature).ravel()[self.support]
        return curvature.sum(0, dtype=np.float64), f_w.astype(np.float64), pair_sum.astype(np.float64)
