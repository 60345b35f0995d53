"""The model directory's metadata, `tagger.json`: read and checked in one place (no TensorFlow).

tagger.json holds the format marker and version, the gpseq version that wrote it, the labels,
the configuration (features, model, training), the scores, the array shapes and the "files"
manifest (size and sha256 of every other file). `Tagger.load`, the spaCy component and
`gpseq info` read it through `read_model_meta`; `Tagger.load` checks its labels and array shapes
against the model configuration and the size limits (`check_meta_shapes`) before anything is
allocated, and then the arrays read (`check_arrays`: shapes, and values with
`check_array_values`) before building anything.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from gpseq.errors import ConfigError, ModelFormatError, NumericalError
from gpseq.saved.files import MAX_ARRAY_BYTES, MAX_JSON_BYTES, MAX_NPZ_MEMBERS, open_model_file
from gpseq.saved.format import read_format_json

META_FILE = "tagger.json"
FORMAT = "gpseq-tagger"
FORMAT_VERSION = 1

# The most labels a tagger may have: its pairwise potentials and their variances are V × V arrays
# (training holds several, and V² per sentence), and every token carries V-wide marginals.
# 10,000 labels make each pairwise array 400 MB in float32.
MAX_LABELS = 10_000
# The arrays whose values must be positive (the others are free: pretransformed by softplus)
_POSITIVE_ARRAYS = ("var:temperature", "var:variance_scale")


def read_model_meta(directory: str | os.PathLike) -> dict:
    """tagger.json of a model directory, checked: a regular file (not a link, FIFO or device) of at
    most MAX_JSON_BYTES, non-empty, JSON nested no deeper than the parser's limit, gpseq's format
    marker, a format version this gpseq reads. Anything else is a one-line ModelFormatError naming
    the file."""
    directory = Path(directory)
    meta_path = directory / META_FILE
    if not os.path.lexists(meta_path) or meta_path.is_dir():
        raise ModelFormatError(f"{directory}: not a gpseq model directory (no {META_FILE})")
    with open_model_file(directory, META_FILE, max_bytes=MAX_JSON_BYTES):
        pass  # a regular file, not a link, of a size gpseq parses: read next
    try:
        return read_format_json(meta_path, marker=FORMAT, version_key="format_version",
                                max_version=FORMAT_VERSION, kind="tagger model")
    except RecursionError:  # the JSON parser's nesting limit
        raise ModelFormatError(f"{meta_path}: unreadable model metadata (nested too deeply)") from None


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


def check_label_count(n_labels: int, source) -> None:
    """ConfigError naming `source` (a training corpus) when it has more than MAX_LABELS labels."""
    if n_labels > MAX_LABELS:
        raise ConfigError(f"{source}: more than {MAX_LABELS:,} distinct labels; a gpseq tagger has at most "
                          f"{MAX_LABELS:,} (its pairwise potentials are labels × labels arrays)")


def largest_array(num_labels: int, num_features: int, model) -> int:
    """The most numbers any one array of a model of `num_labels` V and `num_features` D can hold
    (`model`: its `ModelConfig`): the largest of its weights [D, V], pairwise potentials [V, V],
    inducing inputs (at most M × D non-zeros), q(u)'s Cholesky factors [K, V, M(M+1)/2], the deep
    unaries' [D, Q] and [Q, M(M+1)/2], and the gpnet unaries' [V, F(F+1)/2] or [F, V]."""
    V, D = num_labels, num_features
    M, K, Q, F = model.num_inducing, model.num_components, model.hidden_dims, model.num_random_features
    triangle = M * (M + 1) // 2
    gpnet = V * F * (F + 1) // 2 if model.gpnet_full_covariance else V * F
    return max(V * V, V * D, M * D + M + 1, D * Q, K * V * triangle, K * M * V, max(V, Q) * triangle, M * Q,
               gpnet, 16)


def check_meta_shapes(meta_path: Path, meta: dict, model) -> None:
    """The label list against the array shapes tagger.json records, and those against the size
    limits, before anything is read or allocated (a tagger.json with extra labels must not build a
    [V, V] model first, an array must not hold more than its model's largest array can, all of
    them together more than `gpseq.saved.files.MAX_ARRAY_BYTES` in float32); `model` is the model's
    `ModelConfig`."""
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
        if not 1 <= M <= model.num_inducing:
            raise ModelFormatError(f"{meta_path}: {max(M, 0)} inducing inputs (indptr of shape {[M + 1]}); the "
                                   f"model has 1 to num_inducing {model.num_inducing}")
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
    if V > MAX_LABELS:
        raise ModelFormatError(f"{meta_path}: {V:,} labels; gpseq tags with at most {MAX_LABELS:,}")
    if len(shapes) > MAX_NPZ_MEMBERS:
        raise ModelFormatError(f"{meta_path}: {len(shapes):,} arrays; gpseq writes at most {MAX_NPZ_MEMBERS:,}")
    limit = largest_array(V, D, model)
    for name, shape in shapes.items():
        if math.prod(shape) > limit:
            raise ModelFormatError(f"{meta_path}: the array {name} of shape {shape} holds more numbers than "
                                   f"any array of a model of {V:,} labels and {D:,} features can ({limit:,})")
    total = sum(math.prod(shape) for shape in shapes.values())
    if total * 4 > MAX_ARRAY_BYTES:
        raise ModelFormatError(f"{meta_path}: its arrays hold {total:,} numbers, more than the "
                               f"{MAX_ARRAY_BYTES // 4:,} gpseq loads")


def check_array_values(path: Path, arrays: dict, *, saving: bool = False) -> None:
    """Every float array of `arrays` finite (no NaN, no ±inf) and the temperature and variance scale
    positive: a model that breaks this tags NaN. At load (`check_arrays`) a ModelFormatError naming
    arrays.npz `path`; with `saving` (`Tagger.save`, `path` the model directory) a NumericalError,
    and the model is not written."""
    problem = None
    for name, value in arrays.items():
        value = np.asarray(value)
        if value.dtype.kind in "fc" and not _finite(value):
            problem = f"array {name!r} holds {'NaN' if np.isnan(value).any() else 'infinite values'}"
            break
        if name in _POSITIVE_ARRAYS and not (value > 0).all():
            problem = f"array {name!r} is {value.tolist()}; it must be positive"
            break
    if problem is None:
        return
    if saving:
        raise NumericalError(f"{path}: not saved: the model's {problem} (did training diverge?)")
    raise ModelFormatError(f"{path}: {problem}; the model cannot tag")


def _finite(value: np.ndarray) -> bool:
    """Whether a float array holds no NaN and no ±inf: its minimum and maximum (NaN propagates
    through both) without the array-sized mask `np.isfinite` would make."""
    if value.size == 0:
        return True
    if value.dtype.kind == "c":
        return _finite(value.real) and _finite(value.imag)
    return bool(np.isfinite(value.min()) and np.isfinite(value.max()))


def check_arrays(meta_path: Path, npz_path: Path, meta: dict, arrays: dict, n_features: int, model) -> None:
    """The arrays read from arrays.npz against tagger.json's shapes, their values
    (`check_array_values`), the inducing inputs' sparse structure, and num_features against the
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
    check_array_values(npz_path, arrays)
    if model.has_inducing:
        shape = arrays["inducing_inputs/shape"]
        indptr, indices = arrays["inducing_inputs/indptr"], arrays["inducing_inputs/indices"]
        M = indptr.shape[0] - 1
        if shape.dtype.kind not in "iu" or [int(d) for d in shape] != [M, n_features]:
            raise ModelFormatError(f"{npz_path}: inducing inputs of shape {shape.tolist()}, expected "
                                   f"[{M}, {n_features}] (inducing points × features)")
        if indptr.dtype.kind not in "iu" or indices.dtype.kind not in "iu" or indptr[0] != 0 \
                or (np.diff(indptr) < 0).any() or indptr[-1] != len(indices) \
                or len(indices) != len(arrays["inducing_inputs/data"]) \
                or (len(indices) and not 0 <= indices.min() <= indices.max() < n_features):
            raise ModelFormatError(f"{npz_path}: the inducing inputs' sparse rows (indptr, indices, data) do not "
                                   f"describe a [{M}, {n_features}] matrix")
