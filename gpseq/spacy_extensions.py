"""The spaCy component's extension attributes and the per-Doc store behind them:
`Token._.<extension>` (a token's marginals as {label: p(y_t = label | X)}, read from
`doc.user_data[("gpseq", extension)]` = {"labels": [V], "probs": [N_doc, V]}, NaN rows for
untagged tokens) and `Span._.<span_extension>` (P(this exact span | X)).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from spacy.tokens import Doc, Span, Token

from gpseq.errors import ConfigError

__all__ = ["register_extensions", "store_probabilities", "token_distribution", "token_probabilities"]

_DATA_KEY = "gpseq"


def store_probabilities(doc: Doc, extension: str, labels: Sequence[str], probs: np.ndarray) -> None:
    """Keep a Doc's marginals `probs [N_doc, V]` over `labels [V]` for `Token._.<extension>`."""
    doc.user_data[(_DATA_KEY, extension)] = {"labels": list(labels), "probs": probs}


def token_distribution(token: Token, extension: str = "gpseq_probs") -> dict[str, float] | None:
    """{label: probability} of `token` written by the component with that `extension` (None if untagged)."""
    data = token.doc.user_data.get((_DATA_KEY, extension))
    if data is None:
        return None
    row = data["probs"][token.i]
    if np.isnan(row[0]):
        return None
    return {label: float(p) for label, p in zip(data["labels"], row)}


def token_probabilities(doc: Doc, extension: str = "gpseq_probs") -> tuple[list[str], np.ndarray] | None:
    """(labels [V], probabilities [N_doc, V]) written by that component; NaN rows for untagged tokens."""
    data = doc.user_data.get((_DATA_KEY, extension))
    return None if data is None else (list(data["labels"]), np.asarray(data["probs"]))


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
