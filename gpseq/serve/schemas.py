"""The bodies of `gpseq serve`'s endpoints (pydantic; they make the OpenAPI documentation).

Requests are validated strictly (a number in quotes is a wrong type, unknown fields are refused);
responses are built as plain dicts and described here for the documentation only.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

Token = Annotated[str, StringConstraints(min_length=1)]
Row = Annotated[list[Token], Field(min_length=1)]
TokenList = Annotated[list[Token], Field(min_length=1)]
RowList = Annotated[list[Row], Field(min_length=1)]


class TagRequest(BaseModel):
    """POST /tag: `text` or `sentences` (exactly one), and the options of `gpseq tag`."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [
            {"text": "The committee approved the budget. It funds three projects."},
            {"sentences": [["The", "cat", "sat", "."]], "full_distribution": True},
            {"model": "chunk", "sentences": [[["He", "PRP"], ["reckons", "VBZ"], ["so", "RB"], [".", "."]]]},
        ]},
    )

    model: Optional[str] = Field(None, description="Name of a served model (GET /models); default: the first.")
    text: Optional[str] = Field(None, description="Raw text: split into sentences and tokens by spaCy (the model's "
                                                  "language), as `gpseq tag` reads a text file.")
    sentences: Optional[list[Union[TokenList, RowList]]] = Field(
        None, min_length=1,
        description="Pre-tokenised sentences: each a list of tokens, or of rows [token, column 1, ...] (a CoNLL "
                    "line without its label) for a model whose features read corpus columns such as POS tags.")
    samples: Optional[int] = Field(None, ge=1, description="Monte Carlo marginals over S draws of f (`--samples`).")
    mean: bool = Field(False, description="The deterministic calibrated marginals, whatever the model's default "
                                          "(`--mean`).")
    full_distribution: bool = Field(False, description="Add every label's probability per token (`distributions`).")
    abstain_below: Optional[float] = Field(None, ge=0.0, le=1.0, description="Flag (abstain, span_abstain) the tokens "
                                           "and spans whose probability is below P; labels are never changed "
                                           "(`--abstain-below`).")
    nbest: int = Field(0, ge=0, description="Also return the K most probable label sequences with their "
                                            "probabilities (`--nbest`).")
    span_probs: Literal["exact", "product"] = Field("exact", description="Span probabilities: exact (P(this exact "
                                                    "span)) or product (of the token marginals) (`--span-probs`).")
    decode: Optional[Literal["viterbi", "max-marginal", "span-f1"]] = Field(
        None, description="viterbi, max-marginal or span-f1; default: the model's (`--decode`).")

    @model_validator(mode="after")
    def _one_input(self) -> "TagRequest":
        if (self.text is None) == (self.sentences is None):
            raise ValueError('give exactly one of "text" and "sentences"')
        return self


class TaggedSentenceOut(BaseModel):
    """One tagged sentence: the object a line of `gpseq tag --format jsonl` holds."""

    source: Optional[str] = Field(None, description='"text" for raw text, null for given sentences.')
    line: Optional[int] = Field(None, description="Raw text: the line (1-based) of the sentence's first token.")
    tokens: list[str]
    labels: list[str]
    confidences: list[float] = Field(description="p(label_t | tokens) of each returned label.")
    distributions: Optional[list[dict[str, float]]] = Field(
        None, description="With full_distribution: per token, label -> p.")
    spans: list[tuple[Optional[str], int, int, float]] = Field(
        description="Chunk labels only: [type, start, end_exclusive, probability], the probability that exactly this "
                    "span is a chunk of that type (or, with span_probs product, the product of its token marginals).")
    span_probability: Optional[str] = Field(None, description='How spans were scored: "exact" or "product".')
    sequence_log_prob: Optional[float] = Field(description="log p(label path | tokens).")
    abstain_below: Optional[float] = Field(None, description="With abstain_below: the threshold.")
    abstain: Optional[list[bool]] = Field(None, description="With abstain_below: per token, p(label) < threshold.")
    span_abstain: Optional[list[bool]] = Field(None, description="With abstain_below: per span, its probability < "
                                                                 "threshold.")
    nbest: Optional[list[dict]] = Field(None, description='With nbest: [{"labels": [...], "probability": p}], most '
                                                          "probable first.")
    chain: Optional[list[dict]] = Field(None, description='A model chain: [{"model": name, "labels": [...]}] of each '
                                                          "model before the last, whose labels the later ones read.")


class TagResponse(BaseModel):
    model: str
    n_sentences: int
    n_tokens: int
    sentences: list[TaggedSentenceOut]


class ModelInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    default: bool
    labels: list[str]
    span_scheme: Optional[str] = Field(description="Tag scheme of chunk labels (spans are returned), else null.")
    input: dict = Field(description="text: whether raw text is accepted; row_fields: fields a token row needs.")
    features: dict
    predictive: str
    predict_samples: int
    decode: str
    scores: dict
    version: dict = Field(description="gpseq version and model format version the model was written with.")
    chain: Optional[list[str]] = Field(None, description="A model chain: its models in order, each one's labels a "
                                                         "column the later ones read; the rest describes the last.")


class ModelsResponse(BaseModel):
    gpseq_version: str
    models: list[ModelInfo]


class HealthResponse(BaseModel):
    status: str
    models: dict[str, dict]
    process: dict = Field(description="The process that answered: pid, resident_mib (its resident memory).")


class ErrorResponse(BaseModel):
    error: str = Field(description="One line: what was wrong.")
