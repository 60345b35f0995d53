"""Lexical token attributes: context-free properties of a word string, read from spaCy lexemes.

A lexical attribute depends only on the word (spaCy stores them on the `Lexeme`, shared by every
`Token` with that text), so the featurizer computes them once per word type and caches them.
Attribute values are strings (booleans as "True"/"False").
"""

from __future__ import annotations

import unicodedata
from typing import Callable

_FLAGS = (
    "is_alpha", "is_ascii", "is_digit", "is_lower", "is_upper", "is_title", "is_punct",
    "is_space", "is_stop", "is_bracket", "is_quote", "is_left_punct", "is_right_punct",
    "is_currency", "like_url", "like_num", "like_email",
)


def _flag(name: str) -> Callable:
    return lambda lex, text: "True" if getattr(lex, name) else "False"


def _prefix(n: int) -> Callable:
    return lambda lex, text: text[:n]


def _suffix(n: int) -> Callable:
    return lambda lex, text: text[-n:]


def _char_class_of(ch: str) -> str:
    """Script class for CJK (Hiragana/Katakana/Han/Hangul), else the Unicode general category."""
    cp = ord(ch)
    if 0x3040 <= cp <= 0x309F:
        return "Hira"
    if 0x30A0 <= cp <= 0x30FF or 0x31F0 <= cp <= 0x31FF or 0xFF66 <= cp <= 0xFF9F:
        return "Kata"
    if (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0xF900 <= cp <= 0xFAFF
            or 0x20000 <= cp <= 0x2FFFF or cp == 0x3005):
        return "Han"
    if 0xAC00 <= cp <= 0xD7AF or 0x1100 <= cp <= 0x11FF:
        return "Hangul"
    return unicodedata.category(ch)


def char_class(text: str) -> str:
    """Character classes of `text`, runs merged, at most 4 (e.g. "Lu-Ll", "Han", "Nd-Po-Nd")."""
    classes: list[str] = []
    for ch in text:
        cls = _char_class_of(ch)
        if not classes or classes[-1] != cls:
            classes.append(cls)
            if len(classes) == 4:
                break
    return "-".join(classes) if classes else "EMPTY"


# name -> function(lexeme, text) -> value string
LEXICAL_ATTRIBUTES: dict[str, Callable] = {
    "word": lambda lex, text: text,
    "lower": lambda lex, text: lex.lower_,
    "norm": lambda lex, text: lex.norm_,
    "shape": lambda lex, text: lex.shape_,
    "prefix": lambda lex, text: lex.prefix_,
    "suffix": lambda lex, text: lex.suffix_,
    "length": lambda lex, text: str(min(len(text), 10)),
    "char_class": lambda lex, text: char_class(text),
    **{f"prefix{n}": _prefix(n) for n in range(1, 5)},
    **{f"suffix{n}": _suffix(n) for n in range(1, 5)},
    **{name: _flag(name) for name in _FLAGS},
}
"""Lexical attributes by name: spaCy `Lexeme` attributes (lower, norm, shape, prefix (1 char),
suffix (3 chars), the `is_*`/`like_*` flags), `word` (the text itself), `prefix1`..`prefix4` and
`suffix1`..`suffix4` (first/last n characters), `length` (capped at 10) and `char_class`."""


# attributes computed from the text alone (no spaCy lexeme: a featurizer using only these never
# imports spaCy, which takes most of a small corpus's featurisation time)
TEXT_ONLY = frozenset({"word", "length", "char_class", *(f"{kind}{n}" for kind in ("prefix", "suffix")
                                                             for n in range(1, 5))})


def needs_lexeme(name: str) -> bool:
    """True when the lexical attribute `name` is read from spaCy's `Lexeme` (not the text alone)."""
    return name not in TEXT_ONLY


def is_lexical(name) -> bool:
    """True when `name` is a lexical (word-type) attribute."""
    return isinstance(name, str) and name in LEXICAL_ATTRIBUTES
