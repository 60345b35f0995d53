"""Lexical token attributes: context-free properties of a word string, as spaCy's lexemes have them.

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


# Attributes computed here from the text alone, equal to spaCy's (the tests compare them with
# spaCy's blank vocabularies over every corpus word type and every Unicode character): a featurizer
# using only these never imports spaCy nor builds its pipeline. spaCy's languages override only a
# lexeme's like_num, is_currency, norm and is_stop; the first two are here for English, the last
# two are always read from spaCy.
TEXT_ONLY = frozenset({"word", "length", "char_class", *(f"{kind}{n}" for kind in ("prefix", "suffix")
                                                             for n in range(1, 5))})


def word_shape(text: str) -> str:
    """spaCy's word shape: letters as X/x by case, digits as d, other characters as themselves, a
    run of one shape character cut after 4; "LONG" for 100 characters or more."""
    if len(text) >= 100:
        return "LONG"
    out: list[str] = []
    previous, run = "", 0
    for ch in text:
        if ch.isalpha():
            code = "X" if ch.isupper() else "x"
        elif ch.isdigit():
            code = "d"
        else:
            code = ch
        run = run + 1 if code == previous else 1
        previous = code
        if run <= 4:
            out.append(code)
    return "".join(out)


def _all_categories(prefix: str) -> Callable[[str], bool]:
    return lambda text: all(unicodedata.category(ch).startswith(prefix) for ch in text)


_EN_NUMBER_WORDS = frozenset((
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety "
    "hundred thousand million billion trillion quadrillion quintillion sextillion septillion "
    "octillion nonillion decillion gajillion bazillion "
    "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth thirteenth "
    "fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth twentieth thirtieth fortieth "
    "fiftieth sixtieth seventieth eightieth ninetieth hundredth thousandth millionth billionth "
    "trillionth quadrillionth quintillionth sextillionth septillionth octillionth nonillionth "
    "decillionth gajillionth bazillionth").split())


def _bare_number(text: str) -> str:
    """`text` without one leading sign (+ - ± ~) and without its , and . separators."""
    return (text[1:] if text[:1] in ("+", "-", "±", "~") else text).replace(",", "").replace(".", "")


def _like_number(text: str) -> bool:
    """Digits once the sign and separators are dropped (e.g. -1,000.5), or a digit fraction."""
    bare = _bare_number(text)
    numerator, slash, denominator = bare.partition("/")
    return bare.isdigit() or (bool(slash) and "/" not in denominator and numerator.isdigit() and denominator.isdigit())


def _like_number_en(text: str) -> bool:
    """`_like_number`, or (once the sign and separators are dropped) an English number or ordinal
    word, or digits followed by st/nd/rd/th."""
    lower = _bare_number(text).lower()
    return _like_number(text) or lower in _EN_NUMBER_WORDS or (lower[-2:] in ("st", "nd", "rd", "th")
                                                               and lower[:-2].isdigit())


_TEXT_FLAGS: dict[str, Callable[[str], bool]] = {
    "is_alpha": str.isalpha, "is_ascii": str.isascii, "is_digit": str.isdigit, "is_lower": str.islower,
    "is_upper": str.isupper, "is_title": str.istitle, "is_space": str.isspace,
    "is_punct": _all_categories("P"),
}
_LANGUAGE_FLAGS: dict[str, dict[str, Callable[[str], bool]]] = {
    "en": {"like_num": _like_number_en, "is_currency": _all_categories("Sc")},
}


def _as_value(flag: Callable[[str], bool]) -> Callable[[str], str]:
    # spaCy's empty lexeme has every flag False (the vacuous all() of is_punct would say True)
    return lambda text: "True" if text and flag(text) else "False"


def text_function(name: str, lang: str) -> Callable[[str], str] | None:
    """The function computing lexical attribute `name` of a word from its text, equal to spaCy's
    `Lexeme` attribute in language `lang`; None when it is read from spaCy's vocabulary."""
    if name in TEXT_ONLY:
        function = LEXICAL_ATTRIBUTES[name]
        return lambda text: function(None, text)
    if name == "lower":
        return str.lower
    if name == "shape":
        return word_shape
    if name == "prefix":
        return lambda text: text[:1]
    if name == "suffix":
        return lambda text: text[-3:]
    flag = _TEXT_FLAGS.get(name) or _LANGUAGE_FLAGS.get(lang, {}).get(name)
    return None if flag is None else _as_value(flag)


def is_lexical(name) -> bool:
    """True when `name` is a lexical (word-type) attribute."""
    return isinstance(name, str) and name in LEXICAL_ATTRIBUTES
