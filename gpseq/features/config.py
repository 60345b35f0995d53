"""`FeatureConfig`: a named, JSON-serialisable feature set, and the presets.

Value sources, used in `attributes`, `token_attributes`, `columns` and `conjunctions`:
- a lexical attribute name (`gpseq.features.lexical.LEXICAL_ATTRIBUTES`: word, lower, shape, …),
  read from the word type;
- an int: a corpus column (`Sentence.columns[t][i]`, e.g. 1 = the POS column of CoNLL-2000); in
  `Featurizer.transform_docs` column i is read from the token attribute `column_attributes[i]`
  (e.g. {1: "tag_"}), column 0 from the token text when unmapped;
- any other string: a spaCy `Token` attribute set by a pipeline ("tag_", "pos_", "lemma_",
  "dep_", "ent_type_", "morph", or "_.name" for an extension), read from the Docs that
  `pipeline` produces (or that `transform_docs` is given).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from gpseq.corpora.text import spacy_language
from gpseq.errors import ConfigError
from gpseq.features.lexical import LEXICAL_ATTRIBUTES, is_lexical
from gpseq.features.templates import (
    BIAS_TEMPLATE,
    FeatureTemplate,
    conjunction_template,
    parse_crfpp_template,
    window_template,
)

_DTYPES = ("float32", "float64")
# The farthest token a feature may read (window, column_window, conjunction and CRF++ offsets):
# each offset of a window is a template of its own, and a sentence's boundary values grow with it
MAX_WINDOW = 10
MAX_FEATURES = 1 << 26  # columns of a vocabulary or hashing_dim: a model holds D × labels weights


@dataclass
class FeatureConfig:
    """What features a token gets and how they become sparse columns (see module docstring).

    attributes/window: sources used at every offset -window..+window; token_attributes: sources
    at offset 0 only; columns/column_window: corpus columns (or token attributes) in their own
    window; conjunctions: tuples of (source, offset) whose values form one feature; bias: a
    constant feature on every token; crfpp_template: CRF++ template text (U lines add
    templates). Vectoriser: min_count and max_features (most frequent) for the vocabulary, or
    hashing_dim for the hashing trick (column 0 stays reserved); binary values, optional L2 row
    normalisation, dtype of the values.
    """

    preset: str = "custom"
    lang: str = "en"
    attributes: list = field(default_factory=list)
    window: int = 2
    token_attributes: list = field(default_factory=list)
    columns: list = field(default_factory=list)
    column_window: int = 2
    column_attributes: dict = field(default_factory=dict)
    conjunctions: list = field(default_factory=list)
    bias: bool = True
    pipeline: str | None = None
    crfpp_template: str | None = None
    min_count: int = 1
    max_features: int | None = None
    hashing_dim: int | None = None
    binary: bool = True
    l2_normalize: bool = False
    dtype: str = "float32"
    unseen_column: bool = True  # column 0 carries the token's features the vocabulary lacks: their
    # weights' prior variance enters the predictive (vocabulary mode, no L2 norm)
    unseen_shared: bool = True  # the k unseen features of a token are one unknown (they all derive from
    # one new word form): column 0 is k and their variance k² σ²; false: independent, √k and k σ²

    def __post_init__(self) -> None:
        self.conjunctions = [tuple((s, int(o)) for s, o in conj) for conj in self.conjunctions]
        self.column_attributes = {int(k): str(v) for k, v in self.column_attributes.items()}
        self.attributes = list(self.attributes)
        self.token_attributes = list(self.token_attributes)
        self.columns = list(self.columns)

    # ------------------------------------------------------------------ validation, templates
    def validate(self) -> "FeatureConfig":
        """Raise ConfigError on an invalid value; returns self."""
        for name in ("window", "column_window"):  # checked before any template is built
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_WINDOW:
                raise ConfigError(f"features.{name} must be an integer in [0, {MAX_WINDOW}], got {value!r}")
        if not isinstance(self.min_count, int) or isinstance(self.min_count, bool) or self.min_count < 1:
            raise ConfigError(f"features.min_count must be an integer >= 1, got {self.min_count!r}")
        for name, low in (("max_features", 1), ("hashing_dim", 2)):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or not low <= value <= MAX_FEATURES):
                raise ConfigError(f"features.{name} must be None or an integer in [{low}, {MAX_FEATURES:,}], "
                                  f"got {value!r}")
        for name in ("bias", "binary", "l2_normalize", "unseen_column", "unseen_shared"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"features.{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("preset", "lang"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"features.{name} must be a string, got {getattr(self, name)!r}")
        if not spacy_language(self.lang):
            raise ConfigError(f"features.lang {self.lang!r}: no spaCy language of that code")
        if self.hashing_dim is not None:
            if self.min_count != 1 or self.max_features is not None:
                raise ConfigError("features.min_count/max_features apply to a vocabulary, not to hashing_dim")
        if self.dtype not in _DTYPES:
            raise ConfigError(f"features.dtype must be one of {_DTYPES}, got {self.dtype!r}")
        for source in self.sources():
            check_source(source)
        for column, attribute in self.column_attributes.items():
            check_source(column)
            check_source(attribute)
        for conj in self.conjunctions:
            if not conj:
                raise ConfigError("features.conjunctions: an empty conjunction")
        templates = self.templates()
        if not templates:
            raise ConfigError("the feature configuration defines no features")
        far = max((abs(offset) for template in templates for _, offset in template.parts), default=0)
        if far > MAX_WINDOW:
            raise ConfigError(f"features: a template reads {far} tokens away; at most {MAX_WINDOW}")
        return self

    def sources(self) -> list:
        """Every value source the templates read, in first-use order."""
        out: list = []
        for template in self.templates(validate=False):
            for source, _ in template.parts:
                if source not in out:
                    out.append(source)
        return out

    def templates(self, validate: bool = True) -> list[FeatureTemplate]:
        """The feature templates this configuration defines, in column order."""
        out: list[FeatureTemplate] = []
        if self.bias:
            out.append(BIAS_TEMPLATE)
        for source in self.attributes:
            out.extend(window_template(source, o) for o in range(-self.window, self.window + 1))
        for source in self.token_attributes:
            out.append(window_template(source, 0))
        for source in self.columns:
            out.extend(window_template(source, o) for o in range(-self.column_window, self.column_window + 1))
        out.extend(conjunction_template(conj) for conj in self.conjunctions)
        if self.crfpp_template:
            out.extend(parse_crfpp_template(self.crfpp_template)[0])
        names = [t.name for t in out]
        if validate and len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ConfigError(f"duplicate feature templates: {dup}")
        return out

    def needs_pipeline_attributes(self) -> bool:
        """True when some source is a spaCy token attribute (not lexical, not a corpus column)."""
        return any(isinstance(s, str) and not is_lexical(s) for s in self.sources())

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict:
        """A JSON-serialisable dict (tuples become lists, int dict keys become strings)."""
        data = dataclasses.asdict(self)
        data["conjunctions"] = [[[s, o] for s, o in conj] for conj in self.conjunctions]
        data["column_attributes"] = {str(k): v for k, v in self.column_attributes.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "FeatureConfig":
        """Inverse of `to_dict`; unknown keys raise ConfigError."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown feature configuration keys: {unknown}")
        return cls(**data).validate()

    @classmethod
    def from_template_file(cls, path) -> "FeatureConfig":
        """The "crfpp" preset with the CRF++ template file at `path` (its text is stored)."""
        return get_preset("crfpp", template=_read_template_file(path))


# spaCy Token attributes the presets and most configurations use (checked against spaCy in the tests)
_COMMON_TOKEN_ATTRIBUTES = frozenset({"tag_", "pos_", "lemma_", "dep_", "ent_type_", "ent_iob_", "norm_", "morph"})


def check_source(source) -> None:
    """Raise ConfigError unless `source` is a lexical attribute, a column index or a Token attribute."""
    if isinstance(source, bool) or not isinstance(source, (int, str)):
        raise ConfigError(f"feature source must be an attribute name or a column index, got {source!r}")
    if isinstance(source, int):
        if source < 0:
            raise ConfigError(f"feature column index must be >= 0, got {source}")
        return
    if is_lexical(source) or source.startswith("_.") or source in _COMMON_TOKEN_ATTRIBUTES:
        return
    from spacy.tokens import Token  # (importing spaCy takes a second: the common names are known)

    if not hasattr(Token, source):
        raise ConfigError(
            f"unknown feature attribute {source!r}: not a lexical attribute "
            f"({', '.join(sorted(LEXICAL_ATTRIBUTES))}) nor a spaCy Token attribute"
        )


def _read_template_file(path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read CRF++ template {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"CRF++ template {path} is not UTF-8 text") from None


def _template_text(template: str) -> str:
    """`template` is a path to a template file or the template text itself."""
    if "\n" not in template and os.path.isfile(template):
        return _read_template_file(template)
    if "\n" not in template and not template.lstrip().startswith(("U", "B", "#")):
        raise ConfigError(f"CRF++ template {template!r} is neither a file nor template text")
    parse_crfpp_template(template)  # raises ConfigError when malformed
    return template


_FLAGS = ["is_title", "is_upper", "is_digit", "like_num", "is_punct"]
_AFFIXES = [f"prefix{n}" for n in range(1, 5)] + [f"suffix{n}" for n in range(1, 5)]


def _preset_chunking() -> FeatureConfig:
    return FeatureConfig(
        preset="chunking",
        attributes=["word"],
        window=2,
        token_attributes=["lower", "shape", *_AFFIXES, *_FLAGS],
        columns=[1],
        column_window=2,
        column_attributes={1: "tag_"},
        conjunctions=[
            (("word", -1), ("word", 0)),
            (("word", 0), ("word", 1)),
            ((1, -2), (1, -1)),
            ((1, -1), (1, 0)),
            ((1, 0), (1, 1)),
            ((1, 1), (1, 2)),
            ((1, -1), (1, 0), (1, 1)),
            ((1, 0), ("word", 0)),
        ],
    )


def _preset_ner() -> FeatureConfig:
    return FeatureConfig(
        preset="ner",
        attributes=["lower", "shape"],
        window=2,
        token_attributes=["word", *_AFFIXES, *_FLAGS, "is_alpha", "length"],
        conjunctions=[
            (("lower", -1), ("lower", 0)),
            (("lower", 0), ("lower", 1)),
            (("shape", -1), ("shape", 0)),
            (("shape", 0), ("shape", 1)),
            (("shape", -1), ("shape", 0), ("shape", 1)),
        ],
    )


def _preset_pos() -> FeatureConfig:
    return FeatureConfig(
        preset="pos",
        attributes=["lower"],
        window=2,
        token_attributes=["word", "shape", *_AFFIXES, *_FLAGS, "is_alpha"],
        conjunctions=[
            (("lower", -1), ("lower", 0)),
            (("lower", 0), ("lower", 1)),
            (("suffix3", -1), ("suffix3", 0)),
        ],
    )


def _preset_segmentation() -> FeatureConfig:
    return FeatureConfig(
        preset="segmentation",
        attributes=["word", "char_class"],
        window=2,
        conjunctions=[
            (("word", -2), ("word", -1)),
            (("word", -1), ("word", 0)),
            (("word", 0), ("word", 1)),
            (("word", 1), ("word", 2)),
            (("word", -1), ("word", 1)),
            (("char_class", -1), ("char_class", 0)),
            (("char_class", 0), ("char_class", 1)),
            (("char_class", -1), ("char_class", 0), ("char_class", 1)),
        ],
    )


def _preset_crfpp() -> FeatureConfig:
    return FeatureConfig(preset="crfpp", bias=False, column_attributes={})


_PRESETS = {
    "chunking": _preset_chunking,
    "ner": _preset_ner,
    "pos": _preset_pos,
    "segmentation": _preset_segmentation,
    "crfpp": _preset_crfpp,
}


def list_presets() -> list[str]:
    """Names accepted by `get_preset`."""
    return list(_PRESETS)


def preset_or_template(name: str) -> FeatureConfig:
    """The feature preset `name`, or the "crfpp" preset with the CRF++ template file at path `name`
    (what `gpseq train --features` and the spaCy component's `features` take); ConfigError naming the
    presets when it is neither."""
    if name in _PRESETS:
        return get_preset(name)
    if Path(name).is_file():
        return FeatureConfig.from_template_file(name)
    return get_preset(name)  # raises ConfigError naming the presets


def get_preset(name: str, **overrides) -> FeatureConfig:
    """The preset `name` with fields replaced by `overrides`.

    `template=` (a CRF++ template file path or its text) sets `crfpp_template`; the "crfpp"
    preset requires it. Unknown presets or fields raise ConfigError.
    """
    if name not in _PRESETS:
        raise ConfigError(f"unknown feature preset {name!r}; choose one of {list_presets()}")
    config = _PRESETS[name]()
    template = overrides.pop("template", None)
    if template is not None:
        overrides["crfpp_template"] = _template_text(str(template))
    if name == "crfpp" and not overrides.get("crfpp_template"):
        raise ConfigError('the "crfpp" preset needs template= (a CRF++ template file or its text)')
    known = {f.name for f in dataclasses.fields(FeatureConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(f"unknown feature configuration keys: {unknown}")
    return dataclasses.replace(config, **overrides).validate()
