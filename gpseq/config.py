"""`TaggerConfig`: everything needed to rebuild a tagger (features, model, training, prediction),
saved as tagger.json's "config"; the CLI builds it, `Tagger` consumes it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from gpseq.errors import ConfigError
from gpseq.features import FeatureConfig, get_preset
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

