"""`gpseq train`: the model directory it writes with the configuration asked for, --resume, what its
summary reports (the objective by name, the decoder it kept), labels only in --dev, and the inputs
it refuses (a label column the features read, standard input)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from helpers import SAMPLE
from helpers.cli import TRAIN_OPTIONS, invoke, one_line, read_first_columns, sample, trained  # noqa: F401
from helpers.files import snapshot
from helpers.tiny_model import TINY, corpus  # noqa: F401


def test_train_writes_model_with_the_requested_configuration(trained):
    model_dir, result = trained
    meta = json.loads((model_dir / "tagger.json").read_text())
    config = meta["config"]
    assert config["features"]["preset"] == "ner"
    assert config["model"]["num_inducing"] == 8
    assert config["training"]["max_steps"] == 8
    assert config["training"]["seed"] == 3
    assert config["training"]["batch_size"] == 32  # from --set
    assert config["predict_samples"] == 4  # from --set, a top-level key
    assert meta["scores"]["steps"] == 8
    assert (model_dir.with_name(model_dir.name + ".ckpt") / "checkpoint").is_dir()
    assert re.search(r"\bsteps\s+│\s+8\b", result.output), result.output  # the summary table
    gold = {row[-1] for sentence in read_first_columns(SAMPLE / "train.conll") for row in sentence}
    assert set(meta["labels"]) <= gold


@pytest.mark.slow
def test_train_resume_repeats_the_uninterrupted_run(sample, tmp_path):
    """4 steps, then --resume to 8, gives the parameters of 8 uninterrupted steps (no dev set, so
    no best-so-far restore can differ between the two)."""

    def train(model_dir, steps, *extra):
        options = list(TRAIN_OPTIONS)
        options[options.index("--max-steps") + 1] = str(steps)
        result = invoke("train", sample / "train.conll", "-o", model_dir, *options,
                        "--set", "training.dev_fraction=0", *extra)
        assert result.exit_code == 0, result.stderr
        return result

    ckpt = tmp_path / "ckpt"
    train(tmp_path / "resumed", 4, "--checkpoint-dir", ckpt)
    assert json.loads((ckpt / "checkpoint" / "state.json").read_text())["step"] == 4
    second = train(tmp_path / "resumed", 8, "--checkpoint-dir", ckpt, "--resume")
    assert re.search(r"\b8/8\b", second.stderr)  # the progress bar ends at 8 of 8 steps
    train(tmp_path / "straight", 8)
    assert json.loads((tmp_path / "resumed" / "tagger.json").read_text())["scores"]["steps"] == 8
    with np.load(tmp_path / "resumed" / "arrays.npz") as a, np.load(tmp_path / "straight" / "arrays.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for name in a.files:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-4, atol=1e-5, err_msg=name)  # float32 sums


def test_train_refuses_a_label_column_the_features_read(sample, tmp_path):
    """`gpseq train` on a `token label` file with the chunking preset (which reads column 1 as POS)
    would train on the gold labels as features (dev NLL near 0, a useless model): exit 2 naming the
    file and nothing written; the same for a --dev file; with word-only features it trains."""
    blocks = [b for b in (sample / "train.conll").read_text(encoding="utf-8").split("\n\n") if b.strip()][:40]
    two_columns = tmp_path / "two.conll"
    two_columns.write_text("".join("\n".join(f"{line.split()[0]} {line.split()[-1]}" for line in block.splitlines())
                                   + "\n\n" for block in blocks), encoding="utf-8")
    refused = invoke("train", two_columns, "-o", tmp_path / "m", "--features", "chunking")
    assert refused.exit_code == 2
    assert f"{two_columns}:1:" in one_line(refused) and "column 1" in one_line(refused)
    assert not (tmp_path / "m").exists()
    dev_refused = invoke("train", sample / "train.conll", "--dev", two_columns, "-o", tmp_path / "m2",
                         "--features", "chunking")
    assert dev_refused.exit_code == 2 and f"{two_columns}:1:" in one_line(dev_refused)
    words_only = invoke("train", two_columns, "-o", tmp_path / "m3", "--features", "pos")
    assert words_only.exit_code == 0, words_only.stderr


def test_default_training_reports_its_objective_by_name(tmp_path):
    """The default fit maximises a log posterior by L-BFGS: its progress and summary say so, not
    "ELBO" and "steps" (which name SVI's objective and Adam steps)."""
    corpus = tmp_path / "train.conll"
    corpus.write_text("".join(f"the\tD\n{w}\tN\nsat\tV\n\n" for w in ["cat", "dog", "yak", "zebu"] * 8))
    result = invoke("train", corpus, "-o", tmp_path / "m", "--features", "ner")
    assert result.exit_code == 0, result.stderr
    progress, summary = " ".join(result.stderr.split()), " ".join(result.stdout.split())
    assert "log posterior/token" in progress and "L-BFGS iterations" in summary
    assert "ELBO" not in progress + summary


def test_gpseq_train_reports_the_decoder_it_kept_with_both_held_out_scores(sample_dir, tmp_path):
    """The summary of the default `gpseq train` names the decoder the training kept (decode "auto")
    with the held-out score of each, as the saved model has them."""
    import json
    import re

    from typer.testing import CliRunner

    from gpseq import cli

    lines = (sample_dir / "train.conll").read_text(encoding="utf-8").split("\n\n")[:80]
    train = tmp_path / "train.conll"
    train.write_text("\n\n".join(lines) + "\n", encoding="utf-8")
    result = CliRunner().invoke(cli.app, ["train", str(train), "--features", "chunking", "-o", str(tmp_path / "m")],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "m" / "tagger.json").read_text())
    chosen, scores = meta["config"]["decode"], meta["scores"]["decode_scores"]
    assert chosen in ("viterbi", "max-marginal") and scores["metric"] == "chunk_f1"
    row = re.search(r"decoder \(dev\)\s+│\s+(\S+) \(chunk F1 ([\d.]+); (\S+) ([\d.]+)\)", result.output)
    assert row, result.output
    assert row.group(1) == chosen and row.group(3) == ({"viterbi", "max-marginal"} - {chosen}).pop()
    assert float(row.group(2)) == pytest.approx(scores[chosen], abs=6e-5)
    assert float(row.group(4)) == pytest.approx(scores[row.group(3)], abs=6e-5)


def test_labels_only_in_dev_are_named_in_one_warning(corpus, tmp_path):
    rows = corpus.read_text(encoding="utf-8").splitlines()
    changed = [row.rsplit(" ", 1)[0] + " B-ZZZ" if row.endswith(" B-NP") else row for row in rows[:40]]
    changed = [row.rsplit(" ", 1)[0] + " I-ZZZ" if row.endswith(" I-NP") else row for row in changed]
    assert any(r.endswith("B-ZZZ") for r in changed) and any(r.endswith("I-ZZZ") for r in changed)
    dev = tmp_path / "dev.conll"
    dev.write_text("\n".join(changed).rstrip("\n") + "\n\n", encoding="utf-8")
    result = invoke("train", corpus, "--dev", dev, "-o", tmp_path / "m", *TINY)
    assert result.exit_code == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: {dev}: label(s) not in the training corpus, which the model cannot predict "
                        "(they count as errors on dev): B-ZZZ I-ZZZ"], result.stderr
    result = invoke("train", corpus, "--dev", corpus, "-o", tmp_path / "m2", *TINY)
    assert result.exit_code == 0, result.stderr
    assert "warning:" not in result.stderr


def test_train_from_standard_input_is_a_one_line_error(corpus, tmp_path):
    before = snapshot(tmp_path)
    result = invoke("train", "-", "-o", tmp_path / "model", *TINY, input=corpus.read_text(encoding="utf-8"))
    assert result.exit_code == 2
    assert one_line(result) == ("error: -: training needs a file, not - (standard input): a corpus is read more "
                                "than once")
    assert snapshot(tmp_path) == before
