"""A model as `gpseq serve` holds it: loaded once, read-only, with what a request needs from it
(the span scheme, the corpus columns its features read, a spaCy tokeniser for raw text). A served
model may be a chain of models (`DIR+DIR`, `gpseq.chain_models.ModelChain`): each one's labels a
column for the next, the last one's labels returned."""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpseq.chain_models import ModelChain, model_name
from gpseq.corpora.types import Sentence
from gpseq.errors import ConfigError, InputFormatError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
CHAIN = "+"  # between the directories of a chained model: `gpseq serve chunk=POS_DIR+CHUNK_DIR`


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
    """One served model: its name in requests, the `Tagger` or `ModelChain` (only the batch worker
    calls `tag`) and its (last) model directory's tagger.json (`meta`, for the version)."""

    name: str
    tagger: Any
    path: Path | None = None
    meta: dict | None = None
    scheme: str | None = field(init=False)
    columns: list[int] = field(init=False)  # corpus columns (> 0) of the input the features read
    width: int = field(init=False)  # fields a token row of the input needs (1: tokens will do)
    lang: str = field(init=False)  # the language raw text is tokenised in (a chain's: its first model's)
    chain: list[str] | None = field(init=False)  # a chain's model names in order; None for one model
    _nlp: Any = field(init=False, default=None, repr=False)
    _nlp_lock: threading.Lock = field(init=False, default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        from gpseq.corpora import is_chunk_labelling

        config = self.tagger.config
        self.scheme = config.tag_scheme if is_chunk_labelling(self.tagger.labels, config.tag_scheme) else None
        chain = ModelChain.of(self.tagger)
        self.columns, self.width, self.lang = chain.input_columns, chain.input_width, chain.lang
        self.chain = list(chain.names) if len(chain.taggers) > 1 else None

    @property
    def accepts_text(self) -> bool:
        """Raw text has only tokens: a model whose features read other corpus columns (that no model
        before it in a chain gives) needs rows."""
        return self.width == 1

    def deterministic(self, mean: bool, samples: int | None) -> bool:
        """Whether `Tagger.tag(mean=mean or None, samples=samples)` uses the deterministic predictive
        (the same rule as the Tagger's: explicit mean, then explicit samples, then the config)."""
        return bool(mean) or (samples is None and self.tagger.config.predictive == "deterministic")

    def sentences_from_text(self, text: str, max_sentences: int) -> list[Sentence]:
        """Raw text as the sentences `gpseq tag` reads from a text file (spaCy tokeniser and
        sentencizer of the model's language, `gpseq.corpora.text`), at most `max_sentences` + 1
        (enough to tell that a text has too many); thread-safe."""
        from gpseq.corpora.text import TEXT_MAX_TOKENS, iter_text, text_pipeline

        if not self.accepts_text:
            raise RequestError(422, f"model {self.name!r} reads corpus column(s) {self.columns} besides the "
                                    "token (e.g. POS tags): send \"sentences\" as rows [token, column 1, ...], "
                                    "not \"text\"")
        with self._nlp_lock:  # the language's raw-text pipeline, called by one of this model's threads at a time
            if self._nlp is None:
                self._nlp = text_pipeline(self.lang)
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
        width = self.width
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
        width = self.width
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
            "input": {"text": self.accepts_text, "row_fields": self.width, "columns": self.columns},
            "features": {"preset": config.features.preset, "n_features": int(featurizer.n_features),
                         "lang": self.lang},
            "predictive": config.predictive,
            "predict_samples": config.predict_samples,
            "decode": config.decoder,
            "scores": dict(self.tagger.scores),
            "version": {"gpseq": meta.get("gpseq_version"), "format_version": meta.get("format_version")},
            **({"chain": self.chain} if self.chain else {}),
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


def _named(spec: str) -> tuple[str | None, str]:
    """(NAME, the rest) of `NAME=...`, (None, spec) without a name or when `spec` is an existing path."""
    name, sep, rest = spec.partition("=")
    if sep and NAME.match(name) and not Path(spec).exists():
        return name, rest
    return None, spec


def parse_model_spec(spec: str) -> tuple[str, Path]:
    """`DIR` (named after the directory) or `NAME=DIR`."""
    name, directory = _named(spec)
    return name or model_name(directory), Path(directory)


def parse_served_spec(spec) -> tuple[str, list[Path]]:
    """(name, model directories) of `[NAME=]DIR` or of a chain `[NAME=]DIR+DIR+...` (named after
    its last directory by default); an existing directory whose name holds `=` or `+` is one model.
    Also takes a (name, directories) pair, as `absolute_spec` gives it to worker processes."""
    if not isinstance(spec, str):
        name, directories = spec
        return name, [Path(d) for d in directories]
    name, body = _named(spec)
    if CHAIN not in body or Path(body).exists():
        return name or model_name(body), [Path(body)]
    parts = body.split(CHAIN)
    if not all(parts):
        raise ConfigError(f"{spec}: an empty model directory in the chain; write DIR{CHAIN}DIR")
    return name or model_name(parts[-1]), [Path(part) for part in parts]


def checked_model_spec(spec, taken) -> tuple[str, list[Path]]:
    """(name, directories) of one `[NAME=]DIR[+DIR...]` of the command line, checked: ConfigError for
    a name requests cannot use or one already in `taken`, InputFormatError for a missing directory."""
    name, paths = parse_served_spec(spec)
    if not NAME.match(name):
        raise ConfigError(f"{spec}: model name {name!r} must be letters, digits, '_', '.' or '-'; "
                          "name it with NAME=DIR")
    if name in taken:
        raise ConfigError(f"two models named {name!r}: name them with NAME=DIR")
    for path in paths:
        if not path.is_dir():
            raise InputFormatError(path, None, "no such model directory")
    return name, paths


def load_models(specs: list, load_tagger) -> dict[str, ServedModel]:
    """The models of `gpseq serve MODEL ...`, each loaded once with `load_tagger(path)` (a chain's
    models into a `ModelChain`); the first is the default. ConfigError for two models of one name or
    a name requests cannot use."""
    from gpseq.saved.meta import read_model_meta

    served: dict[str, ServedModel] = {}
    for spec in specs:
        name, paths = checked_model_spec(spec, served)
        taggers = [load_tagger(path) for path in paths]
        tagger = taggers[0] if len(taggers) == 1 else ModelChain(taggers, [model_name(path) for path in paths])
        served[name] = ServedModel(name, tagger, paths[-1], read_model_meta(paths[-1]))
    return served
