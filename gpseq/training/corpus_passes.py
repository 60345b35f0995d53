"""The training corpus read in passes: what the training (`gpseq.training.train`) needs of its
sentences without holding them, so that a corpus file of any size (`gpseq.corpora.CorpusFile`,
read anew at each pass) trains in the memory of its vocabulary, its dev split and the bounded
objective (`gpseq.training.chain_objective`).

A pass is one iteration of the corpus: `scan` (counts and checks), `split` (the dev sentences kept,
the others selected by position), the featurizer's fit (`Featurizer.fit` reads once, in blocks,
and `labelled` gathers the label set on the way), then the objective's blocks
(`gpseq.training.batching.SentenceBlocks`). A list is read the same way, for free. `prepare` runs
the passes before the fit: the dev split, the featurizer and the label set.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from gpseq.corpora.types import UNLABELLED, Sentence
from gpseq.errors import ConfigError, GpseqError, InputFormatError

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


@dataclass
class PreparedCorpus:
    """A training corpus ready to fit: `train` (the sentences the fit runs on, re-iterable: a list or
    `Selected`), `dev` (the dev split carved from the corpus, the user's dev sentences, or None),
    the `featurizer` fitted on its vocabulary, the sorted `labels` and their `label_index`, and
    `counted` (the corpus's `scan`)."""

    train: Iterable[Sentence]
    dev: Sequence[Sentence] | None
    featurizer: object
    labels: list[str]
    label_index: dict[str, int]
    counted: CorpusScan


def prepare(corpus: Iterable[Sentence], config, dev: Sequence[Sentence] | None, method: str) -> PreparedCorpus:
    """The passes before the fit of a `TaggerConfig` by `method` ("laplace" or "svi"): `scan`; the dev
    split (`training.dev_fraction` of the corpus, at most `dev_max_sentences`, when no `dev` is given
    and the training uses one: calibration, or SVI's early stopping; none below 10 sentences, nor when
    it would take every labelled sentence of a partially annotated corpus); the featurizer's fit and
    the label set. Partial annotation (`?` tokens) needs "laplace" (ConfigError otherwise); a corpus
    of `?` only is a GpseqError."""
    from gpseq.features import Featurizer

    if isinstance(corpus, Iterator):  # read once: kept
        corpus = list(corpus)
    counted = scan(corpus)  # a list, or a corpus read in passes (`CorpusFile`)
    tcfg = config.training
    partial = counted.partial
    if partial is not None and method != "laplace":
        raise ConfigError(f"{partial.source}:{partial.line}: tokens labelled {UNLABELLED!r} (partial annotation) "
                          f"need the default training (method laplace); this configuration trains by {method}")
    wants_dev = tcfg.calibrate if method == "laplace" else tcfg.early_stopping != "none"
    dev_ids = None
    if dev is None and tcfg.dev_fraction > 0 and wants_dev and counted.sentences >= 10:
        from gpseq.corpora.splits import train_dev_split

        dev_ids = train_dev_split(counted.sentences, tcfg.dev_fraction, seed=tcfg.seed,
                                  max_dev=tcfg.dev_max_sentences)[1]
    train, held_out = split(corpus, counted, dev_ids)
    if dev_ids is not None and partial is not None and not any(
            label != UNLABELLED for sentence in train for label in sentence.labels):
        # a partially annotated corpus whose labelled sentences the dev split took, all of them:
        # nothing would be left to train on, so no dev split
        dev_ids = None
        train, held_out = split(corpus, counted, None)
    dev = held_out if dev_ids is not None else dev
    seen: set = set()
    # the vocabulary and the label set: of the training corpus, the dev split carved from it
    # included when the final weights train on it too (the default training refits on train +
    # dev, and cross-fits over both): a label or a feature of the user's training file is not
    # lost because the random dev split took the one sentence that has it. A --dev file of the
    # user's adds none (`cli.train.warn_dev_only_labels`).
    vocabulary = labelled(train, seen)
    if method == "laplace" and dev_ids is not None:
        from gpseq.training.prior_path import final_fit_sees_dev

        if final_fit_sees_dev(tcfg, counted.tokens):
            vocabulary = itertools.chain(vocabulary, labelled(dev, seen))
    featurizer = Featurizer(config.features).fit(vocabulary)
    labels = sorted(seen - {UNLABELLED})
    if not labels:
        raise GpseqError(f"{partial.source}: no labelled token in the training corpus (every label is "
                         f"{UNLABELLED!r})")
    return PreparedCorpus(train, dev, featurizer, labels, {label: i for i, label in enumerate(labels)}, counted)
