"""The spaCy component's extension attributes and the per-Doc store behind them:
`Token._.<extension>` (a token's marginals as {label: p(y_t = label | X)}, read from
`doc.user_data[("gpseq", extension)]` = {"labels": [V], "probs": [N_doc, V], "starts": [N_doc],
"ends": [N_doc], "chosen": [N_doc], "chunks": [[type, start_char, end_char, P]]}, NaN rows for
untagged tokens) and `Span._.<span_extension>` (P(this exact span | X)). "chosen" (the id of the
label the component returned, −1 untagged) and "chunks" (its chunks with P(exact span | X)) keep the
component's own decisions, which its `score` measures whatever later components do to the Doc.

Rows are found by the tokens' character offsets (`starts`, `ends`), not by `token.i` alone: a later
component that retokenises the Doc (`merge_entities`, `merge_noun_chunks`) shifts the indices,
and a token made by merging several has no distribution of its own (None).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from spacy.tokens import Doc, Span, Token

from gpseq.errors import ConfigError

__all__ = ["register_extensions", "stored_predictions", "store_probabilities", "token_distribution",
           "token_probabilities"]

_DATA_KEY = "gpseq"


def store_probabilities(doc: Doc, extension: str, labels: Sequence[str], probs: np.ndarray, chosen: np.ndarray,
                        chunks: Sequence[tuple] = ()) -> None:
    """Keep a Doc's marginals `probs [N_doc, V]` over `labels [V]` for `Token._.<extension>`, with
    the character offsets of its tokens, the returned label ids `chosen [N_doc]` (−1: untagged) and
    the returned chunks (type, start_char, end_char, P(exact span | X))."""
    starts, ends = _offsets(doc)
    doc.user_data[(_DATA_KEY, extension)] = {"labels": list(labels), "probs": probs, "starts": starts, "ends": ends,
                                             "chosen": np.asarray(chosen, dtype=np.int64),
                                             "chunks": [list(chunk) for chunk in chunks]}


def _offsets(doc: Doc) -> tuple[np.ndarray, np.ndarray]:
    """The character offsets (starts, ends) `[N_doc]` each of a Doc's tokens."""
    starts = np.fromiter((token.idx for token in doc), dtype=np.int64, count=len(doc))
    return starts, starts + np.fromiter((len(token) for token in doc), dtype=np.int64, count=len(doc))


def _rows(data: dict, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """[N] row of `data["probs"]` of each token with character offsets `starts`, `ends` [N]; −1 for a
    token that was not one token when the probabilities were stored (e.g. one merged since)."""
    stored_starts, stored_ends = np.asarray(data["starts"]), np.asarray(data["ends"])
    if len(stored_starts) == 0:
        return np.full(len(starts), -1)
    rows = np.minimum(np.searchsorted(stored_starts, starts), len(stored_starts) - 1)
    found = (stored_starts[rows] == starts) & (stored_ends[rows] == ends)
    return np.where(found, rows, -1)


def token_distribution(token: Token, extension: str = "gpseq_probs") -> dict[str, float] | None:
    """{label: probability} of `token` written by the component with that `extension` (None if untagged)."""
    data = token.doc.user_data.get((_DATA_KEY, extension))
    if data is None:
        return None
    row = token.i  # Docs stored without offsets: rows are token indices
    if "starts" in data:
        row = _rows(data, np.array([token.idx]), np.array([token.idx + len(token)]))[0]
    if row < 0:
        return None
    distribution = data["probs"][row]
    if np.isnan(distribution[0]):
        return None
    return {label: float(p) for label, p in zip(data["labels"], distribution)}


def token_probabilities(doc: Doc, extension: str = "gpseq_probs") -> tuple[list[str], np.ndarray] | None:
    """(labels [V], probabilities [N_doc, V]) written by that component, one row per token of the Doc
    as it is now; NaN rows for untagged tokens (and tokens merged since)."""
    data = doc.user_data.get((_DATA_KEY, extension))
    if data is None:
        return None
    probs = np.asarray(data["probs"])
    if "starts" not in data:  # stored without offsets: rows are token indices
        return list(data["labels"]), probs
    rows = _rows(data, *_offsets(doc))
    out = np.full((len(doc), probs.shape[1]), np.nan)
    out[rows >= 0] = probs[rows[rows >= 0]]
    return list(data["labels"]), out


def stored_predictions(doc: Doc, extension: str = "gpseq_probs"):
    """What that component returned, per token of the Doc as it is now: (labels [V], probabilities
    [N_doc, V] (NaN rows untagged), returned label ids [N_doc] (−1 untagged), {(start_char, end_char,
    type): P(exact span | X)} of its chunks); None where it stored no decisions on the Doc."""
    data = doc.user_data.get((_DATA_KEY, extension))
    if data is None or "chosen" not in data:
        return None
    labels, probs = token_probabilities(doc, extension)
    stored = np.asarray(data["chosen"])
    rows = _rows(data, *_offsets(doc))
    chosen = np.where(rows >= 0, stored[np.maximum(rows, 0)], -1) if len(stored) else np.full(len(doc), -1)
    chunks = {(int(start), int(end), kind): float(p) for kind, start, end, p in data["chunks"]}
    return labels, probs, chosen, chunks


def register_extensions(extension: str, span_extension: str) -> None:
    """`Token._.<extension>` (a getter over the Doc's stored marginals) and `Span._.<span_extension>`."""

    def getter(token: Token) -> dict[str, float] | None:
        return token_distribution(token, extension)

    getter.gpseq_extension = extension
    existing = Token.get_extension(extension)
    if existing is not None and getattr(existing[2], "gpseq_extension", None) != extension:
        raise ConfigError(f"Token extension {extension!r} is already set by someone else; choose another 'extension'")
    if existing is None:
        Token.set_extension(extension, getter=getter)
    existing = Span.get_extension(span_extension)
    if existing is None:
        Span.set_extension(span_extension, default=None)
    elif any(part is not None for part in existing):  # (default, method, getter, setter)
        # a foreign default, method, getter or setter: the span probabilities written would not be
        # what `span._.<span_extension>` reads
        raise ConfigError(f"Span extension {span_extension!r} is already set by someone else; choose another")
