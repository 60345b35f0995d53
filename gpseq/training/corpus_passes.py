"""The training corpus read in passes: what `Tagger.train` needs of its sentences without holding
them, so that a corpus file of any size (`gpseq.corpora.CorpusFile`, read anew at each pass)
trains in the memory of its vocabulary, its dev split and the bounded objective
(`gpseq.training.chain_objective`).

A pass is one iteration of the corpus: `scan` (counts and checks), `split` (the dev sentences kept,
the others selected by position), the featurizer's fit (`Featurizer.fit` reads once, in blocks,
and `labelled` gathers the label set on the way), then the objective's blocks
(`gpseq.training.batching.SentenceBlocks`). A list is read the same way, for free.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from gpseq.corpora.types import UNLABELLED, Sentence
from gpseq.errors import GpseqError, InputFormatError

# the longest training sentence: one chain's forward–backward runs over all of its tokens at once, and
# past about 10^5 tokens the training's sums lose the precision they need (a model of NaN); a longer
# text is cut into sentences (or pieces) first
MAX_TRAIN_SENTENCE_TOKENS = 65_536


@dataclass
class CorpusScan:
    """One pass over a training corpus: its size, its first partially labelled sentence (None:
    every token labelled) and its number of `?` tokens."""

    sentences: int
    tokens: int
    partial: Sentence | None
    unlabelled_tokens: int


def scan(corpus: Iterable[Sentence]) -> CorpusScan:
    """Count `corpus` and check that every sentence has labels (GpseqError naming the first that
    has none, or an empty corpus), at most `MAX_TRAIN_SENTENCE_TOKENS` tokens (InputFormatError) and
    at most `saved.meta.MAX_LABELS` labels in all (ConfigError, before any array is sized by them)."""
    from gpseq.saved.meta import MAX_LABELS, check_label_count

    sentences = tokens = unlabelled = 0
    partial = None
    labels: set = set()
    for sentence in corpus:
        if sentence.labels is None:
            raise GpseqError(f"{sentence.source}:{sentence.line}: training sentence without labels")
        labels.update(sentence.labels)
        if len(labels) > MAX_LABELS + 1:  # (one of them may be the unlabelled mark)
            check_label_count(len(labels - {UNLABELLED}), sentence.source)
        if len(sentence) > MAX_TRAIN_SENTENCE_TOKENS:
            raise InputFormatError(sentence.source, sentence.line,
                                   f"a training sentence of {len(sentence):,} tokens; at most "
                                   f"{MAX_TRAIN_SENTENCE_TOKENS:,} train as one chain: split it into sentences")
        sentences += 1
        tokens += len(sentence)
        if UNLABELLED in sentence.labels:
            unlabelled += sentence.labels.count(UNLABELLED)
            partial = partial or sentence
    if not sentences:
        raise GpseqError("empty training corpus")
    return CorpusScan(sentences, tokens, partial, unlabelled)


class Selected:
    """The sentences of a re-iterable `corpus` at the positions where `keep [B]` is true, in corpus
    order, itself re-iterable (each iteration one pass over `corpus`); `sentences` and `tokens`
    counted beforehand."""

    def __init__(self, corpus: Iterable[Sentence], keep: np.ndarray | None, sentences: int, tokens: int):
        self.corpus, self.keep, self.sentences, self.n_tokens = corpus, keep, sentences, tokens

    def __len__(self) -> int:
        return self.sentences

    def __iter__(self) -> Iterator[Sentence]:
        seen = 0
        for sentence in self.corpus:
            if self.keep is None or (seen < len(self.keep) and self.keep[seen]):
                yield sentence
            seen += 1
        if self.keep is not None and seen != len(self.keep):  # a file edited between two passes
            raise GpseqError(f"{self.corpus}: the corpus changed while training read it "
                             f"({len(self.keep)} sentences, then {seen})")


def split(corpus: Iterable[Sentence], counted: CorpusScan, dev_ids: np.ndarray | None):
    """(the training part as `Selected`, the dev sentences `dev_ids` as a list) in one pass;
    `dev_ids` None: all of `corpus` trains and the dev list is empty."""
    if dev_ids is None:
        return Selected(corpus, None, counted.sentences, counted.tokens), []
    keep = np.ones(counted.sentences, dtype=bool)
    keep[dev_ids] = False
    dev = [sentence for sentence, kept in zip(corpus, keep) if not kept]
    return Selected(corpus, keep, int(keep.sum()), counted.tokens - sum(len(s) for s in dev)), dev


def labelled(corpus: Iterable[Sentence], labels: set) -> Iterator[Sentence]:
    """The sentences of `corpus`, adding their labels to `labels` as they pass."""
    for sentence in corpus:
        labels.update(sentence.labels)
        yield sentence
