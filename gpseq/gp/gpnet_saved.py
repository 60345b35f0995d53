"""A GPNet as one `.npz` of plain arrays (no pickle): its variables by name (`GPNet.get_state`) and
the JSON config that rebuilds its structure (kernel, likelihood, feature map, settings).
"""

from __future__ import annotations

import json
import os

import numpy as np

from gpseq.corpora._atomic import atomic_target
from gpseq.errors import ConfigError, ModelFormatError
from gpseq.gp.kernels import RBF, Linear
from gpseq.gp.likelihoods import Bernoulli, Gaussian, Softmax
from gpseq.gp.random_features import RandomFeatures

__all__ = ["FORMAT", "FORMAT_VERSION", "gpnet_config", "load_gpnet", "save_gpnet"]

FORMAT = "gpseq.gpnet"
FORMAT_VERSION = 2  # 2: `weight_factor` (a dense V^{1/2}); a version-1 file has the lower-triangular one


def gpnet_config(model) -> dict:
    """What rebuilds a `GPNet`'s structure (its values are in `get_state`)."""
    kernel = {"kind": "rbf", "ard": bool(model.kernel.ard)} if isinstance(model.kernel, RBF) else {"kind": "linear"}
    if not isinstance(model.kernel, (RBF, Linear)):
        raise ConfigError(f"GPNet saves RBF and linear prior kernels, not {type(model.kernel).__name__}")
    lik = model.likelihood
    if isinstance(lik, Gaussian):
        likelihood = {"kind": "gaussian"}
    elif isinstance(lik, Bernoulli):
        likelihood = {"kind": "bernoulli", "link": lik.link}
    elif isinstance(lik, Softmax):
        likelihood = {"kind": "softmax", "num_classes": lik.num_classes, "num_samples": lik.num_samples}
    else:
        raise ConfigError(f"GPNet saves Gaussian, Bernoulli and Softmax likelihoods, not {type(lik).__name__}")
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "input_dim": model.input_dim,
        "kernel": kernel, "likelihood": likelihood,
        "features": {"kind": model.features.kind, "num_features": model.features.num_features,
                     "ard": bool(model.features.ard)},
        "num_data": model.num_data, "num_latent": model.num_latent, "num_measurement": model.num_measurement,
        "spread": model.spread, "spread_scale": model.spread_scale, "full_cov": model.full_cov,
        "weight_factor": model.weight_factor,
        "residual_hidden": model.residual_hidden, "beta0": model.beta0, "beta_decay": model.beta_decay,
        "beta_power": model.beta_power,
        "learn_hyperparameters": model.learn_hyperparameters, "jitter": model.jitter,
        "projection_ridge": model.projection_ridge,
    }


def save_gpnet(model, path: str | os.PathLike) -> None:
    """The state and the config as JSON in one `.npz`, written atomically."""
    arrays = {"state/" + name: value for name, value in model.get_state().items()}
    arrays["config"] = np.asarray(json.dumps(model.config()))
    with atomic_target(path) as temp, open(temp, "wb") as handle:
        np.savez(handle, **arrays)


def load_gpnet(cls, path: str | os.PathLike, inputs=None):
    """The `cls` (GPNet) model `save_gpnet` wrote (pass the training `inputs` to train it further)."""
    with np.load(path, allow_pickle=False) as data:
        if "config" not in data:
            raise ModelFormatError(f"{path}: not a saved GPNet (no config array)")
        config = json.loads(str(data["config"]))
        state = {name[len("state/"):]: data[name] for name in data.files if name.startswith("state/")}
    if config.get("format") != FORMAT or config.get("format_version", 0) > FORMAT_VERSION:
        raise ModelFormatError(f"{path}: not a GPNet file this gpseq reads ({config.get('format')!r}, "
                               f"version {config.get('format_version')})")
    D = config["input_dim"]
    kernel = RBF(ard=config["kernel"]["ard"], lengthscales=np.ones(D) if config["kernel"]["ard"] else 1.0) \
        if config["kernel"]["kind"] == "rbf" else Linear()
    lik = config["likelihood"]
    if lik["kind"] == "gaussian":
        likelihood = Gaussian()
    elif lik["kind"] == "bernoulli":
        likelihood = Bernoulli(lik["link"])
    else:
        likelihood = Softmax(lik["num_classes"], num_samples=lik["num_samples"])
    feat = config["features"]
    features = RandomFeatures(D, feat["num_features"], feat["kind"], ard=feat["ard"],
                              lengthscales=np.ones(D) if feat["ard"] else 1.0)
    model = cls(kernel, likelihood, inputs, num_data=config["num_data"], features=features, input_dim=D,
                num_latent=config["num_latent"], num_measurement=config["num_measurement"],
                spread=config["spread"], spread_scale=config["spread_scale"], full_cov=config["full_cov"],
                weight_factor=config.get("weight_factor", "lower"),
                residual_hidden=config["residual_hidden"], beta0=config["beta0"],
                beta_decay=config["beta_decay"], beta_power=config.get("beta_power", 0.5),
                learn_hyperparameters=config["learn_hyperparameters"],
                projection_ridge=config.get("projection_ridge", 1e-2), jitter=config["jitter"])
    model.set_state(state)
    return model
