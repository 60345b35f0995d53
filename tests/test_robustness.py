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
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli import invoke, one_line  # the in-process CliRunner helpers (and `import cli`)

import cli  # noqa: E402  (test_cli put the checkout on sys.path)

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
    real_call = cli._TrainProgress.__call__

    def call(self, progress):
        if not foreign.exists():
            foreign.write_text("written during training\n")
        return real_call(self, progress)

    monkeypatch.setattr(cli._TrainProgress, "__call__", call)
    result = invoke("train", corpus, "-o", target, *TINY, "--checkpoint-dir", tmp_path / "ckpt")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {target}: holds notes-written-meanwhile.txt, which gpseq did not write; refusing to replace it")
    assert foreign.read_text() == "written during training\n"
    assert snapshot(target) == {**original, "notes-written-meanwhile.txt": sha(foreign)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "m"]  # no .m.tmp-* / .m.old-* left


def test_save_rechecks_after_moving_the_old_directory_aside(model, copy, tmp_path, monkeypatch):
    """A file that appears after the last check but before the replace is not deleted either."""
    import gpseq.tagger as tagger_module
    from gpseq.errors import OutputError

    tagger = tagger_module.Tagger.load(model)
    target = copy()
    foreign = target / "late.txt"
    real_check = tagger_module._check_save_target
    calls = []

    def check(directory):
        real_check(directory)
        calls.append(directory)
        if len(calls) == 2:  # the check inside save, immediately before the replace
            foreign.write_text("just in time\n")

    monkeypatch.setattr(tagger_module, "_check_save_target", check)
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
    q_mu = meta["arrays"].get("var:linear/q_mu")
    if q_mu is not None:  # keep the recorded shapes consistent: only the featurizer disagrees
        meta["arrays"]["var:linear/q_mu"] = [real + 1, q_mu[1]]
    (model_dir / "tagger.json").write_text(json.dumps(meta))
    result = invoke("info", model_dir)
    assert result.exit_code == 3
    assert one_line(result) == (f"error: {model_dir / 'tagger.json'}: num_features {real + 1:,} does not match "
                                f"the featurizer's {real:,} (features/featurizer.json)")


# ---------------------------------------------------------------------------------------------
# --resume from a checkpoint of another configuration
# ---------------------------------------------------------------------------------------------


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
