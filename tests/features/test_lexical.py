"""The lexical attributes computed from the text (`text_function`) against spaCy's own lexemes:
every Unicode character, crafted numbers and shapes, and every word type of the shared corpora."""

from __future__ import annotations

import sys

import pytest

from gpseq.features.lexical import LEXICAL_ATTRIBUTES, TEXT_ONLY, text_function

CRAFTED = [
    "", " ", "\t", "a", "A", "Aa", "aA", "AAA", "The", "U.S.", "e-mail", "IBM's", "o'clock", "3.5", "-3.5",
    "+1,000.25", "±7", "~40", "--5", "1/2", "1/2/3", "/2", "3/", "½", "²", "٣", "1st", "2ND", "33rd", "4th",
    "th", "1.st", "twenty", "Twenty", "TWENTY-ONE", "first", "Millionth", "gajillion", "zero.", "-one",
    "...", "!?", "«»", "(", "``", "''", "$", "€", "$5", "£££", "x" * 99, "x" * 100, "Xx1" * 40,
    "aaaaaa", "AAAAAA", "111111", "......", "ǅ", "ǅungla", "ÉCOLE", "ß", "İstanbul", "日本語", "カタカナ",
    "ｶﾀｶﾅ", "한국어", "١٢٣", "Ⅻ", "x²", "a\u0301", "\u0301", "🙂", "🙂🙂🙂🙂🙂", "A1b2", "http://x.org",
]


def _native(lang: str) -> dict:
    names = [name for name in LEXICAL_ATTRIBUTES if name not in TEXT_ONLY]
    return {name: fn for name in names if (fn := text_function(name, lang)) is not None}


def _characters() -> list[str]:
    return [chr(cp) for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF and (cp < 0x30000 or cp % 97 == 0)]


def _assert_equal_to_spacy(lang: str, words: list[str]) -> None:
    import spacy

    vocab = spacy.blank(lang).vocab
    functions = _native(lang)
    for word in dict.fromkeys(words):
        lexeme = vocab[word]
        for name, fn in functions.items():
            expected = LEXICAL_ATTRIBUTES[name](lexeme, word)
            assert fn(word) == expected, (lang, name, word)
        vocab = vocab if len(vocab) < 200_000 else spacy.blank(lang).vocab  # bounded memory


def test_the_text_covers_the_presets_lexical_attributes_in_english():
    from gpseq.features.config import get_preset, list_presets

    for preset in list_presets():
        config = get_preset(preset, template="U00:%x[0,0]\n") if preset == "crfpp" else get_preset(preset)
        lexical = {s for s in config.token_attributes + config.attributes if s in LEXICAL_ATTRIBUTES}
        assert all(text_function(name, "en") is not None for name in lexical), preset
    assert text_function("norm", "en") is None and text_function("is_stop", "en") is None
    assert text_function("like_num", "de") is None  # German number words are spaCy's


@pytest.mark.parametrize("lang", ["en", "de", "xx"])
def test_text_functions_equal_spacy_lexemes_on_every_character_and_crafted_words(lang):
    _assert_equal_to_spacy(lang, CRAFTED + _characters() + [c + c.upper() + "1" for c in _characters()[:5000]])


def test_text_functions_equal_spacy_lexemes_on_the_shared_corpora_word_types(corpora_dir):
    words: list[str] = []
    for path in sorted(corpora_dir.rglob("*")):
        if path.suffix not in (".txt", ".conll", ".data") or not path.is_file():
            continue
        encoding = "euc-jp" if "JapaneseNE" in str(path) else "utf-8"
        with open(path, encoding=encoding, errors="replace") as lines:
            words += [line.split(maxsplit=1)[0] for line in lines if line.strip()]
    assert len(set(words)) > 40_000
    _assert_equal_to_spacy("en", words)


def test_presets_featurize_without_importing_spacy():
    """The presets' lexical attributes come from the text in English: fitting and transforming
    imports no spaCy; an attribute only spaCy has (norm) does import it."""
    import subprocess

    code = ("import sys; from gpseq.corpora.types import Sentence; from gpseq.features import Featurizer; "
            "from gpseq.features.config import FeatureConfig, get_preset; "
            "s = [Sentence(tokens=('日', 'Twenty', 'A.'), labels=('B', 'I', 'B'))]; "
            "Featurizer({}).fit(s).transform(s); print('spacy' in sys.modules)")
    run = lambda config: subprocess.run([sys.executable, "-c", code.format(config)], capture_output=True,  # noqa: E731
                                        text=True, check=True).stdout.strip()
    for preset in ("segmentation", "ner", "pos", "chunking"):
        config = f"get_preset({preset!r}, columns=[], column_attributes={{}}, conjunctions=[])"
        assert run(config) == "False", preset
    assert run("FeatureConfig(token_attributes=['norm'])") == "True"


def test_a_language_code_spacy_lacks_is_refused_by_the_configuration():
    from gpseq.errors import ConfigError
    from gpseq.features.config import get_preset

    with pytest.raises(ConfigError, match="features.lang 'zz'"):
        get_preset("pos", lang="zz")
    for lang in ("en", "de", "ja", "zh", "xx"):  # packages of spaCy's own, segmenters or not
        assert get_preset("segmentation", lang=lang).lang == lang
