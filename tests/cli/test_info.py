"""`gpseq info`: the sizes it reports against the model directory read from disk."""

from __future__ import annotations

import json
import os

import numpy as np

from helpers.cli import invoke, library_tagger, sample, trained  # noqa: F401


def test_info_json_reports_sizes_from_disk(trained, library_tagger):
    model_dir, _ = trained
    result = invoke("info", model_dir, "--json")
    assert result.exit_code == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["labels"] == library_tagger.labels
    assert info["n_features"] == library_tagger.featurizer.n_features
    on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(model_dir) for f in files)
    assert info["bytes_on_disk"] == on_disk
    with np.load(model_dir / "arrays.npz") as arrays:
        assert info["n_parameters"] == sum(arrays[name].size for name in arrays.files)
    assert info["format_version"] == json.loads((model_dir / "tagger.json").read_text())["format_version"]
    assert info["training"]["max_steps"] == 8
    table = invoke("info", model_dir)
    assert table.exit_code == 0 and "arrays" in table.stdout
