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
TensorFlow: no import or tracing, and each evaluation costs less than the same objective compiled
in TensorFlow. Its sparse products run a row block per thread (`gpseq.training.row_blocks`); W is
held as the support's head block and tail (`gpseq.training.support_split`), never as a dense
`[D, V]` array.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from gpseq.features.rows import ranges
from gpseq.structured.numpy_chain import TimeMajor
from gpseq.training.batching import UNLABELLED_ID, SequenceData
from gpseq.training.row_blocks import RowBlocks, csr_on, ones
from gpseq.training.support_split import SplitRows, SupportSplit


# tokens of one chunk of the objective (`NumpyChainObjective`): the forward–backward's arrays of
# the two chunks in flight (ten or so of [n, V] each) are the part of training's memory that grows
# with V; at this size they are small enough to stay in cache between steps, and the Python cost
# per chunk is still small against its products (benchmarks/RESULTS.md, the training-time section)
CHUNK_TOKENS = 16_384
MEMORY_TOKENS = 500_000  # tokens of chunks an objective keeps in memory; the others it writes to disk
PAIR_MASK_SIZE = 1 << 26  # (feature, label) pairs up to which `observed_pairs` marks a mask rather than sorting
CHUNK_THREADS = 2  # chunks of the objective evaluated at once (`NumpyChainObjective._summed`)
_CHUNK_POOL: list = []


def _chunk_threads() -> ThreadPoolExecutor:
    """The workers of `NumpyChainObjective._summed` (apart from `row_blocks`' pool: a chunk's products use that)."""
    if not _CHUNK_POOL:
        _CHUNK_POOL.append(ThreadPoolExecutor(max_workers=CHUNK_THREADS, thread_name_prefix="gpseq-chunk"))
    return _CHUNK_POOL[0]


def observed_pairs(data: SequenceData, num_labels: int) -> np.ndarray:
    """Flat indices f · V + v `[P]` (sorted) of the (feature, label) pairs that occur in the
    labelled `data`: the weights the MAP fit estimates (CRFsuite's feature set); every other
    weight is structurally 0. Column 0 (padding) never occurs."""
    known = data.label_ids >= 0
    token_of = np.repeat(np.arange(data.rows.shape[0]), np.diff(data.rows.indptr))
    keep = known[token_of]
    flat = data.rows.indices[keep].astype(np.int64) * num_labels + data.label_ids[token_of[keep]]
    return pair_union([flat], data.rows.shape[1] * num_labels)


def pair_union(arrays: list, size: int) -> np.ndarray:
    """The sorted distinct values of `arrays` (flat pair indices below `size`): by marking a mask
    over every pair, linear in the pairs, where `np.unique` sorts them (the default beyond
    PAIR_MASK_SIZE pairs)."""
    if size > PAIR_MASK_SIZE:
        return np.unique(np.concatenate(arrays))
    seen = np.zeros(size, bool)
    for values in arrays:
        seen[values] = True
    return np.flatnonzero(seen)


def chunk_bounds(offsets: np.ndarray, chunk_tokens: int) -> list[tuple[int, int]]:
    """Consecutive sentence ranges [low, high) of at most `chunk_tokens` tokens each (a longer
    sentence is a range of its own) covering the corpus of sentence `offsets [B+1]`."""
    bounds, low, n = [], 0, len(offsets) - 1
    while low < n:
        high = int(np.searchsorted(offsets, offsets[low] + chunk_tokens, side="right")) - 1
        high = min(max(high, low + 1), n)
        bounds.append((low, high))
        low = high
    return bounds


class ChainChunk:
    """The objective's arrays for one run of consecutive sentences of the corpus: the time-major
    layout, X in that order, the gold labels and transition counts (`arrays`, what a spilled chunk
    writes); `value_and_grad` and `fisher` of its sentences at the weights of a `SupportSplit`,
    X cut by it once (`split_rows`)."""

    def __init__(self, arrays: dict, num_labels: int):
        self.arrays_ = arrays
        self.layout = TimeMajor.from_arrays({k[7:]: v for k, v in arrays.items() if k.startswith("layout_")})
        indices = arrays["rows_indices"]
        data = arrays["rows_data"] if "ones" not in arrays else ones(len(indices), arrays["ones"].dtype)
        rows = csr_on(data, indices, arrays["rows_indptr"], arrays["rows_shape"])
        self._rows = RowBlocks(rows)  # X (None while a whole cut stands in for it: `split_rows`)
        self._split = None  # X cut by the last support split it was evaluated at (`split_rows`)
        self.dtype = rows.dtype
        self.token, self.gold, self.transitions = arrays["token"], arrays["gold"], arrays["transitions"]
        self.n_tokens = int(arrays["n_tokens"][0])
        self.partial_layout = None
        if "partial_rows" in arrays:
            self.partial_layout = TimeMajor.from_arrays({k[8:]: v for k, v in arrays.items() if k.startswith("partial_")
                                                         and k != "partial_rows"})
            labels = arrays["labels"][arrays["partial_rows"]]
            self.partial_rows = arrays["partial_rows"]
            self.allowed = (labels[:, None] == np.arange(num_labels)) | (labels[:, None] < 0)  # [N_p, V]

    @classmethod
    def build(cls, data: SequenceData, num_labels: int, dtype) -> "ChainChunk":
        """The chunk of the sentences of `data` (each with a labelled token)."""
        V = num_labels
        known = data.label_ids >= 0
        layout = TimeMajor(data.offsets)
        rows = data.rows[layout.order].astype(dtype)
        arrays = {f"layout_{k}": v for k, v in layout.arrays().items()}
        arrays.update(rows_indices=rows.indices, rows_indptr=rows.indptr, rows_shape=np.array(rows.shape))
        if np.all(rows.data == 1):  # indicator features (the presets): a view of one shared array of ones
            arrays["ones"] = np.zeros(0, dtype)  # (its dtype)
        else:
            arrays["rows_data"] = rows.data
        labels = data.label_ids[layout.order].astype(np.int64)
        partial = np.add.reduceat((~known).astype(np.int64), data.offsets[:-1]) > 0  # [B] corpus order
        in_full = ~partial[layout.sentences][layout.sentence_of]  # [N] time-major
        token = np.flatnonzero(in_full)  # the tokens of fully labelled sentences, scored by their gold path
        arrays.update(labels=labels, token=token, gold=labels[token], n_tokens=np.array([known.sum()]),
                      transitions=layout.transition_counts(labels, V, where=in_full),
                      pairs=observed_pairs(data, V))
        if partial.any():  # a layout of their own: the constrained chain runs on these sentences only
            sentences = np.flatnonzero(partial)
            partial_layout = TimeMajor(data.subset(sentences).offsets)
            corpus_token = ranges(data.offsets[sentences], data.offsets[sentences + 1])
            time_major_row = np.empty(len(layout.order), np.int64)
            time_major_row[layout.order] = np.arange(len(layout.order))
            arrays.update({f"partial_{k}": v for k, v in partial_layout.arrays().items()})
            arrays["partial_rows"] = time_major_row[corpus_token[partial_layout.order]]  # [N_p] rows of `rows`
        return cls(arrays, V)

    def drop_split(self) -> None:
        """Let go of X's cut by the last split (`split_rows` makes it again when asked)."""
        self._restore_rows()
        self._split = None

    def split_rows(self, split: SupportSplit) -> SplitRows:
        """X cut by `split` (kept for the next evaluation at the same split). A cut that holds all
        of X stands in for it until another split needs X again (X's indices are as large as
        either half of the cut: held once, not twice)."""
        if self._split is None or self._split.split is not split:
            self._restore_rows()
            self._split = SplitRows(self._rows.matrix, split)
            if self._split.whole:
                self._rows = None
                for name in ("rows_indices", "rows_indptr"):
                    self.arrays_.pop(name, None)
        return self._split

    def _restore_rows(self) -> None:
        if self._rows is None:  # X from the cut that stood in for it
            matrix = self._split.rows()
            self._rows = RowBlocks(matrix)
            self.arrays_.update(rows_indices=matrix.indices, rows_indptr=matrix.indptr)

    def value_and_grad(self, b, split, pairwise, add):
        """(−log-likelihood, ∂/∂b [V], ∂/∂P [V, V]) of this chunk at the weights of `split`
        (`SupportSplit`), float64; ∂/∂W, X_hᵀ R on the head block and its terms on the tail, goes
        to `add(X_hᵀ, R, tail weight ids, tail terms)` (`NumpyChainObjective._summed`'s sums)."""
        rows = self.split_rows(split)
        unary = rows.unary(b)
        p = np.asarray(pairwise, self.dtype)
        # what is read of the unaries is taken first: the forward–backward then works in their array
        gold = unary[self.token, self.gold]
        partial = None if self.partial_layout is None else unary[self.partial_rows]
        marg, pair_sum, log_z = self.layout.forward_backward(unary, p, consume=True)
        del unary
        score = gold.sum(dtype=np.float64) + np.sum(self.transitions * pairwise)
        resid = marg
        resid[self.token, self.gold] -= 1.0
        target_pair_sum = self.transitions
        if partial is not None:  # E_{p|observed} in place of the gold path
            observed_marg, observed_pair_sum, log_z_observed = self.partial_layout.constrained_forward_backward(
                partial, p, self.allowed)
            score += log_z_observed.sum()
            resid[self.partial_rows] -= observed_marg
            target_pair_sum = self.transitions + observed_pair_sum
        add(rows.head_t, resid, rows.tail_weight, rows.tail_terms(resid))
        return (float(log_z.sum() - score), resid.sum(0, dtype=np.float64),
                pair_sum.astype(np.float64) - target_pair_sum)

    def fisher(self, b, split, pairwise, add):
        """The chunk's Fisher diagonals of (b [V], P [V, V]), float64; W's, (X_h∘X_h)ᵀ C on the head
        block and its terms on the tail, goes to `add((X_h∘X_h)ᵀ, C, tail weight ids, tail terms)`."""
        rows = self.split_rows(split)
        marg, pair_sum, _ = self.layout.forward_backward(rows.unary(b), np.asarray(pairwise, self.dtype), consume=True)
        curvature = marg * (1.0 - marg)
        add(rows.head_squared_t, curvature, rows.tail_weight, rows.tail_terms(curvature, squared=True))
        return curvature.sum(0, dtype=np.float64), pair_sum.astype(np.float64)


class SpilledChunk:
    """A `ChainChunk` written to `directory` (one .npy per array) and mapped back for each use: its
    memory is the operating system's page cache between uses, not the process's."""

    def __init__(self, chunk: ChainChunk, directory: Path, num_labels: int):
        directory.mkdir()
        _save(directory, chunk.arrays_)
        self.directory, self.num_labels, self.n_tokens = directory, num_labels, chunk.n_tokens
        self._split = None  # the support split whose cut of X is on disk too (directory / "split")

    def load(self, split: SupportSplit | None = None) -> ChainChunk:
        """The chunk, mapped; with `split`, its X cut by it, from disk after the first time."""
        chunk = ChainChunk(_mapped(self.directory), self.num_labels)
        if split is not None:
            folder = self.directory / "split"
            if self._split is not split:  # cut once per split, then mapped like the rest
                if folder.exists():
                    import shutil

                    shutil.rmtree(folder)
                folder.mkdir()
                _save(folder, chunk.split_rows(split).arrays())
                self._split = split
            else:
                chunk._split = SplitRows.from_arrays(_mapped(folder), split)
        return chunk

    def drop_split(self) -> None:  # its cut lives on disk, not in memory
        pass

    def value_and_grad(self, b, split, *rest):
        return self.load(split).value_and_grad(b, split, *rest)

    def fisher(self, b, split, *rest):
        return self.load(split).fisher(b, split, *rest)


def _save(directory: Path, arrays: dict) -> None:
    for name, array in arrays.items():
        np.save(directory / f"{name}.npy", np.ascontiguousarray(array))


def _mapped(directory: Path) -> dict:
    return {path.stem: np.load(path, mmap_mode="r") for path in directory.glob("*.npy")}


def _parts(data) -> list:
    return [data] if isinstance(data, SequenceData) else data


class NumpyChainObjective:
    """The corpus objective on NumPy/SciPy in `dtype` (sums in float64 but W's gradient and Fisher
    on the support's head block, accumulated over the chunks in one `dtype` array `[D_h, V]`,
    `gpseq.training.support_split`), summed over chunks of at
    most `chunk_tokens` tokens of consecutive sentences (`ChainChunk`, tokens in time-major order
    within each): the forward–backward's token-by-label arrays (ten or so of `[N, V]` at once)
    exist for one chunk at a time per core used (`CHUNK_THREADS`: two chunks' forward–backward
    run at once, their matrix products release the GIL; W's sums are added in chunk order, so
    the result does not depend on which finishes first); the sums are the same up to float64
    rounding. `data`: a
    SequenceData or an iterable of them (the parts of one corpus, e.g. train and dev, or blocks
    featurised one at a time), partially labelled or not (`UNLABELLED_ID`).

    Past `memory_tokens` tokens the chunks are written to a temporary directory (`spill_dir`, else
    the system's) and mapped back one at a time for each evaluation (`SpilledChunk`): the memory of
    a large corpus's fit stays within `memory_tokens` tokens' worth of chunks, plus one chunk and
    the weights; the directory goes with the objective (`close`, or garbage collection).
    Small products: run it with BLAS on one thread (`train_laplace` does), faster than several."""

    def __init__(self, data, num_labels: int, *, dtype="float32", chunk_tokens: int = CHUNK_TOKENS,
                 memory_tokens: int = MEMORY_TOKENS, spill_dir=None):
        self.num_labels = V = int(num_labels)
        self.dtype = dtype = np.dtype(dtype)
        self.chunks, self.n_tokens, in_memory, pairs = [], 0, 0, []
        self.num_features, self._spill, self._spill_dir = None, None, spill_dir
        self._chunk_tokens, self._memory_tokens, self._owners = chunk_tokens, memory_tokens, ()
        for part in _parts(data):
            self.num_features = int(part.rows.shape[1])
            known = part.label_ids >= 0
            if np.any(~known & (part.label_ids != UNLABELLED_ID)):
                raise ValueError("the corpus objective needs every token's label known or marked unlabelled")
            labelled = np.add.reduceat(known.astype(np.int64), part.offsets[:-1]) if len(part) else np.zeros(0)
            if not labelled.all():  # no labelled token: no evidence, a term of 0
                part = part.subset(np.flatnonzero(labelled))
            bounds = chunk_bounds(part.offsets, chunk_tokens)
            for low, high in bounds:
                chunk = ChainChunk.build(part if len(bounds) == 1 else part.subset(np.arange(low, high)), V, dtype)
                pairs.append(chunk.arrays_.pop("pairs"))
                if len(pairs) > 16:  # the union so far: support-sized, whatever the number of chunks
                    pairs = [pair_union(pairs, self.num_features * V)]
                self.n_tokens += chunk.n_tokens
                tokens = len(chunk.arrays_["labels"])
                if in_memory + tokens > memory_tokens:
                    chunk = SpilledChunk(chunk, self._spill_directory() / str(len(self.chunks)), V)
                else:
                    in_memory += tokens
                self.chunks.append(chunk)
        if not self.n_tokens:
            raise ValueError("the corpus objective needs at least one labelled token")
        # column 0 (PAD_ID: the count of a token's features the vocabulary lacks) is never free: its
        # weight keeps its prior, the predictive's variance for unseen features (`gpseq.features`)
        support = pair_union(pairs, self.num_features * V)
        self.support = support[support >= V]
        self._split = None  # the support's `SupportSplit` (made at the first evaluation)
        self._sums = None  # W's gradient or Fisher summed over the chunks: ([D_h, V] `dtype`, tail [D_t] float64)

    def extended(self, data) -> "NumpyChainObjective":
        """The objective of this corpus and `data`'s sentences (SequenceData or parts): this one's
        chunks are shared, not rebuilt (it stays usable; its spilled chunks live as long as either)."""
        kept = sum(len(c.arrays_["labels"]) for c in self.chunks if isinstance(c, ChainChunk))
        # the union's support splits X anew: this objective's split, its sums and its chunks' cuts of
        # X go now, not after the new ones are made (made again if this objective is evaluated)
        self._split = self._sums = None
        for chunk in self.chunks:
            chunk.drop_split()
        more = NumpyChainObjective(data, self.num_labels, dtype=self.dtype, chunk_tokens=self._chunk_tokens,
                                   memory_tokens=max(0, self._memory_tokens - kept), spill_dir=self._spill_dir)
        both = NumpyChainObjective.__new__(NumpyChainObjective)
        both.__dict__.update(more.__dict__)
        both.chunks, both.n_tokens = self.chunks + more.chunks, self.n_tokens + more.n_tokens
        both.support = pair_union([self.support, more.support], self.num_features * self.num_labels)
        both._spill, both._owners = None, (self, more)  # theirs: the spill directories
        return both

    def _spill_directory(self) -> Path:
        if self._spill is None:
            import tempfile

            self._spill = tempfile.TemporaryDirectory(prefix="gpseq-objective-", dir=self._spill_dir)
        return Path(self._spill.name)

    @property
    def spilled(self) -> int:
        """The number of chunks written to disk."""
        return sum(isinstance(chunk, SpilledChunk) for chunk in self.chunks)

    def close(self) -> None:
        """Delete the spilled chunks and let go of the chunks and the weights' arrays (the
        objective is unusable after): what follows a fit (the model's arrays) reuses their memory."""
        for owner in self._owners:
            owner.close()
        if self._spill is not None:
            self._spill.cleanup()
            self._spill = None
        self.chunks, self._split, self._sums = [], None, None

    def _summed(self, method: str, b, w_support, p) -> tuple:
        """The chunks' `method` summed, W's part (its head block accumulated in one [D_h, V] array,
        its tail summed with the rest) on the support third: (value,) ∂/∂b or F_b, W's on the
        support, ∂/∂P or F_P."""
        if self._split is None:
            self._split = SupportSplit(self.support, self.num_features, self.num_labels, self.dtype)
        split, total = self._split, None
        split.write(w_support)
        if self._sums is None:
            self._sums = np.zeros_like(split.weights), np.zeros(len(split.tail_weights))
        for array in self._sums:
            array.fill(0)
        (sums, tail_sums), turns = self._sums, [threading.Event() for _ in self.chunks]

        def run(number, chunk):
            def add(blocks, dense, tail_index, tail_terms):  # chunk `number`'s W part, after chunk number − 1's
                if number:
                    turns[number - 1].wait()
                blocks.accumulate(dense, sums)
                np.add.at(tail_sums, tail_index, tail_terms)

            try:
                return getattr(chunk, method)(b, split, p, add)
            finally:
                turns[number].set()  # also when it failed: the next one is not kept waiting

        threads = min(CHUNK_THREADS, os.cpu_count() or 1, len(self.chunks))
        parts = _chunk_threads().map(run, range(len(self.chunks)), self.chunks) if threads > 1 else \
            map(run, range(len(self.chunks)), self.chunks)
        for part in parts:  # in chunk order
            total = list(part) if total is None else [a + c for a, c in zip(total, part)]
        return (*total[:-1], split.gather(sums, tail_sums), total[-1])

    def value_and_grad(self, b, w_support, p):
        """(−log-likelihood, ∂/∂b [V], ∂/∂w on the support [P], ∂/∂P [V, V]), float64."""
        return self._summed("value_and_grad", b, w_support, p)

    def fisher(self, b, w_support, p):
        """Fisher diagonals of (b [V], w on the support [P], P [V, V]), float64: the model marginals'
        over every token, labelled or not (module docstring)."""
        return self._summed("fisher", b, w_support, p)
