"""Raw text as tokens and sentences without importing spaCy: its rule-based tokenizer and sentencizer, replayed.

spaCy's rule-based tokenizer is data (prefix, suffix and infix regexes, a token regex and a URL regex, special
cases) run by one algorithm. `rules_of` reads a language's data from spaCy (already imported), `remember_rules`
keeps it as JSON in the cache directory under spaCy's version, and `fast_text_pipeline` builds from that file a
`RuleTextPipeline` giving the tokens, whitespace and sentence starts of `text._text_pipeline` (spaCy v3.8's
`Tokenizer.__call__` and default `Sentencizer`) without importing spaCy, the larger part of a short text's start-up.

The algorithm, as spaCy documents it ("How spaCy's tokenizer works", `Tokenizer.explain`): text is cut into
whitespace-separated chunks; a chunk that is a special case is replaced by its pieces; otherwise prefixes and
suffixes are stripped one at a time (stopping at a special case or a token-regex match), and what remains is a
special case, a token or URL match, or is cut at infixes. Last, special cases that the affix rules split into
several tokens (e.g. "a.m." inside "5a.m.") are found among the tokens and merged back.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import unicodedata
from pathlib import Path
from typing import Iterator, NamedTuple

from gpseq.corpora._atomic import write_bytes_atomic

FORMAT_VERSION = 1  # of the rules file: a change to its fields or to what RuleTokenizer derives from them
MAX_RULES_BYTES = 4 * 2**20  # the largest language's rules (Indonesian, 16,000 special cases) take about 1 MB
MAX_CACHED_CHUNKS = 10_000  # chunks whose pieces are remembered (spaCy's tokenizer caches as many)
_WHITESPACE = re.compile(r"(\s+)")  # \s of a str pattern is exactly str.isspace, which spaCy splits on
_MATCH_METHODS = ("match", "search", "fullmatch")
_ABOUT_VERSION = re.compile(r"""^__version__ = ["']([^"'\s]+)["']""", re.MULTILINE)


class RuleToken(NamedTuple):
    """A token as `text.iter_text` reads spaCy's: position `i`, character offset `idx`, the whitespace after it."""

    i: int
    idx: int
    text: str
    whitespace_: str
    is_space: bool


class RuleDoc:
    """Tokens of one text, with the sentence starts a sentencizer sets: read like a spaCy Doc (`len`, `doc[i]`,
    iteration, `sents`), without a vocabulary."""

    vocab = None

    def __init__(self, tokens: list[RuleToken], sentence_starts: list[int] | None = None):
        self.tokens, self.sentence_starts = tokens, sentence_starts

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> RuleToken:
        return self.tokens[i]

    def __iter__(self) -> Iterator[RuleToken]:
        return iter(self.tokens)

    @property
    def sents(self) -> Iterator[list[RuleToken]]:
        """The sentences, each the list of its tokens (a ValueError before a sentencizer has run, as in spaCy)."""
        if self.sentence_starts is None:
            raise ValueError("sentence boundaries are unset: run a sentencizer over the doc first")
        ends = self.sentence_starts[1:] + [len(self.tokens)]
        for start, end in zip(self.sentence_starts, ends):
            yield self.tokens[start:end]


class RuleTokenizer:
    """spaCy v3.8's rule-based `Tokenizer.__call__` over `rules` (as `rules_of` gives them): text → RuleDoc."""

    def __init__(self, rules: dict):
        self.specials = {chunk: tuple(pieces) for chunk, pieces in rules["exceptions"].items()}
        self.prefix_search = _regex_method(rules["prefix"], "search")
        self.suffix_search = _regex_method(rules["suffix"], "search")
        self.infix_finditer = _regex_method(rules["infix"], "finditer")
        self.token_match = _regex_method(rules["token_match"])
        self.url_match = _regex_method(rules["url_match"])
        self._cache: dict[str, tuple[str, ...]] = {}
        # spaCy's phrase matcher of special cases, as a trie of token texts
        self._phrases: dict = {}
        for phrase in rules["special_phrases"]:
            node = self._phrases
            for piece in phrase:
                node = node.setdefault(piece, {})
            node[None] = True

    def __call__(self, text: str) -> RuleDoc:
        pieces, spaces = self._merge_special_phrases(*self._chunked(text))
        offsets = itertools.accumulate((len(piece) + space for piece, space in zip(pieces, spaces)), initial=0)
        whitespace = [" " if space else "" for space in spaces]
        return RuleDoc(list(map(RuleToken._make, zip(itertools.count(), offsets, pieces, whitespace,
                                                     map(str.isspace, pieces)))))

    def _chunked(self, text: str) -> tuple[list[str], list[bool]]:
        """Token texts of `text` and whether one space follows each, before special phrases are merged.

        Chunks alternate between whitespace and the rest; one space after a token is its trailing space and
        any further whitespace is a chunk of its own (tokenised like any other), as is whitespace at the start."""
        pieces, spaces = [], []
        for chunk in _WHITESPACE.split(text):  # words alternate with runs of whitespace
            if chunk[:1] == " " and pieces:  # a run after a token: its first space is the token's
                spaces[-1] = True
                chunk = chunk[1:]
            if not chunk:
                continue
            chunk_pieces = self.specials.get(chunk) or self._cache.get(chunk)
            if chunk_pieces is None:
                chunk_pieces = self._split_affixes(chunk)
                if len(self._cache) < MAX_CACHED_CHUNKS:
                    self._cache[chunk] = chunk_pieces
            pieces.extend(chunk_pieces)
            spaces.extend([False] * len(chunk_pieces))
        return pieces, spaces

    def _split_affixes(self, chunk: str) -> tuple[str, ...]:
        """Pieces of one chunk that is not a special case: prefixes and suffixes stripped one of each per round
        (a round ends the stripping when the token regex matches what remains, or it or what remains without the
        prefix or without the suffix is a special case), then the rest (`_split_infixes`)."""
        specials, prefixes, suffixes = self.specials, [], []
        rest, last_size = chunk, 0
        while rest and len(rest) != last_size:
            if (self.token_match and self.token_match(rest)) or rest in specials:
                break
            last_size = len(rest)
            prefix_size = _match_size(self.prefix_search, rest)
            if prefix_size and rest[prefix_size:] in specials:
                prefixes.append(rest[:prefix_size])
                rest = rest[prefix_size:]
                break
            suffix_size = _match_size(self.suffix_search, rest[prefix_size:])  # sought after the prefix: no overlap
            if suffix_size and rest[:-suffix_size] in specials:  # the prefix, if any, stays on
                suffixes.append(rest[-suffix_size:])
                rest = rest[:-suffix_size]
                break
            if prefix_size:
                prefixes.append(rest[:prefix_size])
            if suffix_size:
                suffixes.append(rest[-suffix_size:])
            rest = rest[prefix_size:len(rest) - suffix_size]
        return (*prefixes, *self._split_infixes(rest), *reversed(suffixes))

    def _split_infixes(self, rest: str) -> tuple[str, ...]:
        """Pieces of what affix stripping leaves: a special case's, itself if the token or URL regex matches it,
        else cut at each infix (an infix at its very start is not cut off; an empty infix only cuts)."""
        if not rest:
            return ()
        if rest in self.specials:
            return self.specials[rest]
        infixes = list(self.infix_finditer(rest)) if self.infix_finditer else []
        # without infixes the rest is one token whatever the regexes say: they are only run when it matters
        if not infixes or (self.token_match and self.token_match(rest)) or (self.url_match and self.url_match(rest)):
            return (rest,)
        pieces, start = [], 0
        for infix in infixes:
            infix_start, infix_end = infix.span()
            if infix_start == 0:
                continue
            if infix_start != start:
                pieces.append(rest[start:infix_start])
            if infix_start != infix_end:
                pieces.append(rest[infix_start:infix_end])
            start = infix_end
        if rest[start:]:
            pieces.append(rest[start:])
        return tuple(pieces)

    def _merge_special_phrases(self, pieces: list[str], spaces: list[bool]) -> tuple[list[str], list[bool]]:
        """Token texts and spaces after spaCy's last pass: every run of tokens spelling a special case's affix
        tokens is found; the longest first (leftmost among equally long) is kept unless its first or last token
        is in a run seen before; each kept run whose text (spaces included) is a special case becomes its pieces."""
        found = []
        for start in range(len(pieces) if self._phrases else 0):
            node, end = self._phrases.get(pieces[start]), start + 1
            while node is not None:
                if None in node:
                    found.append((start, end))
                if end == len(pieces):
                    break
                node, end = node.get(pieces[end]), end + 1
        if not found:
            return pieces, spaces
        found.sort(key=lambda run: (run[0] - run[1], run[0]))
        seen, kept = set(), []
        for start, end in found:
            if start not in seen and end - 1 not in seen:
                kept.append((start, end))
            seen.update(range(start, end))  # a run not kept still hides those after it, as in spaCy
        merged_pieces, merged_spaces, done = [], [], 0
        for start, end in sorted(kept):
            merged_pieces += pieces[done:start]
            merged_spaces += spaces[done:start]
            text = "".join(piece + " " * space for piece, space in zip(pieces[start:end], spaces[start:end]))
            special = self.specials.get(text[:-1] if spaces[end - 1] else text)
            if special is None:
                merged_pieces += pieces[start:end]
                merged_spaces += spaces[start:end]
            else:
                merged_pieces += special
                merged_spaces += [False] * (len(special) - 1) + [spaces[end - 1]]
            done = end
        return merged_pieces + pieces[done:], merged_spaces + spaces[done:]


class RuleSentencizer:
    """spaCy's `Sentencizer` rule: a sentence starts at each token that is neither punctuation nor one of
    `punct_chars` and follows one of `punct_chars` with nothing but punctuation in between."""

    def __init__(self, punct_chars: list[str]):
        self.punct_chars = frozenset(punct_chars)

    def __call__(self, doc: RuleDoc) -> RuleDoc:
        starts, after_end = ([0] if len(doc) else []), False
        for token in doc:
            is_end = token.text in self.punct_chars
            if after_end and not is_end and not is_punct(token.text):
                starts.append(token.i)
                after_end = False
            elif is_end:
                after_end = True
        doc.sentence_starts = starts
        return doc


class RuleTextPipeline:
    """`RuleTokenizer` then `RuleSentencizer` of `rules`: text → RuleDoc with sentences, as `text.TextPipeline`
    gives for the language the rules were read from. No vocabulary: tokenisation only."""

    vocab = None

    def __init__(self, rules: dict):
        self.tokenizer = RuleTokenizer(rules)
        self.sentencizer = RuleSentencizer(rules["punct_chars"])

    def __call__(self, text: str) -> RuleDoc:
        return self.sentencizer(self.tokenizer(text))


def is_punct(text: str) -> bool:
    """spaCy's lexical attribute `is_punct`: every character is Unicode punctuation (category P*)."""
    return all(unicodedata.category(char).startswith("P") for char in text)


def _regex_method(entry: list | None, method: str | None = None):
    """The method (`entry[2]` unless given) of the regex `entry` = [pattern, flags, …]; None for None."""
    if entry is None:
        return None
    regex = re.compile(entry[0])  # as spaCy compiles it (its flags are inline): found compiled where spaCy ran
    return getattr(regex if regex.flags == entry[1] else re.compile(entry[0], entry[1]), method or entry[2])


def _match_size(search, text: str) -> int:
    """Characters that `search` (a prefix or suffix regex's) matches in `text`: 0 for none."""
    match = search(text) if search else None
    return match.end() - match.start() if match else 0


def fast_text_pipeline(lang: str) -> RuleTextPipeline | None:
    """The `RuleTextPipeline` of spaCy language `lang` from the rules cached for the installed spaCy; None where
    there are none (never cached, another spaCy version, a damaged file): then spaCy's own pipeline is needed."""
    rules = cached_rules(lang)
    try:
        return None if rules is None else RuleTextPipeline(rules)
    except (re.error, ValueError, TypeError, OverflowError, RecursionError):  # a regex or flags that do not compile
        return None


def remember_rules(lang: str) -> dict | None:
    """The rules of `lang` for `fast_text_pipeline`: those cached, else `rules_of(lang)` (spaCy imported) written
    to the cache; where the cache cannot be written the file is left out: spaCy's pipeline keeps serving."""
    rules = cached_rules(lang)
    if rules is not None or not _is_code(lang) or (rules := rules_of(lang)) is None:
        return rules
    try:
        path = rules_path(lang, rules["spacy"])
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, json.dumps(rules, ensure_ascii=False).encode("utf-8"))
    except (OSError, RuntimeError):  # RuntimeError: no home directory to put the cache in
        pass
    return rules


def rules_of(lang: str) -> dict | None:
    """What `text._text_pipeline` builds spaCy's tokenizer and sentencizer of `lang` from, as JSON-able data; None
    where the fast path cannot give spaCy's tokens: the language has its own tokenizer, a token or URL matcher
    that is not a plain regex method, or its own punctuation attribute."""
    from spacy import util
    from spacy.attrs import IS_PUNCT, ORTH, intify_attrs
    from spacy.lang.lex_attrs import is_punct as spacy_is_punct
    from spacy.pipeline import Sentencizer

    language, version = util.get_lang_class(lang), installed_spacy_version()
    defaults = language.Defaults
    if language.default_config["nlp"]["tokenizer"] != {"@tokenizers": "spacy.Tokenizer.v1"} or version is None:
        return None
    if defaults.lex_attr_getters.get(IS_PUNCT, spacy_is_punct) is not spacy_is_punct:
        return None
    rules = {"format": FORMAT_VERSION, "spacy": version, "lang": lang}
    for name, entries, compile_regex in (("prefix", defaults.prefixes, util.compile_prefix_regex),
                                         ("suffix", defaults.suffixes, util.compile_suffix_regex),
                                         ("infix", defaults.infixes, util.compile_infix_regex)):
        regex = compile_regex(entries) if entries else None
        rules[name] = None if regex is None else [regex.pattern, regex.flags]
    for name in ("token_match", "url_match"):
        method = getattr(defaults, name)
        regex = getattr(method, "__self__", None)
        if method is not None and not (isinstance(regex, re.Pattern) and method.__name__ in _MATCH_METHODS):
            return None
        rules[name] = None if method is None else [regex.pattern, regex.flags, method.__name__]
    rules["exceptions"] = {chunk: [intify_attrs(spec, _do_deprecated=True)[ORTH] for spec in specs]
                           for chunk, specs in sorted((defaults.tokenizer_exceptions or {}).items())}
    rules["special_phrases"] = special_phrases(rules)
    rules["punct_chars"] = sorted(Sentencizer.default_punct_chars)
    return rules


def special_phrases(rules: dict) -> list[list[str]]:
    """The token texts spaCy's last pass looks for (spaCy imported): the special cases as a tokenizer with the same
    affix rules but none of them splits them; with `faster_heuristics` (spaCy's default, kept by text.py) only
    those the affix rules may split or that hold a space."""
    from spacy.tokenizer import Tokenizer
    from spacy.vocab import Vocab

    affix_only = Tokenizer(Vocab(), prefix_search=_regex_method(rules["prefix"], "search"),
                           suffix_search=_regex_method(rules["suffix"], "search"),
                           infix_finditer=_regex_method(rules["infix"], "finditer"),
                           token_match=_regex_method(rules["token_match"]), url_match=_regex_method(rules["url_match"]))
    return [[token.text for token in affix_only(chunk)] for chunk in rules["exceptions"]
            if not affix_only.faster_heuristics or " " in chunk or affix_only.find_prefix(chunk)
            or affix_only.find_suffix(chunk) or affix_only.find_infix(chunk)]


def cached_rules(lang: str) -> dict | None:
    """The rules `remember_rules` cached for `lang` and the installed spaCy; None where there are none, they are
    of another spaCy or format version, or the file is unreadable, too large or malformed."""
    version = installed_spacy_version()
    if version is None or not _is_code(lang):
        return None
    try:
        with open(rules_path(lang, version), "rb") as handle:
            payload = handle.read(MAX_RULES_BYTES + 1)
        rules = json.loads(payload) if len(payload) <= MAX_RULES_BYTES else None
    except (OSError, RuntimeError, ValueError, RecursionError):  # ValueError: not UTF-8, not JSON
        return None
    return rules if _well_formed(rules, lang, version) else None


def _well_formed(rules, lang: str, version: str) -> bool:
    """Whether `rules` holds every field `RuleTextPipeline` reads, of the right types, for `lang` and `version`."""
    def strings(items) -> bool:
        return isinstance(items, list) and all(isinstance(item, str) for item in items)

    def regex(entry, size: int) -> bool:  # [pattern, flags] or, for a matcher, [pattern, flags, method]
        return entry is None or (isinstance(entry, list) and len(entry) == size and isinstance(entry[0], str)
                                 and type(entry[1]) is int and (size == 2 or entry[2] in _MATCH_METHODS))

    return (isinstance(rules, dict) and rules.get("format") == FORMAT_VERSION and rules.get("spacy") == version
            and rules.get("lang") == lang and isinstance(rules.get("exceptions"), dict)
            and isinstance(rules.get("special_phrases"), list) and strings(rules.get("punct_chars"))
            and all(regex(rules.get(name, 0), 2) for name in ("prefix", "suffix", "infix"))
            and all(regex(rules.get(name, 0), 3) for name in ("token_match", "url_match"))
            and all(strings(pieces) and "".join(pieces) == chunk for chunk, pieces in rules["exceptions"].items())
            and all(map(strings, rules["special_phrases"])))


def _is_code(lang: str) -> bool:
    """Whether `lang` can name a cache file: a language code, never a path."""
    return lang.isascii() and lang.isidentifier()


def installed_spacy_version() -> str | None:
    """The version of the spaCy that `import spacy` would load, read from its `about.py` without importing it (nor
    importlib.metadata, whose import alone costs more than reading the rules); None where there is none."""
    try:
        spec = importlib.util.find_spec("spacy")
        with open(Path(spec.submodule_search_locations[0]) / "about.py", encoding="utf-8") as handle:
            found = _ABOUT_VERSION.search(handle.read(10_000))
    except (AttributeError, IndexError, TypeError, OSError, ValueError):  # no spaCy, or no about.py to read
        return None
    return found.group(1) if found else None


def cache_dir() -> Path:
    """gpseq's cache: $GPSEQ_CACHE_DIR, else $XDG_CACHE_HOME/gpseq, else ~/.cache/gpseq (RuntimeError: no home)."""
    if os.environ.get("GPSEQ_CACHE_DIR"):
        return Path(os.environ["GPSEQ_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "gpseq"
    return Path.home() / ".cache" / "gpseq"


def rules_path(lang: str, spacy_version: str) -> Path:
    """The file of the rules of `lang` under spaCy `spacy_version`."""
    return cache_dir() / "tokenizer" / f"{lang}-spacy-{spacy_version}.json"
