"""`gpseq evaluate`: its JSON report against a hand count over `gpseq tag`'s output, CoNLL-U input,
the error and entity plots, where --plot may write, and the options and inputs it refuses before
tagging (a label column the features read, non-positive --samples, --bins below one)."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from helpers.cli import invoke, one_line, parse_conll_output, read_first_columns, sample, trained  # noqa: F401
from helpers.files import snapshot
from helpers.sample_models import models  # noqa: F401
from helpers.tiny_model import copy, corpus, model  # noqa: F401


def test_evaluate_json_and_reliability_png(trained, sample, tmp_path):
    model_dir, _ = trained
    png = tmp_path / "reliability.png"
    result = invoke("evaluate", model_dir, sample / "test.conll", "--json", "--mean", "--plot", png)
    assert result.exit_code == 0, result.stderr
    metrics = json.loads(result.stdout)
    tagged = invoke("tag", model_dir, sample / "test.conll", "--input-format", "conll", "--mean")
    predicted = [row[1] for s in parse_conll_output(tagged.stdout) for row in s]
    gold = [row[-1] for s in read_first_columns(sample / "test.conll") for row in s]
    assert metrics["n_tokens"] == len(gold)
    assert metrics["token_accuracy"] == pytest.approx(np.mean([g == p for g, p in zip(gold, predicted)]), abs=1e-12)
    assert 0.0 <= metrics["ece"] <= 1.0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = invoke("evaluate", model_dir, sample / "test.conll", "--mean")
    assert table.exit_code == 0 and "token_accuracy" in table.stdout


def test_evaluate_and_tag_read_conllu(trained, sample, tmp_path):
    """The same sentences as CoNLL-U (FORM and UPOS fields holding the token and the label) give the
    same metrics as the CoNLL file, by suffix or by --format; tag reads it too (--input-format auto)."""
    model_dir, _ = trained
    conllu = tmp_path / "test.conllu"
    lines = []
    for sentence in read_first_columns(sample / "test.conll"):
        lines += [f"{i}\t{row[0]}\t_\t{row[-1]}\t_\t_\t_\t_\t_\t_" for i, row in enumerate(sentence, 1)] + [""]
    conllu.write_text("\n".join(lines) + "\n", encoding="utf-8")
    unsuffixed = tmp_path / "test.ud"
    unsuffixed.write_bytes(conllu.read_bytes())
    want = json.loads(invoke("evaluate", model_dir, sample / "test.conll", "--json", "--mean").stdout)
    for args in ([conllu], [unsuffixed, "--format", "conllu"]):
        result = invoke("evaluate", model_dir, *args, "--json", "--mean")
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout) == want
    tagged = invoke("tag", model_dir, conllu, "--mean")
    assert [[row[0] for row in s] for s in parse_conll_output(tagged.stdout)] == [
        [row[0] for row in s] for s in read_first_columns(sample / "test.conll")]


def test_evaluate_target_error_and_entity_plots(trained, sample, tmp_path):
    model_dir, _ = trained
    png = tmp_path / "reliability.png"
    result = invoke("evaluate", model_dir, sample / "test.conll", "--json", "--plot", png, "--target-error", "0.01")
    assert result.exit_code == 0, result.stderr
    metrics = json.loads(result.stdout)
    for key in ("entity_ece", "entity_brier", "entity_ece_product", "entity_aurc", "entity_error_at_90",
                "error_at_80", "error_at_95", "abstain_threshold", "abstain_coverage"):
        assert key in metrics
    if metrics["abstain_threshold"] is not None:
        assert metrics["abstain_error"] <= 0.01
    for path in (png, tmp_path / "reliability-entities.png", tmp_path / "reliability-risk-coverage.png"):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the text report's threshold is the measured one to the last bit: passed to --abstain-below it
    # keeps exactly the tokens that were measured (a rounded one can keep others)
    text = invoke("evaluate", model_dir, sample / "test.conll", "--target-error", "0.05")
    assert text.exit_code == 0, text.stderr
    as_json = json.loads(invoke("evaluate", model_dir, sample / "test.conll", "--json", "--target-error", "0.05").stdout)
    printed = re.findall(r"--abstain-below (\S+) keeps", " ".join(text.stdout.split()))
    expected = [as_json[key] for key in ("abstain_threshold", "entity_abstain_threshold")
                if as_json.get(key) is not None]
    assert expected and [float(p) for p in printed] == expected


def test_evaluate_refuses_a_label_column_the_features_read(sample, tmp_path):
    """A `token label` file evaluated with a model whose features read column 1 (the chunking
    preset's POS column): column 1 is the gold label, so the features would see the answer (scores
    came out near perfect). Exit 2 naming the file; a file with the POS column evaluates."""
    small = tmp_path / "small.conll"
    blocks = (sample / "train.conll").read_text(encoding="utf-8").split("\n\n")[:40]
    small.write_text("\n\n".join(blocks) + "\n\n", encoding="utf-8")
    model_dir = tmp_path / "chunking"
    result = invoke("train", small, "-o", model_dir, "--features", "chunking", "--max-steps", "5")
    assert result.exit_code == 0, result.stderr
    two_columns = tmp_path / "two.conll"
    two_columns.write_text("".join(
        "\n".join(f"{line.split()[0]} {line.split()[-1]}" for line in block.splitlines()) + "\n\n"
        for block in (sample / "test.conll").read_text(encoding="utf-8").split("\n\n") if block.strip()))
    refused = invoke("evaluate", model_dir, two_columns, "--json")
    assert refused.exit_code == 2
    assert f"{two_columns}:1:" in one_line(refused) and "column 1" in one_line(refused)
    assert refused.stdout == ""
    accepted = invoke("evaluate", model_dir, sample / "test.conll", "--json")
    assert accepted.exit_code == 0, accepted.stderr


@pytest.mark.parametrize("samples", ["-2", "0"])
def test_evaluate_refuses_a_non_positive_samples_in_one_line(models, tmp_path, samples):
    """`gpseq evaluate --samples -2` ended in a TensorFlow traceback ("Dimension -2 must be >= 0") and
    exit 1; `--samples 0` silently used the model's default draws. Now one line and exit 4, as `tag`."""
    from typer.testing import CliRunner

    from gpseq import cli

    corpus = tmp_path / "test.conll"
    corpus.write_text("The DT B-NP\ncat NN I-NP\nsat VBD B-VP\n\n", encoding="utf-8")
    before = corpus.read_bytes()
    result = CliRunner().invoke(cli.app, ["evaluate", str(models["chunk"]), str(corpus), "--samples", samples])
    assert result.exit_code == 4, result.output
    lines = result.output.strip().splitlines()
    assert lines == [f"error: --samples must be in [1, 1,000] (Monte Carlo draws; memory grows with them); "
                     f"got {samples}"]
    assert corpus.read_bytes() == before


def test_evaluate_refuses_bins_below_one_before_tagging(models, tmp_path):
    """`--bins 0` failed only after the whole corpus was tagged, with "n_bins must be >= 1" (no option
    named); now at once, naming --bins."""
    from typer.testing import CliRunner

    from gpseq import cli

    corpus = tmp_path / "test.conll"
    corpus.write_text("The DT B-NP\ncat NN I-NP\n\n", encoding="utf-8")
    result = CliRunner().invoke(cli.app, ["evaluate", str(models["chunk"]), str(corpus), "--bins", "0"])
    assert result.exit_code == 4, result.output
    assert result.output.strip().splitlines() == ["error: --bins must be in [1, 10,000]; got 0"]


def test_evaluate_plot_never_replaces_a_pipe_and_writes_through_a_symlink(models, tmp_path):
    """`--plot` wrote by renaming a temporary file onto the path: a FIFO (or a device such as
    /dev/null) given there was replaced by a regular file, and a symlink by a file while its target
    kept the old image. Now a pipe or device is refused in one line before any work, and a symlink
    is written through (the link kept), as `-o` does."""
    import os
    import stat

    from typer.testing import CliRunner

    from gpseq import cli
    from gpseq.cli.outputs import PNG_SIGNATURE

    corpus = tmp_path / "test.conll"
    corpus.write_text("The DT B-NP\ncat NN I-NP\nsat VBD B-VP\n\n", encoding="utf-8")
    fifo = tmp_path / "fifo.png"
    os.mkfifo(fifo)
    result = CliRunner().invoke(cli.app, ["evaluate", str(models["chunk"]), str(corpus), "--plot", str(fifo)])
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        f"error: {fifo}: is not a regular file (a device or a pipe); --plot writes a PNG file there"]

    real = tmp_path / "images" / "real.png"
    real.parent.mkdir()
    real.write_bytes(PNG_SIGNATURE)  # an earlier (stub) image
    link = tmp_path / "link.png"
    link.symlink_to(real)
    result = CliRunner().invoke(cli.app, ["evaluate", str(models["chunk"]), str(corpus), "--plot", str(link)])
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_bytes().startswith(PNG_SIGNATURE) and real.stat().st_size > 1000


def test_evaluate_plot_never_overwrites_an_input_the_model_or_a_file_that_is_not_a_png(copy, corpus, tmp_path):
    model = copy()
    gold = tmp_path / "gold.conll"
    shutil.copyfile(corpus, gold)
    text = tmp_path / "notes.txt"
    text.write_text("not an image\n", encoding="utf-8")
    derived = tmp_path / "fig-entities.png"  # what --plot fig.png also writes, here a text file
    derived.write_text("not an image either\n", encoding="utf-8")
    cases = [(gold, f"error: {gold}: is the same file as the input {gold}"),
             (model / "arrays.npz", f"error: {model / 'arrays.npz'}: is inside the model directory"),
             (text, f"error: {text}: exists and is not a PNG image; refusing to overwrite it"),
             (tmp_path / "fig.png", f"error: {derived}: exists and is not a PNG image; refusing to overwrite it"),
             (tmp_path / "missing" / "x.png", f"error: {tmp_path / 'missing' / 'x.png'}: cannot be written: directory")]
    for plot, message in cases:
        before = snapshot(tmp_path)
        result = invoke("evaluate", model, gold, "--plot", plot)
        assert result.exit_code == 2, (plot, result.stderr)
        assert one_line(result).startswith(message), one_line(result)
        assert snapshot(tmp_path) == before
    written = tmp_path / "ok.png"
    for _ in range(2):  # a PNG, its own earlier output included, is replaced
        result = invoke("evaluate", model, gold, "--plot", written)
        assert result.exit_code == 0, result.stderr
        assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
