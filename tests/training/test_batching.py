"""Batches of the training (gpseq/training/batching.py): token-bounded batches of the default
training and of SVI, long sentences cut into pieces, the windows of prediction, a corpus featurised
a block at a time; and the peak memory of `gpseq train` on one 10,000-token sentence."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from helpers import ROOT, SAMPLE
from helpers.laplace import sample_problem
from helpers.peak_rss import PEAK_RSS_BOUND_MB, peak_rss_mb
from helpers.tiny_model import corpus  # noqa: F401

from gpseq.training.batching import token_batches
from gpseq.training.chain_objective import NumpyChainObjective


def test_token_batches_bound_the_padded_size():
    lengths = np.array([3, 50, 7, 7, 1, 20, 2, 9])
    for max_sentences in (None, 2):
        batches = token_batches(lengths, 20, max_sentences)
        assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
        for ids in batches:
            assert len(ids) == 1 or len(ids) * lengths[ids].max() <= 20
            assert max_sentences is None or len(ids) <= max_sentences


def test_sentence_blocks_featurise_the_corpus_as_a_whole_transform_does():
    """The default training featurises its corpus a block at a time (`SentenceBlocks`): the blocks,
    concatenated, are the whole corpus's matrix and labels, and the objective is the same."""
    from gpseq.training.batching import SentenceBlocks
    from gpseq.training.prior_path import concatenate

    sentences, featurizer, labels, data_of = sample_problem()
    whole = data_of(sentences)
    blocks = SentenceBlocks(sentences, data_of, size=7)
    assert len(blocks) == len(sentences) and blocks.n_tokens == whole.n_tokens == sum(map(len, sentences))
    assert len(list(blocks)) == -(-len(sentences) // 7)
    joined = concatenate(blocks)
    np.testing.assert_array_equal(joined.rows.toarray(), whole.rows.toarray())
    np.testing.assert_array_equal(joined.offsets, whole.offsets)
    np.testing.assert_array_equal(joined.label_ids, whole.label_ids)
    V = len(labels)
    mine, reference = NumpyChainObjective(blocks, V, dtype="float64"), NumpyChainObjective(whole, V, dtype="float64")
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(mine.support, reference.support)
    b, p, w = rng.normal(size=V), rng.normal(size=(V, V)), rng.normal(size=len(reference.support))
    for a, e in zip(mine.value_and_grad(b, w, p), reference.value_and_grad(b, w, p)):
        np.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-10)


@pytest.mark.parametrize("max_tokens, overlap", [(5, 1), (7, 3), (10, 2), (200, 50), (1000, 50)])
def test_sequence_windows_cover_every_token_once_with_context(max_tokens, overlap):
    """For every length up to a few windows: windows of exactly max_tokens tokens inside the sentence,
    consecutive ones sharing >= 2·overlap tokens; the keep ranges partition the sentence in order, and
    every kept token has >= overlap tokens of its window on each side unless the sentence ends there."""
    from gpseq.training.batching import sequence_windows

    for length in list(range(1, 4 * max_tokens)) + [50_000]:
        windows = sequence_windows(length, max_tokens, overlap)
        starts, stops, keep_starts, keep_stops = windows.T
        if length <= max_tokens:
            assert windows.tolist() == [[0, length, 0, length]]
            continue
        assert (stops - starts == max_tokens).all() and starts[0] == 0 and stops[-1] == length
        assert (stops[:-1] - starts[1:] >= 2 * overlap).all(), (length, windows)
        assert keep_starts[0] == 0 and keep_stops[-1] == length and (keep_starts[1:] == keep_stops[:-1]).all()
        kept = np.concatenate([np.arange(a, b) for a, b in zip(keep_starts, keep_stops)])
        assert (kept == np.arange(length)).all()
        for start, stop, keep_start, keep_stop in windows:
            assert keep_start < keep_stop
            assert start == 0 or keep_start - start >= overlap, (length, windows)
            assert stop == length or stop - keep_stop >= overlap, (length, windows)


@pytest.mark.parametrize("max_tokens", [None, 1, 40, 100, 10_000])
def test_bucketed_batches_capped_by_tokens(max_tokens):
    """Over random corpora: every sentence once per epoch; at most batch_size sentences and (given
    max_tokens) at most max_tokens padded tokens a batch, a longer sentence alone; lengths sorted
    into consecutive runs; as many batches as batch_count for every rng; with no cap, the
    same batches as cutting the sorted order every batch_size sentences."""
    from gpseq.training.batching import batch_count, bucketed_batches

    rng = np.random.default_rng(14)
    for trial in range(40):
        lengths = rng.integers(1, 60, size=rng.integers(1, 80))
        batch_size = int(rng.integers(1, 12))
        counts = set()
        for seed in range(3):
            batches = bucketed_batches(lengths, batch_size, np.random.default_rng(seed), max_tokens=max_tokens)
            counts.add(len(batches))
            assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
            for ids in batches:
                padded = len(ids) * lengths[ids].max()
                assert len(ids) <= batch_size
                assert max_tokens is None or padded <= max_tokens or len(ids) == 1, (lengths[ids], max_tokens)
        # unshuffled (rng None): consecutive runs of the sorted lengths, each as long as the limits allow
        ordered = bucketed_batches(lengths, batch_size, None, max_tokens=max_tokens)
        flat = np.sort(lengths)
        assert np.array_equal(lengths[np.concatenate(ordered)], flat)
        position = 0
        for ids in ordered:
            position += len(ids)
            if position < len(flat) and len(ids) < batch_size:
                assert max_tokens is not None and (len(ids) + 1) * flat[position] > max_tokens
        assert counts == {batch_count(lengths, batch_size, max_tokens)}
        if max_tokens is None:
            want = [np.sort(lengths)[i:i + batch_size].tolist() for i in range(0, len(lengths), batch_size)]
            got = sorted((np.sort(lengths[ids]).tolist() for ids in batches), key=lambda x: (x[0], x[-1], len(x)))
            assert got == sorted(want, key=lambda x: (x[0], x[-1], len(x)))


def test_cut_long_pieces_concatenate_to_the_sentence():
    """Sentences longer than max_tokens become ceil(T / max_tokens) consecutive pieces of nearly
    equal length, at most max_tokens each, whose rows and labels concatenate to the sentence's;
    shorter sentences are kept whole and in order."""
    import scipy.sparse as sp

    from gpseq.training.batching import SequenceData

    rng = np.random.default_rng(3)
    lengths = np.array([5, 23, 1, 8, 17, 9])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    rows = sp.csr_matrix(rng.integers(0, 3, size=(offsets[-1], 7)))
    labels = rng.integers(0, 4, size=offsets[-1]).astype(np.int32)
    data = SequenceData(rows, offsets, labels)
    assert data.cut_long(23) is data
    cut = data.cut_long(8)
    want_pieces = [1, 3, 1, 1, 3, 2]
    assert len(cut) == sum(want_pieces)
    assert cut.lengths.max() <= 8 and cut.lengths.max() - cut.lengths.min() <= 8
    assert (cut.rows != rows).nnz == 0 and np.array_equal(cut.label_ids, labels)  # same tokens, same order
    piece = 0
    for length, count in zip(lengths, want_pieces):
        parts = cut.lengths[piece:piece + count]
        assert parts.sum() == length and parts.max() - parts.min() <= 1
        piece += count


def test_svi_training_batches_are_capped_by_tokens(corpus, monkeypatch):
    """SVI on the tiny corpus plus one 700-token sentence, training.batch_tokens 128: every batch that
    reaches the training step holds at most 128 padded tokens and batch_size sentences, and one epoch
    covers every training token exactly once (the long sentence in pieces)."""
    import gpseq.training.distribute as distribute
    from gpseq.corpora import Sentence, read_conll
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger, TaggerConfig
    from gpseq.training.trainer import TrainingConfig

    train = read_conll(corpus)
    long = Sentence(([t for s in train for t in s.tokens] * 3)[:700], ([l for s in train for l in s.labels] * 3)[:700])
    assert len(long.tokens) == 700
    shapes = []
    real_make_batch = distribute.make_batch

    def make_batch(data, ids, **kwargs):
        batch = real_make_batch(data, ids, **kwargs)
        shapes.append((*batch["labels"].shape, int(batch["lengths"].sum())))  # B, T, real tokens
        return batch

    monkeypatch.setattr(distribute, "make_batch", make_batch)
    training = TrainingConfig(method="svi", batch_size=8, batch_tokens=128, epochs=1, dev_fraction=0.0,
                              early_stopping="none", checkpoint_every=0, seed=3)
    tagger = Tagger.train(train + [long], TaggerConfig(features=get_preset("ner"), training=training))
    assert tagger.scores["steps"] == len(shapes)
    assert max(B * T for B, T, _ in shapes) <= 128 and max(B for B, _, _ in shapes) <= 8
    assert sum(tokens for *_, tokens in shapes) == sum(len(s.tokens) for s in train) + 700


@pytest.mark.slow
@pytest.mark.parametrize("method", ["default", "svi"])
def test_peak_rss_training_on_one_10k_token_sentence(tmp_path, method):
    """`gpseq train` on a corpus of one 10,000-token sentence (3.15 GB before): under the bound, a
    model saved (SVI: pieces of batch_tokens; the default training: its own token-bounded batches)."""
    rows = [line for line in (SAMPLE / "train.conll").read_text(encoding="utf-8").splitlines() if line.strip()]
    path = tmp_path / "one.conll"
    path.write_text("\n".join(rows[i % len(rows)] for i in range(10_000)) + "\n\n", encoding="utf-8")
    extra = ["--set", "training.method=svi"] if method == "svi" else []
    out = tmp_path / "model"
    code, peak, stderr = peak_rss_mb([sys.executable, ROOT / "cli.py", "train", path, "-o", out, "--features", "ner",
                                       "--max-steps", "2", *extra])
    assert code == 0, stderr
    print(f"peak RSS training ({method}) on one 10k-token sentence: {peak:.0f} MB")
    assert peak < PEAK_RSS_BOUND_MB
    assert (out / "tagger.json").is_file()
