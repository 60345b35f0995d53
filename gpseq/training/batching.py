"""Minibatches of sequences for SVI: length-bucketed, padded, with batch-local feature ids.

A batch is a dict of numpy arrays (the input of the training step):
    indices      [B, T, F] int32  batch-local feature ids (0 = padding, also local id of PAD_ID)
    values       [B, T, F] float  feature values (0 at padding)
    feature_ids  [U]       int32  global feature id of each local id (feature_ids[0] == PAD_ID)
    labels       [B, T]    int32  label ids (0 at padding)
    lengths      [B]       int32
Local ids let the model sample only the U weights a batch touches (exact, O(U · V) per sample)
instead of all D. Everything is vectorised numpy: no Python loop over tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gpseq.features.padded import PAD_ID, padded_from_csr
from gpseq.features.rows import ranges

if TYPE_CHECKING:
    import scipy.sparse as sp

    from gpseq.features.rows import CsrRows


def _round_up(value: int, multiple: int) -> int:
    return max(multiple, -(-value // multiple) * multiple)


# label ids below 0: tokens that no likelihood term scores as gold
UNKNOWN_LABEL_ID = -1  # a gold label the model does not know (dev and test data only)
UNLABELLED_ID = -2  # a token without a gold label (`?`, partial annotation): marginalised by the default training


@dataclass
class SequenceData:
    """A featurised corpus: CSR rows `[N_tokens, D]` (`CsrRows`, or a SciPy matrix),
    sentence offsets `[B+1]`, flat label ids `[N]` (`UNKNOWN_LABEL_ID`, `UNLABELLED_ID` below 0)."""

    rows: sp.csr_matrix | CsrRows
    offsets: np.ndarray
    label_ids: np.ndarray | None = None

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[-1])

    def subset(self, sentence_ids: np.ndarray) -> "SequenceData":
        """The sentences `sentence_ids` (in that order) as a new SequenceData."""
        sentence_ids = np.asarray(sentence_ids, dtype=np.int64)
        return self.slices(self.offsets[sentence_ids], self.offsets[sentence_ids + 1])

    def slices(self, starts: np.ndarray, stops: np.ndarray) -> "SequenceData":
        """Token ranges `[starts[i], stops[i])` (flat token positions, in that order) as the
        sequences of a new SequenceData; ranges may overlap (windows of one long sentence)."""
        starts, stops = np.asarray(starts, dtype=np.int64), np.asarray(stops, dtype=np.int64)
        token_ids = ranges(starts, stops)
        offsets = np.concatenate([[0], np.cumsum(stops - starts)]).astype(np.int64)
        labels = None if self.label_ids is None else self.label_ids[token_ids]
        return SequenceData(self.rows[token_ids], offsets, labels)

    @classmethod
    def featurised(cls, featurizer, sentences: list, label_index: dict | None = None) -> "SequenceData":
        """`sentences` through `featurizer.transform`, with their labels as ids of `label_index`
        (`UNLABELLED_ID` for `?`, `UNKNOWN_LABEL_ID` for a label it lacks; None: no labels)."""
        from gpseq.corpora.types import UNLABELLED

        matrix = featurizer.transform(sentences)
        label_ids = None
        if label_index is not None:
            index = {**label_index, UNLABELLED: UNLABELLED_ID}
            flat = [label for s in sentences for label in (s.labels or [])]
            label_ids = np.fromiter((index.get(label, UNKNOWN_LABEL_ID) for label in flat), dtype=np.int32,
                                    count=len(flat))
        return cls(matrix.csr.narrowed(), np.asarray(matrix.offsets, dtype=np.int64), label_ids)

    def cut_long(self, max_tokens: int) -> "SequenceData":
        """Every sequence longer than `max_tokens` cut into consecutive pieces of at most
        `max_tokens` tokens (as equal as possible), each a sequence of its own; the others as they
        are. The same object when no sequence is longer."""
        lengths = self.lengths
        if not (lengths > max_tokens).any():
            return self
        pieces = -(-lengths // max_tokens)  # [B] pieces per sequence, 1 for the short ones
        owner = np.repeat(np.arange(len(lengths)), pieces)
        index = np.arange(len(owner)) - np.repeat(np.cumsum(pieces) - pieces, pieces)  # piece number within its sequence
        starts = self.offsets[owner] + (lengths[owner] * index) // pieces[owner]
        stops = self.offsets[owner] + (lengths[owner] * (index + 1)) // pieces[owner]
        return self.slices(starts, stops)


class SentenceBlocks:
    """A corpus featurised block by block as it is iterated: `featurise(block)` → SequenceData of
    `size` sentences at a time (what the default training's objective consumes), so a large corpus
    is never featurised whole. `sentences`: a list or a re-iterable corpus that knows its length
    and `n_tokens` (`gpseq.training.corpus_passes.Selected`)."""

    def __init__(self, sentences, featurise, size: int = 4096):
        self.sentences, self.featurise, self.size = sentences, featurise, size

    def __len__(self) -> int:
        return len(self.sentences)

    @property
    def n_tokens(self) -> int:
        known = getattr(self.sentences, "n_tokens", None)
        return known if known is not None else sum(len(s) for s in self.sentences)

    def __iter__(self):
        block: list = []
        for sentence in self.sentences:
            block.append(sentence)
            if len(block) == self.size:
                yield self.featurise(block)
                block = []
        if block:
            yield self.featurise(block)


def make_batch(
    data: SequenceData,
    sentence_ids: np.ndarray,
    *,
    dtype=np.float32,
    time_multiple: int = 1,
    width_multiple: int = 1,
    unique_multiple: int = 1,
) -> dict[str, np.ndarray]:
    """Pad the sentences `sentence_ids` into one batch (see module docstring for the arrays).

    `*_multiple` round T, F and U up so that fewer distinct shapes reach a compiled step.
    """
    sentence_ids = np.asarray(sentence_ids, dtype=np.int64)
    lengths = data.lengths[sentence_ids].astype(np.int32)
    n_seq = len(sentence_ids)
    time = _round_up(int(lengths.max()) if n_seq else 0, time_multiple)
    token_ids = ranges(data.offsets[sentence_ids], data.offsets[sentence_ids + 1])
    sub = data.rows[token_ids]
    row_nnz = np.diff(sub.indptr)
    width = _round_up(int(row_nnz.max()) if row_nnz.size else 0, width_multiple)
    flat = padded_from_csr(sub, width=width, dtype=dtype)
    # where each token goes in [B, T]
    seq_of = np.repeat(np.arange(n_seq), lengths)
    pos = np.arange(len(token_ids)) - np.repeat(np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    unique, inverse = np.unique(np.concatenate([[PAD_ID], flat.indices.ravel()]), return_inverse=True)
    local = inverse[1:].reshape(flat.indices.shape).astype(np.int32)
    n_unique = _round_up(len(unique), unique_multiple)
    feature_ids = np.full(n_unique, PAD_ID, dtype=np.int32)
    feature_ids[: len(unique)] = unique
    indices = np.zeros((n_seq, time, width), dtype=np.int32)
    values = np.zeros((n_seq, time, width), dtype=dtype)
    indices[seq_of, pos] = local
    values[seq_of, pos] = flat.values
    labels = np.zeros((n_seq, time), dtype=np.int32)
    if data.label_ids is not None:
        labels[seq_of, pos] = data.label_ids[token_ids]
    return {
        "indices": indices,
        "values": values,
        "feature_ids": feature_ids,
        "labels": labels,
        "lengths": lengths,
    }


def bucketed_batches(
    lengths: np.ndarray, batch_size: int, rng: np.random.Generator | None, max_tokens: int | None = None
) -> list[np.ndarray]:
    """Sentence ids grouped into batches of similar length; batch order shuffled by `rng`.

    Sentences are sorted by length (ties broken randomly when `rng` is given) and cut into
    consecutive batches of at most `batch_size` sentences and, given `max_tokens`, at most that
    many padded tokens (B × T_max; a sentence longer than that is a batch of its own), so padding
    is small and memory bounded by tokens; with `rng=None` the order is deterministic. The cuts
    depend only on the sorted lengths, so every epoch has `batch_count(...)` batches.
    """
    lengths = np.asarray(lengths)
    if rng is None:
        order = np.argsort(lengths, kind="stable")
    else:
        order = np.lexsort((rng.random(len(lengths)), lengths))
    batches = [order[a:b] for a, b in _cuts(lengths[order], batch_size, max_tokens)]
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def batch_count(lengths: np.ndarray, batch_size: int, max_tokens: int | None = None) -> int:
    """How many batches `bucketed_batches` makes of these sentences (the same for every `rng`)."""
    return len(_cuts(np.sort(np.asarray(lengths)), batch_size, max_tokens))


def _cuts(sorted_lengths: np.ndarray, max_sentences: int | None, max_tokens: int | None) -> list[tuple[int, int]]:
    """(start, stop) of consecutive batches of ascending `sorted_lengths`, greedily as large as
    allowed: at most `max_sentences` sentences and `max_tokens` padded tokens (B × the last,
    longest, length); a sentence longer than `max_tokens` alone."""
    count = len(sorted_lengths)
    cap = max_sentences or max(count, 1)
    if max_tokens is None:
        return [(a, min(a + cap, count)) for a in range(0, count, cap)]
    cuts, start = [], 0
    while start < count:
        stop = start + 1
        while stop < count and stop - start < cap and (stop + 1 - start) * sorted_lengths[stop] <= max_tokens:
            stop += 1
        cuts.append((start, stop))
        start = stop
    return cuts


def sequence_windows(length: int, max_tokens: int, overlap: int) -> np.ndarray:
    """Overlapping windows over a sequence of `length` tokens, for tagging it `max_tokens` at a time:
    int64 `[W, 4]` rows (start, stop, keep_start, keep_stop), token positions, stop exclusive.

    One window `[0, length)` when `length <= max_tokens`. Otherwise W windows of exactly
    `max_tokens` tokens, the first at 0, the last ending at `length`, starts spread evenly so
    that consecutive windows share at least 2·`overlap` tokens. The keep ranges partition
    `[0, length)`, cut in the middle of each shared part: a token is kept from the window where
    it is most central, with at least `overlap` tokens of its window on either side (or the
    sentence's own start or end). Needs 1 <= overlap and 2·overlap < max_tokens."""
    if not 1 <= overlap or 2 * overlap >= max_tokens:
        raise ValueError(f"windows need 1 <= overlap and 2 * overlap < max_tokens; got {overlap}, {max_tokens}")
    if length <= max_tokens:
        return np.array([[0, length, 0, length]], dtype=np.int64)
    stride = max_tokens - 2 * overlap
    count = 1 + -(-(length - max_tokens) // stride)
    starts = (np.arange(count, dtype=np.int64) * (length - max_tokens) + (count - 1) // 2) // (count - 1)
    stops = starts + max_tokens
    cuts = (starts[1:] + stops[:-1]) // 2  # the middle of each shared part
    keep_starts = np.concatenate([[0], cuts])
    keep_stops = np.concatenate([cuts, [length]])
    return np.stack([starts, stops, keep_starts, keep_stops], axis=1)


def token_batches(lengths: np.ndarray, max_tokens: int, max_sentences: int | None = None) -> list[np.ndarray]:
    """Sentence ids sorted by length, cut so that each padded batch (B × T_max) has at most
    `max_tokens` slots and at most `max_sentences` sentences (a longer sentence is a batch of its
    own): memory bounded by tokens, not by the number of sentences."""
    lengths = np.asarray(lengths)
    order = np.argsort(lengths, kind="stable")
    return [order[a:b] for a, b in _cuts(lengths[order], max_sentences, max_tokens)]


def batch_signature(dtype) -> dict:
    """`tf.TensorSpec`s of a batch with unknown sizes, so a compiled step traces once."""
    import tensorflow as tf

    return {
        "indices": tf.TensorSpec([None, None, None], tf.int32),
        "values": tf.TensorSpec([None, None, None], dtype),
        "feature_ids": tf.TensorSpec([None], tf.int32),
        "labels": tf.TensorSpec([None, None], tf.int32),
        "lengths": tf.TensorSpec([None], tf.int32),
    }
