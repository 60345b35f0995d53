"""A `Tagger`'s parts in a model directory: `write_tagger` writes what `Tagger.save` documents
(`features/`, `arrays.npz`, then `tagger.json` with the manifest of the others), `read_tagger`
checks and reads them back for `Tagger.load`, and `build_model` makes the `StructuredGP`
(TensorFlow, imported only then) from the arrays.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from gpseq import __version__
from gpseq.config import TaggerConfig
from gpseq.errors import ConfigError, ModelFormatError
from gpseq.features import Featurizer
from gpseq.saved.directory import file_manifest, read_arrays, verify_manifest, writing_model_dir
from gpseq.saved.files import write_npz
from gpseq.saved.meta import (FORMAT, FORMAT_VERSION, META_FILE, check_array_values, check_arrays, check_meta_shapes,
                              json_default, read_model_meta)
from gpseq.structured.likelihoods import saved_likelihood

__all__ = ["build_model", "read_tagger", "write_tagger"]


def write_tagger(directory: str | os.PathLike, config: TaggerConfig, featurizer: Featurizer, labels: list[str],
                 arrays: dict[str, np.ndarray], scores: dict) -> Path:
    """The model directory of a tagger (`StructuredGP.get_state` names for `arrays`), written atomically
    through `writing_model_dir` (`Tagger.save`)."""
    directory = Path(directory)
    check_array_values(directory, arrays, saving=True)  # a model that would tag NaN is never written
    with writing_model_dir(directory) as tmp:
        featurizer.save(tmp / "features")
        write_npz(tmp / "arrays.npz", arrays, compress=True)
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "gpseq_version": __version__,
            "labels": labels,
            "num_features": int(featurizer.n_features),
            "config": config.to_dict(),
            "scores": scores,
            "arrays": {name: list(value.shape) for name, value in arrays.items()},
            "files": file_manifest(tmp),
        }
        with open(tmp / META_FILE, "w", encoding="utf-8") as handle:
            json.dump(meta, handle, indent=2, default=json_default)
    return directory


def read_tagger(directory: str | os.PathLike, likelihoods: dict | None = None) -> tuple:
    """(config, featurizer, labels, arrays, scores, likelihood) of a model directory, every part
    checked first (`Tagger.load`); the likelihood resolved by `saved_likelihood` (no import of code the
    model names; `likelihoods`: the user's {plug-in name: function})."""
    directory = Path(directory)
    meta_path = directory / META_FILE
    meta = read_model_meta(directory)
    if "files" in meta:
        verify_manifest(directory, meta_path, meta["files"])
    try:
        config = TaggerConfig.from_dict(meta["config"])
        config.validate()
    except KeyError:
        raise ModelFormatError(f"{meta_path}: no model configuration (key 'config')") from None
    except (ConfigError, TypeError, AttributeError, ValueError) as error:
        raise ModelFormatError(f"{meta_path}: invalid model configuration ({error})") from None
    try:
        likelihood = saved_likelihood(config.model.likelihood, likelihoods)
    except ConfigError as error:
        raise ModelFormatError(f"{meta_path}: {error}") from None
    check_meta_shapes(meta_path, meta, config.model)
    featurizer = Featurizer.load(directory / "features")
    arrays = read_arrays(directory / "arrays.npz")
    check_arrays(meta_path, directory / "arrays.npz", meta, arrays, featurizer.n_features, config.model)
    return config, featurizer, meta["labels"], arrays, meta.get("scores"), likelihood


def build_model(config: TaggerConfig, num_features: int, num_labels: int, arrays: dict, likelihood=None):
    """The `StructuredGP` of `config` holding `arrays` (`StructuredGP.get_state` names); `likelihood`
    the resolved object (None: resolved from the config's name, for a tagger trained here)."""
    from gpseq import _tensorflow

    tf = _tensorflow.load()

    from gpseq.structured.model import StructuredGP, build_structured_gp

    dtype = tf.float32 if config.dtype == "float32" else tf.float64
    model = build_structured_gp(config.model, num_features, num_labels, StructuredGP.inducing_from_state(arrays),
                                dtype, likelihood=likelihood)
    model.set_state(arrays)
    return model
