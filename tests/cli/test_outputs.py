"""Bad inputs and faults (issue 14): outputs never clobber inputs or foreign files, corrupt models
and mismatched checkpoints are one-line errors with the documented exit code, unwritable outputs
are refused before any work.

Every CLI case asserts the exit code, that stderr is one line `error: …` naming the file and the
problem, and the sha256 of every file around it before and after. One tiny model (20 sentences
of the bundled sample, 2 steps) is trained once for the module. Cases that need an unwritable
directory run the CLI in a subprocess without the root capabilities that bypass permissions
(`setpriv`), since the suite may run as root.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from test_cli import invoke, one_line  # the in-process CliRunner helpers (and `import cli`)

from gpseq.cli.train import TrainProgress  # noqa: E402
from gpseq.corpora.text import TEXT_MAX_CHARS, TEXT_MAX_TOKENS, iter_text  # noqa: E402
from gpseq.predict.writers import ConllWriter  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "corpora" / "sample"
TINY = ["--features", "ner", "--inducing", "8", "--max-steps", "2", "--seed", "3",
        "--set", "training.dev_fraction=0", "--set", "predict_samples=2", "--set", "training.batch_size=8"]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file under `root` (hidden ones too), and every directory (as "dir")."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.relpath(os.path.join(folder, name), root)] = "dir"
        for name in files:
            path = Path(folder, name)
            out[os.path.relpath(path, root)] = sha(path)
    return out


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def strip_manifest(model: Path) -> None:
    """Make `model` look like a model written before tagger.json had a file manifest."""
    meta = json.loads((model / "tagger.json").read_text())
    del meta["files"]
    (model / "tagger.json").write_text(json.dumps(meta, indent=2))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    if not (SAMPLE / "train.conll").is_file():
        pytest.skip("the bundled sample corpus (corpora/sample/train.conll) is not there")
    blocks = (SAMPLE / "train.conll").read_text(encoding="utf-8").split("\n\n")[:20]
    path = tmp_path_factory.mktemp("corpus") / "small.conll"
    path.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def model(corpus, tmp_path_factory) -> Path:
    """A tiny model directory (with its checkpoint directory MODEL.ckpt beside it); do not modify."""
    model_dir = tmp_path_factory.mktemp("tiny") / "model"
    result = invoke("train", corpus, "-o", model_dir, *TINY)
    assert result.exit_code == 0, result.stderr
    return model_dir


@pytest.fixture()
def copy(model, tmp_path):
    """A fresh copy of the tiny model directory: copy(name) → path."""
    def make(name="m", manifest=True):
        target = tmp_path / name
        shutil.copytree(model, target)
        if not manifest:
            strip_manifest(target)
        return target

    return make


@pytest.fixture()
def notes(tmp_path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("The committee approved the budget. It funds three projects.\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# 1. tag -o: never an input, checked before any work, written through a temporary file
# ---------------------------------------------------------------------------------------------


def test_tag_refuses_output_that_is_the_input(model, notes, tmp_path):
    before = snapshot(tmp_path)
    result = invoke("tag", model, notes, "-o", notes)
    assert result.exit_code == 2
    line = one_line(result)
    assert line.startswith(f"error: {notes}: is the same file as the input"), line
    assert snapshot(tmp_path) == before  # notes.txt intact, no temporary left


@pytest.mark.parametrize("command", ["tag", "select"])
@pytest.mark.parametrize("alias", ["same", "symlink"])
def test_output_that_is_the_file_standard_input_reads_is_refused(model, notes, tmp_path, command, alias):
    """`gpseq tag MODEL - -o f < f`: standard input is compared with the output by device and inode
    (a real process, its stdin the file itself); a pipe on stdin is never refused."""
    target = notes if alias == "same" else tmp_path / "link.txt"
    if alias == "symlink":
        target.symlink_to(notes)
    before = snapshot(tmp_path)
    args = [command, str(model), "-", "-o", str(target)] + (["-n", "1"] if command == "select" else [])
    with open(notes, "rb") as stdin:
        result = subprocess.run([sys.executable, "-m", "gpseq", *args], stdin=stdin, capture_output=True, text=True,
                                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), timeout=300)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {target}: is the file standard input reads"), lines
    assert snapshot(tmp_path) == before
    piped = subprocess.run([sys.executable, "-m", "gpseq", "tag", str(model), "-", "-o", str(tmp_path / "out.conll")],
                           input=notes.read_text(), capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert piped.returncode == 0, piped.stderr
    assert "committee" in (tmp_path / "out.conll").read_text()


@pytest.mark.parametrize("link", ["symlink", "hardlink", "dotted"])
def test_tag_refuses_output_that_is_the_input_by_another_name(model, notes, tmp_path, link):
    if link == "symlink":
        alias = tmp_path / "alias.txt"
        alias.symlink_to(notes)
    elif link == "hardlink":
        alias = tmp_path / "alias.txt"
        os.link(notes, alias)
    else:
        (tmp_path / "sub").mkdir()
        alias = tmp_path / "sub" / ".." / "notes.txt"
    before = snapshot(tmp_path)
    result = invoke("tag", model, notes, "-o", alias)
    assert result.exit_code == 2
    line = one_line(result)
    assert line.startswith(f"error: {alias}: is the same file as the input {notes}"), line
    assert snapshot(tmp_path) == before


def test_tag_refuses_output_that_is_a_directory(model, notes, tmp_path):
    (tmp_path / "out").mkdir()
    before = snapshot(tmp_path)
    result = invoke("tag", model, notes, "-o", tmp_path / "out")
    assert result.exit_code == 2
    assert one_line(result) == f"error: {tmp_path / 'out'}: is a directory; -o needs a file name"
    assert snapshot(tmp_path) == before


def test_tag_refuses_output_in_a_missing_directory(model, notes, tmp_path):
    target = tmp_path / "missing" / "out.conll"
    before = snapshot(tmp_path)
    result = invoke("tag", model, notes, "-o", target)
    assert result.exit_code == 2
    line = one_line(result)
    assert line.startswith(f"error: {target}: cannot be written: directory") and "does not exist" in line, line
    assert snapshot(tmp_path) == before


def test_tag_refuses_read_only_output_file(model, notes, tmp_path):
    target = tmp_path / "out.conll"
    target.write_text("keep me\n")
    target.chmod(0o444)
    before = snapshot(tmp_path)
    result = invoke("tag", model, notes, "-o", target)
    assert result.exit_code == 2
    assert one_line(result) == f"error: {target}: is a read-only file; refusing to overwrite it"
    assert snapshot(tmp_path) == before


def test_tag_refuses_output_inside_the_model_directory(copy, notes, tmp_path):
    model_dir = copy()
    before = snapshot(tmp_path)
    result = invoke("tag", model_dir, notes, "-o", model_dir / "arrays.npz")
    assert result.exit_code == 2
    line = one_line(result)
    assert line.startswith(f"error: {model_dir / 'arrays.npz'}: is inside the model directory"), line
    assert snapshot(tmp_path) == before


def test_tag_failure_midway_leaves_an_existing_output_untouched(model, tmp_path):
    """The first sentence is tagged and written (batch size 1) before line 4 fails to decode:
    the old output stays as it was and no temporary file is left."""
    bad = tmp_path / "bad.conll"
    bad.write_bytes("The\ncat\n\ncaf\xe9\n".encode("latin-1"))
    target = tmp_path / "out.conll"
    target.write_text("previous results\n")
    before = snapshot(tmp_path)
    result = invoke("tag", model, bad, "-o", target, "--batch-size", "1", "--mean")
    assert result.exit_code == 2
    assert one_line(result).startswith(f"error: {bad}:4:")
    assert snapshot(tmp_path) == before


def test_tag_replaces_an_existing_output_keeping_its_mode(model, notes, tmp_path):
    target = tmp_path / "out.conll"
    target.write_text("previous results\n")
    target.chmod(0o640)
    inputs = sha(notes)
    result = invoke("tag", model, notes, "-o", target, "--mean")
    assert result.exit_code == 0, result.stderr
    rows = [line.split("\t") for line in target.read_text().splitlines() if line]
    assert [row[0] for row in rows][:3] == ["The", "committee", "approved"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o640)
    assert sha(notes) == inputs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "out.conll"]  # no temporary left


def test_tag_output_temporary_names_the_pid_and_stale_ones_are_removed(model, notes, tmp_path, monkeypatch):
    """`tag -o OUT` writes `.OUT.tmp-PID-RANDOM`: a temporary of a dead process is removed, one of a
    running process (another writer of the same OUT) is left alone, and this run's own temporary,
    named with its PID, is renamed onto OUT."""
    target = tmp_path / "out.conll"
    dead, alive = dead_pid(), 1
    (tmp_path / f".out.conll.tmp-{dead}-0a0b0c0d").write_text("half written by a killed run\n")
    (tmp_path / f".out.conll.tmp-{alive}-1a2b3c4d").write_text("being written by another run\n")
    seen = []
    real_write = ConllWriter.write

    def write(self, item, result, scheme):
        seen.append(sorted(p.name for p in tmp_path.iterdir()))
        return real_write(self, item, result, scheme)

    monkeypatch.setattr(ConllWriter, "write", write)
    inputs = sha(notes)
    result = invoke("tag", model, notes, "-o", target, "--mean")
    assert result.exit_code == 0, result.stderr
    ours = [name for name in seen[0] if name.startswith(f".out.conll.tmp-{os.getpid()}-")]
    assert len(ours) == 1, seen[0]
    assert sorted(seen[0]) == sorted([f".out.conll.tmp-{alive}-1a2b3c4d", ours[0], "notes.txt"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f".out.conll.tmp-{alive}-1a2b3c4d", "notes.txt", "out.conll"])
    assert target.read_text().startswith("The\t") and sha(notes) == inputs


def test_tag_failure_removes_its_temporary_file(model, tmp_path):
    """A run that fails after it started writing (a bad byte on line 4, batch size 1) leaves no
    temporary and no output."""
    bad = tmp_path / "bad.conll"
    bad.write_bytes("The\ncat\n\ncaf\xe9\n".encode("latin-1"))
    before = snapshot(tmp_path)
    result = invoke("tag", model, bad, "-o", tmp_path / "out.conll", "--batch-size", "1", "--mean")
    assert result.exit_code == 2
    assert one_line(result).startswith(f"error: {bad}:4:")
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------------
# 2. train -o: only a directory gpseq wrote is replaced, checked at start-up and at save time
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# 3. unwritable outputs: refused before any work (a subprocess without permission-bypassing capabilities)
# ---------------------------------------------------------------------------------------------

RUNNER_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
import cli
from typer.testing import CliRunner
runner = CliRunner()
out = []
for args in json.loads(sys.argv[2]):
    result = runner.invoke(cli.app, args)
    out.append([result.exit_code, result.stderr, repr(result.exception)])
print(json.dumps(out))
"""


def unprivileged() -> list[str]:
    """A command prefix under which permission bits apply (root bypasses them otherwise)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root and no setpriv to drop CAP_DAC_OVERRIDE")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]


def test_unwritable_outputs_are_refused_before_any_work(model, corpus, notes, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "kept.txt").write_text("kept\n")
    readonly = tmp_path / "readonly.conll"
    readonly.write_text("do not overwrite\n")
    readonly.chmod(0o444)
    cases = [
        (["train", corpus, "-o", ro / "m", *TINY], ro / "m", "directory {ro} is not writable"),
        (["train", corpus, "-o", ro / "sub" / "m", *TINY], ro / "sub" / "m", "directory {ro} is not writable"),
        (["train", corpus, "-o", tmp_path / "ok", "--checkpoint-dir", ro / "ckpt", *TINY], ro / "ckpt",
         "directory {ro} is not writable"),
        (["tag", model, notes, "-o", ro / "out.conll"], ro / "out.conll", "directory {ro} is not writable"),
        (["tag", model, notes, "-o", readonly], readonly, "is a read-only file"),
    ]
    ro.chmod(0o555)
    try:
        before = snapshot(tmp_path)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        args = json.dumps([[str(a) for a in case[0]] for case in cases])
        process = subprocess.run([*unprivileged(), sys.executable, "-c", RUNNER_SCRIPT, str(ROOT), args],
                                 capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
        assert process.returncode == 0, process.stderr
        results = json.loads(process.stdout.strip().splitlines()[-1])
        for (_, path, problem), (code, stderr, exception) in zip(cases, results):
            lines = stderr.strip().splitlines()
            assert code == 2 and len(lines) == 1, (path, code, stderr, exception)
            assert lines[0].startswith(f"error: {path}: ") and problem.format(ro=ro) in lines[0], lines[0]
        assert snapshot(tmp_path) == before  # nothing written, no checkpoint, no temporaries
    finally:
        ro.chmod(0o755)


# ---------------------------------------------------------------------------------------------
# 4. corrupt model files: exit 3 naming the file
# ---------------------------------------------------------------------------------------------


def _damage(model_dir: Path, damage: str) -> Path:
    if damage == "empty arrays":
        (model_dir / "arrays.npz").write_bytes(b"")
        return model_dir / "arrays.npz"
    if damage == "truncated arrays":
        payload = (model_dir / "arrays.npz").read_bytes()
        (model_dir / "arrays.npz").write_bytes(payload[: len(payload) // 2])
        return model_dir / "arrays.npz"
    if damage == "empty tagger.json":
        (model_dir / "tagger.json").write_bytes(b"")
    elif damage == "invalid tagger.json":
        text = (model_dir / "tagger.json").read_text()
        (model_dir / "tagger.json").write_text(text[: len(text) // 2])
    elif damage == "tagger.json not an object":
        (model_dir / "tagger.json").write_text("[1, 2, 3]\n")
    return model_dir / "tagger.json"


PROBLEMS = {
    "empty arrays": "empty file",
    "truncated arrays": "truncated",
    "empty tagger.json": "empty file",
    "invalid tagger.json": "unreadable model metadata",
    "tagger.json not an object": "not a gpseq tagger model",
}


@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "legacy"])
@pytest.mark.parametrize("damage", list(PROBLEMS))
def test_corrupt_model_files_are_exit_3_naming_the_file(copy, tmp_path, damage, manifest):
    model_dir = copy(manifest=manifest)
    damaged = _damage(model_dir, damage)
    before = snapshot(tmp_path)
    result = invoke("info", model_dir)
    assert result.exit_code == 3
    line = one_line(result)
    assert line.startswith(f"error: {damaged}: ") and PROBLEMS[damage] in line, line
    assert snapshot(tmp_path) == before


def test_tag_with_an_empty_arrays_file_is_one_line(copy, notes, tmp_path):
    model_dir = copy(manifest=False)
    (model_dir / "arrays.npz").write_bytes(b"")
    result = invoke("tag", model_dir, notes, "-o", tmp_path / "out.conll")
    assert result.exit_code == 3
    assert one_line(result) == f"error: {model_dir / 'arrays.npz'}: empty file (0 bytes); the model directory is damaged"
    assert not (tmp_path / "out.conll").exists()


class _PicklePayload:
    """Unpickling this creates the file `marker` (harmless stand-in for arbitrary code)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _update_manifest(model_dir: Path, name: str) -> None:
    """Record the current size and sha256 of `name` in tagger.json (a tamperer covering its tracks)."""
    meta = json.loads((model_dir / "tagger.json").read_text())
    meta["files"][name] = {"sha256": sha(model_dir / name), "size": (model_dir / name).stat().st_size}
    (model_dir / "tagger.json").write_text(json.dumps(meta, indent=2))


@pytest.mark.parametrize("command", ["info", "tag"])
@pytest.mark.parametrize("tamper", ["arrays-manifest-stale", "arrays-manifest-updated", "arrays-legacy",
                                    "arrays-raw-pickle", "vocabulary-checksums-updated"])
def test_tampered_arrays_with_a_pickle_payload_are_refused_unexecuted(copy, notes, tmp_path, tamper, command):
    """An .npz whose array is a pickled object (or a bare pickle in its place): exit 3, one line
    naming the file, the payload never unpickled (its marker file is not created), nothing written."""
    import pickle

    marker = tmp_path / "payload-ran"
    evil = np.array([_PicklePayload(marker)], dtype=object)
    model_dir = copy(manifest=tamper != "arrays-legacy")
    if tamper.startswith("vocabulary"):
        damaged = model_dir / "features" / "vocabulary.npz"
        with np.load(damaged) as data:
            arrays = {name: data[name] for name in data.files}
        np.savez(damaged, **{**arrays, "keys_0": evil})
        featurizer_json = model_dir / "features" / "featurizer.json"
        meta = json.loads(featurizer_json.read_text())
        meta["vocabulary_sha256"] = sha(damaged)
        featurizer_json.write_text(json.dumps(meta))
        _update_manifest(model_dir, "features/vocabulary.npz")
        _update_manifest(model_dir, "features/featurizer.json")
        problem = "unreadable"
    else:
        damaged = model_dir / "arrays.npz"
        if tamper == "arrays-raw-pickle":
            damaged.write_bytes(pickle.dumps(evil))
        else:
            with np.load(damaged) as data:
                arrays = {name: data[name] for name in data.files}
            np.savez(damaged, **{**arrays, "var:label_bias": evil})
        if tamper == "arrays-manifest-stale":
            problem = "tagger.json records"
        else:
            if tamper != "arrays-legacy":
                _update_manifest(model_dir, "arrays.npz")
            problem = "unreadable arrays"
    before = snapshot(tmp_path)
    args = ["info", model_dir] if command == "info" else ["tag", model_dir, notes, "-o", tmp_path / "out.conll"]
    result = invoke(*args)
    assert result.exit_code == 3, result.stderr
    line = one_line(result)
    assert line.startswith(f"error: {damaged}: ") and problem in line, line
    assert not marker.exists()
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------------
# Bad input files (the cases the first sweep found handled well, kept so): one line naming file:line
# ---------------------------------------------------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
# case → (file content, {command: (line named, problem)}); a command absent here accepts the file
BAD_INPUTS = {
    "ragged columns": (b"The DT B-NP\ncat NN\n\n",
                       dict.fromkeys(["train", "tag", "evaluate"], (2, "2 column(s), expected 3 (as on line 1)"))),
    "latin-1 bytes": ("The DT B-NP\ncaf\xe9 NN I-NP\n\n".encode("latin-1"),
                      dict.fromkeys(["train", "tag", "evaluate"], (2, "bytes b'\\xe9' at byte 4 are not valid utf-8"))),
    "utf-16": ("The DT B-NP\n\n".encode("utf-16"),
               dict.fromkeys(["train", "tag", "evaluate"], (1, "bytes b'\\xff' at byte 1 are not valid utf-8"))),
    "binary (png)": (PNG, dict.fromkeys(["train", "tag", "evaluate"], (1, "bytes b'\\x89' at byte 1 are not valid utf-8"))),
    "label column missing": (b"The\ncat\n\n", dict.fromkeys(["train", "evaluate"], (1, "label column missing"))),
    "empty file": (b"", dict.fromkeys(["train", "evaluate"], (None, "no sentences in the file"))),
    "blank lines only": (b"\n \n\t\n", dict.fromkeys(["train", "evaluate"], (None, "no sentences in the file"))),
    "token column missing": (b"The DT B-NP\n\n", {"tag": (1, "token column 5 missing")}),
}


def _command(command: str, model_dir: Path, path: Path, out: Path) -> list:
    if command == "train":
        return ["train", path, "-o", out, *TINY]
    extra = ["--token-column", "5"] if path.name.startswith("token-column") else []
    if command == "tag":
        return ["tag", model_dir, path, "-o", out, "--mean", *extra]
    return ["evaluate", model_dir, path, "--mean"]


@pytest.mark.parametrize("case, command", [(case, command) for case, (_, errors) in BAD_INPUTS.items()
                                           for command in ("train", "tag", "evaluate")
                                           if command in errors or command == "tag"])
def test_bad_input_files_are_one_line_errors(model, tmp_path, case, command):
    """Ragged columns, wrong encodings, binary data, a missing column, an empty file: exit 2 and one
    line `error: FILE:LINE: problem` (no line for a file without sentences), nothing written; or,
    where the command does not need what is missing, exit 0 (the input unchanged either way)."""
    content, errors = BAD_INPUTS[case]
    path = tmp_path / (case.replace(" ", "-").replace("(", "").replace(")", "") + ".conll")
    path.write_bytes(content)
    out = tmp_path / ("model" if command == "train" else "out.conll")
    before = snapshot(tmp_path)
    result = invoke(*_command(command, model, path, out))
    if command not in errors:
        assert result.exit_code == 0, result.stderr
        assert sha(path) == before[path.name]
        return
    line, problem = errors[command]
    assert result.exit_code == 2, result.stderr
    where = f"{path}:{line}" if line is not None else f"{path}"
    assert one_line(result).startswith(f"error: {where}: {problem}"), one_line(result)
    assert snapshot(tmp_path) == before


def test_bom_and_crlf_are_read_as_plain_lines(model, tmp_path):
    """A UTF-8 byte-order mark and CRLF line ends: the tokens are the words (no U+FEFF, no CR), for
    tag and evaluate, and the input is unchanged."""
    path = tmp_path / "windows.conll"
    path.write_bytes("\ufeffThe DT B-NP\r\ncommittee NN I-NP\r\n\r\napproved VBD B-VP\r\n\r\n".encode("utf-8"))
    before = sha(path)
    out = tmp_path / "out.jsonl"
    result = invoke("tag", model, path, "-o", out, "--format", "jsonl", "--mean")
    assert result.exit_code == 0, result.stderr
    records = [json.loads(row) for row in out.read_text(encoding="utf-8").splitlines()]
    assert [r["tokens"] for r in records] == [["The", "committee"], ["approved"]]
    assert [r["line"] for r in records] == [1, 4]
    result = invoke("evaluate", model, path, "--mean", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["n_sentences"], report["n_tokens"], report["n_gold_chunks"]) == (2, 3, 2)
    assert report["n_unseen_gold_tokens"] == 0  # the labels have no CR left on them
    assert sha(path) == before


# ---------------------------------------------------------------------------------------------
# 6. metadata validated before the model is built
# ---------------------------------------------------------------------------------------------


@pytest.fixture()
def no_model_building(monkeypatch):
    """Building a StructuredGP fails the test: the metadata must be refused before allocation."""
    from gpseq.structured.model import StructuredGP

    def refuse(self, *args, **kwargs):
        raise AssertionError("StructuredGP was built from metadata that does not match the arrays")

    monkeypatch.setattr(StructuredGP, "__init__", refuse)


@pytest.mark.parametrize("extra", [30_000, 2_000_000])
def test_extra_labels_are_refused_before_the_model_is_built(copy, tmp_path, extra, no_model_building):
    model_dir = copy()
    meta = json.loads((model_dir / "tagger.json").read_text())
    n_labels = len(meta["labels"])
    meta["labels"] += [f"B-X{i}" for i in range(extra)]
    (model_dir / "tagger.json").write_text(json.dumps(meta))
    before = snapshot(tmp_path)
    result = invoke("info", model_dir)
    assert result.exit_code == 3
    assert one_line(result).startswith(
        f"error: {model_dir / 'tagger.json'}: {n_labels + extra:,} labels and {meta['num_features']:,} features, "
        f"but the array var:label_bias has shape [{n_labels}]")
    assert snapshot(tmp_path) == before


def test_num_features_not_matching_the_featurizer_is_exit_3(copy, no_model_building):
    model_dir = copy()
    meta = json.loads((model_dir / "tagger.json").read_text())
    real = meta["num_features"]
    meta["num_features"] = real + 1
    # the arrays and their recorded shapes grow by a feature too (their header is checked against the
    # record first): only the featurizer disagrees
    with np.load(model_dir / "arrays.npz") as data:
        arrays = {name: data[name] for name in data.files}
    for name, value in arrays.items():
        if value.ndim == 2 and value.shape[0] == real:
            arrays[name] = np.concatenate([value, value[:1]])
            meta["arrays"][name] = list(arrays[name].shape)
    np.savez_compressed(model_dir / "arrays.npz", **arrays)
    del meta["files"]
    (model_dir / "tagger.json").write_text(json.dumps(meta))
    result = invoke("info", model_dir)
    assert result.exit_code == 3
    assert one_line(result) == (f"error: {model_dir / 'tagger.json'}: num_features {real + 1:,} does not match "
                                f"the featurizer's {real:,} (features/featurizer.json)")


# ---------------------------------------------------------------------------------------------
# --resume from a checkpoint of another configuration
# ---------------------------------------------------------------------------------------------


def test_resume_with_another_learning_rate_is_refused(model, corpus, tmp_path):
    """The same model but another optimiser setting: the checkpoint's Adam state belongs to the old
    one, so --resume names the setting and both values instead of carrying on silently."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(model.with_name(model.name + ".ckpt"), ckpt)
    before = snapshot(tmp_path)
    result = invoke("train", corpus, "-o", tmp_path / "m2", *TINY, "--set", "training.learning_rate=0.5",
                    "--checkpoint-dir", ckpt, "--resume")
    assert result.exit_code == 4, result.stderr
    line = one_line(result)
    assert line.startswith(f"error: {ckpt}: the checkpoint was trained with other optimiser settings: "
                           "training.learning_rate "), line
    assert "0.5 now" in line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("recorded", [True, False], ids=["shapes-recorded", "old-checkpoint"])
def test_resume_from_a_checkpoint_of_another_configuration(model, corpus, tmp_path, recorded):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(model.with_name(model.name + ".ckpt"), ckpt)
    if not recorded:  # a checkpoint written before state.json recorded the variable shapes
        state = json.loads((ckpt / "checkpoint" / "state.json").read_text())
        del state["variables"]
        (ckpt / "checkpoint" / "state.json").write_text(json.dumps(state))
    before = snapshot(tmp_path)
    options = list(TINY)
    options[options.index("ner")] = "pos"  # other features: other feature columns
    result = invoke("train", corpus, "-o", tmp_path / "m2", *options, "--checkpoint-dir", ckpt, "--resume")
    assert result.exit_code == 4
    line = one_line(result)
    assert line.startswith(f"error: {ckpt}: the checkpoint "), line
    if recorded:  # names the variables whose shapes differ, with both shapes
        assert "linear/q_mu [" in line and "in the checkpoint" in line and "now" in line, line
    else:  # TensorFlow's own account of the mismatch, on the same line
        assert "incompatible tensor with shape" in line, line
    assert "--resume" in line, line
    assert snapshot(tmp_path) == before


# state.json of a checkpoint written by gpseq before the single Trainer (b379e36^, 2026-11-23), as
# written then for a tiny linear+rbf tagger: its variables are named as the old model named them
_FORMAT_1_STATE = {
    "step": 3, "best_score": None, "best_step": None, "evals_without_improvement": 0, "skipped_steps": 0,
    "stopped_early": False, "history": [], "best_values": None,
    "variables": {"label_bias": [9], "pairwise_mean": [9, 9], "temperature": [], "variance_scale": [],
                  "inducing/mixture_logits": [1], "inducing/q_mu": [1, 8, 9],
                  "inducing/q_sqrt/_pretransformed_input": [1, 9, 36],
                  "kernel/lengthscales/_pretransformed_input": [], "kernel/variance/_pretransformed_input": [],
                  "linear/q_mu": [2748, 9], "linear/prior_variance/_pretransformed_input": [],
                  "linear/q_variance/_pretransformed_input": [2748, 9],
                  "pairwise_variance/_pretransformed_input": [9, 9]},
}


def test_resume_from_a_checkpoint_written_before_the_single_trainer(model, corpus, tmp_path):
    """A checkpoint of the old trainer cannot be restored into the composed model: one line saying
    so and what to do (exit 4), nothing written."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(model.with_name(model.name + ".ckpt"), ckpt)
    assert json.loads((ckpt / "checkpoint" / "state.json").read_text())["checkpoint_format"] == 2
    (ckpt / "checkpoint" / "state.json").write_text(json.dumps(_FORMAT_1_STATE))
    before = snapshot(tmp_path)
    result = invoke("train", corpus, "-o", tmp_path / "m2", *TINY, "--checkpoint-dir", ckpt, "--resume")
    assert result.exit_code == 4
    line = one_line(result)
    assert line == (f"error: {ckpt}: the checkpoint was written by an older gpseq (checkpoint format 1, before "
                    "its single Trainer and composed model) and cannot be resumed by this one; train without "
                    "--resume to start afresh (or use another --checkpoint-dir)"), line
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------------
# Raw text without sentence boundaries: bounded segments for spaCy, bounded sentences for the tagger
# ---------------------------------------------------------------------------------------------


def _unpunctuated_line(n_chars: int, seed: int = 0) -> str:
    """Words without punctuation (so spaCy's tokens are the words), no sentence boundary anywhere."""
    rng = random.Random(seed)
    words = ["committee", "budget", "approved", "three", "small", "projects", "fund", "the", "on", "Tuesday"]
    out, size = [], 0
    while size < n_chars:
        word = rng.choice(words)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:n_chars].rstrip()


class _RecordingNlp:
    """spaCy's blank pipeline with the sentencizer, recording the length of every text it is given."""

    def __init__(self):
        import spacy

        self.nlp = spacy.blank("en")
        self.nlp.add_pipe("sentencizer")
        self.lengths: list[int] = []

    def __call__(self, text):
        self.lengths.append(len(text))
        return self.nlp(text)


def test_text_reader_cuts_a_5mb_line_into_bounded_pieces(tmp_path):
    """A 5 MB line without punctuation (spaCy alone: E088, "text length exceeds 1000000"): spaCy only
    ever sees at most TEXT_MAX_CHARS characters, no sentence has more than TEXT_MAX_TOKENS tokens, the
    cuts fall at whitespace (the tokens are exactly the words) and every piece names line 2."""
    line = _unpunctuated_line(5_000_000)
    path = tmp_path / "long.txt"
    path.write_text("A first line.\n" + line + "\n\nThe last one.\n", encoding="utf-8")
    nlp = _RecordingNlp()
    items = list(iter_text(path, nlp, encoding="utf-8", name=str(path)))
    assert max(nlp.lengths) <= TEXT_MAX_CHARS == 100_000
    assert len(nlp.lengths) >= 50
    assert [item.tokens for item in items[:1]] == [["A", "first", "line", "."]]
    assert items[-1].tokens == ["The", "last", "one", "."] and items[-1].line == 4
    middle = items[1:-1]
    assert max(len(item.tokens) for item in middle) == TEXT_MAX_TOKENS == 1_000
    assert [t for item in middle for t in item.tokens] == line.split()
    assert {item.line for item in middle} == {2}
    for item in items:
        assert len(item.spaces) == len(item.tokens) and item.spaces[-1] is False


def test_text_reader_splits_long_sentences_between_words_not_inside_them(tmp_path):
    """Pieces of at most max_tokens tokens, cut after a token followed by whitespace: "don't" is two
    tokens (do, n't) that are never separated; a line without whitespace is cut between tokens."""
    words = " ".join(["we", "don't", "stop"] * 700)  # 2,800 tokens, no sentence punctuation
    path = tmp_path / "words.txt"
    path.write_text(words + "\n" + "x" * 250_000 + "\n", encoding="utf-8")
    nlp = _RecordingNlp()
    items = list(iter_text(path, nlp, encoding="utf-8", name=str(path), max_tokens=100))
    first = [item for item in items if item.line == 1]
    assert all(len(item.tokens) <= 100 for item in first)
    assert all(item.tokens[0] != "n't" and item.tokens[-1] != "do" for item in first)
    assert [t for item in first for t in item.tokens] == ["we", "do", "n't", "stop"] * 700
    second = [item for item in items if item.line == 2]  # 250,000 characters, no whitespace
    assert max(nlp.lengths) <= TEXT_MAX_CHARS
    assert "".join(t for item in second for t in item.tokens) == "x" * 250_000


def test_tag_a_300kb_unpunctuated_line(model, tmp_path):
    """The CLI end to end on one 300 KB line (about 45,000 words): exit 0, every output sentence at
    most --text-max-tokens tokens, all the words tagged in order, every sentence from line 1."""
    line = _unpunctuated_line(300_000, seed=1)
    path = tmp_path / "line.txt"
    path.write_text(line + "\n", encoding="utf-8")
    out = tmp_path / "tagged.jsonl"
    result = invoke("tag", model, path, "--format", "jsonl", "--mean", "--batch-size", "16",
                    "--text-max-tokens", "800", "-o", out)
    assert result.exit_code == 0, result.stderr
    records = [json.loads(row) for row in out.read_text(encoding="utf-8").splitlines()]
    assert max(len(r["tokens"]) for r in records) == 800
    assert [t for r in records for t in r["tokens"]] == line.split()
    assert {r["line"] for r in records} == {1}
    assert all(len(r["labels"]) == len(r["tokens"]) for r in records)


def test_text_max_tokens_must_be_positive(model, notes):
    result = invoke("tag", model, notes, "--text-max-tokens", "0")
    assert result.exit_code == 4
    assert one_line(result) == "error: --text-max-tokens must be >= 1; got 0"


# ---------------------------------------------------------------------------------------------
# Two trainings writing the same -o: a lock file beside the model directory
# ---------------------------------------------------------------------------------------------

LOCK_HOLDER = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from gpseq.cli.outputs import train_lock
with train_lock(Path(sys.argv[2])):
    print("locked", flush=True)
    sys.stdin.read()
"""


def _subprocess_env() -> dict[str, str]:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}


def test_a_second_training_on_the_same_output_fails_at_start(corpus, tmp_path):
    """A training in progress (another process holding MODEL.lock): exit 2 at start, one line naming
    the model directory and the PID holding it, nothing written; once that process is killed
    (SIGKILL: its lock file stays, naming a dead PID), the next training takes the lock over and
    removes it at the end."""
    out = tmp_path / "model"
    lock = tmp_path / "model.lock"
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(ROOT), str(out)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=_subprocess_env())
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert lock.read_text().strip() == str(holder.pid)
        before = snapshot(tmp_path)
        result = invoke("train", corpus, "-o", out, *TINY)
        assert result.exit_code == 2
        line = one_line(result)
        assert line.startswith(f"error: {out}: another gpseq train (PID {holder.pid}) is writing this model "
                               f"directory (lock {lock})"), line
        assert snapshot(tmp_path) == before  # no model, no checkpoints, the holder's lock untouched
    finally:
        holder.kill()
        holder.wait()
    assert lock.read_text().strip() == str(holder.pid)  # stale: its process is dead
    result = invoke("train", corpus, "-o", out, *TINY)
    assert result.exit_code == 0, result.stderr
    assert (out / "tagger.json").is_file()
    assert not lock.exists()


def test_concurrent_cli_trainings_on_the_same_output(corpus, tmp_path):
    """Two real `gpseq train` runs: while the first (a subprocess) trains, the second fails at start
    naming the first one's PID; the first finishes and saves its model."""
    out = tmp_path / "model"
    lock = tmp_path / "model.lock"
    first = subprocess.Popen([sys.executable, str(ROOT / "cli.py"), "train", str(corpus), "-o", str(out),
                              *KILL_OPTIONS], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=_subprocess_env())
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and first.poll() is None:
            try:
                if lock.read_text().strip() == str(first.pid):
                    break
            except FileNotFoundError:
                pass
            time.sleep(0.05)
        assert first.poll() is None, "the first training ended before the second could start"
        result = invoke("train", corpus, "-o", out, *TINY)
        still_running = first.poll() is None
    finally:
        stderr = first.communicate(timeout=300)[1]
    assert first.returncode == 0, stderr
    assert still_running, "the first training ended while the second was starting: inconclusive"
    assert result.exit_code == 2
    assert one_line(result).startswith(f"error: {out}: another gpseq train (PID {first.pid}) is writing")
    assert (out / "tagger.json").is_file() and not lock.exists()


# ---------------------------------------------------------------------------------------------
# Labels seen only in --dev
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Kill -9 at random points, then --resume
# ---------------------------------------------------------------------------------------------

# The SVI trainer (checkpoints every 5 of its 40 steps); the default method is a one-shot L-BFGS fit
KILL_OPTIONS = ["--features", "ner", "--max-steps", "40", "--epochs", "20", "--seed", "3",
                "--set", "training.method=svi", "--set", "training.checkpoint_every=5",
                "--set", "training.dev_fraction=0", "--set", "training.batch_size=8", "--set", "predict_samples=2"]
KILL_TRIALS = 10


def _train_command(corpus: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "cli.py"), "train", str(corpus), "-o", str(out), *KILL_OPTIONS, *extra]


def _arrays(model_dir: Path) -> dict:
    import numpy as np

    with np.load(model_dir / "arrays.npz", allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def _assert_same_arrays(got: dict, want: dict, what: str) -> None:
    import numpy as np

    assert sorted(got) == sorted(want), what
    for name in want:
        assert np.allclose(got[name], want[name], rtol=1e-6, atol=1e-9), f"{what}: {name} differs"


@pytest.mark.slow
def test_kill_at_random_points_then_resume(corpus, tmp_path):
    """`gpseq train` (SVI, checkpoints) killed with SIGKILL at random times spread over an
    uninterrupted run's duration: every trial leaves either no model or a complete, loadable one
    equal to the uninterrupted result; `--resume` then reaches the uninterrupted result (the
    arrays), cleaning the killed run's temporaries and its stale lock."""
    from gpseq.tagger import Tagger

    reference = tmp_path / "reference" / "model"
    reference.parent.mkdir()
    started = time.monotonic()
    done = subprocess.run(_train_command(corpus, reference), capture_output=True, text=True, env=_subprocess_env(),
                          timeout=600)
    duration = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    want = _arrays(reference)
    rng = random.Random(14)
    outcomes = []
    for trial in range(KILL_TRIALS):
        folder = tmp_path / f"trial{trial}"
        folder.mkdir()
        out = folder / "model"
        # trial 0 during start-up (imports, features); the others spread over the rest of the run and
        # a little past it (TensorFlow's start-up is about a third of a run of this size)
        if trial == 0:
            delay = rng.uniform(0.0, 0.3) * duration
        else:
            delay = (0.3 + 0.75 * (trial - 1 + rng.random()) / (KILL_TRIALS - 1)) * duration
        trial_started = time.monotonic()
        process = subprocess.Popen(_train_command(corpus, out), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, env=_subprocess_env())
        state = out.with_name("model.ckpt") / "checkpoint" / "state.json"
        if trial % 2 == 1:
            # odd trials: killed once a given checkpoint exists (load on the machine cannot make every
            # time-based kill land before the first checkpoint); even trials: at a random time
            target = rng.choice([5, 10, 15, 20, 25, 30, 35])
            deadline = time.monotonic() + 600
            while process.poll() is None and time.monotonic() < deadline:
                try:
                    if json.loads(state.read_text())["step"] >= target:
                        break
                except (OSError, ValueError, KeyError):
                    pass
                time.sleep(0.02)
            delay = time.monotonic() - trial_started  # for the report only
        try:
            process.wait(timeout=0 if trial % 2 == 1 else delay)
            killed = False
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            process.wait()
            killed = True
        left = sorted(os.listdir(folder))
        unexpected = [name for name in left if name not in ("model", "model.ckpt", "model.lock")
                      and not name.startswith((".model.tmp-", ".model.old-"))]
        assert not unexpected, f"trial {trial} (killed after {delay:.1f} s): {unexpected}"
        if out.exists():  # a complete, loadable model: the uninterrupted one
            Tagger.load(out)
            _assert_same_arrays(_arrays(out), want, f"trial {trial}: the model left by the killed run")
        checkpoint = out.with_name("model.ckpt") / "checkpoint" / "state.json"
        step = json.loads(checkpoint.read_text())["step"] if checkpoint.exists() else None
        outcomes.append((round(delay, 1), killed, out.exists(), step))
        resumed = subprocess.run(_train_command(corpus, out, "--resume"), capture_output=True, text=True,
                                 env=_subprocess_env(), timeout=600)
        assert resumed.returncode == 0, f"trial {trial}: {resumed.stderr}"
        Tagger.load(out)
        _assert_same_arrays(_arrays(out), want, f"trial {trial}: --resume after a kill at {delay:.1f} s")
        assert sorted(os.listdir(folder)) == ["model", "model.ckpt"], f"trial {trial}: {os.listdir(folder)}"
        assert os.listdir(out.with_name("model.ckpt")) == ["checkpoint"]
    print("kill trials (delay s, killed, model left, checkpoint step):", outcomes)
    assert any(killed for _, killed, _, _ in outcomes)
    assert any(step is not None and step < 40 for *_, step in outcomes), outcomes  # some resumed mid-training


# ---------------------------------------------------------------------------------------------
# Long sentences in the library: tagged in overlapping windows, stitched
# ---------------------------------------------------------------------------------------------

# The default training (MAP + Laplace, linear kernel), converged on the tiny corpus: its transitions
# are strong enough that the context across a cut matters (checked below), unlike 2 SVI steps'.
# float64, so that the whole-sentence reference of a few thousand tokens is itself accurate.
DEFAULT_TINY = ["--features", "ner", "--seed", "3", "--max-steps", "40", "--set", "training.dev_fraction=0",
                "--set", "dtype=float64"]


@pytest.fixture(scope="module")
def default_model(corpus, tmp_path_factory) -> Path:
    """A tiny model of the default training; do not modify."""
    model_dir = tmp_path_factory.mktemp("tiny_default") / "model"
    result = invoke("train", corpus, "-o", model_dir, *DEFAULT_TINY)
    assert result.exit_code == 0, result.stderr
    return model_dir


@pytest.fixture(scope="module")
def default_tagger(default_model):
    from gpseq.tagger import Tagger

    return Tagger.load(default_model)


@pytest.fixture(scope="module")
def long_sentence():
    """The bundled sample's sentences run together: one labelled sentence of a few hundred tokens."""
    from gpseq.corpora import Sentence, read_conll

    sentences = read_conll(SAMPLE / "train.conll")
    tokens = [token for s in sentences for token in s.tokens]
    labels = [label for s in sentences for label in s.labels]
    assert len(tokens) > 400
    return Sentence(tokens=tokens, labels=labels)


@pytest.mark.parametrize("max_tokens, overlap", [(5, 1), (7, 3), (10, 2), (200, 50), (1000, 50)])
def test_sequence_windows_cover_every_token_once_with_context(max_tokens, overlap):
    """For every length up to a few windows: windows of exactly max_tokens tokens inside the sentence,
    consecutive ones sharing >= 2·overlap tokens; the keep ranges partition the sentence in order, and
    every kept token has >= overlap tokens of its window on each side unless the sentence ends there."""
    from gpseq.training.batching import sequence_windows

    for length in list(range(1, 4 * max_tokens)) + [50_000]:
        windows = sequence_windows(length, max_tokens, overlap)
        starts, stops, keep_starts, keep_stops = windows.T
        if length <= max_tokens:
            assert windows.tolist() == [[0, length, 0, length]]
            continue
        assert (stops - starts == max_tokens).all() and starts[0] == 0 and stops[-1] == length
        assert (stops[:-1] - starts[1:] >= 2 * overlap).all(), (length, windows)
        assert keep_starts[0] == 0 and keep_stops[-1] == length and (keep_starts[1:] == keep_stops[:-1]).all()
        kept = np.concatenate([np.arange(a, b) for a, b in zip(keep_starts, keep_stops)])
        assert (kept == np.arange(length)).all()
        for start, stop, keep_start, keep_stop in windows:
            assert keep_start < keep_stop
            assert start == 0 or keep_start - start >= overlap, (length, windows)
            assert stop == length or stop - keep_stop >= overlap, (length, windows)


def test_long_sentence_windows_match_the_whole_sentence(default_tagger, long_sentence):
    """A sentence of a few hundred tokens in windows of 200 (50 tokens of context each side) against
    the same sentence tagged whole (max_tokens above its length): every token's marginals agree to
    1e-6 (linear-chain marginals forget a cut geometrically fast), the labels agree, and the stitched path's log-probability and the gold path's
    are the whole sentence's. The check has teeth: cutting the sentence at a window edge instead
    moves the marginals next to the cut by far more than the tolerance."""
    from gpseq.corpora import Sentence

    tokens = long_sentence.tokens
    whole = default_tagger.tag([tokens], max_tokens=10**6)[0]
    windowed = default_tagger.tag([tokens], max_tokens=200)[0]
    assert windowed.probabilities.shape == whole.probabilities.shape == (len(tokens), len(default_tagger.labels))
    assert np.abs(windowed.probabilities - whole.probabilities).max() < 1e-6
    agree = np.mean([a == b for a, b in zip(windowed.labels, whole.labels)])
    assert agree >= 0.98, agree
    assert windowed.sequence_log_prob == pytest.approx(whole.sequence_log_prob, rel=1e-9, abs=1e-6)
    gold = Sentence(tokens, [label if label in default_tagger.label_index else "O" for label in long_sentence.labels])
    gold_whole, gold_windowed = (default_tagger.gold_log_probs([gold], max_tokens=m)[0] for m in (10**6, 200))
    assert np.isfinite(gold_whole) and gold_windowed == pytest.approx(gold_whole, rel=1e-9, abs=1e-6)
    # without the windows' context: the first 200 tokens alone differ from the whole near their end
    cut = default_tagger.tag([tokens[:200]], max_tokens=10**6)[0]
    assert np.abs(cut.probabilities[-5:] - whole.probabilities[195:200]).max() > 0.01


def test_short_sentences_are_unchanged_when_a_long_one_is_windowed(default_tagger, long_sentence):
    """Sentences up to max_tokens are tagged exactly as without the long one (bit for bit: the same
    batches); Monte Carlo marginals of a windowed sentence are distributions and its labels are the
    deterministic predictive's (both Viterbi on the posterior-mean potentials)."""
    shorts = [long_sentence.tokens[:60], long_sentence.tokens[100:300]]  # 60 and 200 (= max_tokens) tokens
    alone = default_tagger.tag(shorts, max_tokens=200)
    together = default_tagger.tag([shorts[0], long_sentence.tokens, shorts[1]], max_tokens=200)
    for result, want in zip((together[0], together[2]), alone):
        assert result.labels == want.labels
        assert np.array_equal(result.probabilities, want.probabilities)
        assert result.sequence_log_prob == want.sequence_log_prob
    mc = default_tagger.tag([long_sentence.tokens], samples=2, max_tokens=200)[0]
    assert np.allclose(mc.probabilities.sum(-1), 1.0) and np.isfinite(mc.sequence_log_prob)
    assert mc.sequence_log_prob <= 0.0
    assert mc.labels == together[1].labels


def test_window_settings_are_checked(default_tagger, long_sentence):
    from gpseq.errors import ConfigError
    from gpseq.tagger import TaggerConfig

    with pytest.raises(ConfigError, match=r"predict_max_tokens must be > 2 \* predict_overlap \(100\), got 100"):
        default_tagger.tag([long_sentence.tokens], max_tokens=100)
    with pytest.raises(ConfigError, match="predict_overlap must be >= 1, got 0"):
        TaggerConfig(predict_overlap=0).validate()


def test_spacy_component_windows_a_long_doc(default_model, default_tagger, long_sentence):
    """A Doc without sentence boundaries, longer than the component's max_tokens: its token
    distributions are the whole sentence's (Tagger.tag unwindowed)."""
    spacy = pytest.importorskip("spacy")
    from spacy.tokens import Doc

    from gpseq.errors import ConfigError

    nlp = spacy.blank("en")
    nlp.add_pipe("gpseq", name="windowed", config={"model": str(default_model), "max_tokens": 150, "task": "tag",
                                                   "extension": "windowed_probs"})
    doc = nlp(Doc(nlp.vocab, words=long_sentence.tokens))
    whole = default_tagger.tag([long_sentence.tokens], max_tokens=10**6)[0]
    probs = np.array([[token._.windowed_probs[label] for label in default_tagger.labels] for token in doc])
    assert np.abs(probs - whole.probabilities).max() < 1e-6
    assert np.mean([token.tag_ == label for token, label in zip(doc, whole.labels)]) >= 0.98
    bad = spacy.blank("en")
    bad.add_pipe("gpseq", config={"model": str(default_model), "max_tokens": 100, "extension": "bad_probs"})
    with pytest.raises(ConfigError, match=r"max_tokens must be > 2 × the model's predict_overlap \(100\), got 100"):
        bad(Doc(bad.vocab, words=["a", "b"]))


# ---------------------------------------------------------------------------------------------
# Memory bounded by construction: batches, and the peak RSS of real runs on long inputs
# ---------------------------------------------------------------------------------------------

PEAK_RSS_BOUND_MB = 1536  # the bound (1.5 GB) for every run below, at default settings


def test_prediction_batches_are_bounded_whatever_the_sentence_length(default_tagger, long_sentence, monkeypatch):
    """Every batch that reaches the compiled prediction and scoring functions (or the default
    model's NumPy predictive) holds at most PREDICT_TOKENS padded tokens and sequences of at most
    max_tokens tokens, for sentences of thousands of tokens tagged and scored next to short ones:
    memory bounded by construction."""
    import gpseq.predict.predictor as prediction_module
    from gpseq.corpora import Sentence
    from gpseq.predict.linear import LinearPredictive

    shapes = []
    real_make_batch, real_padded = prediction_module.make_batch, LinearPredictive._padded

    def make_batch(data, ids, **kwargs):
        batch = real_make_batch(data, ids, **kwargs)
        shapes.append(batch["labels"].shape)  # [B, T]
        return batch

    def padded(self, data, ids):
        out = real_padded(self, data, ids)
        shapes.append(out[0].shape[:2])  # [B, T]
        return out

    monkeypatch.setattr(prediction_module, "make_batch", make_batch)
    monkeypatch.setattr(LinearPredictive, "_padded", padded)
    tokens = long_sentence.tokens  # about 3,400 tokens
    default_tagger.tag([tokens, tokens[:30], tokens[:7]], max_tokens=300)
    default_tagger.gold_log_probs([long_sentence, long_sentence], max_tokens=300)
    assert len(shapes) >= 4
    assert max(T for _, T in shapes) <= 300
    assert max(B * T for B, T in shapes) <= prediction_module.PREDICT_TOKENS
    # Monte Carlo: S draws of every token, so at most PREDICT_TOKEN_DRAWS tokens × draws a batch, or
    # one sentence or window alone (at S = 100 a batch of PREDICT_TOKENS tokens held 12 GB with 44 labels)
    shapes.clear()
    samples = 100
    sentences = [tokens[:40]] * 30 + [tokens]
    default_tagger.tag(sentences, samples=samples, max_tokens=300)
    short = Sentence(tokens=tokens[:40], labels=long_sentence.labels[:40])
    default_tagger.gold_log_probs([long_sentence] + [short] * 30, samples=samples, max_tokens=300)
    assert len(shapes) >= 8
    assert all(B * T * samples <= prediction_module.PREDICT_TOKEN_DRAWS or B == 1 for B, T in shapes), shapes
    assert max(T for _, T in shapes) <= 300


def _unpunctuated_words(n_words: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["committee", "budget", "approved", "three", "small", "projects", "fund", "the", "on", "Tuesday"]
    return [rng.choice(words) for _ in range(n_words)]


# Runs argv[1:] and prints its exit code and the peak RSS (KB) of the children it waited for. The test
# process cannot measure its own child: Linux carries the RSS high-water mark of the memory a child
# starts from (the parent's, with vfork or fork) into the child's ru_maxrss, and this process holds
# TensorFlow and models; the wrapper is a small process, so its child's peak is the command's own.
PEAK_RSS_WRAPPER = """
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode
print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def _peak_rss_mb(args: list, timeout: float = 600) -> tuple[int, float, str]:
    """Run `args` in a fresh process: (exit code, its peak RSS in MB, its stderr)."""
    done = subprocess.run([sys.executable, "-c", PEAK_RSS_WRAPPER, *map(str, args)], capture_output=True,
                          text=True, env=_subprocess_env(), timeout=timeout)
    assert done.returncode == 0, done.stderr
    code, peak_kb = map(int, done.stdout.split())
    return code, peak_kb / 1024, done.stderr


@pytest.mark.slow
def test_peak_rss_tagging_1mb_of_unpunctuated_text(default_model, tmp_path):
    """`gpseq tag` at default settings on 1 MB of wrapped text without a sentence boundary (past 12
    GB before issue 14): under the bound, every word tagged."""
    words = _unpunctuated_words(150_000)
    lines = [" ".join(words[i:i + 12]) for i in range(0, len(words), 12)]
    text = tmp_path / "wrapped.txt"
    text.write_text("\n".join(lines)[:1_000_000] + "\n", encoding="utf-8")
    out = tmp_path / "out.conll"
    code, peak, stderr = _peak_rss_mb([sys.executable, ROOT / "cli.py", "tag", default_model, text, "-o", out])
    assert code == 0, stderr
    print(f"peak RSS tagging 1 MB of unpunctuated text: {peak:.0f} MB")
    assert peak < PEAK_RSS_BOUND_MB
    tagged = [line.split("\t")[0] for line in out.read_text(encoding="utf-8").splitlines() if line]
    assert tagged == text.read_text(encoding="utf-8").split()


@pytest.mark.slow
@pytest.mark.parametrize("form", ["text line", "conll sentence"])
def test_peak_rss_tagging_a_50k_token_line(default_model, tmp_path, form):
    """A 50,000-token line of raw text (cut into sentences of --text-max-tokens) and a 50,000-token
    CoNLL sentence (tagged in windows of predict_max_tokens): under the bound at default settings."""
    words = _unpunctuated_words(50_000, seed=1)
    if form == "text line":
        path = tmp_path / "line.txt"
        path.write_text(" ".join(words) + "\n", encoding="utf-8")
    else:
        path = tmp_path / "sentence.conll"
        path.write_text("\n".join(words) + "\n\n", encoding="utf-8")
    out = tmp_path / "out.conll"
    code, peak, stderr = _peak_rss_mb([sys.executable, ROOT / "cli.py", "tag", default_model, path, "-o", out])
    assert code == 0, stderr
    print(f"peak RSS tagging a 50k-token {form}: {peak:.0f} MB")
    assert peak < PEAK_RSS_BOUND_MB
    assert sum(1 for line in out.read_text(encoding="utf-8").splitlines() if line) == 50_000


SPACY_DOC_SCRIPT = """
import sys
import spacy
from spacy.tokens import Doc
nlp = spacy.blank("en")
nlp.add_pipe("gpseq", config={"model": sys.argv[1], "task": "tag"})
words = open(sys.argv[2], encoding="utf-8").read().split()
doc = nlp(Doc(nlp.vocab, words=words))
assert len(doc) == len(words) and all(token.tag_ for token in doc)
"""


@pytest.mark.slow
def test_peak_rss_spacy_component_on_a_20k_token_doc(default_model, tmp_path):
    """A 20,000-token Doc without sentence boundaries through the component (5.35 GB before):
    under the bound, every token tagged."""
    pytest.importorskip("spacy")
    words = tmp_path / "words.txt"
    words.write_text(" ".join(_unpunctuated_words(20_000, seed=2)), encoding="utf-8")
    code, peak, stderr = _peak_rss_mb([sys.executable, "-c", SPACY_DOC_SCRIPT, default_model, words])
    assert code == 0, stderr
    print(f"peak RSS of the spaCy component on a 20k-token Doc: {peak:.0f} MB")
    assert peak < PEAK_RSS_BOUND_MB


# ---------------------------------------------------------------------------------------------
# SVI training batches capped by tokens; longer sentences cut into pieces
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_tokens", [None, 1, 40, 100, 10_000])
def test_bucketed_batches_capped_by_tokens(max_tokens):
    """Over random corpora: every sentence once per epoch; at most batch_size sentences and (given
    max_tokens) at most max_tokens padded tokens a batch, a longer sentence alone; lengths sorted
    into consecutive runs; as many batches as batch_count for every rng; with no cap, the
    same batches as cutting the sorted order every batch_size sentences."""
    from gpseq.training.batching import batch_count, bucketed_batches

    rng = np.random.default_rng(14)
    for trial in range(40):
        lengths = rng.integers(1, 60, size=rng.integers(1, 80))
        batch_size = int(rng.integers(1, 12))
        counts = set()
        for seed in range(3):
            batches = bucketed_batches(lengths, batch_size, np.random.default_rng(seed), max_tokens=max_tokens)
            counts.add(len(batches))
            assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
            for ids in batches:
                padded = len(ids) * lengths[ids].max()
                assert len(ids) <= batch_size
                assert max_tokens is None or padded <= max_tokens or len(ids) == 1, (lengths[ids], max_tokens)
        # unshuffled (rng None): consecutive runs of the sorted lengths, each as long as the limits allow
        ordered = bucketed_batches(lengths, batch_size, None, max_tokens=max_tokens)
        flat = np.sort(lengths)
        assert np.array_equal(lengths[np.concatenate(ordered)], flat)
        position = 0
        for ids in ordered:
            position += len(ids)
            if position < len(flat) and len(ids) < batch_size:
                assert max_tokens is not None and (len(ids) + 1) * flat[position] > max_tokens
        assert counts == {batch_count(lengths, batch_size, max_tokens)}
        if max_tokens is None:
            want = [np.sort(lengths)[i:i + batch_size].tolist() for i in range(0, len(lengths), batch_size)]
            got = sorted((np.sort(lengths[ids]).tolist() for ids in batches), key=lambda x: (x[0], x[-1], len(x)))
            assert got == sorted(want, key=lambda x: (x[0], x[-1], len(x)))


def test_cut_long_pieces_concatenate_to_the_sentence():
    """Sentences longer than max_tokens become ceil(T / max_tokens) consecutive pieces of nearly
    equal length, at most max_tokens each, whose rows and labels concatenate to the sentence's;
    shorter sentences are kept whole and in order."""
    import scipy.sparse as sp

    from gpseq.training.batching import SequenceData

    rng = np.random.default_rng(3)
    lengths = np.array([5, 23, 1, 8, 17, 9])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    rows = sp.csr_matrix(rng.integers(0, 3, size=(offsets[-1], 7)))
    labels = rng.integers(0, 4, size=offsets[-1]).astype(np.int32)
    data = SequenceData(rows, offsets, labels)
    assert data.cut_long(23) is data
    cut = data.cut_long(8)
    want_pieces = [1, 3, 1, 1, 3, 2]
    assert len(cut) == sum(want_pieces)
    assert cut.lengths.max() <= 8 and cut.lengths.max() - cut.lengths.min() <= 8
    assert (cut.rows != rows).nnz == 0 and np.array_equal(cut.label_ids, labels)  # same tokens, same order
    piece = 0
    for length, count in zip(lengths, want_pieces):
        parts = cut.lengths[piece:piece + count]
        assert parts.sum() == length and parts.max() - parts.min() <= 1
        piece += count


def test_svi_training_batches_are_capped_by_tokens(corpus, monkeypatch):
    """SVI on the tiny corpus plus one 700-token sentence, training.batch_tokens 128: every batch that
    reaches the training step holds at most 128 padded tokens and batch_size sentences, and one epoch
    covers every training token exactly once (the long sentence in pieces)."""
    import gpseq.training.distribute as distribute
    from gpseq.corpora import Sentence, read_conll
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger, TaggerConfig
    from gpseq.training.trainer import TrainingConfig

    train = read_conll(corpus)
    long = Sentence(([t for s in train for t in s.tokens] * 3)[:700], ([l for s in train for l in s.labels] * 3)[:700])
    assert len(long.tokens) == 700
    shapes = []
    real_make_batch = distribute.make_batch

    def make_batch(data, ids, **kwargs):
        batch = real_make_batch(data, ids, **kwargs)
        shapes.append((*batch["labels"].shape, int(batch["lengths"].sum())))  # B, T, real tokens
        return batch

    monkeypatch.setattr(distribute, "make_batch", make_batch)
    training = TrainingConfig(method="svi", batch_size=8, batch_tokens=128, epochs=1, dev_fraction=0.0,
                              early_stopping="none", checkpoint_every=0, seed=3)
    tagger = Tagger.train(train + [long], TaggerConfig(features=get_preset("ner"), training=training))
    assert tagger.scores["steps"] == len(shapes)
    assert max(B * T for B, T, _ in shapes) <= 128 and max(B for B, _, _ in shapes) <= 8
    assert sum(tokens for *_, tokens in shapes) == sum(len(s.tokens) for s in train) + 700


@pytest.mark.slow
@pytest.mark.parametrize("method", ["default", "svi"])
def test_peak_rss_training_on_one_10k_token_sentence(tmp_path, method):
    """`gpseq train` on a corpus of one 10,000-token sentence (3.15 GB before): under the bound, a
    model saved (SVI: pieces of batch_tokens; the default training: its own token-bounded batches)."""
    rows = [line for line in (SAMPLE / "train.conll").read_text(encoding="utf-8").splitlines() if line.strip()]
    path = tmp_path / "one.conll"
    path.write_text("\n".join(rows[i % len(rows)] for i in range(10_000)) + "\n\n", encoding="utf-8")
    extra = ["--set", "training.method=svi"] if method == "svi" else []
    out = tmp_path / "model"
    code, peak, stderr = _peak_rss_mb([sys.executable, ROOT / "cli.py", "train", path, "-o", out, "--features", "ner",
                                       "--max-steps", "2", *extra])
    assert code == 0, stderr
    print(f"peak RSS training ({method}) on one 10k-token sentence: {peak:.0f} MB")
    assert peak < PEAK_RSS_BOUND_MB
    assert (out / "tagger.json").is_file()


# ---------------------------------------------------------------------------------------------
# spaCy component to_disk: replaces only a model directory gpseq wrote, atomically
# ---------------------------------------------------------------------------------------------


def _component_nlp(model_dir: Path, name: str = "chunker"):
    spacy = pytest.importorskip("spacy")
    nlp = spacy.blank("en")
    nlp.add_pipe("gpseq", name=name, config={"model": str(model_dir), "extension": f"{name}_probs",
                                             "span_extension": f"{name}_prob"})
    return nlp


@pytest.mark.parametrize("loaded", [False, True], ids=["copied", "saved"])
@pytest.mark.parametrize("case", ["foreign-file", "not-a-model", "changed-file", "symlink"])
def test_component_to_disk_refuses_to_replace_what_gpseq_did_not_write(model, tmp_path, case, loaded):
    """<pipeline>/<component>/model already there and not (only) what gpseq wrote: OutputError naming
    it and the problem, every file around unchanged, no temporary left; the model not yet loaded
    (copied) or loaded (saved by Tagger.save) alike."""
    from gpseq.errors import OutputError

    nlp = _component_nlp(model)
    if loaded:
        assert nlp.get_pipe("chunker").tagger is not None
    pipeline = tmp_path / "pipeline"
    nlp.to_disk(pipeline)
    target = pipeline / "chunker" / "model"
    problem = {"foreign-file": "holds thesis.tex, which gpseq did not write",
               "not-a-model": "exists and is not a gpseq model directory (no tagger.json)",
               "changed-file": "holds arrays.npz, changed since gpseq wrote it",
               "symlink": "is a symbolic link"}[case]
    if case == "foreign-file":
        (target / "thesis.tex").write_text("years of work\n")
    elif case == "not-a-model":
        shutil.rmtree(target)
        target.mkdir()
        (target / "thesis.tex").write_text("years of work\n")
    elif case == "changed-file":
        with open(target / "arrays.npz", "ab") as handle:
            handle.write(b"appended")
    else:
        elsewhere = tmp_path / "elsewhere"
        shutil.move(target, elsewhere)
        target.symlink_to(elsewhere, target_is_directory=True)
    before = snapshot(tmp_path)
    with pytest.raises(OutputError) as caught:
        nlp.to_disk(pipeline)
    assert str(caught.value).splitlines()[0].startswith(f"{target}: {problem}"), str(caught.value)
    assert snapshot(tmp_path) == before


def test_component_to_disk_replaces_its_own_model_and_copies_only_what_gpseq_wrote(copy, tmp_path):
    """A second to_disk replaces the model directory the first wrote (the rest of the pipeline
    directory untouched); a foreign file in the source model directory is not copied; the
    result loads with spaCy and has the source model's files, byte for byte."""
    spacy = pytest.importorskip("spacy")
    source = copy("source")
    (source / "my-notes.txt").write_text("not part of the model\n")
    nlp = _component_nlp(source)
    pipeline = tmp_path / "pipeline"
    nlp.to_disk(pipeline)
    (pipeline / "chunker" / "README.txt").write_text("mine\n")  # beside the model: not gpseq's to touch
    nlp.to_disk(pipeline)
    target = pipeline / "chunker" / "model"
    want = {name: digest for name, digest in snapshot(source).items() if name != "my-notes.txt"}
    assert snapshot(target) == want
    assert (pipeline / "chunker" / "README.txt").read_text() == "mine\n"
    assert sorted(p.name for p in (pipeline / "chunker").iterdir()) == ["README.txt", "model"]
    loaded = spacy.load(pipeline)
    assert loaded.get_pipe("chunker").labels == nlp.get_pipe("chunker").labels


# ---------------------------------------------------------------------------------------------
# Files beside the outputs that gpseq did not write: a lock file, a checkpoint directory, plots
# ---------------------------------------------------------------------------------------------


def test_train_never_takes_or_removes_a_users_file_named_like_its_lock(corpus, tmp_path):
    out = tmp_path / "model"
    users = tmp_path / "model.lock"
    users.write_text("meeting notes, not a lock\n", encoding="utf-8")
    before = snapshot(tmp_path)
    result = invoke("train", corpus, "-o", out, *TINY)
    assert result.exit_code == 2
    line = one_line(result)
    assert line.startswith(f"error: {users}: exists and is not a gpseq lock file; refusing to use or remove it"), line
    assert snapshot(tmp_path) == before  # the file as it was, no model


def test_svi_checkpoints_never_replace_a_users_directory_named_checkpoint(corpus, tmp_path):
    checkpoints = tmp_path / "work"
    (checkpoints / "checkpoint").mkdir(parents=True)
    (checkpoints / "checkpoint" / "notes.txt").write_text("mine\n", encoding="utf-8")
    before = snapshot(tmp_path)
    result = invoke("train", corpus, "-o", tmp_path / "model", "--checkpoint-dir", checkpoints, *TINY,
                    "--set", "training.method=svi", "--set", "training.checkpoint_every=1")
    assert result.exit_code == 2
    line = one_line(result)
    assert line.startswith(f"error: {checkpoints / 'checkpoint'}: holds files gpseq did not write (notes.txt)"), line
    assert snapshot(tmp_path) == before


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


def test_train_from_standard_input_is_a_one_line_error(corpus, tmp_path):
    before = snapshot(tmp_path)
    result = invoke("train", "-", "-o", tmp_path / "model", *TINY, input=corpus.read_text(encoding="utf-8"))
    assert result.exit_code == 2
    assert one_line(result) == ("error: -: training needs a file, not - (standard input): a corpus is read more "
                                "than once")
    assert snapshot(tmp_path) == before


def test_text_reader_bounds_stretches_without_whitespace(tmp_path):
    """spaCy's tokenizer takes time quadratic in a stretch without whitespace made of prefixes or
    suffixes ("((((…" of 16,000 characters: 19 s; 100,000, within gpseq serve's max_chars: ~12
    minutes, the worker frozen). spaCy never gets more than TEXT_MAX_RUN (500) such characters in a
    row; every character is kept, in order; cuts in unspaced text fall after sentence punctuation;
    normal lines are tokenised as before."""
    from gpseq.corpora.text import TEXT_MAX_RUN

    assert TEXT_MAX_RUN == 500

    class Bounded(_RecordingNlp):
        def __call__(self, text):
            assert max(map(len, text.split()), default=0) <= 500, "spaCy got a longer stretch"
            return super().__call__(text)

    japanese = "。".join(["日本語の文です"] * 200) + "。"
    lines = ["A first line.", "(" * 100_000, "Quote " + "'" * 20_000 + " end.", japanese, "The last one."]
    path = tmp_path / "runs.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    nlp = Bounded()
    started = time.perf_counter()
    items = list(iter_text(path, nlp, encoding="utf-8", name=str(path)))
    assert time.perf_counter() - started < 60
    assert items[0].tokens == ["A", "first", "line", "."] and items[-1].tokens == ["The", "last", "one", "."]
    for number, line in enumerate(lines, start=1):
        tokens = [t for item in items if item.line == number for t in item.tokens]
        assert "".join(tokens) == "".join(line.split())
    pieces = ["".join(item.tokens) for item in items if item.line == 4]
    assert all(piece.endswith("。") for piece in pieces)
