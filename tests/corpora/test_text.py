"""Raw text without sentence boundaries (gpseq/corpora/text.py): spaCy only ever sees bounded
segments, the tagger bounded sentences, cut between words; stretches without whitespace are bounded
too. Through `iter_text` directly and through `gpseq tag` on the tiny model of `helpers.tiny_model`
(trained once for the module)."""

from __future__ import annotations

import json
import random
import time

import pytest

from helpers.cli import invoke, one_line
from helpers.tiny_model import corpus, model, notes  # noqa: F401

from gpseq.corpora.text import TEXT_MAX_CHARS, TEXT_MAX_TOKENS, iter_text


def _unpunctuated_line(n_chars: int, seed: int = 0) -> str:
    """Words without punctuation (so spaCy's tokens are the words), no sentence boundary anywhere."""
    rng = random.Random(seed)
    words = ["committee", "budget", "approved", "three", "small", "projects", "fund", "the", "on", "Tuesday"]
    out, size = [], 0
    while size < n_chars:
        word = rng.choice(words)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:n_chars].rstrip()


class _RecordingNlp:
    """spaCy's blank pipeline with the sentencizer, recording the length of every text it is given."""

    def __init__(self):
        import spacy

        self.nlp = spacy.blank("en")
        self.nlp.add_pipe("sentencizer")
        self.lengths: list[int] = []

    def __call__(self, text):
        self.lengths.append(len(text))
        return self.nlp(text)


def test_text_reader_cuts_a_5mb_line_into_bounded_pieces(tmp_path):
    """A 5 MB line without punctuation (spaCy alone: E088, "text length exceeds 1000000"): spaCy only
    ever sees at most TEXT_MAX_CHARS characters, no sentence has more than TEXT_MAX_TOKENS tokens, the
    cuts fall at whitespace (the tokens are exactly the words) and every piece names line 2."""
    line = _unpunctuated_line(5_000_000)
    path = tmp_path / "long.txt"
    path.write_text("A first line.\n" + line + "\n\nThe last one.\n", encoding="utf-8")
    nlp = _RecordingNlp()
    items = list(iter_text(path, nlp, encoding="utf-8", name=str(path)))
    assert max(nlp.lengths) <= TEXT_MAX_CHARS == 100_000
    assert len(nlp.lengths) >= 50
    assert [item.tokens for item in items[:1]] == [["A", "first", "line", "."]]
    assert items[-1].tokens == ["The", "last", "one", "."] and items[-1].line == 4
    middle = items[1:-1]
    assert max(len(item.tokens) for item in middle) == TEXT_MAX_TOKENS == 1_000
    assert [t for item in middle for t in item.tokens] == line.split()
    assert {item.line for item in middle} == {2}
    for item in items:
        assert len(item.spaces) == len(item.tokens) and item.spaces[-1] is False


def test_text_reader_splits_long_sentences_between_words_not_inside_them(tmp_path):
    """Pieces of at most max_tokens tokens, cut after a token followed by whitespace: "don't" is two
    tokens (do, n't) that are never separated; a line without whitespace is cut between tokens."""
    words = " ".join(["we", "don't", "stop"] * 700)  # 2,800 tokens, no sentence punctuation
    path = tmp_path / "words.txt"
    path.write_text(words + "\n" + "x" * 250_000 + "\n", encoding="utf-8")
    nlp = _RecordingNlp()
    items = list(iter_text(path, nlp, encoding="utf-8", name=str(path), max_tokens=100))
    first = [item for item in items if item.line == 1]
    assert all(len(item.tokens) <= 100 for item in first)
    assert all(item.tokens[0] != "n't" and item.tokens[-1] != "do" for item in first)
    assert [t for item in first for t in item.tokens] == ["we", "do", "n't", "stop"] * 700
    second = [item for item in items if item.line == 2]  # 250,000 characters, no whitespace
    assert max(nlp.lengths) <= TEXT_MAX_CHARS
    assert "".join(t for item in second for t in item.tokens) == "x" * 250_000


def test_text_reader_bounds_stretches_without_whitespace(tmp_path):
    """spaCy's tokenizer takes time quadratic in a stretch without whitespace made of prefixes or
    suffixes ("((((…" of 16,000 characters: 19 s; 100,000, within gpseq serve's max_chars: ~12
    minutes, the worker frozen). spaCy never gets more than TEXT_MAX_RUN (500) such characters in a
    row; every character is kept, in order; cuts in unspaced text fall after sentence punctuation;
    normal lines are tokenised as before."""
    from gpseq.corpora.text import TEXT_MAX_RUN

    assert TEXT_MAX_RUN == 500

    class Bounded(_RecordingNlp):
        def __call__(self, text):
            assert max(map(len, text.split()), default=0) <= 500, "spaCy got a longer stretch"
            return super().__call__(text)

    japanese = "。".join(["日本語の文です"] * 200) + "。"
    lines = ["A first line.", "(" * 100_000, "Quote " + "'" * 20_000 + " end.", japanese, "The last one."]
    path = tmp_path / "runs.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    nlp = Bounded()
    started = time.perf_counter()
    items = list(iter_text(path, nlp, encoding="utf-8", name=str(path)))
    assert time.perf_counter() - started < 60
    assert items[0].tokens == ["A", "first", "line", "."] and items[-1].tokens == ["The", "last", "one", "."]
    for number, line in enumerate(lines, start=1):
        tokens = [t for item in items if item.line == number for t in item.tokens]
        assert "".join(tokens) == "".join(line.split())
    pieces = ["".join(item.tokens) for item in items if item.line == 4]
    assert all(piece.endswith("。") for piece in pieces)


def test_tag_a_300kb_unpunctuated_line(model, tmp_path):
    """The CLI end to end on one 300 KB line (about 45,000 words): exit 0, every output sentence at
    most --text-max-tokens tokens, all the words tagged in order, every sentence from line 1."""
    line = _unpunctuated_line(300_000, seed=1)
    path = tmp_path / "line.txt"
    path.write_text(line + "\n", encoding="utf-8")
    out = tmp_path / "tagged.jsonl"
    result = invoke("tag", model, path, "--format", "jsonl", "--mean", "--batch-size", "16",
                    "--text-max-tokens", "800", "-o", out)
    assert result.exit_code == 0, result.stderr
    records = [json.loads(row) for row in out.read_text(encoding="utf-8").splitlines()]
    assert max(len(r["tokens"]) for r in records) == 800
    assert [t for r in records for t in r["tokens"]] == line.split()
    assert {r["line"] for r in records} == {1}
    assert all(len(r["labels"]) == len(r["tokens"]) for r in records)


def test_text_max_tokens_must_be_positive(model, notes):
    result = invoke("tag", model, notes, "--text-max-tokens", "0")
    assert result.exit_code == 4
    assert one_line(result) == "error: --text-max-tokens must be >= 1; got 0"


def _masc_text(corpora_dir, limit: int = 3000) -> list[str]:
    """Sentences of the MASC genres as text: tokens joined by spaces, with the space before
    punctuation and clitics dropped (so the tokenizer's prefix/suffix/infix rules and exceptions act)."""
    texts, tokens = [], []
    for path in sorted((corpora_dir / "masc").glob("*.conll")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                tokens.append(line.split()[0])
                continue
            if tokens:
                text = tokens[0]
                for token in tokens[1:]:
                    glue = token[:1] in ".,;:!?)'%" or token.startswith("n'")
                    text += ("" if glue else " ") + token
                texts.append(text)
                tokens = []
            if len(texts) >= limit:
                return texts
    return texts


CRAFTED_TEXT = [
    "Dr. Smith's dog (aged 3) didn't bark at https://example.com/a?b=c -- or at j.doe@mail.org!",
    "U.S.-based firms paid $4.5bn in 2019; e.g. Apple's 10% rise… “Really?” she asked. Yes.",
    "I'm gonna go :) can't stop won't stop #tbt @someone 12:30pm 5km/h 3x4 A/B testing...",
    "Mr.Jones\tarrived\n\nlate.  Twice   over.The end",
    "Straße über Köln. Él dijo «¡hola!». C'est l'été, n'est-ce pas? 東京に行きます。",
]


def _assert_tokenised_as_spacy_blank_pipeline(lang: str, texts: list[str]) -> None:
    import spacy

    from gpseq.corpora.text import TextPipeline, blank_nlp

    ours = blank_nlp(lang)
    assert isinstance(ours, TextPipeline)
    reference = spacy.blank(lang)
    reference.add_pipe("sentencizer")
    for text in texts:
        got, want = ours(text), reference(text)
        assert [(t.text, t.whitespace_, t.is_sent_start) for t in got] == \
               [(t.text, t.whitespace_, t.is_sent_start) for t in want], text


@pytest.mark.parametrize("lang", ["en", "de", "fr", "xx"])
def test_text_pipeline_tokenises_and_splits_as_spacy_blank_pipeline(lang, sample_dir):
    """The reader's tokenizer (built from the language defaults, `TextPipeline`) gives the same
    tokens, whitespace and sentence starts as spaCy's own blank pipeline with a sentencizer."""
    _assert_tokenised_as_spacy_blank_pipeline(lang, CRAFTED_TEXT + [(sample_dir / "example.txt").read_text("utf-8")])


def test_text_pipeline_tokenises_masc_as_spacy_blank_pipeline(corpora_dir):
    _assert_tokenised_as_spacy_blank_pipeline("en", _masc_text(corpora_dir))


def test_text_pipeline_of_a_language_with_its_own_segmenter_is_spacy_blank_pipeline():
    """Chinese has its own segmenter (characters by default): the reader uses spaCy's pipeline."""
    from gpseq.corpora.text import TextPipeline, blank_nlp

    nlp = blank_nlp("zh")
    assert not isinstance(nlp, TextPipeline)
    assert [[t.text for t in s] for s in nlp("东京很大。我去。").sents] == [list("东京很大。"), list("我去。")]
