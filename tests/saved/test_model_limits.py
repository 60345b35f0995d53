"""Crafted models and hostile options are refused with one line, before they cost memory or time.

A model directory is data from anywhere: every case below starts from a copy of one tiny trained
model (`test_robustness`'s fixtures), crafts one file of it (a tamperer updates the manifest and
the checksums to match, so the crafted content reaches the reader), and runs `python -m gpseq info`
(or `tag`) in a subprocess under a wrapper interpreter that reports the command's peak RSS. Each
must exit 3 with one stderr line naming the crafted file, within a timeout (a hang fails), at a
peak RSS of at most PEAK_RSS_MB: the bombs inflate to a GiB, /dev/zero and FIFOs never end.

Options: each bad value exits 4 with one line before any work (training and loading are patched to
fail the test, and no output is created).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from test_cli import invoke, one_line
from test_robustness import _subprocess_env, corpus, model  # noqa: F401  (fixtures: a tiny trained model)

from gpseq.config import MAX_NBEST, MAX_SAMPLES, TaggerConfig
from gpseq.errors import ConfigError, ModelFormatError, NumericalError
from gpseq.features.config import MAX_WINDOW, FeatureConfig
from gpseq.saved.meta import MAX_LABELS, check_array_values
from gpseq.structured.config import ModelConfig
from gpseq.training.config import TrainingConfig

PEAK_RSS_MB = 300
TIMEOUT_S = 120
BOMB_BYTES = 1 << 30  # what each zip bomb inflates to: far past PEAK_RSS_MB

# Runs argv[2:] with a timeout of argv[1] seconds (killing it then) and prints its exit code (or
# "timeout") and its peak RSS in KB: a small wrapper, so that the child's ru_maxrss is its own (a
# child forked from the test process would start from the test process's high-water mark)
WRAPPER = """
import resource, subprocess, sys
try:
    code = subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, timeout=float(sys.argv[1])).returncode
except subprocess.TimeoutExpired:
    code = "timeout"
print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def run_gpseq(*args) -> tuple[int | str, float, str]:
    """`python -m gpseq ARGS` in a fresh process: (exit code or "timeout", peak RSS in MB, stderr)."""
    done = subprocess.run([sys.executable, "-c", WRAPPER, str(TIMEOUT_S), sys.executable, "-m", "gpseq",
                           *map(str, args)], capture_output=True, text=True, env=_subprocess_env(),
                          timeout=TIMEOUT_S + 60)
    code, peak_kb = done.stdout.split()
    return (int(code) if code != "timeout" else code), int(peak_kb) / 1024, done.stderr


def assert_refused(result, path: Path | None, problem: str, code: int = 3) -> None:
    """Exit `code`, one stderr line `error: PATH: …` (`error: …` for an option: `path` None) holding
    `problem`, peak RSS within PEAK_RSS_MB."""
    exit_code, peak_mb, stderr = result
    assert exit_code == code, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"error: {path}: " if path is not None else "error: ") and problem in lines[0], \
        lines[0]
    assert peak_mb <= PEAK_RSS_MB, f"peak RSS {peak_mb:.0f} MB"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def update_manifest(model_dir: Path, *names: str) -> None:
    """Record the current size and sha256 of `names` in tagger.json (a tamperer covering its tracks)."""
    meta = json.loads((model_dir / "tagger.json").read_text())
    for name in names:
        meta["files"][name] = {"sha256": sha(model_dir / name), "size": (model_dir / name).stat().st_size}
    (model_dir / "tagger.json").write_text(json.dumps(meta, indent=2))


def edit_meta(model_dir: Path, edit) -> None:
    meta = json.loads((model_dir / "tagger.json").read_text())
    edit(meta)
    (model_dir / "tagger.json").write_text(json.dumps(meta, indent=2))


def load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


def write_npz(path: Path, arrays: dict[str, np.ndarray], declared: dict | None = None,
              compression: int = zipfile.ZIP_DEFLATED) -> None:
    """An .npz of `arrays` and, for each {name: (shape, dtype, data bytes)} of `declared`, a member
    whose .npy header declares that shape, followed by `data bytes` zero bytes written in chunks
    (a bomb never held in memory)."""
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asarray(array), allow_pickle=False)
        for name, (shape, dtype, n_bytes) in (declared or {}).items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array_header_2_0(
                    member, {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": tuple(shape)})
                chunk = bytes(1 << 20)
                while n_bytes > 0:
                    member.write(chunk[:n_bytes])
                    n_bytes -= len(chunk)


@pytest.fixture()
def crafted(model, tmp_path):
    """A fresh copy of the tiny model directory (inside tmp_path/models, beside an `outside` folder)."""
    target = tmp_path / "models" / "m"
    shutil.copytree(model, target)
    (tmp_path / "outside").mkdir()
    return target


@pytest.fixture(scope="module")
def bombs(model, tmp_path_factory) -> dict[str, Path]:
    """Zip bombs built once from the tiny model's own arrays: each ~1 MB, inflating to 1 GiB."""
    folder = tmp_path_factory.mktemp("bombs")
    arrays = load_npz(model / "arrays.npz")
    vocabulary = load_npz(model / "features" / "vocabulary.npz")
    out = {}
    # var:label_bias [V] replaced by 2**27 float64 zeros
    out["arrays"] = folder / "arrays.npz"
    write_npz(out["arrays"], {k: v for k, v in arrays.items() if k != "var:label_bias"},
              {"var:label_bias": ([BOMB_BYTES // 8], "<f8", BOMB_BYTES)})
    # a free (scalar) array of the model inflated, tagger.json then records its shape too
    out["free array"] = folder / "free.npz"
    write_npz(out["free array"], {k: v for k, v in arrays.items() if k != "var:kernel/variance/_pretransformed_input"},
              {"var:kernel/variance/_pretransformed_input": ([BOMB_BYTES // 4], "<f4", BOMB_BYTES)})
    out["vocabulary extra member"] = folder / "vocabulary-extra.npz"
    write_npz(out["vocabulary extra member"], vocabulary, {"junk": ([BOMB_BYTES // 8], "<i8", BOMB_BYTES)})
    out["vocabulary table"] = folder / "vocabulary-table.npz"
    write_npz(out["vocabulary table"], {k: v for k, v in vocabulary.items() if k != "columns_1"},
              {"columns_1": ([BOMB_BYTES // 4], "<i4", BOMB_BYTES)})
    return out


# ---------------------------------------------------------------------------------------------
# crafted arrays.npz and vocabulary.npz: checked in the .npy headers, before decompressing
# ---------------------------------------------------------------------------------------------


def test_arrays_zip_bomb_is_refused_from_its_header(crafted, bombs):
    """A 1 MB arrays.npz whose var:label_bias inflates to 1 GiB (tagger.json still records [V])."""
    shutil.copyfile(bombs["arrays"], crafted / "arrays.npz")
    assert (crafted / "arrays.npz").stat().st_size < 4 << 20
    update_manifest(crafted, "arrays.npz")
    assert_refused(run_gpseq("info", crafted), crafted / "arrays.npz",
                   f"array 'var:label_bias' has shape [{BOMB_BYTES // 8}], tagger.json records")


def test_arrays_zip_bomb_recorded_in_tagger_json_is_refused_by_the_model_dims(crafted, bombs):
    """The same bomb in an array whose shape no label or feature count pins, tagger.json agreeing:
    no array of a model of V labels and D features holds a GiB."""
    shutil.copyfile(bombs["free array"], crafted / "arrays.npz")
    update_manifest(crafted, "arrays.npz")
    edit_meta(crafted, lambda meta: meta["arrays"].update(
        {"var:kernel/variance/_pretransformed_input": [BOMB_BYTES // 4]}))
    assert_refused(run_gpseq("info", crafted), crafted / "tagger.json",
                   "holds more numbers than any array of a model of")


@pytest.mark.parametrize("bomb", ["vocabulary extra member", "vocabulary table"])
def test_vocabulary_zip_bomb_is_refused_from_its_header(crafted, bombs, bomb):
    """vocabulary.npz with a 1 GiB member besides its tables (numpy would read it and the model
    load), or one table inflated past featurizer.json's n_features; checksums updated."""
    vocabulary = crafted / "features" / "vocabulary.npz"
    shutil.copyfile(bombs[bomb], vocabulary)
    featurizer_json = crafted / "features" / "featurizer.json"
    data = json.loads(featurizer_json.read_text())
    data["vocabulary_sha256"] = sha(vocabulary)
    featurizer_json.write_text(json.dumps(data))
    update_manifest(crafted, "features/vocabulary.npz", "features/featurizer.json")
    problem = "holds an array 'junk' gpseq does not write" if bomb.endswith("member") else \
        f"array 'columns_1' of shape [{BOMB_BYTES // 4}] holds more than the"
    assert_refused(run_gpseq("info", crafted), vocabulary, problem)


def test_header_declaring_ten_trillion_numbers(crafted):
    """An .npy header declaring 10^13 float32 (40 TB) over 36 bytes of data: refused from the header
    (numpy would allocate it first)."""
    arrays = load_npz(crafted / "arrays.npz")
    write_npz(crafted / "arrays.npz", {k: v for k, v in arrays.items() if k != "var:label_bias"},
              {"var:label_bias": ([10**13], "<f4", 36)})
    update_manifest(crafted, "arrays.npz")
    assert_refused(run_gpseq("info", crafted), crafted / "arrays.npz",
                   "array 'var:label_bias' has shape [10000000000000], tagger.json records")


def test_header_declaring_ten_trillion_numbers_recorded_in_tagger_json(crafted):
    arrays = load_npz(crafted / "arrays.npz")
    name = "var:kernel/variance/_pretransformed_input"
    write_npz(crafted / "arrays.npz", {k: v for k, v in arrays.items() if k != name}, {name: ([10**13], "<f4", 4)})
    update_manifest(crafted, "arrays.npz")
    edit_meta(crafted, lambda meta: meta["arrays"].update({name: [10**13]}))
    assert_refused(run_gpseq("info", crafted), crafted / "tagger.json",
                   "holds more numbers than any array of a model of")


def test_arrays_compressed_by_bzip2_are_refused(crafted):
    """The model's own arrays, bzip2-compressed (zipfile reads it; bzip2 inflates a million-fold,
    past what deflate can, in one call): numpy never writes it, so it is refused."""
    write_npz(crafted / "arrays.npz", load_npz(crafted / "arrays.npz"), compression=zipfile.ZIP_BZIP2)
    update_manifest(crafted, "arrays.npz")
    assert_refused(run_gpseq("info", crafted), crafted / "arrays.npz", "compressed by zip method 12")


def test_labels_past_the_limit_are_refused_before_reading_arrays(crafted):
    """tagger.json claims MAX_LABELS + 1 labels with array shapes to match: refused from the
    metadata (the [V, V] arrays it records would be 400 MB each)."""
    def edit(meta):
        old_V, V = len(meta["labels"]), MAX_LABELS + 1
        meta["labels"] = [f"B-X{i}" for i in range(V)]
        for name in ("var:label_bias", "var:pairwise_mean", "var:pairwise_variance/_pretransformed_input",
                     "var:linear/q_mu", "var:linear/q_variance/_pretransformed_input", "var:inducing/q_mu",
                     "var:inducing/q_sqrt/_pretransformed_input"):
            meta["arrays"][name] = [V if d == old_V else d for d in meta["arrays"][name]]
    edit_meta(crafted, edit)
    assert_refused(run_gpseq("info", crafted), crafted / "tagger.json",
                   f"{MAX_LABELS + 1:,} labels; gpseq tags with at most {MAX_LABELS:,}")


# ---------------------------------------------------------------------------------------------
# files that are not regular files inside the model directory
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tagger.json", "arrays.npz", "features/featurizer.json",
                                  "features/vocabulary.npz"])
@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "legacy"])
def test_a_file_linked_to_dev_zero_is_refused_unread(crafted, name, manifest):
    """Each file a load reads, as a symbolic link to /dev/zero (endless): refused without reading it,
    in a model with a manifest and in one without (whose files nothing else bounds)."""
    if not manifest:
        edit_meta(crafted, lambda meta: meta.pop("files"))
    (crafted / name).unlink()
    (crafted / name).symlink_to("/dev/zero")
    assert_refused(run_gpseq("info", crafted), crafted / name, "a symbolic link")


@pytest.mark.parametrize("name", ["arrays.npz", "features/vocabulary.npz", "features/featurizer.json"])
def test_a_fifo_in_place_of_a_file_is_refused_without_waiting(crafted, name):
    """A FIFO with no writer where a legacy model (no manifest to compare sizes) has a file:
    opening or reading it would wait forever."""
    edit_meta(crafted, lambda meta: meta.pop("files"))
    (crafted / name).unlink()
    os.mkfifo(crafted / name)
    assert_refused(run_gpseq("info", crafted), crafted / name, "a FIFO, not a regular file")


def test_a_manifest_entry_naming_a_fifo_is_refused_without_waiting(crafted):
    """The manifest lists an empty file that is a FIFO: its size (0) matches, its sha256 would be
    read from it forever."""
    os.mkfifo(crafted / "extra.bin")
    edit_meta(crafted, lambda meta: meta["files"].update(
        {"extra.bin": {"size": 0, "sha256": hashlib.sha256(b"").hexdigest()}}))
    assert_refused(run_gpseq("info", crafted), crafted / "extra.bin", "a FIFO, not a regular file")


@pytest.mark.parametrize("command", ["info", "tag"])
@pytest.mark.parametrize("link", ["arrays.npz", "features"])
def test_a_symbolic_link_out_of_the_model_directory_is_refused(crafted, tmp_path, link, command):
    """arrays.npz, or the features directory, as a link to an identical copy outside the model
    directory (so sizes and checksums match): refused, the outside file never read."""
    outside = tmp_path / "outside" / link
    shutil.move(crafted / link, outside)
    (crafted / link).symlink_to(outside)
    notes = tmp_path / "notes.txt"
    notes.write_text("The committee approved the budget.\n", encoding="utf-8")
    args = ["info", crafted] if command == "info" else ["tag", crafted, notes, "-o", tmp_path / "out.conll"]
    assert_refused(run_gpseq(*args), crafted / link, "a symbolic link")
    assert not (tmp_path / "out.conll").exists()


def test_a_symbolic_link_inside_the_model_directory_is_refused_too(crafted):
    """The policy is simple: gpseq writes no link, and reads none below the model directory."""
    (crafted / "arrays.npz").rename(crafted / "arrays-real.npz")
    (crafted / "arrays.npz").symlink_to("arrays-real.npz")
    assert_refused(run_gpseq("info", crafted), crafted / "arrays.npz", "a symbolic link")


def test_the_model_directory_itself_may_be_a_symbolic_link(crafted, tmp_path):
    (tmp_path / "current").symlink_to(crafted)
    code, peak, stderr = run_gpseq("info", tmp_path / "current")
    assert code == 0, stderr


# ---------------------------------------------------------------------------------------------
# values: a model that would tag NaN is refused at load (and never saved)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, value, problem", [
    ("var:pairwise_mean", np.nan, "array 'var:pairwise_mean' holds NaN"),
    ("var:linear/q_mu", np.inf, "array 'var:linear/q_mu' holds infinite values"),
    ("var:temperature", 0.0, "array 'var:temperature' is 0.0; it must be positive"),
    ("var:variance_scale", -1.0, "array 'var:variance_scale' is -1.0; it must be positive"),
])
def test_arrays_that_tag_nan_are_refused_at_load(crafted, tmp_path, name, value, problem):
    arrays = load_npz(crafted / "arrays.npz")
    arrays[name] = np.full_like(arrays[name], value)
    np.savez_compressed(crafted / "arrays.npz", **arrays)
    update_manifest(crafted, "arrays.npz")
    notes = tmp_path / "notes.txt"
    notes.write_text("The committee approved the budget.\n", encoding="utf-8")
    assert_refused(run_gpseq("tag", crafted, notes, "-o", tmp_path / "out.conll"), crafted / "arrays.npz", problem)
    assert not (tmp_path / "out.conll").exists()


def test_check_array_values_refuses_to_save_what_would_tag_nan(tmp_path):
    """What `Tagger.save` calls before writing: a NumericalError naming the directory."""
    good = {"var:temperature": np.float32(1.5), "var:pairwise_mean": np.zeros((3, 3), np.float32)}
    check_array_values(tmp_path, good, saving=True)
    with pytest.raises(NumericalError, match=r"not saved: the model's array 'var:pairwise_mean' holds NaN"):
        check_array_values(tmp_path, {**good, "var:pairwise_mean": np.full((3, 3), np.nan)}, saving=True)
    with pytest.raises(ModelFormatError, match="'var:temperature' is 0.0; it must be positive"):
        check_array_values(tmp_path, {**good, "var:temperature": np.float32(0)})


# ---------------------------------------------------------------------------------------------
# deeply nested JSON
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tagger.json", "features/featurizer.json"])
def test_deeply_nested_json_is_one_line(crafted, name):
    path = crafted / name
    data = json.loads(path.read_text())
    text = json.dumps(data)
    nested = "[" * 100_000 + "]" * 100_000
    path.write_text(text[:-1] + f', "nested": {nested}}}')
    if name != "tagger.json":
        update_manifest(crafted, name)
    assert_refused(run_gpseq("info", crafted), path, "nested too deeply")


# ---------------------------------------------------------------------------------------------
# options: checked before any work
# ---------------------------------------------------------------------------------------------


class WorkStarted(Exception):
    """Raised by the patched Tagger.train / Tagger.load: the command got past its checks."""


@pytest.fixture()
def no_work(monkeypatch):
    from gpseq.tagger import Tagger

    def started(*args, **kwargs):
        raise WorkStarted

    monkeypatch.setattr(Tagger, "train", started)
    monkeypatch.setattr(Tagger, "load", started)


@pytest.fixture()
def no_fit(monkeypatch):
    """The first work of a training, after its corpus is scanned: fitting the featurizer."""
    from gpseq.features import Featurizer

    def started(*args, **kwargs):
        raise WorkStarted

    monkeypatch.setattr(Featurizer, "fit", started)


def _invoke_refused(*args, problem: str):
    result = invoke(*args)
    assert result.exit_code == 4, result.stderr
    line = one_line(result)
    assert problem in line, line
    return line


@pytest.mark.parametrize("assignment, problem", [
    ("tag_scheme=xyz", "unknown tag scheme 'xyz'"),
    ("model.prior_variance=-1", "model.prior_variance must be a finite number > 0, got -1"),
    ("model.prior_variance=NaN", "model.prior_variance must be a finite number > 0, got nan"),
    ('model.prior_variance="abc"', "model.prior_variance must be a finite number > 0, got 'abc'"),
    ("model.prior_variance=true", "model.prior_variance must be a finite number > 0, got True"),
    ("model.num_inducing=0", "model.num_inducing must be an integer >= 1"),
    ("training.seed=-1", "training.seed must be an integer >= 0 and <= 2,147,483,647, got -1"),
    ("training.seed=1e30", "training.seed must be an integer >= 0 and <= 2,147,483,647, got 1e+30"),
    ("training.learning_rate=Infinity", "training.learning_rate must be a finite number >= 0, got inf"),
    ("features.window=11", f"features.window must be an integer in [0, {MAX_WINDOW}], got 11"),
    ("predict_samples=100000", f"predict_samples must be an integer >= 1 and <= {MAX_SAMPLES:,}"),
    ("training.seed=" + "9" * 5000, "(5,000 characters) is not a value a configuration holds"),
    ('features.conjunctions=[[["lower","x"]]]', "invalid tagger configuration: invalid literal for int()"),
])
def test_bad_training_options_are_refused_before_training(corpus, tmp_path, no_work, assignment, problem):
    out = tmp_path / "out"
    _invoke_refused("train", corpus, "-o", out, "--set", assignment, problem=problem)
    assert sorted(tmp_path.iterdir()) == []  # no model, no checkpoint, no lock


def test_a_huge_window_is_refused_before_any_template_is_built(corpus, tmp_path):
    """features.window=1000000 built two million templates (7.5 GB) before failing."""
    result = run_gpseq("train", corpus, "-o", tmp_path / "out", "--set", "features.window=1000000")
    assert_refused(result, None, f"features.window must be an integer in [0, {MAX_WINDOW}], got 1000000", code=4)
    assert not (tmp_path / "out").exists()


def _labelled_file(path: Path, n_labels: int) -> Path:
    path.write_text("".join(f"w{i} L{i}\n" + ("\n" if i % 50 == 49 else "") for i in range(n_labels)),
                    encoding="utf-8")
    return path


def test_too_many_labels_are_refused_naming_the_training_file(tmp_path, no_fit):
    """100,000 labels asked 74.5 GiB of one pairwise array."""
    train = _labelled_file(tmp_path / "many.conll", 100_000)
    line = _invoke_refused("train", train, "-o", tmp_path / "out", "--features", "ner",
                           problem=f"more than {MAX_LABELS:,} distinct labels")
    assert line.startswith(f"error: {train}: ")
    assert not (tmp_path / "out").exists()


def test_labels_up_to_the_limit_reach_training(tmp_path, no_fit):
    train = _labelled_file(tmp_path / "many.conll", MAX_LABELS)
    with pytest.raises(WorkStarted):
        invoke("train", train, "-o", tmp_path / "out", "--features", "ner")


@pytest.mark.parametrize("option, value, problem", [
    ("--nbest", 1_000_000, f"--nbest must be in [0, {MAX_NBEST}]"),
    ("--samples", 100_000, f"--samples must be in [1, {MAX_SAMPLES:,}]"),
])
def test_bad_tag_options_are_refused_before_loading(model, tmp_path, no_work, option, value, problem):
    notes = tmp_path / "notes.txt"
    notes.write_text("The committee approved the budget.\n", encoding="utf-8")
    _invoke_refused("tag", model, notes, option, value, "-o", tmp_path / "out.conll", problem=problem)
    assert not (tmp_path / "out.conll").exists()
    with pytest.raises(WorkStarted):  # the limits themselves are allowed
        invoke("tag", model, notes, option, MAX_NBEST if option == "--nbest" else MAX_SAMPLES)


# ---------------------------------------------------------------------------------------------
# every numeric configuration field: type, finiteness and range
# ---------------------------------------------------------------------------------------------


def _numeric_fields():
    for section, cls in (("features", FeatureConfig), ("model", ModelConfig), ("training", TrainingConfig),
                         (None, TaggerConfig)):
        for field in dataclasses.fields(cls):
            if field.type in ("int", "float", "int | None", "float | None"):
                yield section, field.name


@pytest.mark.parametrize("section, name", list(_numeric_fields()))
@pytest.mark.parametrize("bad", ["abc", True, math.nan, -1])
def test_every_numeric_field_is_checked(section, name, bad):
    data = TaggerConfig().to_dict()
    (data[section] if section else data)[name] = bad
    with pytest.raises(ConfigError, match=name):
        TaggerConfig.from_dict(data).validate()


@pytest.mark.parametrize("grid", ["prior_variance_grid", "pairwise_variance_grid", "l1_grid"])
@pytest.mark.parametrize("bad", ["abc", True, math.nan, -1])
def test_grid_values_are_checked(grid, bad):
    data = TaggerConfig().to_dict()
    data["training"][grid] = [1.0, bad]
    with pytest.raises(ConfigError, match=grid):
        TaggerConfig.from_dict(data).validate()
