"""The command-line app: `python cli.py --help` from the checkout, and user errors as one line on
stderr with the documented exit codes (2: a file, 3: a model directory, 4: the configuration)."""

from __future__ import annotations

import json
import shutil
import sys

from helpers.cli import invoke, one_line, run, sample, text_file, trained  # noqa: F401


def test_python_cli_py_help_from_checkout():
    result = run(sys.executable, "cli.py", "--help")
    assert result.returncode == 0, result.stderr
    for command in ("train", "tag", "evaluate", "info", "corpus"):
        assert command in result.stdout
    assert "Exit codes" in result.stdout


def test_missing_training_file_is_exit_2_naming_the_path(tmp_path):
    missing = tmp_path / "nope.conll"
    result = invoke("train", missing, "-o", tmp_path / "m")
    assert result.exit_code == 2
    assert str(missing) in one_line(result)


def test_missing_model_directory_is_exit_2(tmp_path, text_file):
    result = invoke("tag", tmp_path / "no-model", text_file)
    assert result.exit_code == 2
    assert "no-model" in one_line(result)


def test_malformed_corpus_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.conll"
    bad.write_text("The DT B-NP\ncat NN I-NP\nsat VBD\n\n", encoding="utf-8")
    result = invoke("train", bad, "-o", tmp_path / "m", "--features", "ner")
    assert result.exit_code == 2
    assert f"{bad}:3:" in one_line(result)


def test_bad_encoding_names_file_and_line(tmp_path):
    bad = tmp_path / "latin.conll"
    bad.write_bytes("a DT B-NP\n\nb NN B-NP\ncaf\xe9 NN I-NP\n".encode("latin-1"))
    result = invoke("train", bad, "-o", tmp_path / "m", "--features", "ner")
    assert result.exit_code == 2
    assert f"{bad}:4:" in one_line(result)


def test_newer_model_format_is_exit_3(trained, tmp_path, text_file):
    copy = tmp_path / "future-model"
    shutil.copytree(trained[0], copy)
    meta = json.loads((copy / "tagger.json").read_text())
    meta["format_version"] = meta["format_version"] + 1
    (copy / "tagger.json").write_text(json.dumps(meta))
    result = invoke("tag", copy, text_file)
    assert result.exit_code == 3
    assert "newer" in one_line(result)
    assert invoke("info", copy).exit_code == 3


def test_directory_without_tagger_json_is_exit_3(tmp_path, text_file):
    (tmp_path / "empty").mkdir()
    result = invoke("tag", tmp_path / "empty", text_file)
    assert result.exit_code == 3
    assert "tagger.json" in one_line(result)


def test_unknown_preset_and_config_key_are_exit_4(tmp_path):
    train = tmp_path / "t.conll"
    train.write_text("The DT B-NP\ncat NN I-NP\n\n", encoding="utf-8")
    result = invoke("train", train, "-o", tmp_path / "m", "--features", "no-such-preset")
    assert result.exit_code == 4
    assert "no-such-preset" in one_line(result)
    result = invoke("train", train, "-o", tmp_path / "m", "--set", "model.no_such_key=1")
    assert result.exit_code == 4
    assert "no_such_key" in one_line(result)
    result = invoke("train", train, "-o", tmp_path / "m", "--likelihood", "bogus")
    assert result.exit_code == 4
    assert "likelihood" in one_line(result)


def test_verbose_shows_the_traceback(tmp_path):
    result = invoke("train", tmp_path / "nope.conll", "-o", tmp_path / "m", "--verbose")
    assert result.exit_code == 2
    assert "Traceback" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")
