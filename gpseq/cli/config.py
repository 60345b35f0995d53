"""The TaggerConfig a `gpseq train` asks for: library defaults ← --config JSON ← named options ← --set."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from gpseq.cli.common import require_file, tagger_module
from gpseq.errors import ConfigError, InputFormatError


def parse_value(text: str):
    """A --set value: JSON when it parses (2.0, true, null, [1,2], "x"), else the plain string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
    except (ValueError, RecursionError):  # an integer of more digits than Python converts; nesting
        raise ConfigError(f"--set value {text[:40]!r}{'…' if len(text) > 40 else ''} ({len(text):,} characters) "
                          "is not a value a configuration holds") from None


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
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise InputFormatError(path, line, f"bytes {raw[error.start:error.end]!r} are not valid UTF-8 "
                                           "(a configuration is a UTF-8 JSON file)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputFormatError(path, error.lineno, f"not valid JSON: {error.msg}") from None
    except ValueError as error:  # an integer of more digits than Python converts
        raise InputFormatError(path, None, f"not a configuration: {error}") from None
    except RecursionError:
        raise InputFormatError(path, None, "not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise InputFormatError(path, 1, "the configuration must be a JSON object")
    return tagger_module().TaggerConfig.from_dict(data).to_dict()


# the named `gpseq train` options that set one configuration key each
NAMED_OPTIONS = {
    "--likelihood": "model.likelihood",
    "--inducing": "model.num_inducing",
    "--epochs": "training.epochs",
    "--max-steps": "training.max_steps",
    "--seed": "training.seed",
    "--devices": "training.devices",
    "--strategy": "training.strategy",
}


@dataclass
class ConfigOptions:
    """What `gpseq train` asks of the configuration, lowest precedence first: the library defaults
    or a --config JSON file, a feature preset or CRF++ template file, the named options, --set."""

    config_file: Path | None = None
    features: str | None = None  # a preset name or a CRF++ template file
    named: dict[str, object] = field(default_factory=dict)  # NAMED_OPTIONS option → value (None: not given)
    tag_scheme: str | None = None
    overrides: list[str] = field(default_factory=list)  # --set KEY.PATH=VALUE, in order


def build_config(options: ConfigOptions):
    """The TaggerConfig: library defaults ← --config JSON ← named options ← --set overrides."""
    from gpseq.features import FeatureConfig, get_preset, list_presets

    TaggerConfig = tagger_module().TaggerConfig
    data = _config_file(options.config_file) if options.config_file is not None else TaggerConfig().to_dict()
    if options.features is not None:
        if options.features in list_presets():
            feature_config = get_preset(options.features)
        elif Path(options.features).is_file():
            feature_config = FeatureConfig.from_template_file(options.features)
        else:
            get_preset(options.features)  # raises ConfigError naming the presets
        data["features"] = feature_config.to_dict()
    for option, value in options.named.items():
        if value is None:
            continue
        section, key = NAMED_OPTIONS[option].split(".")
        if key not in data[section]:
            raise ConfigError(f"{option} is not supported by this gpseq's {section} configuration "
                              f"(no {section}.{key})")
        data[section][key] = value
    if options.named.get("--inducing") is not None and data["model"]["kernel"] == "linear":
        data["model"]["kernel"] = "linear+rbf"  # inducing inputs ask for the sparse RBF part (SVI)
    if options.tag_scheme is not None:
        data["tag_scheme"] = options.tag_scheme
    for assignment in options.overrides:
        apply_override(data, assignment)
    config = TaggerConfig.from_dict(data)
    config.validate()
    return config
