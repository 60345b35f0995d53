"""The spaCy-free tokenizer and sentencizer (gpseq/corpora/rule_tokenizer.py) against spaCy itself: the pipeline
`text._text_pipeline` builds is the oracle for every token's text, offset, whitespace and is_space and for the
sentence starts, on corpus text, special cases, hand-picked hard inputs, random text and other languages; then
the rules cache (where it lives, what it refuses) and the promise of not importing spaCy."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("spacy")

from gpseq.corpora import rule_tokenizer  # noqa: E402
from gpseq.corpora.rule_tokenizer import (  # noqa: E402
    RuleTextPipeline, RuleTokenizer, cached_rules, fast_text_pipeline, remember_rules, rules_of, rules_path)
from gpseq.corpora.text import _text_pipeline, iter_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=None)
def pipelines(lang: str):
    """(spaCy's pipeline as text.py builds it, the RuleTextPipeline of its rules after a trip through JSON)."""
    return _text_pipeline(lang), RuleTextPipeline(json.loads(json.dumps(rules_of(lang))))


def analysis(doc) -> tuple[list[tuple], list[int]]:
    """Everything `text.iter_text` reads of a doc: each token's (text, idx, whitespace_, is_space), and the index of
    each sentence's first token."""
    return ([(token.text, token.idx, token.whitespace_, token.is_space) for token in doc],
            [next(iter(sent)).i for sent in doc.sents])


def assert_same_as_spacy(lang: str, texts) -> None:
    """The rule pipeline of `lang` analyses each of `texts` as spaCy does (the first differences are shown)."""
    spacy_nlp, rule_nlp = pipelines(lang)
    differences = []
    for text in texts:
        expected, got = analysis(spacy_nlp(text)), analysis(rule_nlp(text))
        if got != expected:
            differences.append(f"{text!r}:\n  spaCy {expected}\n  rules {got}")
    assert not differences, f"{len(differences)} of {len(texts)} texts differ, e.g.\n" + "\n".join(differences[:5])


# ---- corpus text -----------------------------------------------------------------------------------------

_PTB_TOKENS = {"``": "\u201c", "''": "\u201d", "-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]",
               "-LCB-": "{", "-RCB-": "}"}
_GLUED_TO_PREVIOUS = {",", ".", ";", ":", "!", "?", "%", ")", "]", "}", "''", "'", "...", "n't", "'s", "'re", "'ve",
                      "'ll", "'d", "'m", "-RRB-", "-RSB-", "-RCB-"}
_GLUED_TO_NEXT = {"(", "[", "{", "``", "$", "#", "-LRB-", "-LSB-", "-LCB-"}


def detokenised(tokens: list[str]) -> str:
    """The words as running text: punctuation, closing quotes and brackets, and clitics ("n't", "'s") glued to
    the word before, opening ones to the word after ("do n't" → "don't", "( see )" → "(see)")."""
    text = ""
    for i, token in enumerate(tokens):
        if i and token not in _GLUED_TO_PREVIOUS and tokens[i - 1] not in _GLUED_TO_NEXT:
            text += " "
        text += _PTB_TOKENS.get(token, token)
    return text


def corpus_sentences(corpora_dir: Path, every: int) -> list[list[str]]:
    """Every `every`-th sentence (its words) of the MASC files and of CoNLL-2000's test set."""
    sentences, words = [], []
    for path in sorted((corpora_dir / "masc").glob("*.conll")) + [corpora_dir / "conll2000" / "test.txt"]:
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines() + [""]:
            if line.strip():
                words.append(line.split()[0])
            elif words:
                sentences.append(words)
                words = []
    return sentences[::every]


def test_corpus_text_as_spacy(corpora_dir):
    """Sentences of MASC and CoNLL-2000 with their words spaced, detokenised, and as paragraphs of twenty
    detokenised sentences (one line, and one sentence a line as `iter_text` joins a block)."""
    sentences = corpus_sentences(corpora_dir, every=8)
    assert len(sentences) > 1500
    running = [detokenised(words) for words in sentences]
    paragraphs = [running[i:i + 20] for i in range(0, len(running), 20)]
    assert_same_as_spacy("en", [" ".join(words) for words in sentences] + running
                         + [" ".join(lines) for lines in paragraphs] + ["\n".join(lines) for lines in paragraphs])


def test_iter_text_reads_the_same_sentences(corpora_dir, tmp_path):
    """`iter_text` gives the same sentences (words, spaces, lines) through either pipeline."""
    lines = [detokenised(words) for words in corpus_sentences(corpora_dir, every=40)]
    path = tmp_path / "raw.txt"
    path.write_text("\n".join(line if i % 7 else "" for i, line in enumerate(lines)) + "\n", encoding="utf-8")
    spacy_nlp, rule_nlp = pipelines("en")

    def read(nlp) -> list[tuple]:
        return [(s.tokens, s.spaces, s.line) for s in iter_text(path, nlp, max_tokens=30, max_run=40)]

    expected = read(spacy_nlp)
    assert len(expected) > 100
    assert read(rule_nlp) == expected


# ---- special cases and hand-picked inputs ------------------------------------------------------------------

def test_every_english_special_case_alone_and_in_context():
    """Each tokenizer exception of English alone, quoted, bracketed, before punctuation, inside a sentence and
    glued to a neighbour: special cases are looked up on whole chunks, between affixes and in the last pass."""
    texts = []
    for special in rules_of("en")["exceptions"]:
        texts += [special, f'("{special}")', f"'{special}'.", f"He said {special}, then {special}!",
                  f"x{special}y", f"{special}:)"]
    assert_same_as_spacy("en", texts)


HARD_INPUTS = [
    "", " ", "   ", "\t", "\n", " \n ", "\n\n\n", "a", " a", "a ", "  a  ", "\ta\t", "a\n\nb", "a \t b", "a\u00a0b",
    "Hello  world.  Bye ", "Line one.\nLine two!\n\nLine three?", "Tabs\tbetween\twords.\t",
    "Visit https://www.example.com/path?q=1&r=2#frag, or http://x.org.", "www.google.com/search.",
    "Mail me at john.doe+tag@example.co.uk!", "(see http://en.wikipedia.org/wiki/Foo_(bar))",
    "It costs $5.00, €3,50 or £1.5m (about 10%).", "Run 5km in 20min at 3.5°C; 10kg, 2.5cm, 100mph.",
    "The well-known state-of-the-art e-mail co-operation -- dash—dash – dash.", "Wait... what?!... Really?!?",
    "Ellipsis… and more…", "He said \"don't!\" (at 5p.m.) e.g. U.S.A. 'tis o'clock y'all.",
    "I can't, won't, shouldn't've; it's gonna be ok.", "CAN'T DON'T Won't", "l'amour d'Italie", ":) :-( ;) <3 :D",
    "a.m. p.m. Mr. Mrs. Dr. St. Jan. Feb. Inc. Ltd. vs. etc.", "U.K.'s 1990s' 90's rock'n'roll",
    "Smith & Wesson; AT&T; R&D.", "#hashtag @user $AAPL", "1,000,000 1.000.000 1/2 3:45 10-12 +44 (0)20",
    "“Quoted,” she said. ‘Single.’ «Guillemets»", "[brackets] {braces} <angle>", "C++ C# F# .NET node.js",
    "ßtraße ÉCOLE naïve façade", "Καλημέρα κόσμε. Γεια!", "中文句子。另一个句子！", "😀😀 emoji! 👍🏽.", "...", "?!",
    "end.", "Mr.", "(", ")", "\"", "a-", "-a", "--", "a--b", "x.y.z", "a/b/c", "3-4", "3.", ".3", "'", "''", "`",
]


def test_hard_inputs():
    assert_same_as_spacy("en", HARD_INPUTS)


def test_empty_text_and_sentences_before_the_sentencizer():
    """No tokens and no sentences for empty text; asking a tokenized doc for sentences is a ValueError, as in
    spaCy."""
    doc = pipelines("en")[1]("")
    assert len(doc) == 0 and list(doc.sents) == []
    with pytest.raises(ValueError):
        list(pipelines("en")[1].tokenizer("A text. Two.").sents)


def test_regex_whitespace_is_str_isspace():
    """The chunker splits with the regex `\\s`, spaCy with str.isspace: the same characters."""
    every_character = "".join(map(chr, range(0x110000)))
    assert set(re.findall(r"\s", every_character)) == {char for char in every_character if char.isspace()}


# ---- random text -------------------------------------------------------------------------------------------

_TRICKY_CHARACTERS = ("abcxyzABCXYZ0189" ".,;:!?'\"()[]{}-–—/\\@#$%&*+=<>~^|_" "“”‘’«»…"
                      " \u00a0\t\n" "éßαβγΩ中文字" "😀👍")
_FRAGMENTS = ["don't", "n't", "'s", "a.m.", "U.S.", "e.g.", ":)", "http://", "www.", ".com", "@x.org", "...", "--",
              "$", "%", "km", "5", "3.5", "Mr.", "'", "''", "``", "’s", "&", "(", ")"]
_random_text = st.lists(st.one_of(st.text(_TRICKY_CHARACTERS, min_size=1, max_size=4), st.sampled_from(_FRAGMENTS)),
                        max_size=16).map("".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_random_text)
def test_random_text_as_spacy(text):
    assert_same_as_spacy("en", [text])


# ---- rules of its own: branches the languages' rules do not reach --------------------------------------------

SYNTHETIC_RULES = {  # an infix that is no prefix ("~"), an empty infix, a suffix that may match nothing ("x*"),
    # special cases holding a space or split by the affix rules, a token regex that is a fullmatch
    "exceptions": {"a-b": ["a", "-b"], "x y": ["x y"], "(a": ["(", "a"], "b.": ["b."], "~": ["~"], "y/": ["y", "/"]},
    "prefix": [r"^-|^\(|^~~", 0], "suffix": [r"\)$|\.$|x*$", 0], "infix": [r"~|-|(?<=a)(?=b)|/", 0],
    "token_match": [r"\d+-\d+|\(1\)", 0, "fullmatch"], "url_match": [r"w+\.\w+", 0, "match"],
}


@functools.lru_cache(maxsize=None)
def synthetic_tokenizers():
    """(spaCy's Tokenizer of SYNTHETIC_RULES, the RuleTokenizer of the same rules)."""
    from spacy.attrs import ORTH
    from spacy.lang.en import English
    from spacy.tokenizer import Tokenizer
    from spacy.vocab import create_vocab

    def method(name: str, method_name: str | None = None):
        entry = SYNTHETIC_RULES[name]
        return getattr(re.compile(entry[0], entry[1]), method_name or entry[2])

    exceptions = {chunk: [{ORTH: piece} for piece in pieces] for chunk, pieces in SYNTHETIC_RULES["exceptions"].items()}
    spacy_tokenizer = Tokenizer(create_vocab("en", English.Defaults), rules=exceptions,
                                prefix_search=method("prefix", "search"), suffix_search=method("suffix", "search"),
                                infix_finditer=method("infix", "finditer"), token_match=method("token_match"),
                                url_match=method("url_match"))
    rules = {**SYNTHETIC_RULES, "special_phrases": rule_tokenizer.special_phrases(SYNTHETIC_RULES)}
    return spacy_tokenizer, RuleTokenizer(rules)


@settings(max_examples=400, deadline=None)
@given(st.text("ab-x~()./1 yw\n", max_size=16))
@example("(1) (1)) ((1 1-1. (1-1)")
@example("x y x  y (x y) ~a~b ab -a-b a-b. (a. b.) y/ y//")
def test_synthetic_rules_as_spacy(text):
    spacy_tokenizer, tokenizer = synthetic_tokenizers()
    expected = [(token.text, token.idx, token.whitespace_, token.is_space) for token in spacy_tokenizer(text)]
    assert [(token.text, token.idx, token.whitespace_, token.is_space) for token in tokenizer(text)] == expected


# ---- other languages ---------------------------------------------------------------------------------------

OTHER_LANGUAGES = {
    "de": ["Das ist z.B. ein Test, oder? Ich hab's gesehen (am 3. Mai 2020).", "Die U.S.A. sind groß! Ca. 5 km."],
    "fr": ["L'homme qu'on a vu aujourd'hui est-il là ? C'est-à-dire : « oui ».", "M. Dupont habite au 3e étage."],
    "es": ["¿Dónde está el Sr. García? ¡No lo sé!", "EE. UU. y la U.E. firmaron el acuerdo, i.e. ayer."],
    "nl": ["'s Avonds gaat hij naar z'n werk. Dat is o.a. belangrijk, nietwaar? Ja!", "Zie blz. 5 t/m 10."],
    "hu": ["A 2020-as évben 15%-kal nőtt. Ez pl. fontos, ugye? Igen.", "Kb. 3 km-re van."],
    "ru": ["Т.е. это было в 1990-х гг. Он сказал: «Привет!» И ушёл.", "См. стр. 5, т. е. дальше."],
}


@pytest.mark.parametrize("lang", sorted(OTHER_LANGUAGES))
def test_other_languages_as_spacy(lang):
    """A few sentences of the language, and each of its special cases alone and in a sentence."""
    specials = list(rules_of(lang)["exceptions"])
    assert_same_as_spacy(lang, OTHER_LANGUAGES[lang] + specials + [f"({special}) {special}." for special in specials])


def test_no_rules_without_the_rule_based_tokenizer(monkeypatch):
    """Languages with their own segmenter, and a URL matcher that is not a regex method, have no fast path."""
    from spacy.lang.en import English

    assert rules_of("ja") is None and rules_of("zh") is None
    monkeypatch.setattr(English.Defaults, "url_match", lambda text: None)
    assert rules_of("en") is None


# ---- the cache ---------------------------------------------------------------------------------------------

@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty cache directory named by GPSEQ_CACHE_DIR."""
    monkeypatch.setenv("GPSEQ_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_cache_round_trip(cache):
    assert cached_rules("en") is None and fast_text_pipeline("en") is None
    rules = remember_rules("en")
    version = rule_tokenizer.installed_spacy_version()
    assert version == __import__("spacy").__version__
    assert [path.relative_to(cache) for path in cache.rglob("*")] == [Path("tokenizer"),
                                                                       Path(f"tokenizer/en-spacy-{version}.json")]
    assert cached_rules("en") == rules == rules_of("en")
    assert rules["format"] == rule_tokenizer.FORMAT_VERSION and rules["spacy"] == version
    assert remember_rules("en") == rules  # read back, not rewritten
    text = "He said \"don't!\" at 5p.m. Then he left."
    assert analysis(fast_text_pipeline("en")(text)) == analysis(pipelines("en")[0](text))


def test_cache_directory(monkeypatch, tmp_path):
    """$GPSEQ_CACHE_DIR, else $XDG_CACHE_HOME/gpseq, else ~/.cache/gpseq."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("GPSEQ_CACHE_DIR", str(tmp_path / "gpseq"))
    assert rules_path("en", "3.8.0") == tmp_path / "gpseq" / "tokenizer" / "en-spacy-3.8.0.json"
    monkeypatch.delenv("GPSEQ_CACHE_DIR")
    assert rule_tokenizer.cache_dir() == tmp_path / "xdg" / "gpseq"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert rule_tokenizer.cache_dir() == tmp_path / "home" / ".cache" / "gpseq"


def _write_rules(cache: Path, edit) -> None:
    """The rules of English as remember_rules writes them, changed by `edit` (rules → JSON-able or bytes)."""
    rules = rules_of("en")
    path = rules_path("en", rules["spacy"])
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = edit(rules)
    path.write_bytes(payload if isinstance(payload, bytes) else json.dumps(payload).encode("utf-8"))


@pytest.mark.parametrize("edit", [
    lambda rules: {**rules, "spacy": "0.0.1"},
    lambda rules: {**rules, "format": rule_tokenizer.FORMAT_VERSION + 1},
    lambda rules: {**rules, "lang": "de"},
    lambda rules: {key: value for key, value in rules.items() if key != "special_phrases"},
    lambda rules: {**rules, "exceptions": {"don't": ["do", "not"]}},
    lambda rules: {**rules, "exceptions": {"a": "a"}},
    lambda rules: {**rules, "prefix": ["^a", "32"]},
    lambda rules: {**rules, "url_match": [rules["url_match"][0], 32, "sub"]},
    lambda rules: [rules],
    lambda rules: json.dumps(rules).encode("utf-8")[:-10],
    lambda rules: b"\xff\xfe not UTF-8",
    lambda rules: b"[" * 100_000,
    lambda rules: b" " * (rule_tokenizer.MAX_RULES_BYTES + 1) + json.dumps(rules).encode("utf-8"),
], ids=["spacy-version", "format-version", "language", "field-missing", "pieces-not-the-text", "pieces-not-a-list",
        "flags-not-a-number", "matcher-method", "not-a-dict", "truncated", "not-utf8", "nested", "too-large"])
def test_cache_refuses_a_file_of_another_version_or_malformed(cache, edit):
    _write_rules(cache, edit)
    assert cached_rules("en") is None and fast_text_pipeline("en") is None


def test_cache_with_a_regex_that_does_not_compile(cache):
    _write_rules(cache, lambda rules: {**rules, "infix": ["(unclosed", 32]})
    assert cached_rules("en") is not None
    assert fast_text_pipeline("en") is None


def test_cache_under_a_file_is_skipped(monkeypatch, tmp_path):
    """No directory can be made: no file, no error, the rules still."""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("GPSEQ_CACHE_DIR", str(tmp_path / "file" / "cache"))
    assert remember_rules("en") == rules_of("en") and cached_rules("en") is None


def test_refused_write_is_skipped(cache, monkeypatch):
    """A write refused as in a read-only directory (which root, running the tests here, could write to)."""

    def refused(path, payload):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(rule_tokenizer, "write_bytes_atomic", refused)
    assert remember_rules("en") == rules_of("en") and cached_rules("en") is None
    assert list(cache.rglob("*.json")) == []


def test_no_home_directory(monkeypatch):
    """Neither variable set and no home directory to find: no cache, no error."""
    monkeypatch.delenv("GPSEQ_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert remember_rules("en") == rules_of("en") and cached_rules("en") is None and fast_text_pipeline("en") is None


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes to read-only directories")
def test_read_only_cache_directory_is_skipped(monkeypatch, tmp_path):
    read_only = tmp_path / "read-only"
    read_only.mkdir(mode=0o500)
    monkeypatch.setenv("GPSEQ_CACHE_DIR", str(read_only))
    try:
        assert remember_rules("en") == rules_of("en") and cached_rules("en") is None
        assert list(read_only.iterdir()) == []
    finally:
        read_only.chmod(0o700)


# ---- without spaCy -----------------------------------------------------------------------------------------

def test_fast_path_imports_neither_spacy_nor_scipy_nor_tensorflow(cache):
    """In a fresh interpreter, the module and a pipeline from the cache tokenise without importing them."""
    remember_rules("en")
    script = ("import sys\nfrom gpseq.corpora.rule_tokenizer import fast_text_pipeline\n"
              "doc = fast_text_pipeline('en')(\"I can't go. Bye!\")\n"
              "print([[t.text for t in sent] for sent in doc.sents])\n"
              "print(sorted({name.split('.')[0] for name in sys.modules}\n"
              "             & {'spacy', 'thinc', 'scipy', 'tensorflow', 'tensorflow_probability'}))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "GPSEQ_CACHE_DIR": str(cache)}, check=True)
    assert result.stdout.splitlines() == ["[['I', 'ca', \"n't\", 'go', '.'], ['Bye', '!']]", "[]"]


def test_rule_tokenizer_needs_no_spacy_objects():
    """A RuleTokenizer is built from plain data: hand-written rules give the algorithm's tokens."""
    tokenizer = RuleTokenizer({"exceptions": {"can't": ["ca", "n't"]}, "prefix": [r"^\(", 0], "suffix": [r"\.$|\)$", 0],
                               "infix": [r"-", 0], "token_match": None, "url_match": None, "special_phrases": []})
    doc = tokenizer("(can't)  well-known.")
    assert [(token.text, token.idx, token.whitespace_) for token in doc] == [
        ("(", 0, ""), ("ca", 1, ""), ("n't", 3, ""), (")", 6, " "), (" ", 8, ""), ("well", 9, ""), ("-", 13, ""),
        ("known", 14, ""), (".", 19, "")]
