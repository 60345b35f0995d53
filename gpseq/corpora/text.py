"""Raw text as sentences: spaCy's tokeniser and sentencizer, in pieces of bounded size.

`text_pipeline` gives the raw-text readers spaCy's pipeline once per language; after that, while the
installed spaCy stays the same, the same tokens and sentences come from its rules cached as data
(`gpseq.corpora.rule_tokenizer`), without importing spaCy.

Neither spaCy nor the tagger ever sees an unbounded input: spaCy gets at most TEXT_MAX_CHARS
characters per call (its own limit, nlp.max_length, is 1,000,000), so longer lines are cut at
whitespace; a sentence of more than `max_tokens` tokens (raw text without sentence punctuation)
is split into pieces of at most that many tokens, at whitespace between tokens.

Nor a stretch of more than TEXT_MAX_RUN characters without whitespace: spaCy's tokenizer strips a
word's prefixes and suffixes one at a time, copying the rest each time, so its time grows with the
square of such a stretch. A line holding a longer one is tokenised in pieces, cut inside such
stretches only, every TEXT_MAX_RUN characters (after the last sentence-final punctuation of the
window's second half when there is one, e.g. 。 in unspaced scripts): a token longer than that is
cut into pieces.

Nor is a line ever held whole: it is read in pieces of at most MAX_LINE_BYTES (`numbered_pieces`),
and a line longer than that is cut at whitespace as its pieces arrive, so memory stays bounded for
a file without line breaks of any size. A NUL byte is refused (binary data, not text).
"""

from __future__ import annotations

import importlib.util
import itertools
import re
from pathlib import Path
from typing import Iterable, Iterator

from gpseq.corpora.lines import Source, numbered_pieces
from gpseq.corpora.types import Sentence
from gpseq.errors import ConfigError

TEXT_MAX_CHARS = 100_000
TEXT_MAX_TOKENS = 1_000
TEXT_MAX_RUN = 500  # characters without whitespace spaCy gets at once (its tokenizer is quadratic in them)
_RUN = re.compile(r"\S+")
_SENTENCE_END = ".!?。．！？"


_BLANK_NLPS: dict = {}


class TextPipeline:
    """A language's default spaCy tokenizer and a sentencizer, called like a pipeline (text → Doc
    with sentences). Built from the language's defaults directly: the same tokenizer as
    `spacy.blank(lang)`'s, without resolving a pipeline config (part of a one-sentence `gpseq tag`'s
    start-up)."""

    def __init__(self, tokenizer, sentencizer):
        self.tokenizer, self.sentencizer = tokenizer, sentencizer
        self.vocab = tokenizer.vocab

    def __call__(self, text: str):
        return self.sentencizer(self.tokenizer(text))


def _text_pipeline(lang: str):
    """`TextPipeline` of `lang` when its tokenizer is spaCy's rule-based one; else (languages with
    their own segmenters: Japanese, Chinese, Thai…) the blank pipeline with a sentencizer."""
    import spacy
    from spacy import util

    language = util.get_lang_class(lang)
    if language.default_config["nlp"]["tokenizer"] != {"@tokenizers": "spacy.Tokenizer.v1"}:
        nlp = spacy.blank(lang)
        nlp.add_pipe("sentencizer")
        return nlp
    from spacy.pipeline import Sentencizer
    from spacy.tokenizer import Tokenizer
    from spacy.vocab import create_vocab

    defaults = language.Defaults
    prefixes, suffixes, infixes = defaults.prefixes, defaults.suffixes, defaults.infixes
    tokenizer = Tokenizer(
        create_vocab(lang, defaults), rules=defaults.tokenizer_exceptions,
        prefix_search=util.compile_prefix_regex(prefixes).search if prefixes else None,
        suffix_search=util.compile_suffix_regex(suffixes).search if suffixes else None,
        infix_finditer=util.compile_infix_regex(infixes).finditer if infixes else None,
        token_match=defaults.token_match, url_match=defaults.url_match)
    return TextPipeline(tokenizer, Sentencizer())


def spacy_language(lang: str) -> bool:
    """True when spaCy has language `lang`: a package of its own (looked up without importing
    spaCy), else one spaCy's registry resolves (an import of spaCy)."""
    if lang not in _SPACY_LANGUAGES:
        spec = importlib.util.find_spec("spacy")
        places = (spec.submodule_search_locations or []) if spec is not None else []
        known = lang.isidentifier() and any((Path(place) / "lang" / lang / "__init__.py").is_file()
                                            for place in places)
        if not known:
            try:
                from spacy import util

                util.get_lang_class(lang)
                known = True
            except Exception:  # spaCy raises ImportError/KeyError-like errors for unknown codes
                known = False
        _SPACY_LANGUAGES[lang] = known
    return _SPACY_LANGUAGES[lang]


_SPACY_LANGUAGES: dict[str, bool] = {}


def blank_nlp(lang: str, setting: str = "language"):
    """spaCy's blank pipeline of `lang` with a sentencizer (`TextPipeline` where the language's
    tokenizer is the rule-based one), built once per language and process: raw text is read with
    it, and lexical attributes only spaCy has come from its vocabulary (building it compiles the
    language's tokenizer rules, a tenth of a second). An unknown `lang` is a ConfigError naming
    `setting` (the option or key it came from)."""
    if lang not in _BLANK_NLPS:
        try:
            _BLANK_NLPS[lang] = _text_pipeline(lang)
        except Exception as err:  # spaCy raises ImportError/KeyError-like errors for unknown codes
            raise ConfigError(f"{setting} {lang!r}: no spaCy language ({err})") from None
    return _BLANK_NLPS[lang]


def text_pipeline(lang: str, setting: str = "language"):
    """What raw text of `lang` is read with: spaCy's tokenizer and sentencizer replayed from the rules an
    earlier run cached (`rule_tokenizer.fast_text_pipeline`: the same tokens and sentences without importing
    spaCy, a second of a one-sentence `gpseq tag`), else `blank_nlp`, whose rules are then cached for the
    next run (where the cache can be written). Built once per language and process."""
    from gpseq.corpora.rule_tokenizer import fast_text_pipeline, remember_rules

    if lang not in _TEXT_PIPELINES:
        fast = fast_text_pipeline(lang)
        if fast is None:
            fast = blank_nlp(lang, setting)
            remember_rules(lang)
        _TEXT_PIPELINES[lang] = fast
    return _TEXT_PIPELINES[lang]


_TEXT_PIPELINES: dict = {}


def cut_at_whitespace(text: str | Iterable[str], limit: int) -> Iterator[tuple[int, str]]:
    """(offset, piece) of `text` in pieces of at most `limit` characters, each cut at the last
    whitespace within the limit (a hard cut where `limit` characters hold no whitespace).

    `text` may come as consecutive strings (a line read in pieces): the cuts are the same as for
    their concatenation, and no more than `limit` characters and one string are held at a time."""
    rest, base = "", 0  # the text not yet cut, and its offset
    for chunk in [text] if isinstance(text, str) else text:
        rest += chunk
        start, n = 0, len(rest)
        while n - start > limit:
            end = start + limit
            cut = max(rest.rfind(c, start + 1, end + 1) for c in " \t\u3000\u00a0\f\v")
            if cut <= start:  # no whitespace in the window (e.g. unspaced scripts): a hard cut
                yield base + start, rest[start:end]
                start = end
            else:  # rest[cut] is whitespace: it ends this piece
                yield base + start, rest[start:cut]
                start = cut + 1
        rest, base = rest[start:], base + start
    if rest:
        yield base, rest


def has_long_run(text: str, limit: int) -> bool:
    """Whether `text` holds more than `limit` characters without whitespace in a row."""
    return len(text) > limit and any(len(word) > limit for word in text.split())


def cut_long_runs(text: str, limit: int) -> Iterator[tuple[int, str]]:
    """(offset, piece) of `text` in pieces whose stretches without whitespace have at most `limit`
    characters: cut only inside longer stretches, every `limit` characters at most (after the last
    sentence-final punctuation in the window's second half, if any); the pieces join to `text`."""
    start = 0
    for match in _RUN.finditer(text):
        at, end = match.start(), match.end()
        while end - at > limit:
            window = text[at + limit // 2:at + limit]
            stop = max(window.rfind(c) for c in _SENTENCE_END)
            cut = at + limit // 2 + stop + 1 if stop >= 0 else at + limit
            yield start, text[start:cut]
            start = at = cut
    if start < len(text):
        yield start, text[start:]


def split_tokens(n_tokens: int, spaces: list[bool], limit: int) -> list[tuple[int, int]]:
    """[start, end) pieces of a sentence of `n_tokens` tokens, each at most `limit` tokens, cut after a
    token followed by whitespace (the last such one within the limit; a cut between any two tokens
    when the last half of the window has none)."""
    pieces, start = [], 0
    while n_tokens - start > limit:
        end = start + limit
        cut = next((i for i in range(end, start + limit // 2, -1) if spaces[i - 1]), end)
        pieces.append((start, cut))
        start = cut
    pieces.append((start, n_tokens))
    return pieces


def _lines(pieces: Iterator[tuple[int, str, bool]]) -> Iterator[tuple[int, str, Iterator[str] | None]]:
    """(line number, text, rest) from `numbered_pieces`: `rest` is None for a line read in one piece,
    else an iterator of its further pieces, to be exhausted before the next line is asked for."""

    def further() -> Iterator[str]:
        for _, piece, last in pieces:
            yield piece
            if last:
                return

    for number, piece, last in pieces:
        yield number, piece, None if last else further()


def iter_text(source: Source, nlp, *, encoding: str = "utf-8", name: str | None = None,
              max_block_chars: int = TEXT_MAX_CHARS, max_tokens: int = TEXT_MAX_TOKENS,
              max_run: int = TEXT_MAX_RUN) -> Iterator[Sentence]:
    """Sentences of raw text (unlabelled, with `spaces`): blocks of non-blank lines (at most
    max_block_chars characters per `nlp` call; a longer line is cut at whitespace; a line with more
    than max_run characters without whitespace is tokenised in pieces cut inside those), spaCy
    tokens and sentences; sentences longer than max_tokens tokens are split into pieces of at most
    max_tokens (at whitespace between tokens). `line` is the line of the sentence's first token.
    Lines are read in pieces of at most MAX_LINE_BYTES (`numbered_pieces`): memory does not grow
    with a line's length."""

    def split(block: list[str], first: int, name: str) -> Iterator[Sentence]:
        text = "\n".join(block)
        doc = nlp(text)
        position, newlines = 0, 0  # newlines before `position` in text (sentences come in order)
        for sent in doc.sents:
            tokens = [t for t in sent if not t.is_space]
            if not tokens:
                continue
            spaces = []
            for token in tokens:
                following = doc[token.i + 1] if token.i + 1 < len(doc) else None
                spaces.append(bool(token.whitespace_) or (following is not None and following.is_space))
            for start, end in split_tokens(len(tokens), spaces, max_tokens):
                piece = spaces[start:end]
                piece[-1] = False  # each sentence becomes its own Doc: no trailing space
                newlines += text.count("\n", position, tokens[start].idx)
                position = tokens[start].idx
                yield Sentence([t.text for t in tokens[start:end]], source=name, line=first + newlines,
                               spaces=piece)

    with numbered_pieces(source, encoding, name) as (name, pieces):
        block: list[str] = []
        first, size = 0, 0
        for number, line, rest in _lines(pieces):
            if rest is None and not line.strip():
                if block:
                    yield from split(block, first, name)
                    block, size = [], 0
                continue
            long_run = rest is None and has_long_run(line, max_run)
            if block and (rest is not None or size + len(line) + 1 > max_block_chars or long_run):
                yield from split(block, first, name)
                block, size = [], 0
            if rest is not None or len(line) > max_block_chars or long_run:  # a long line (e.g. text without
                text = line if rest is None else itertools.chain([line], rest)  # line breaks): cut at whitespace,
                for _, piece in cut_at_whitespace(text, max_block_chars):  # long stretches inside
                    for _, part in cut_long_runs(piece, max_run):
                        if part.strip():
                            yield from split([part], number, name)
                continue
            if not block:
                first = number
            block.append(line)
            size += len(line) + 1
        if block:
            yield from split(block, first, name)
