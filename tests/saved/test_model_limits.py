"""Crafted models are refused with one line, before they cost memory or time.

A model directory is data from anywhere: every case below starts from a copy of one tiny trained
model (`helpers.tiny_model`), crafts one file of it (a tamperer updates the manifest and the
checksums to match, so the crafted content reaches the reader), and runs `python -m gpseq info`
(or `tag`) in a subprocess under a wrapper interpreter that reports the command's peak RSS. Each
must exit 3 with one stderr line naming the crafted file, within a timeout (a hang fails), at a
peak RSS of at most PEAK_RSS_MB: the bombs inflate to a GiB, /dev/zero and FIFOs never end.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from helpers.peak_rss import assert_refused, run_gpseq
from helpers.tiny_model import corpus, model  # noqa: F401  (fixtures: a tiny trained model)

from gpseq.errors import ModelFormatError, NumericalError
from gpseq.saved.meta import MAX_LABELS, check_array_values


BOMB_BYTES = 1 << 30  # what each zip bomb inflates to: far past PEAK_RSS_MB


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
    # one bad value among finite ones, wherever it sits (the check reads the array's extremes)
    rng = np.random.default_rng(0)
    for bad, problem in [(np.nan, "NaN"), (np.inf, "infinite values"), (-np.inf, "infinite values")]:
        for _ in range(5):
            values = rng.normal(size=(7, 11)).astype(np.float32)
            values.flat[rng.integers(values.size)] = bad
            with pytest.raises(ModelFormatError, match=f"'var:linear/q_mu' holds {problem}"):
                check_array_values(tmp_path, {**good, "var:linear/q_mu": values})
    check_array_values(tmp_path, {**good, "var:linear/q_mu": np.full((2, 2), np.finfo(np.float32).max)})


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
