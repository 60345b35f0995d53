"""Tiny models trained on the bundled sample corpus: a POS tagger and a chunker that reads its POS
column (the models of a chain, a spaCy pipeline, `gpseq evaluate`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import SAMPLE


def train_sample_pos_and_chunker(base: Path, chunk_model) -> dict:
    """Tiny models trained on the bundled sample, saved under `base`: a POS tagger (column 1 as the
    label, `ModelConfig(kernel="linear")`) and a chunker (POS features, `chunk_model`). Returns their
    directories ("pos", "chunk") and taggers ("pos_tagger", "chunk_tagger"); skips without the sample."""
    from gpseq.corpora import Sentence, read_conll
    from gpseq.features import get_preset
    from gpseq.structured.model import ModelConfig
    from gpseq.tagger import Tagger, TaggerConfig
    from gpseq.training.trainer import TrainingConfig

    if not (SAMPLE / "train.conll").is_file():
        pytest.skip("the bundled sample corpus is absent")
    train = read_conll(SAMPLE / "train.conll")
    pos_train = [Sentence(s.tokens, [row[1] for row in s.columns], s.columns) for s in train]
    training = TrainingConfig(max_steps=15, early_stopping="none", dev_fraction=0.0, batch_size=32, seed=1)
    pos = Tagger.train(pos_train, TaggerConfig(features=get_preset("pos"), model=ModelConfig(kernel="linear"),
                                               training=training, predict_samples=4))
    chunk = Tagger.train(train, TaggerConfig(features=get_preset("chunking"), model=chunk_model,
                                             training=training, predict_samples=4))
    return {"pos": pos.save(base / "pos"), "chunk": chunk.save(base / "chunk"), "pos_tagger": pos,
            "chunk_tagger": chunk}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    """Tiny models trained on the bundled sample: a POS tagger (column 1) and a chunker (POS features)."""
    from gpseq.structured.model import ModelConfig

    return train_sample_pos_and_chunker(tmp_path_factory.mktemp("sample_models"), ModelConfig(kernel="linear"))
