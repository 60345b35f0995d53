"""Where a command writes (gpseq/cli/outputs.py): never over an input or a foreign file, checked
before any work, through a temporary file.

`tag -o` refuses the input (under any name, standard input's file included), a directory, a missing
or read-only place, the model directory; it replaces an old output only once it is complete,
keeping its mode, and removes the temporaries of dead runs. Unwritable outputs are refused before
any work (in a subprocess without the root capabilities that bypass permissions, `setpriv`, since
the suite may run as root). `train -o` takes a lock file beside the model directory: a second
training on the same output fails at start, and a user's file of that name is never taken.

Every case asserts the exit code, that stderr is one line `error: …` naming the file and the
problem, and the sha256 of every file around it before and after. The tiny model of
`helpers.tiny_model` is trained once for the module."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from helpers import ROOT
from helpers.cli import invoke, one_line
from helpers.files import dead_pid, sha, snapshot
from helpers.tiny_model import KILL_OPTIONS, TINY, copy, corpus, model, notes, subprocess_env  # noqa: F401

from gpseq.predict.writers import ConllWriter


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


# ---- unwritable outputs: refused before any work (a subprocess without permission-bypassing capabilities)


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


# ---- two trainings writing the same -o: a lock file beside the model directory


LOCK_HOLDER = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from gpseq.cli.outputs import train_lock
with train_lock(Path(sys.argv[2])):
    print("locked", flush=True)
    sys.stdin.read()
"""


def test_a_second_training_on_the_same_output_fails_at_start(corpus, tmp_path):
    """A training in progress (another process holding MODEL.lock): exit 2 at start, one line naming
    the model directory and the PID holding it, nothing written; once that process is killed
    (SIGKILL: its lock file stays, naming a dead PID), the next training takes the lock over and
    removes it at the end."""
    out = tmp_path / "model"
    lock = tmp_path / "model.lock"
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(ROOT), str(out)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=subprocess_env())
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
                             env=subprocess_env())
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
