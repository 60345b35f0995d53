"""A model as `gpseq serve` holds it: loaded once, read-only, with what a request needs from it
(the span scheme, the corpus columns its features read, a spaCy tokeniser for raw text)."""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpseq.corpora.types import Sentence
from gpseq.errors import ConfigError, InputFormatError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


SHOWN_CHARS = 40  # characters of a request's own string that an error message quotes


class RequestError(Exception):
    """A request the service refuses: an HTTP status and a one-line reason."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def shown(value: str, limit: int = SHOWN_CHARS) -> str:
    """A string of the request quoted for an error message, its first `limit` characters only: a
    client's string may be of any size, and an error reply must not send it back."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}… ({len(value):,} characters)"


@dataclass
class ServedModel:
    """One served model: its name in requests, the `Tagger` (only the batch worker calls `tag`) and
    its model directory's tagger.json (`meta`, for the version)."""

    name: str
    tagger: Any
    path: Path | None = None
    meta: dict | None = None
    scheme: str | None = field(init=False)
    columns: list[int] = field(init=False)  # corpus columns (> 0) the features read
    _nlp: Any = field(init=False, default=None, repr=False)
    _nlp_lock: threading.Lock = field(init=False, default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        from gpseq.corpora import is_chunk_labelling

        config = self.tagger.config
        self.scheme = config.tag_scheme if is_chunk_labelling(self.tagger.labels, config.tag_scheme) else None
        self.columns = sorted(c for c in config.features.sources() if isinstance(c, int) and c > 0)

    @property
    def lang(self) -> str:
        return self.tagger.config.features.lang

    @property
    def accepts_text(self) -> bool:
        """Raw text has only tokens: a model whose features read other corpus columns needs rows."""
        return not self.columns

    def deterministic(self, mean: bool, samples: int | None) -> bool:
        """Whether `Tagger.tag(mean=mean or None, samples=samples)` uses the deterministic predictive
        (the same rule as the Tagger's: explicit mean, then explicit samples, then the config)."""
        return bool(mean) or (samples is None and self.tagger.config.predictive == "deterministic")

    def sentences_from_text(self, text: str, max_sentences: int) -> list[Sentence]:
        """Raw text as the sentences `gpseq tag` reads from a text file (spaCy tokeniser and
        sentencizer of the model's language, `gpseq.corpora.text`), at most `max_sentences` + 1
        (enough to tell that a text has too many); thread-safe."""
        from gpseq.corpora.text import TEXT_MAX_TOKENS, blank_nlp, iter_text

        if not self.accepts_text:
            raise RequestError(422, f"model {self.name!r} reads corpus column(s) {self.columns} besides the "
                                    "token (e.g. POS tags): send \"sentences\" as rows [token, column 1, ...], "
                                    "not \"text\"")
        with self._nlp_lock:  # one spaCy pipeline per model, called by one thread at a time
            if self._nlp is None:
                self._nlp = blank_nlp(self.lang)
            sentences = []
            # lines end at \n (a \r before it dropped) as a text file's do for `gpseq tag`, not also
            # at a lone \r, U+2028, form feeds … as `str.splitlines` would: the same blocks and line numbers
            for sentence in iter_text(text.split("\n"), self._nlp, name="text", max_tokens=TEXT_MAX_TOKENS):
                sentences.append(sentence)
                if len(sentences) > max_sentences:
                    break
            return sentences

    def sentences_from_lists(self, sentences: list[list]) -> list[Sentence]:
        """Pre-tokenised sentences: each a list of tokens, or of rows [token, column 1, ...]
        (the columns of a CoNLL line without its label) for a model that reads columns."""
        width = 1 + max(self.columns, default=0)
        out = []
        for s, sentence in enumerate(sentences):
            if isinstance(sentence[0], str):
                if width > 1:
                    raise RequestError(422, f"sentences[{s}]: model {self.name!r} reads corpus column(s) "
                                            f"{self.columns} besides the token (e.g. POS tags): give each "
                                            f"token as a row [token, column 1, ...] of at least {width} fields")
                out.append(Sentence(tokens=list(sentence)))
                continue
            if min(map(len, sentence)) < width:
                t = next(t for t, row in enumerate(sentence) if len(row) < width)
                raise RequestError(422, f"sentences[{s}][{t}]: a row of {len(sentence[t])} field(s); model "
                                        f"{self.name!r} reads column(s) {self.columns}, so rows need at "
                                        f"least {width}")
            out.append(Sentence(tokens=[row[0] for row in sentence], columns=sentence))  # the request's own lists
        return out

    def warm_up(self) -> None:
        """Trace the compiled prediction once, so that the first request does not pay for it."""
        width = 1 + max(self.columns, default=0)
        sentence = Sentence(tokens=["warm", "up"], columns=[["warm"] * width, ["up"] * width])
        self.tagger.tag([sentence])

    def describe(self, default: bool) -> dict:
        """GET /models: what the model is and what it takes."""
        config, featurizer = self.tagger.config, self.tagger.featurizer
        meta = self.meta or {}
        return json_safe({
            "name": self.name,
            "default": default,  # no directory: where the server keeps its models is not the client's business
            "labels": list(self.tagger.labels),
            "span_scheme": self.scheme,
            "input": {"text": self.accepts_text, "row_fields": 1 + max(self.columns, default=0),
                      "columns": self.columns},
            "features": {"preset": config.features.preset, "n_features": int(featurizer.n_features),
                         "lang": self.lang},
            "predictive": config.predictive,
            "predict_samples": config.predict_samples,
            "decode": config.decoder,
            "scores": dict(self.tagger.scores),
            "version": {"gpseq": meta.get("gpseq_version"), "format_version": meta.get("format_version")},
        })


def json_safe(value):
    """`value` with NumPy scalars as Python numbers and NaN/±inf as None (JSON has neither)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # NumPy scalar or 0-d array
        try:
            value = value.item()
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def parse_model_spec(spec: str) -> tuple[str, Path]:
    """`DIR` (named after the directory) or `NAME=DIR`."""
    name, sep, rest = spec.partition("=")
    if sep and NAME.match(name) and not Path(spec).exists():
        return name, Path(rest)
    path = Path(spec)
    return path.resolve().name if path.name in ("", ".", "..") else path.name, path


def checked_model_spec(spec: str, taken) -> tuple[str, Path]:
    """(name, directory) of one `NAME=DIR` or `DIR` of the command line, checked: ConfigError for a
    name requests cannot use or one already in `taken`, InputFormatError for a missing directory."""
    name, path = parse_model_spec(spec)
    if not NAME.match(name):
        raise ConfigError(f"{spec}: model name {name!r} must be letters, digits, '_', '.' or '-'; "
                          "name it with NAME=DIR")
    if name in taken:
        raise ConfigError(f"two models named {name!r}: name them with NAME=DIR")
    if not path.is_dir():
        raise InputFormatError(path, None, "no such model directory")
    return name, path


def load_models(specs: list[str], load_tagger) -> dict[str, ServedModel]:
    """The models of `gpseq serve MODEL ...`, each loaded once with `load_tagger(path)`; the first is
    the default. ConfigError for two models of one name or a name requests cannot use."""
    from gpseq.model_meta import read_model_meta

    served: dict[str, ServedModel] = {}
    for spec in specs:
        name, path = checked_model_spec(spec, served)
        tagger = load_tagger(path)
        served[name] = ServedModel(name, tagger, path, read_model_meta(path))
    return served
