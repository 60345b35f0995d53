"""Active learning, reviewed: defects a user of `select` met, each pinned against an independent
expectation (a dead weak reference, a memory bound, the documented fields)."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest


@pytest.fixture(scope="module")
def saved(sample_dir, tmp_path_factory):
    """A small chunking tagger saved to disk (each test loads its own copy), with the pool."""
    from gpseq.corpora import read_conll
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger, TaggerConfig

    train = read_conll(sample_dir / "train.conll")
    directory = tmp_path_factory.mktemp("review") / "model"
    Tagger.train(train[:120], TaggerConfig(features=get_preset("chunking"))).save(directory)
    return directory, train[120:220]


def test_a_scored_model_is_freed_with_its_tagger(saved):
    """The compiled chain functions were cached under the model (a weak key) but closed over it: the
    cache kept every model a select had scored with alive for the life of the process (a loop of
    active-learning rounds grew by a model per round)."""
    from gpseq.active import score_sentences
    from gpseq.tagger import Tagger

    directory, pool = saved
    for strategy in ("entropy", "bald"):
        tagger = Tagger.load(directory)
        score_sentences(tagger, pool[:10], strategy)
        model = weakref.ref(tagger.model)
        del tagger
        gc.collect()
        assert model() is None, strategy
