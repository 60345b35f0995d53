"""The TaggerConfig a `gpseq train` asks for: library defaults ← --config JSON ← named options ← --set.
The options are parsed here; the configuration is built by the library (`gpseq.config.make_config`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from gpseq.cli.common import require_file, tagger_module
from gpseq.errors import InputFormatError


def __getattr__(name: str):
    """`apply_override`, `parse_value`: the --set syntax is the library's (`gpseq.config`), imported
    when first asked for (the command starts without the library's imports)."""
    if name in ("apply_override", "parse_value"):
        import gpseq.config

        return getattr(gpseq.config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    from gpseq.config import make_config

    base = _config_file(options.config_file) if options.config_file is not None else None
    return make_config(base, features=options.features,
                       settings={NAMED_OPTIONS[option]: value for option, value in options.named.items()},
                       tag_scheme=options.tag_scheme, overrides=options.overrides)
