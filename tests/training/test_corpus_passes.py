"""Training from a corpus read in passes (`gpseq.corpora.CorpusFile`, `gpseq.training.corpus_passes`):
the same model as training from the list of its sentences, through the library and the command
line; the passes' counts, split and errors against direct computation; a sentence too long to
train as one chain is refused by name and line, before any work."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from typer.testing import CliRunner

from helpers import SAMPLE
from helpers.cli import invoke
from helpers.files import snapshot

from gpseq.corpora import CorpusFile, Sentence, read_conll
from gpseq.corpora.splits import train_dev_split
from gpseq.errors import GpseqError, InputFormatError
from gpseq.training import corpus_passes
from gpseq.training.corpus_passes import MAX_TRAIN_SENTENCE_TOKENS, scan


def _same_tagger(mine, reference) -> None:
    assert mine.labels == reference.labels
    assert mine.featurizer.feature_names() == reference.featurizer.feature_names()
    assert mine._state.keys() == reference._state.keys()
    for name, array in reference._state.items():
        np.testing.assert_array_equal(mine._state[name], array, err_msg=name)
    for key in ("train_sentences", "dev_sentences", "l1", "prior_variance", "calibration"):
        assert mine.scores[key] == reference.scores[key]


def test_training_from_a_corpus_file_equals_training_from_its_sentences():
    from gpseq.config import TaggerConfig
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger

    path = SAMPLE / "train.conll"
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    config = TaggerConfig(features=get_preset("chunking"))
    reference = Tagger.train(read_conll(path), config)
    mine = Tagger.train(CorpusFile(path), config)
    _same_tagger(mine, reference)
    assert mine.scores["train_sentences"] + mine.scores["dev_sentences"] == len(read_conll(path))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before  # read, never written


def test_gpseq_train_reads_a_large_file_in_passes_into_the_same_model(tmp_path, monkeypatch):
    import gpseq.cli as cli
    import gpseq.cli.train as train_command
    from gpseq.tagger import Tagger

    runner = CliRunner()
    models = {}
    for name, limit in (("whole", 1 << 40), ("passes", 0)):  # every file is "large" at 0 bytes
        monkeypatch.setattr(train_command, "STREAM_BYTES", limit)
        result = runner.invoke(cli.app, ["train", str(SAMPLE / "train.conll"), "--features", "chunking",
                                         "-o", str(tmp_path / name)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        models[name] = Tagger.load(tmp_path / name)
    _same_tagger(models["passes"], models["whole"])


def test_scan_counts_and_refuses_unlabelled_or_empty_corpora(tmp_path):
    sentences = read_conll(SAMPLE / "dev.conll")
    partial = Sentence(["a", "b", "c"], ["B-NP", "?", "?"], source="p.conll", line=7)
    counted = corpus_passes.scan([*sentences, partial])
    assert counted.sentences == len(sentences) + 1
    assert counted.tokens == sum(len(s.tokens) for s in sentences) + 3
    assert counted.partial is partial and counted.unlabelled_tokens == 2
    assert corpus_passes.scan(sentences).partial is None
    with pytest.raises(GpseqError, match=r"^raw\.txt:4: training sentence without labels$"):
        corpus_passes.scan([sentences[0], Sentence(["x"], None, source="raw.txt", line=4)])
    with pytest.raises(GpseqError, match="empty training corpus"):
        corpus_passes.scan([])
    empty = tmp_path / "empty.conll"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(InputFormatError, match="no sentences in the file"):
        corpus_passes.scan(CorpusFile(empty))


def test_split_keeps_the_dev_sentences_and_selects_the_rest_in_order():
    corpus = CorpusFile(SAMPLE / "dev.conll")
    sentences = list(corpus)
    counted = corpus_passes.scan(corpus)
    train_ids, dev_ids = train_dev_split(counted.sentences, 0.25, seed=5)
    train, dev = corpus_passes.split(corpus, counted, dev_ids)
    assert [s.tokens for s in dev] == [sentences[i].tokens for i in dev_ids]
    assert [s.tokens for s in train] == [sentences[i].tokens for i in train_ids]
    assert [s.tokens for s in train] == [s.tokens for s in train]  # re-iterable: a pass each time
    assert len(train) == len(train_ids) and train.n_tokens == sum(len(sentences[i]) for i in train_ids)
    everything, none = corpus_passes.split(sentences, counted, None)
    assert list(everything) == sentences and none == [] and everything.n_tokens == counted.tokens
    seen: set = set()
    assert list(corpus_passes.labelled(sentences, seen)) == sentences
    assert seen == {label for s in sentences for label in s.labels}


def test_the_dev_split_is_capped_at_dev_max_sentences():
    from gpseq.config import TaggerConfig
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger

    sentences = read_conll(SAMPLE / "train.conll")
    config = TaggerConfig(features=get_preset("chunking"))
    config.training.dev_max_sentences = 7
    config.training.cross_fit_tokens = 0  # the dev split itself calibrates
    tagger = Tagger.train(CorpusFile(SAMPLE / "train.conll"), config)
    assert tagger.scores["dev_sentences"] == 7 < round(0.1 * len(sentences))
    assert tagger.scores["train_sentences"] == len(sentences) - 7
    config.training.dev_max_sentences = 0
    with pytest.raises(Exception, match="dev_max_sentences"):
        config.validate()


def test_a_corpus_file_edited_between_passes_is_refused(tmp_path):
    path = tmp_path / "train.conll"
    path.write_text((SAMPLE / "dev.conll").read_text(encoding="utf-8"), encoding="utf-8")
    corpus = CorpusFile(path)
    counted = corpus_passes.scan(corpus)
    train, _ = corpus_passes.split(corpus, counted, np.array([0, 2]))
    assert len(list(train)) == counted.sentences - 2
    with path.open("a", encoding="utf-8") as handle:  # a sentence appended by someone else
        handle.write("\nextra NN O B-NP\n")
    with pytest.raises(GpseqError, match="the corpus changed while training read it"):
        list(train)


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
