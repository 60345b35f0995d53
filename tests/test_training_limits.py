"""Training refuses a sentence too long to train as one chain, by name and line, before any work."""

from __future__ import annotations

import pytest

from test_cli import invoke
from test_robustness import snapshot

from gpseq.corpora.types import Sentence
from gpseq.errors import InputFormatError
from gpseq.training.corpus_passes import MAX_TRAIN_SENTENCE_TOKENS, scan


def test_train_refuses_a_sentence_over_the_limit_naming_its_line(tmp_path):
    corpus = tmp_path / "long.conll"
    n = MAX_TRAIN_SENTENCE_TOKENS + 1
    corpus.write_text("The\tO\ncat\tO\n\n" + "word\tO\n" * n)
    before = snapshot(tmp_path)
    result = invoke("train", corpus, "-o", tmp_path / "model", "--features", "ner")
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [f"error: {corpus}:4: a training sentence of {n:,} tokens; at most "
                     f"{MAX_TRAIN_SENTENCE_TOKENS:,} train as one chain: split it into sentences"]
    assert snapshot(tmp_path) == before  # no model, no lock, no temporary


def test_a_sentence_at_the_limit_is_accepted():
    at_limit = Sentence(tokens=["w"] * MAX_TRAIN_SENTENCE_TOKENS, labels=["O"] * MAX_TRAIN_SENTENCE_TOKENS)
    assert scan([at_limit]).tokens == MAX_TRAIN_SENTENCE_TOKENS
    with pytest.raises(InputFormatError, match="a training sentence of 65,537 tokens"):
        scan([Sentence(tokens=["w"] * (MAX_TRAIN_SENTENCE_TOKENS + 1), labels=["O"] * (MAX_TRAIN_SENTENCE_TOKENS + 1))])
