"""`train -o` and `Tagger.save` replace only a model directory gpseq wrote (gpseq/saved/directory.py):
a bare tagger.json, a foreign file, a changed file are refused at start-up and again at save time,
nothing deleted; a clean model written before the manifest is replaced, the temporaries of dead
saves cleaned, the new directory following the umask and recording a manifest of its files.

Every case asserts the exit code, the one stderr line, and the sha256 of every file around it
before and after. The tiny model of `helpers.tiny_model` is trained once for the module."""

from __future__ import annotations

import json
import os

import pytest

from helpers.cli import invoke, one_line
from helpers.files import dead_pid, sha, snapshot
from helpers.tiny_model import TINY, copy, corpus, model  # noqa: F401

from gpseq.cli.train import TrainProgress


def test_train_refuses_a_directory_with_a_bare_tagger_json(corpus, tmp_path):
    target = tmp_path / "d"
    target.mkdir()
    (target / "tagger.json").write_text("{}\n")
    (target / "thesis.tex").write_text("\\documentclass{article} years of work\n")
    before = snapshot(tmp_path)
    result = invoke("train", corpus, "-o", target, *TINY)
    assert result.exit_code == 2
    line = one_line(result)
    assert line.startswith(f"error: {target}: is not a gpseq model directory"), line
    assert "refusing to replace it" in line
    assert snapshot(tmp_path) == before  # thesis.tex and tagger.json unchanged, no checkpoint, no temporaries


@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "legacy"])
def test_train_refuses_a_model_directory_holding_a_foreign_file(corpus, copy, tmp_path, manifest):
    target = copy(manifest=manifest)
    (target / "features" / "thesis.tex").write_text("chapter 1\n")
    before = snapshot(tmp_path)
    result = invoke("train", corpus, "-o", target, *TINY)
    assert result.exit_code == 2
    assert one_line(result) == (f"error: {target}: holds features/thesis.tex, which gpseq did not write; "
                                "refusing to replace it")
    assert snapshot(tmp_path) == before


def test_train_refuses_a_model_whose_files_changed(corpus, copy, tmp_path):
    target = copy()
    with open(target / "arrays.npz", "ab") as handle:
        handle.write(b"user data appended")
    before = snapshot(tmp_path)
    result = invoke("train", corpus, "-o", target, *TINY)
    assert result.exit_code == 2
    line = one_line(result)
    assert line.startswith(f"error: {target}: holds arrays.npz, changed since gpseq wrote it"), line
    assert snapshot(tmp_path) == before


def test_train_keeps_files_put_into_the_output_during_training(corpus, copy, tmp_path, monkeypatch):
    """The start-up check passes (a clean model directory); a file appears while training runs;
    save refuses at the end and deletes nothing."""
    target = copy()
    original = snapshot(target)
    foreign = target / "notes-written-meanwhile.txt"
    real_call = TrainProgress.__call__

    def call(self, progress):
        if not foreign.exists():
            foreign.write_text("written during training\n")
        return real_call(self, progress)

    monkeypatch.setattr(TrainProgress, "__call__", call)
    result = invoke("train", corpus, "-o", target, *TINY, "--checkpoint-dir", tmp_path / "ckpt")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {target}: holds notes-written-meanwhile.txt, which gpseq did not write; refusing to replace it")
    assert foreign.read_text() == "written during training\n"
    assert snapshot(target) == {**original, "notes-written-meanwhile.txt": sha(foreign)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "m"]  # no .m.tmp-* / .m.old-* left


def test_save_rechecks_after_moving_the_old_directory_aside(model, copy, tmp_path, monkeypatch):
    """A file that appears after the last check but before the replace is not deleted either."""
    import gpseq.saved.directory as model_dir_module
    from gpseq.errors import OutputError
    from gpseq.tagger import Tagger

    tagger = Tagger.load(model)
    target = copy()
    foreign = target / "late.txt"
    real_check = model_dir_module.check_save_target
    calls = []

    def check(directory):
        real_check(directory)
        calls.append(directory)
        if len(calls) == 2:  # the check inside save, immediately before the replace
            foreign.write_text("just in time\n")

    monkeypatch.setattr(model_dir_module, "check_save_target", check)
    original = snapshot(target)
    with pytest.raises(OutputError, match="holds late.txt, which gpseq did not write"):
        tagger.save(target)
    assert len(calls) == 2
    assert snapshot(target) == {**original, "late.txt": sha(foreign)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_train_replaces_a_clean_legacy_model_cleaning_stale_temporaries(corpus, copy, tmp_path):
    """A model written before the manifest is replaced; temporaries of killed saves and
    checkpoints are removed when their process is dead (kept when it runs); the new directory
    follows the umask (not mkdtemp's 0700) and records a manifest of its files."""
    target = copy(manifest=False)
    dead, alive = dead_pid(), 1
    for name in (f".m.tmp-{dead}-abc123", f".m.old-{dead}-0f0f", f".m.tmp-{alive}-def456"):
        (tmp_path / name / "features").mkdir(parents=True)
        (tmp_path / name / "arrays.npz").write_bytes(b"half written")
    ckpt = tmp_path / "ckpt"
    (ckpt / f".checkpoint.tmp-{dead}").mkdir(parents=True)
    (ckpt / f".checkpoint.tmp-{alive}").mkdir()
    (tmp_path / ".m.tmp-notapid").mkdir()  # not ours by its name: left alone
    old_umask = os.umask(0o027)
    try:
        result = invoke("train", corpus, "-o", target, *TINY, "--checkpoint-dir", ckpt)
    finally:
        os.umask(old_umask)
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".m.tmp-1-def456", ".m.tmp-notapid", "ckpt", "m"])
    assert sorted(p.name for p in ckpt.iterdir()) == sorted([".checkpoint.tmp-1", "checkpoint"])
    assert target.stat().st_mode & 0o777 == 0o750
    assert (target / "features").stat().st_mode & 0o777 == 0o750
    for path in (target / "tagger.json", target / "arrays.npz", target / "features" / "featurizer.json"):
        assert path.stat().st_mode & 0o777 == 0o640, path
    meta = json.loads((target / "tagger.json").read_text())
    files = {str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()} - {"tagger.json"}
    assert set(meta["files"]) == files
    for name, record in meta["files"].items():
        assert record == {"sha256": sha(target / name), "size": (target / name).stat().st_size}
