"""The model directory's metadata, `tagger.json`: read and checked in one place (no TensorFlow).

tagger.json holds the format marker and version, the gpseq version that wrote it, the labels,
the configuration (features, model, training), the scores, the array shapes and the "files"
manifest (size and sha256 of every other file). `Tagger.load`, the spaCy component and
`gpseq info` read it through `read_model_meta`; `Tagger.load` checks its labels and array shapes
against the model configuration (`check_meta_shapes`) and then the arrays read
(`check_arrays`) before building anything.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpseq.errors import ModelFormatError
from gpseq.saved_format import read_format_json

META_FILE = "tagger.json"
FORMAT = "gpseq-tagger"
FORMAT_VERSION = 1


def read_model_meta(directory: str | os.PathLike) -> dict:
    """tagger.json of a model directory, checked: present, non-empty, JSON, gpseq's format marker,
    a format version this gpseq reads. Anything else is a one-line ModelFormatError naming the file."""
    directory = Path(directory)
    meta_path = directory / META_FILE
    if not meta_path.is_file():
        raise ModelFormatError(f"{directory}: not a gpseq model directory (no {META_FILE})")
    return read_format_json(meta_path, marker=FORMAT, version_key="format_version", max_version=FORMAT_VERSION,
                            kind="tagger model")


def n_parameters(meta: dict) -> int:
    """The number of numbers in the model's arrays (tagger.json's "arrays": name -> shape)."""
    total = 0
    for shape in (meta.get("arrays") or {}).values():
        size = 1
        for dim in shape:
            size *= int(dim)
        total += size
    return total


def json_default(value):
    """JSON of what tagger.json and `--json` output hold besides plain values: numpy scalars and
    arrays, paths."""
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _shape(value) -> list[int] | None:
    if isinstance(value, (list, tuple)) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                for d in value):
        return list(value)
    return None


def check_meta_shapes(meta_path: Path, meta: dict, model) -> None:
    """The label list against the array shapes tagger.json records, before anything is read or
    allocated (a tagger.json with extra labels must not build a [V, V] model first); `model` is
    the model's `ModelConfig`."""
    labels = meta.get("labels")
    if not isinstance(labels, list) or not labels or not all(isinstance(l, str) for l in labels):
        raise ModelFormatError(f"{meta_path}: 'labels' must be a non-empty list of strings")
    if len(set(labels)) != len(labels):
        raise ModelFormatError(f"{meta_path}: 'labels' has duplicates")
    num_features = meta.get("num_features")
    if not isinstance(num_features, int) or isinstance(num_features, bool) or num_features < 1:
        raise ModelFormatError(f"{meta_path}: 'num_features' must be a positive integer, got {num_features!r}")
    recorded = meta.get("arrays")
    if not isinstance(recorded, dict) or not recorded:
        raise ModelFormatError(f"{meta_path}: no array shapes ('arrays')")
    shapes = {}
    for name, shape in recorded.items():
        shapes[name] = _shape(shape)
        if shapes[name] is None:
            raise ModelFormatError(f"{meta_path}: array {name!r} has an invalid shape {shape!r}")
    V, D = len(labels), num_features
    expected = {"var:label_bias": [V], "var:pairwise_mean": [V, V]}
    if model.has_weight_space:
        expected["var:linear/q_mu"] = [D, V]
    for name, shape in expected.items():
        if shapes.get(name) != shape:
            raise ModelFormatError(
                f"{meta_path}: {V:,} labels and {D:,} features, but the array {name} has shape "
                f"{shapes.get(name)} (expected {shape}): labels or num_features do not match the arrays"
            )
    if model.unary == "gpnet" and "var:gpnet/q/q_mu" in shapes \
            and shapes["var:gpnet/q/q_mu"] != [1, model.num_random_features, V]:
        raise ModelFormatError(
            f"{meta_path}: {V:,} labels and num_random_features {model.num_random_features}, but the array "
            f"var:gpnet/q/q_mu has shape {shapes['var:gpnet/q/q_mu']}")
    if model.has_inducing:
        if shapes.get("inducing_inputs/shape") != [2] or shapes.get("inducing_inputs/indptr") is None:
            raise ModelFormatError(f"{meta_path}: the model's inducing inputs are missing from 'arrays'")
        M = shapes["inducing_inputs/indptr"][0] - 1
        if M < 1:
            raise ModelFormatError(f"{meta_path}: no inducing inputs (indptr of shape {[M + 1]})")
        if model.unary != "deep":
            K = model.num_components
            for name, shape in {"var:inducing/mixture_logits": [K], "var:inducing/q_mu": [K, M, V]}.items():
                if name in shapes and shapes[name] != shape:
                    raise ModelFormatError(
                        f"{meta_path}: {V:,} labels, {K} components and {M} inducing inputs, but the array "
                        f"{name} has shape {shapes[name]} (expected {shape})")
        elif "var:deep/mean_weights" in shapes and shapes["var:deep/mean_weights"] != [D, model.hidden_dims]:
            raise ModelFormatError(
                f"{meta_path}: {D:,} features and hidden_dims {model.hidden_dims}, but the array "
                f"var:deep/mean_weights has shape {shapes['var:deep/mean_weights']}")


def check_arrays(meta_path: Path, npz_path: Path, meta: dict, arrays: dict, n_features: int, model) -> None:
    """The arrays read from arrays.npz against tagger.json's shapes, and num_features against the
    featurizer's `n_features`; `model` is the model's `ModelConfig`."""
    if meta["num_features"] != n_features:
        raise ModelFormatError(
            f"{meta_path}: num_features {meta['num_features']:,} does not match the featurizer's "
            f"{n_features:,} (features/featurizer.json)")
    recorded = {name: list(shape) for name, shape in meta["arrays"].items()}
    actual = {name: list(value.shape) for name, value in arrays.items()}
    missing = sorted(set(recorded) - set(actual))
    extra = sorted(set(actual) - set(recorded))
    if missing:
        raise ModelFormatError(f"{npz_path}: lacks the array {missing[0]!r} listed in {meta_path.name}")
    if extra:
        raise ModelFormatError(f"{npz_path}: holds an array {extra[0]!r} not listed in {meta_path.name}")
    for name, shape in recorded.items():
        if actual[name] != shape:
            raise ModelFormatError(f"{npz_path}: array {name!r} has shape {actual[name]}, "
                                   f"{meta_path.name} records {shape}")
    if model.has_inducing:
        shape = arrays["inducing_inputs/shape"]
        M = arrays["inducing_inputs/indptr"].shape[0] - 1
        if shape.dtype.kind not in "iu" or [int(d) for d in shape] != [M, n_features]:
            raise ModelFormatError(f"{npz_path}: inducing inputs of shape {shape.tolist()}, expected "
                                   f"[{M}, {n_features}] (inducing points × features)")
