"""Chunk tag schemes IOB1, IOB2 (alias BIO) and BIOES (alias IOBES): spans and conversion.

A chunk label is `O`, or a prefix (B, I; also E, S in BIOES) optionally followed by `-TYPE`
(`B-NP`, or bare `B` as in the CRF++ basenp set, whose type is ""). Spans follow conlleval's
chunk boundaries (an `I-X` after `O` or after another type starts a chunk; a `B-X` always
does), extended for BIOES as seqeval does (`E-X`/`S-X` end a chunk, `S-X` starts one). Labels
that are not chunk labels (POS tags such as `NN`) raise ConfigError: callers check with
`is_chunk_labelling` first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache

from gpseq.errors import ConfigError

SCHEMES = ("iob1", "iob2", "bioes")
_ALIASES = {"bio": "iob2", "iobes": "bioes"}
_PREFIXES = {"iob1": frozenset("BIO"), "iob2": frozenset("BIO"), "bioes": frozenset("BIOES")}

Span = tuple[str, int, int]  # (type, start, end exclusive)


def normalise_scheme(scheme: str) -> str:
    """The canonical scheme name ('iob1', 'iob2', 'bioes') for a name or alias, any case."""
    key = str(scheme).lower()
    key = _ALIASES.get(key, key)
    if key not in SCHEMES:
        raise ConfigError(f"unknown tag scheme {scheme!r}: use one of iob1, iob2 (bio), bioes (iobes)")
    return key


@lru_cache(maxsize=65536)  # a tagger's label set is small; spans() parses every token's label
def split_label(label: str) -> tuple[str, str] | None:
    """(prefix, type) of a chunk label (`B-NP` → ('B', 'NP'), `O`/`B` → ('O'/'B', '')), else None."""
    if label == "O":
        return "O", ""
    if label and label[0] in "BIES":
        if len(label) == 1:
            return label, ""
        if len(label) > 2 and label[1] == "-":
            return label[0], label[2:]
    return None


def is_chunk_label(label: str, scheme: str = "iob2") -> bool:
    """Whether `label` is a label of `scheme` (its prefix is allowed there)."""
    parts = split_label(label)
    return parts is not None and parts[0] in _PREFIXES[normalise_scheme(scheme)]


def is_chunk_labelling(labels: Iterable[str], scheme: str = "iob2") -> bool:
    """Whether every label is a chunk label of `scheme` (False for POS tags such as `NN`)."""
    allowed = _PREFIXES[normalise_scheme(scheme)]
    for label in set(labels):
        parts = split_label(label)
        if parts is None or parts[0] not in allowed:
            return False
    return True


def _parse(labels: Sequence[str], scheme: str) -> list[tuple[str, str]]:
    allowed = _PREFIXES[scheme]
    parsed = []
    for position, label in enumerate(labels):
        parts = split_label(label)
        if parts is None or parts[0] not in allowed:
            raise ConfigError(f"label {label!r} at position {position} is not a {scheme} chunk label")
        parsed.append(parts)
    return parsed


def _chunk_ends(prev: str, prev_type: str, tag: str, type_: str) -> bool:
    if prev == "O":
        return False
    return prev in "ES" or tag in "BSO" or prev_type != type_


def _chunk_starts(prev: str, prev_type: str, tag: str, type_: str) -> bool:
    if tag == "O":
        return False
    return tag in "BS" or prev in "OES" or prev_type != type_


def spans(labels: Sequence[str], scheme: str = "iob2") -> list[Span]:
    """Chunks of one sentence as (type, start, end_exclusive), conlleval semantics for ill-formed input."""
    scheme = normalise_scheme(scheme)
    out: list[Span] = []
    prev, prev_type, begin = "O", "", 0
    for position, (tag, type_) in enumerate([*_parse(labels, scheme), ("O", "")]):
        if _chunk_ends(prev, prev_type, tag, type_):
            out.append((prev_type, begin, position))
        if _chunk_starts(prev, prev_type, tag, type_):
            begin = position
        prev, prev_type = tag, type_
    return out


def _label(prefix: str, type_: str) -> str:
    return f"{prefix}-{type_}" if type_ else prefix


def spans_to_tags(length: int, chunks: Iterable[Span], scheme: str = "iob2") -> list[str]:
    """Render non-overlapping chunks (type, start, end_exclusive) as labels of `scheme`."""
    scheme = normalise_scheme(scheme)
    tags = ["O"] * length
    previous_end, previous_type = -1, None
    for type_, start, end in sorted(chunks, key=lambda chunk: chunk[1]):
        if not 0 <= start < end <= length or start < previous_end:
            raise ValueError(
                f"chunk {(type_, start, end)} is empty, out of range or overlaps the previous one"
            )
        if scheme == "iob1":
            first = "B" if (previous_end == start and previous_type == type_) else "I"
            tags[start:end] = [_label(first, type_)] + [_label("I", type_)] * (end - start - 1)
        elif scheme == "iob2":
            tags[start:end] = [_label("B", type_)] + [_label("I", type_)] * (end - start - 1)
        elif end - start == 1:
            tags[start] = _label("S", type_)
        else:
            tags[start:end] = (
                [_label("B", type_)] + [_label("I", type_)] * (end - start - 2) + [_label("E", type_)]
            )
        previous_end, previous_type = end, type_
    return tags


def convert_tags(labels: Sequence[str], source: str, target: str) -> list[str]:
    """Convert one sentence's labels between schemes (through its spans; ill-formed input is normalised)."""
    return spans_to_tags(len(labels), spans(labels, source), target)


def detect_scheme(labels: Iterable[str] | Iterable[Sequence[str]]) -> str | None:
    """Guess the scheme of a corpus' labels (one sentence or a list of sentences).

    'bioes' when an E- or S- prefix occurs; 'iob1' when some chunk begins with I- (conlleval
    boundaries); otherwise 'iob2'. None when some label is not a chunk label (e.g. POS tags).
    """
    sentences = [list(labels)] if labels and isinstance(labels[0], str) else [list(s) for s in labels]
    seen = {label for sentence in sentences for label in sentence}
    if not seen or not is_chunk_labelling(seen, "bioes"):
        return None
    if any(split_label(label)[0] in "ES" for label in seen):
        return "bioes"
    for sentence in sentences:
        for _, start, _ in spans(sentence, "iob2"):
            if sentence[start].startswith("I"):
                return "iob1"
    return "iob2"
