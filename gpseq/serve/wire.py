"""POST /tag on the wire: the body to a `TagRequest`, the tagged sentences to the response bytes.

What a service answering many small requests spends its CPU on besides tagging (HTTP aside):
decoding and validating the body, building the records, encoding them. Here each is done once
per request with as little Python per token as the format allows:

- decoding: orjson when installed (the `serve` extra), else the standard library;
- validation: a plain request, the common case, is checked field by field in `fast_request`,
  which accepts only what `TagRequest` (strict pydantic) accepts and builds the same model; any
  other body (an error, or something unusual: an int for a float, a lone surrogate, an integer
  beyond 64 bits) is decoded by the standard library and validated by `TagRequest`, exactly as
  FastAPI would, so every error keeps pydantic's reason (an integer literal of more than
  `MAX_INT_DIGITS` digits is refused as it is read: no field takes one, and Python's own limit on
  converting longer ones raises an error whose text is not for the client);
- records: those of `gpseq.predict.writers.sentence_record` (a line of `gpseq tag --format jsonl`), built
  for all the sentences of a request at once (`tag_records`), the probabilities rounded to 6
  decimals as `round(p, 6)` does, by NumPy (`round6`);
- encoding: orjson, else `json.dumps` as Starlette's JSONResponse calls it.
"""

from __future__ import annotations

import json
import math
from itertools import chain

import numpy as np
from pydantic import ValidationError

from gpseq.predict.writers import add_record_tail, result_spans
from gpseq.serve.models import RequestError
from gpseq.serve.schemas import TagRequest

try:
    import orjson
except ImportError:  # the standard library does the same, more slowly
    orjson = None

EMPTY_BODY = 'empty body: send a JSON object with "text" or "sentences"'
FIELDS = frozenset(TagRequest.model_fields)
SPAN_PROBS = ("exact", "product")
DECODERS = (None, "viterbi", "max-marginal", "span-f1")
STR, LIST = {str}, {list}
SMALL = 32  # round6: up to this many values, `round` one by one
MAX_INT_DIGITS = 40  # digits of an integer literal in a body (2**64 has 20)
MAX_WHERE_CHARS = 80  # characters of a field path in an error message (an unknown field's name is the client's)


def dumps(value) -> bytes:
    """Compact JSON bytes of `value` (dicts, lists, str, int, float, bool, None; floats finite)."""
    if orjson is not None:
        return orjson.dumps(value)
    return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode("utf-8")


def parse_tag_request(body: bytes) -> TagRequest:
    """The `TagRequest` of a POST /tag body (UTF-8 JSON), or RequestError: 400 malformed JSON,
    422 an empty body or one `TagRequest` refuses (pydantic's reason, `validation_message`)."""
    if not body:
        raise RequestError(422, EMPTY_BODY)
    if orjson is not None:
        try:
            request = fast_request(orjson.loads(body))
        except orjson.JSONDecodeError:  # the standard library may still take it (NaN, a lone surrogate)
            request = None
        if request is not None:
            return request
    try:
        value = json.loads(body, parse_int=bounded_int)
    except json.JSONDecodeError as error:
        raise RequestError(400, f"malformed JSON: {error.msg} at character {error.pos}") from None
    except RecursionError:
        raise RequestError(400, "malformed JSON: nested too deeply") from None
    except ValueError:  # not JSON's own error: no text of it goes back
        raise RequestError(400, "malformed JSON") from None
    try:
        return TagRequest.model_validate(value)
    except ValidationError as error:
        raise RequestError(*validation_message(error.errors())) from None


def bounded_int(digits: str) -> int:
    """An integer literal of a body, or RequestError 422 for one of more than `MAX_INT_DIGITS` digits."""
    count = len(digits) - digits.startswith("-")
    if count > MAX_INT_DIGITS:
        raise RequestError(422, f"a number of {count:,} digits; numbers here have at most {MAX_INT_DIGITS}")
    return int(digits)


def validation_message(errors: list[dict]) -> tuple[int, str]:
    """(422, one line) for the pydantic validation errors of a request body."""
    first = errors[0]
    loc = list(first.get("loc", ()))
    if loc and loc[0] == "body":
        loc = loc[1:]
    if not loc and first.get("type") == "missing":
        return 422, EMPTY_BODY
    if not loc and first.get("type") in ("model_type", "model_attributes_type", "dict_type"):
        return 422, 'body: must be a JSON object with "text" or "sentences"'
    # keep field names and indices; drop pydantic's union-branch tags such as 'list[constrained-str]'
    path = [str(p) for i, p in enumerate(loc) if i == 0 or isinstance(p, int)]
    message = first.get("msg", "invalid").removeprefix("Value error, ")
    if first.get("type") == "extra_forbidden":
        message = "unknown field"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    where = ".".join(path) or "body"
    if len(where) > MAX_WHERE_CHARS:
        where = f"{where[:MAX_WHERE_CHARS]}… ({len(where):,} characters)"
    return 422, f"{where}: {message}{more}"


def fast_request(value) -> TagRequest | None:
    """The `TagRequest` of a decoded body when it is plainly valid (what strict `TagRequest`
    accepts, checked here without building per-token models), else None: let pydantic decide.
    Strings come from orjson, which refuses lone surrogates, so every str here is valid UTF-8."""
    if type(value) is not dict or not FIELDS.issuperset(value):
        return None
    get = value.get
    model, text, sentences, samples = get("model"), get("text"), get("sentences"), get("samples")
    abstain_below, decode = get("abstain_below"), get("decode")
    mean, full_distribution = get("mean", False), get("full_distribution", False)
    nbest, span_probs = get("nbest", 0), get("span_probs", "exact")
    if not ((model is None or type(model) is str) and (samples is None or (type(samples) is int and samples >= 1))
            and type(mean) is bool and type(full_distribution) is bool
            and (abstain_below is None or (type(abstain_below) is float and 0.0 <= abstain_below <= 1.0))
            and type(nbest) is int and nbest >= 0 and span_probs in SPAN_PROBS and decode in DECODERS
            and (text is None) != (sentences is None)):
        return None
    if text is not None:
        if type(text) is not str:
            return None
    elif type(sentences) is not list or not sentences or not all(map(_plain_sentence, sentences)):
        return None
    return TagRequest.model_construct(**value)


def _plain_sentence(sentence) -> bool:
    """A non-empty list of non-empty str tokens, or of non-empty rows of non-empty str fields
    (type sets and `all` over C iterators: no Python call per token)."""
    if type(sentence) is not list or not sentence or not all(sentence):
        return False
    kinds = set(map(type, sentence))
    if kinds == STR:
        return True
    return kinds == LIST and set(map(type, chain.from_iterable(sentence))) == STR and all(chain.from_iterable(sentence))


def round6(values: np.ndarray) -> list[float]:
    """`[round(float(v), 6) for v in values]`, vectorised: rint(v·10⁶)/10⁶ is the double nearest
    to the decimal k·10⁻⁶ that `round` returns whenever k is the right integer; v·10⁶ carries a
    rounding error of ~1e-10, so the values within 1e-6 of a tie, beyond 1e9 or not finite go to
    `round` itself."""
    values = np.asarray(values, dtype=np.float64).ravel()
    if values.size <= SMALL:  # NumPy's fixed cost per call is more than `round`'s on a few values
        return [round(v, 6) for v in values.tolist()]
    scaled = values * 1e6
    out = (np.rint(scaled) / 1e6).tolist()
    with np.errstate(invalid="ignore"):
        clear = (np.abs(scaled - np.floor(scaled) - 0.5) > 1e-6) & (np.abs(values) < 1e9)  # False for NaN
    for index in np.flatnonzero(~clear):
        out[index] = round(float(values[index]), 6)
    return out


def tag_records(sentences: list, results: list, scheme: str | None, distributions: bool) -> list[dict]:
    """The record of each tagged sentence, equal to `sentence_record(sentence, result, scheme,
    distributions)` with a non-finite `sequence_log_prob` as None (JSON has no -inf): the
    probabilities of all the sentences gathered into one array, rounded and listed once."""
    if not results:
        return []
    label_set = results[0].label_set
    index = {label: i for i, label in enumerate(label_set)}
    lengths = [len(result.labels) for result in results]
    probabilities = np.concatenate([result.probabilities for result in results])  # [N, V]
    label_ids = [index[label] for result in results for label in result.labels]
    confidences = round6(probabilities[np.arange(len(label_ids)), label_ids])
    spans = [result_spans(result, scheme) for result in results]
    span_probs = iter(round6([p for found in spans for *_, p in found]))
    if distributions:
        flat, V = round6(probabilities), len(label_set)
        rows = [dict(zip(label_set, flat[at:at + V])) for at in range(0, len(flat), V)]
    records, at = [], 0
    for sentence, result, length, found in zip(sentences, results, lengths, spans):
        record = {"source": sentence.source, "line": sentence.line, "tokens": result.tokens, "labels": result.labels,
                  "confidences": confidences[at:at + length]}
        if distributions:
            record["distributions"] = rows[at:at + length]
        at += length
        record["spans"] = [[kind, start, end, next(span_probs)] for kind, start, end, _ in found]
        log_prob = result.sequence_log_prob if math.isfinite(result.sequence_log_prob) else None
        records.append(add_record_tail(record, result, found, log_prob))
    return records
