"""The TaggerConfig a `gpseq train` asks for: library defaults ← --config JSON ← named options ← --set."""

from __future__ import annotations

import json
from pathlib import Path

from gpseq.cli.common import require_file, tagger_module
from gpseq.errors import ConfigError, InputFormatError


def parse_value(text: str):
    """A --set value: JSON when it parses (2.0, true, null, [1,2], "x"), else the plain string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_override(data: dict, assignment: str) -> None:
    """Set `section.key=value` in the nested config dict; unknown keys are a ConfigError."""
    key, sep, value = assignment.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {assignment!r}: expected KEY.PATH=VALUE, e.g. model.prior_variance=2.0")
    parts = key.strip().split(".")
    node = data
    for depth, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            where = ".".join(parts[:depth]) or "the configuration"
            known = ", ".join(sorted(node)) if isinstance(node, dict) else "(not a section)"
            raise ConfigError(f"--set {key}: no key {part!r} in {where}; known: {known}")
        if depth == len(parts) - 1:
            node[part] = parse_value(value)
        else:
            node = node[part]


def _config_file(path: Path) -> dict:
    """The TaggerConfig dict of a --config JSON file (checked by TaggerConfig.from_dict)."""
    require_file(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise InputFormatError(path, error.lineno, f"not valid JSON: {error.msg}") from None
    if not isinstance(data, dict):
        raise InputFormatError(path, 1, "the configuration must be a JSON object")
    return tagger_module().TaggerConfig.from_dict(data).to_dict()


def build_config(config_file, features, likelihood, inducing, epochs, max_steps, seed, tag_scheme,
                 devices, strategy, overrides):
    """The TaggerConfig: library defaults ← --config JSON ← named options ← --set overrides."""
    from gpseq.features import FeatureConfig, get_preset, list_presets

    TaggerConfig = tagger_module().TaggerConfig
    data = _config_file(config_file) if config_file is not None else TaggerConfig().to_dict()
    if features is not None:
        if features in list_presets():
            feature_config = get_preset(features)
        elif Path(features).is_file():
            feature_config = FeatureConfig.from_template_file(features)
        else:
            get_preset(features)  # raises ConfigError naming the presets
        data["features"] = feature_config.to_dict()
    named = {
        ("model", "likelihood"): likelihood,
        ("model", "num_inducing"): inducing,
        ("training", "epochs"): epochs,
        ("training", "max_steps"): max_steps,
        ("training", "seed"): seed,
        ("training", "devices"): devices,
        ("training", "strategy"): strategy,
    }
    for (section, key), value in named.items():
        if value is None:
            continue
        if key not in data[section]:
            raise ConfigError(f"--{key} is not supported by this gpseq's {section} configuration "
                              f"(no {section}.{key})")
        data[section][key] = value
    if inducing is not None and data["model"]["kernel"] == "linear":
        data["model"]["kernel"] = "linear+rbf"  # inducing inputs ask for the sparse RBF part (SVI)
    if tag_scheme is not None:
        data["tag_scheme"] = tag_scheme
    for assignment in overrides or []:
        apply_override(data, assignment)
    config = TaggerConfig.from_dict(data)
    config.validate()
    return config
