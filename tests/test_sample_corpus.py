"""Structural checks of the bundled sample corpus (corpora/sample): columns, tag sets, IOB2, splits.

The parser here is deliberately independent of gpseq.corpora: plain Python over the file text.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SPLITS = ("train", "dev", "test")

# The 45 Penn Treebank part-of-speech tags (Marcus et al. 1993) with the bracket tags as they
# appear in CoNLL-2000 (`(` and `)`), and `#`.
PENN_TAGS = frozenset(
    "CC CD DT EX FW IN JJ JJR JJS LS MD NN NNS NNP NNPS PDT POS PRP PRP$ RB RBR RBS RP SYM TO UH "
    "VB VBD VBG VBN VBP VBZ WDT WP WP$ WRB # $ . , : ( ) `` ''".split()
)
# CoNLL-2000 chunk types (Tjong Kim Sang & Buchholz 2000, Table 1).
CHUNK_TYPES = frozenset("NP VP PP ADVP ADJP SBAR PRT CONJP INTJ LST UCP".split())
# CoNLL-2003 named-entity types.
NER_TYPES = frozenset("PER ORG LOC MISC".split())


def read_sentences(path: Path) -> list[list[tuple[str, ...]]]:
    """Sentences of a 4-column file as lists of (word, POS, NER, chunk); fails on ragged lines."""
    sentences, current = [], []
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n"), f"{path}: no final newline"
    for number, line in enumerate(text.split("\n"), 1):
        if line == "":
            if current:
                sentences.append(current)
                current = []
            continue
        fields = line.split(" ")
        assert len(fields) == 4 and all(fields), f"{path}:{number}: {line!r} is not 4 fields"
        current.append(tuple(fields))
    if current:
        sentences.append(current)
    return sentences


def iob2_errors(labels: list[str], types: frozenset[str]) -> list[str]:
    """Problems of an IOB2 label sequence: unknown label, or I-X not after B-X / I-X."""
    problems, previous = [], "O"
    for position, label in enumerate(labels):
        if label != "O":
            prefix, _, kind = label.partition("-")
            if prefix not in ("B", "I") or kind not in types:
                problems.append(f"{position}: unknown label {label}")
            elif prefix == "I" and previous[2:] != kind:
                problems.append(f"{position}: {label} after {previous}")
        previous = label
    return problems


@pytest.fixture(scope="module")
def corpus(sample_dir: Path) -> dict[str, list[list[tuple[str, ...]]]]:
    return {split: read_sentences(sample_dir / f"{split}.conll") for split in SPLITS}


def test_iob2_checker_catches_bad_sequences():
    assert iob2_errors(["B-NP", "I-NP", "O", "B-VP"], CHUNK_TYPES) == []
    assert iob2_errors(["O", "I-NP"], CHUNK_TYPES) == ["1: I-NP after O"]
    assert iob2_errors(["B-NP", "I-VP"], CHUNK_TYPES) == ["1: I-VP after B-NP"]
    assert iob2_errors(["I-NP"], CHUNK_TYPES) == ["0: I-NP after O"]
    assert iob2_errors(["B-XX"], CHUNK_TYPES) == ["0: unknown label B-XX"]


def test_size(corpus):
    assert sum(len(s) for s in corpus.values()) >= 300
    assert all(len(corpus[split]) >= 40 for split in SPLITS)


def test_tag_sets_and_iob2(corpus):
    for split, sentences in corpus.items():
        for index, sentence in enumerate(sentences):
            words, pos, ner, chunk = zip(*sentence)
            where = f"{split} sentence {index + 1} ({' '.join(words)})"
            assert set(pos) <= PENN_TAGS, (where, set(pos) - PENN_TAGS)
            assert iob2_errors(list(ner), NER_TYPES) == [], where
            assert iob2_errors(list(chunk), CHUNK_TYPES) == [], where
            assert 3 <= len(sentence) <= 60, where


def test_chunk_tags_within_conll2000(corpus, corpora_dir):
    """Every chunk label of the sample occurs in the CoNLL-2000 training data itself."""
    conll = {
        line.split(" ")[2]
        for line in (corpora_dir / "conll2000" / "train.txt").read_text().splitlines()
        if line
    }
    ours = {tok[3] for sentences in corpus.values() for s in sentences for tok in s}
    assert ours <= conll, ours - conll


def test_splits_disjoint(corpus):
    seen: dict[tuple[str, ...], str] = {}
    for split, sentences in corpus.items():
        for sentence in sentences:
            words = tuple(tok[0] for tok in sentence)
            assert words not in seen, f"{' '.join(words)} in {seen[words]} and {split}"
            seen[words] = split


def test_readme_counts_match(corpus, sample_dir):
    """The counts table of corpora/sample/README.md (| split | sentences | tokens |) is true."""
    readme = (sample_dir / "README.md").read_text(encoding="utf-8")
    table = {
        m.group(1): (int(m.group(2).replace(",", "")), int(m.group(3).replace(",", "")))
        for m in re.finditer(r"^\| *`?(train|dev|test|total)`? *\| *([\d,]+) *\| *([\d,]+) *\|", readme, re.M)
    }
    assert set(table) == {*SPLITS, "total"}
    for split in SPLITS:
        assert table[split] == (len(corpus[split]), sum(len(s) for s in corpus[split])), split
    assert table["total"] == tuple(map(sum, zip(*(table[s] for s in SPLITS))))


def test_example_text_not_in_corpus(corpus, sample_dir):
    """The quick start's raw text is fresh: none of its lines is a corpus sentence."""
    lines = [l for l in (sample_dir / "example.txt").read_text(encoding="utf-8").splitlines() if l.strip()]
    assert 8 <= len(lines) <= 12
    # Compared with spaces removed, so tokenisation differences cannot hide a copied sentence.
    corpus_text = {"".join(t[0] for t in s) for sents in corpus.values() for s in sents}
    for line in lines:
        assert re.sub(r"\s", "", line) not in corpus_text, line
