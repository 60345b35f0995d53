"""Taggers of the active-learning tests, trained on the bundled sample: `trained` (chunking features,
120 sentences, in memory), `saved` (token-only features, saved to disk, with a pool), `cli_model`
(trained by `gpseq train`, with a raw-text pool); and `run_select`, `gpseq select` in-process."""

from __future__ import annotations

import pytest

POOL_TEXT = ("The committee approved the new budget on Tuesday. Mills reported a loss in London.\n\n"
             "Harlow Mills said the plant in Essex would close. The budget was approved on Tuesday.\n\n"
             "Shares of Acme Corp rose sharply after the report. A second paragraph follows here.\n")


@pytest.fixture(scope="module")
def trained(sample_dir):
    from gpseq.corpora import read_conll
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger, TaggerConfig

    train = read_conll(sample_dir / "train.conll")
    return Tagger.train(train[:120], TaggerConfig(features=get_preset("chunking"))), train


@pytest.fixture(scope="module")
def saved(sample_dir, tmp_path_factory):
    """A small tagger of token-only features (raw text and JSON Lines pools feed it) saved to disk
    (each test loads its own copy), with a pool."""
    from gpseq.corpora import read_conll
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger, TaggerConfig

    train = read_conll(sample_dir / "train.conll")
    directory = tmp_path_factory.mktemp("saved") / "model"
    Tagger.train(train[:120], TaggerConfig(features=get_preset("ner"))).save(directory)
    return directory, train[120:220]


@pytest.fixture(scope="module")
def cli_model(sample_dir, tmp_path_factory):
    from typer.testing import CliRunner

    from gpseq.cli import app

    base = tmp_path_factory.mktemp("select")
    model = base / "model"
    result = CliRunner().invoke(app, ["train", str(sample_dir / "train.conll"), "-o", str(model), "--features", "ner"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    pool = base / "pool.txt"
    pool.write_text(POOL_TEXT, encoding="utf-8")
    return model, pool, base


def run_select(*args):
    from typer.testing import CliRunner

    from gpseq.cli import app

    return CliRunner().invoke(app, ["select", *map(str, args)], catch_exceptions=False)
