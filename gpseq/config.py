"""`TaggerConfig`: everything needed to rebuild a tagger (features, model, training, prediction),
saved as tagger.json's "config"; `Tagger` consumes it. `make_config` builds one from a configuration
dict, a feature preset or template, named settings and `section.key=value` overrides: what `gpseq
train` and the spaCy component's training ask for, with the model's rules in the library."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping

from gpseq.errors import ConfigError
from gpseq.features import FeatureConfig, get_preset, preset_or_template
from gpseq.structured.config import ModelConfig
from gpseq.errors import check_number
from gpseq.training.config import TrainingConfig

# Monte Carlo draws of f a prediction may take (`predict_samples`, `gpseq tag --samples`): a batch
# holds S draws of every token's V potentials (a sentence or window longer than the batch's share
# is a batch of its own), and the marginals' error shrinks as 1/√S: 1,000 draws are plenty
MAX_SAMPLES = 1000
# Label sequences `gpseq tag --nbest` may ask for: k-best Viterbi holds [tokens, V, k] back-pointers
# and [sentences, V, V·k] candidates per step
MAX_NBEST = 100


@dataclass
class TaggerConfig:
    """Everything needed to rebuild a tagger: features, model, training, prediction."""

    features: FeatureConfig = field(default_factory=lambda: get_preset("chunking"))
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    tag_scheme: str = "iob2"
    predictive: str = "deterministic"  # marginals: "deterministic" (probit-scaled potentials, one
    # forward–backward) | "mc" (average over `predict_samples` draws of f); both calibrated by T, α
    predict_samples: int = 16  # S, Monte Carlo samples of f for the calibrated marginals
    decode: str = "auto"  # "viterbi" (on the posterior-mean potentials) | "max-marginal" | "span-f1" |
    # "auto": the default training keeps viterbi or max-marginal, whichever scores higher (chunk F1 for
    # chunk labels, else token accuracy) on the held-out predictions it calibrates on, and saves that
    # (`predict.decode.choose_decoder`); viterbi where nothing was held out
    dtype: str = "float32"
    # a sentence longer than predict_max_tokens is tagged in windows of that many tokens, each
    # token's results taken from a window where it has >= predict_overlap tokens of context on
    # either side (see `Tagger.tag`): memory bounded whatever the sentence length
    predict_max_tokens: int = 1000
    predict_overlap: int = 50

    @property
    def decoder(self) -> str:
        """The decoder tagging uses unless told: `decode`, with "auto" (a model trained without a
        held-out choice) as viterbi."""
        return "viterbi" if self.decode == "auto" else self.decode

    def to_dict(self) -> dict:
        return {
            "features": self.features.to_dict(),
            "model": self.model.to_dict(),
            "training": asdict(self.training),
            "tag_scheme": self.tag_scheme,
            "predictive": self.predictive,
            "predict_samples": self.predict_samples,
            "decode": self.decode,
            "dtype": self.dtype,
            "predict_max_tokens": self.predict_max_tokens,
            "predict_overlap": self.predict_overlap,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "TaggerConfig":
        data = dict(data)
        try:
            features = data.pop("features", None)
            model = data.pop("model", None) or {}
            training = data.pop("training", None) or {}
            return cls(
                features=FeatureConfig.from_dict(features) if features else get_preset("chunking"),
                model=ModelConfig(**model),
                training=TrainingConfig(**training),
                **data,
            )
        except (TypeError, ValueError) as error:  # a missing or unknown field; a value of the wrong kind
            raise ConfigError(f"invalid tagger configuration: {error}") from None

    def resolved_method(self) -> str:
        """The training method: `training.method`, with "auto" = laplace for the weight-space
        linear model with the exact chain likelihood, svi otherwise (every other likelihood,
        plug-ins included)."""
        if self.training.method != "auto":
            return self.training.method
        m = self.model
        laplace_ok = m.kernel == "linear" and m.unary == "shallow" and m.likelihood == "exact"
        return "laplace" if laplace_ok and self.training.strategy == "default" else "svi"

    def validate(self) -> None:
        """ConfigError naming the first setting of a wrong type, out of range or not allowed, checked
        before any work: the features, the model, the training, and the tagger's own settings."""
        from gpseq.corpora.schemes import normalise_scheme

        self.features.validate()
        self.model.validate()
        if self.training.method == "laplace" and (self.model.kernel != "linear" or self.model.unary != "shallow"):
            raise ConfigError('training.method "laplace" needs model.kernel "linear" with shallow unaries; '
                              'use training.method "svi" for other models')
        if self.training.method == "laplace" and self.model.likelihood != "exact":
            raise ConfigError(f'training.method "laplace" fits the exact chain, not likelihood '
                              f'{self.model.likelihood!r}; use training.method "svi" for other likelihoods')
        self.training.validate()
        if self.decode not in ("auto", "viterbi", "max-marginal", "span-f1"):
            raise ConfigError(f"decode must be auto, viterbi, max-marginal or span-f1, got {self.decode!r}")
        if self.dtype not in ("float32", "float64"):
            raise ConfigError(f"dtype must be float32 or float64, got {self.dtype!r}")
        if self.predictive not in ("deterministic", "mc"):
            raise ConfigError(f"predictive must be deterministic or mc, got {self.predictive!r}")
        check_number("predict_samples", self.predict_samples, low=1, high=MAX_SAMPLES, integer=True)
        check_window(self.predict_max_tokens, self.predict_overlap)
        if not isinstance(self.tag_scheme, str):
            raise ConfigError(f"tag_scheme must be iob1, iob2 (bio) or bioes (iobes), got {self.tag_scheme!r}")
        normalise_scheme(self.tag_scheme)  # ConfigError naming the schemes, before training rather than after



def check_window(max_tokens, overlap) -> None:
    """ConfigError unless sentences can be windowed: 1 <= overlap, 2·overlap < max_tokens."""
    for name, value in (("predict_max_tokens", max_tokens), ("predict_overlap", overlap)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
    if overlap < 1:
        raise ConfigError(f"predict_overlap must be >= 1, got {overlap}")
    if max_tokens <= 2 * overlap:
        raise ConfigError(f"predict_max_tokens must be > 2 * predict_overlap ({2 * overlap}), got {max_tokens}")


def parse_value(text: str):
    """An override's value: JSON when it parses (2.0, true, null, [1,2], "x"), else the plain string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
    except (ValueError, RecursionError):  # an integer of more digits than Python converts; nesting
        raise ConfigError(f"--set value {text[:40]!r}{'…' if len(text) > 40 else ''} ({len(text):,} characters) "
                          "is not a value a configuration holds") from None


def set_value(data: dict, key: str, value, what: str = "") -> None:
    """Set `section.key` (a dotted path) in the nested config dict to `value`; a key that is not
    there is a ConfigError naming the known ones (`what`: how the message names the setting)."""
    parts = key.strip().split(".")
    node = data
    for depth, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            where = ".".join(parts[:depth]) or "the configuration"
            known = ", ".join(sorted(node)) if isinstance(node, dict) else "(not a section)"
            raise ConfigError(f"{what}{key}: no key {part!r} in {where}; known: {known}")
        if depth == len(parts) - 1:
            node[part] = value
        else:
            node = node[part]


def apply_override(data: dict, assignment: str) -> None:
    """Set `section.key=value` (`gpseq train --set`) in the nested config dict; unknown keys are a ConfigError."""
    key, sep, value = assignment.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {assignment!r}: expected KEY.PATH=VALUE, e.g. model.prior_variance=2.0")
    set_value(data, key, parse_value(value), what="--set ")


def make_config(base: dict | None = None, *, features: str | None = None,
                settings: Mapping[str, object] | None = None, tag_scheme: str | None = None,
                overrides: Iterable[str] = ()) -> TaggerConfig:
    """The checked TaggerConfig of `base` (a `TaggerConfig.to_dict`-style dict, e.g. a JSON file's;
    None: the library defaults) and, each taking precedence over the ones before: `features` (a preset
    name or a CRF++ template file), `settings` {"section.key": value} (None values are skipped;
    "model.num_inducing" with the default kernel brings the sparse RBF GP, `ModelConfig.with_inducing`),
    `tag_scheme`, and `overrides` ["section.key=value", …] (`gpseq train --set`: values JSON where they
    parse, else strings)."""
    data = (TaggerConfig.from_dict(base) if base is not None else TaggerConfig()).to_dict()
    if features is not None:
        data["features"] = preset_or_template(features).to_dict()
    settings = {key: value for key, value in (settings or {}).items() if value is not None}
    for key, value in settings.items():
        set_value(data, key, value)
    if "model.num_inducing" in settings:  # inducing points ask for the sparse RBF part (SVI)
        data["model"] = ModelConfig(**data["model"]).with_inducing(settings["model.num_inducing"]).to_dict()
    if tag_scheme is not None:
        data["tag_scheme"] = tag_scheme
    for assignment in overrides:
        apply_override(data, assignment)
    config = TaggerConfig.from_dict(data)
    config.validate()
    return config
