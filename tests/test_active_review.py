"""Active learning, reviewed: defects a user of `select` met, each pinned against an independent
expectation (a dead weak reference, a memory bound, the documented fields)."""

from __future__ import annotations

import gc
import json
import weakref

import numpy as np
import pytest


@pytest.fixture(scope="module")
def saved(sample_dir, tmp_path_factory):
    """A small tagger of token-only features (raw text and JSON Lines pools feed it) saved to disk
    (each test loads its own copy), with a pool."""
    from gpseq.corpora import read_conll
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger, TaggerConfig

    train = read_conll(sample_dir / "train.conll")
    directory = tmp_path_factory.mktemp("review") / "model"
    Tagger.train(train[:120], TaggerConfig(features=get_preset("ner"))).save(directory)
    return directory, train[120:220]


def test_a_scored_model_is_freed_with_its_tagger(saved):
    """The compiled chain functions were cached under the model (a weak key) but closed over it: the
    cache kept every model a select had scored with alive for the life of the process (a loop of
    active-learning rounds grew by a model per round)."""
    from gpseq.active.selection import score_sentences
    from gpseq.tagger import Tagger

    directory, pool = saved
    for strategy in ("entropy", "bald"):
        tagger = Tagger.load(directory)
        score_sentences(tagger, pool[:10], strategy)
        model = weakref.ref(tagger.model)
        del tagger
        gc.collect()
        assert model() is None, strategy


def test_sequence_level_memory_grows_linearly_with_the_draws():
    """Sequence BALD / entropy scored every sampled path (R · paths of them) under every chain (R)
    at once, an array of R² · paths · B · T: --samples 128 --level sequence held ~3.5 GB more than
    --level token for a batch. Its peak now grows with R as the chains themselves do; the scores
    are the same (the same paths, each under every chain)."""
    import tracemalloc

    from gpseq.active.acquisition import chain_scores
    from gpseq.structured.spans import ChainPosterior

    def peak(R):
        rng = np.random.default_rng(0)
        B, T, V = 4, 60, 3
        posterior = ChainPosterior(rng.normal(size=(R, B, T, V)), rng.normal(size=(R, V, V)), np.full(B, T),
                                   np.full(R, 1.0 / R))
        posterior.log_z  # the forward-backward tables are the chains' own memory, not the score's
        tracemalloc.start()
        scores = chain_scores(posterior, "bald", level="sequence", paths=8, rng=np.random.default_rng(1))["sum"]
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top, scores

    small, _ = peak(32)
    large, scores = peak(64)
    assert np.all(np.isfinite(scores))
    assert large / small < 2.5  # linear in R: 2 (quadratic: 4)


def test_tool_outputs_keep_small_scores():
    """Prodigy's meta score and Label Studio's gpseq_score and prediction score were rounded to 6
    decimals: a BALD score of a confident model (1e-6 and below) and P(labels | X) of a long sentence
    came out 0.0 for every task, their order lost. They keep 6 significant digits."""
    from types import SimpleNamespace

    from gpseq.active.annotation import labelstudio_task, prodigy_task
    from gpseq.active.selection import Selected
    from gpseq.corpora.types import Sentence

    sentence = Sentence(tokens=["Acme", "rose", "."])
    tagged = SimpleNamespace(tokens=sentence.tokens, labels=["B-NP", "B-VP", "O"], confidences=[0.9, 0.8, 1.0],
                             spans=[("NP", 0, 1, 3.5e-8), ("VP", 1, 2, 0.75)], sequence_log_prob=-30.0)
    item = Selected(0, sentence, 3.25e-9, tagged)
    task = prodigy_task(item, 1, "bald", "iob2")
    assert task["meta"]["score"] == pytest.approx(3.25e-9, rel=1e-5)
    assert [span["score"] for span in task["spans"]] == pytest.approx([3.5e-8, 0.75], rel=1e-5)
    task = labelstudio_task(item, 1, "bald", "iob2", model_version="m")
    assert task["data"]["gpseq_score"] == pytest.approx(3.25e-9, rel=1e-5)
    assert task["predictions"][0]["score"] == pytest.approx(np.exp(-30.0), rel=1e-5)
    assert [r["value"]["score"] for r in task["predictions"][0]["result"]] == pytest.approx([3.5e-8, 0.75], rel=1e-5)


def test_random_order_does_not_depend_on_the_chunk_size(saved):
    """--chunk-size only bounds memory (its help says so), but the random strategy drew each chunk's
    order from a stream seeded by the chunk's number: the same seed picked other sentences at
    --chunk-size 7 than at the default. One stream over the pool now draws a key per sentence."""
    from gpseq.tagger import Tagger

    directory, pool = saved
    tagger = Tagger.load(directory)
    picks = {size: [p.index for p in tagger.select(pool, 20, "random", seed=5, chunk_size=size, tag=False)]
             for size in (7, 64, 2048)}
    assert len(set(picks[2048])) == 20
    assert picks[7] == picks[64] == picks[2048]


def test_label_studio_model_version_names_the_model_given_as_dot(saved, tmp_path, monkeypatch):
    """model_version defaults to the model directory's name, but `gpseq select . pool` (run inside
    the model directory) wrote "" (Path(".").name): every round's predictions under one blank version."""
    from typer.testing import CliRunner

    from gpseq.cli import app

    directory, _ = saved
    pool = tmp_path / "pool.conll"
    pool.write_text("Shares NNS\nrose VBD\n. .\n", encoding="utf-8")
    out = tmp_path / "tasks.json"
    monkeypatch.chdir(directory)
    result = CliRunner().invoke(app, ["select", ".", str(pool), "-n", "1", "--format", "labelstudio", "-o", str(out)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text(encoding="utf-8"))[0]["predictions"][0]["model_version"] == directory.name


def test_select_conll_output_refuses_a_docstart_token(saved, tmp_path):
    """A pool token spelled -DOCSTART- (raw text or a JSON Lines pool may hold one) was written as a
    row starting with it, which the CoNLL reader takes as a document separator: the picked file read
    back without that token, and trained so. Now exit 2 naming the pool line, nothing written (as
    gpseq's own CoNLL writer refuses it); --format jsonl carries it."""
    from typer.testing import CliRunner

    from gpseq.cli import app

    directory, _ = saved
    pool = tmp_path / "pool.jsonl"
    pool.write_text('{"tokens": ["Shares", "rose", "."]}\n{"tokens": ["-DOCSTART-", "is", "a", "token", "."]}\n',
                    encoding="utf-8")
    out = tmp_path / "picked.conll"

    def run(*args):
        return CliRunner().invoke(app, ["select", str(directory), str(pool), "-n", "2", "--strategy", "random", *args],
                                  catch_exceptions=False)

    result = run("-o", str(out))
    assert result.exit_code == 2, result.output
    assert f"{pool}:2: token 1: a row starting with -DOCSTART-" in result.output
    assert not out.exists()
    result = run("--format", "jsonl")
    assert result.exit_code == 0
    assert sorted(json.loads(line)["tokens"][0] for line in result.stdout.splitlines()) == ["-DOCSTART-", "Shares"]


def test_select_command_takes_candidates(saved, tmp_path):
    """When the best N x candidates sentences are near-duplicates of each other, fewer than N are
    picked and the warning says to raise candidates, which the command had no option for."""
    from typer.testing import CliRunner

    from gpseq.cli import app

    directory, _ = saved
    long = ("The committee of the city council approved the new budget for the schools and the roads on "
            "Tuesday after a long debate about {}")
    short = ["Acme rose .", "Mills fell .", "Prices held .", "Harlow sold .", "Essex grew .", "Bonds slid .",
             "Oil jumped .", "Gold eased ."]
    pool = tmp_path / "pool.txt"
    pool.write_text("\n\n".join([long.format(word) for word in "taxes parks fees rates art jobs ports buses".split()]
                                + short) + "\n", encoding="utf-8")

    def picked(*args):
        result = CliRunner().invoke(app, ["select", str(directory), str(pool), "-n", "2", "--strategy", "entropy",
                                          "--format", "jsonl", *args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return [json.loads(line)["tokens"] for line in result.stdout.splitlines()]

    assert len(picked()) == 1  # the 8 best (2 x 4) are the near-duplicate long sentences
    more = picked("--candidates", "8")
    assert len(more) == 2 and len(more[0]) > 20 and len(more[1]) == 3


def test_select_refuses_a_seed_it_cannot_use(saved, tmp_path):
    """--seed -1 ended in a NumPy traceback (exit 1, "expected non-negative integer") after the model
    was loaded; --seed 4294967296 silently drew the same posterior samples as --seed 0 (the draws'
    seed is an int32). Both are now a one-line configuration error (exit 4)."""
    from typer.testing import CliRunner

    from gpseq.cli import app

    directory, _ = saved
    pool = tmp_path / "pool.txt"
    pool.write_text("Shares of Acme rose sharply.\n", encoding="utf-8")
    for seed in ("-1", str(2**32)):
        result = CliRunner().invoke(app, ["select", str(directory), str(pool), "-n", "1", "--seed", seed])
        assert result.exit_code == 4, (seed, result.output)
        assert f"error: seed must be in [0, 2**31), got {seed}" in result.output
