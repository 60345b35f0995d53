"""Corrupt and tampered model files are one-line errors with exit 3 naming the file: empty,
truncated or invalid files, arrays holding a pickled payload (refused unexecuted), and metadata
that does not match the arrays (refused before the model is built).

Every case asserts the exit code, the one stderr line, and the sha256 of every file around it
before and after. The tiny model of `helpers.tiny_model` is trained once for the module."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers.cli import invoke, one_line
from helpers.files import sha, snapshot
from helpers.tiny_model import copy, corpus, model, notes  # noqa: F401


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


# ---- metadata validated before the model is built


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
