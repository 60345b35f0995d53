"""`gpseq select`: its CoNLL output trains with --init and reads back as the pool's tokens (or is
refused naming the pool line), JSON Lines carries the scores, --candidates, and a seed it cannot use."""

from __future__ import annotations

import json

from helpers.active import cli_model, run_select, saved  # noqa: F401


def test_select_conll_output_trains_with_init_and_jsonl_carries_the_scores(cli_model):
    from typer.testing import CliRunner

    from gpseq.cli import app
    from gpseq.corpora import read_conll

    model, pool, base = cli_model
    picked = base / "picked.conll"
    result = run_select(model, pool, "-n", 4, "--strategy", "entropy", "--level", "sequence", "-o", picked)
    assert result.exit_code == 0, result.output
    sentences = read_conll(picked)
    assert len(sentences) == 4 and all(len(s.columns[0]) == 2 for s in sentences)
    assert picked.read_text(encoding="utf-8").startswith("-DOCSTART- rank=1 score=")
    record = json.loads(run_select(model, pool, "-n", 1, "--format", "jsonl").stdout.splitlines()[0])
    assert record["select"]["rank"] == 1 and record["select"]["strategy"] == "entropy"  # the default
    result = CliRunner().invoke(app, ["train", str(picked), "-o", str(base / "round1"), "--features", "ner",
                                      "--init", str(model)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    bad = run_select(model, pool, "-n", 2, "--strategy", "oracle")
    assert bad.exit_code == 4 and "--strategy" in bad.output


def test_select_conll_output_reads_back_as_the_pool_tokens(cli_model):
    """--format conll writes the pool's columns space-separated: a token with a space (a JSON Lines
    or CoNLL-U pool may hold one, e.g. "New York") made a file that reads back with other columns or
    not at all: exit 2 naming the pool line, nothing written. A CoNLL-U pool's rows start with the
    word ID: a warning says to train with --token-column 1 (it trained on the IDs as tokens)."""
    model, _, base = cli_model
    pool = base / "pool.jsonl"
    pool.write_text('{"tokens": ["Shares", "rose", "."]}\n{"tokens": ["She", "moved", "to", "New York", "."]}\n',
                    encoding="utf-8")
    out = base / "picked-space.conll"
    out.write_text("kept\n", encoding="utf-8")
    result = run_select(model, pool, "-n", 2, "--strategy", "random", "-o", out)
    assert result.exit_code == 2
    assert f"{pool}:2: token 4: field 'New York' is empty or holds white space" in result.output
    assert out.read_text(encoding="utf-8") == "kept\n"
    assert run_select(model, pool, "-n", 2, "--strategy", "random", "--format", "jsonl").exit_code == 0
    conllu = base / "pool.conllu"
    conllu.write_text("".join(
        "".join(f"{i}\t{word}\t{word.lower()}\tX\t_\t_\t0\tdep\t_\t_\n" for i, word in enumerate(words, start=1)) + "\n"
        for words in (["Shares", "rose", "."], ["She", "moved", "to", "Paris", "."])), encoding="utf-8")
    picked = base / "picked-conllu.conll"
    result = run_select(model, conllu, "-n", 2, "--strategy", "random", "-o", picked)
    assert result.exit_code == 0, result.output
    assert f"warning: {picked}: the tokens are column 1 of these lines" in result.output
    assert "--token-column 1" in result.output
    from gpseq.corpora import read_conll

    assert sorted(s.tokens for s in read_conll(picked, token_column=1)) == [["Shares", "rose", "."],
                                                                            ["She", "moved", "to", "Paris", "."]]


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
