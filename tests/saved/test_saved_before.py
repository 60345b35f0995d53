"""A model saved by an earlier gpseq (git 170423a: before the package's rooms were redrawn and
before column 0 counted a token's unseen features as k) loads and tags as that gpseq tagged it.

The fixture `tests/fixtures/saved_170423a/` holds the model directory that version wrote (the `ner`
preset on 40 sentences of the sample corpus) and what its `Tagger.tag` returned for two sentences,
one with a word it never saw; both were produced by that version's code, not by this one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from gpseq import Tagger

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "saved_170423a"
SENTENCES = [["The", "committee", "approved", "the", "zorblax", "budget", "."], ["Mills", "reported", "a", "loss", "."]]


def test_a_model_saved_before_tags_as_it_did(tmp_path):
    model = shutil.copytree(FIXTURE / "model", tmp_path / "model")  # loading never writes, but a copy is sure
    expected = json.loads((FIXTURE / "tagged.json").read_text(encoding="utf-8"))
    tagger = Tagger.load(model)
    assert tagger.featurizer.config.unseen_shared is False  # √k in column 0, as it was saved
    tagged = tagger.tag(SENTENCES)
    for got, want in zip(tagged, expected):
        assert list(got.label_set) == want["label_set"]
        assert list(got.labels) == want["labels"]
        np.testing.assert_allclose(np.asarray(got.probabilities), want["probabilities"], atol=2e-6)
