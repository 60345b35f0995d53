"""Tag schemes: spans against hand-worked conlleval cases and seqeval, conversions as round trips."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpseq.corpora import (
    convert_tags,
    detect_scheme,
    is_chunk_label,
    is_chunk_labelling,
    normalise_scheme,
    spans,
    spans_to_tags,
    split_label,
)
from gpseq.errors import ConfigError

TYPES = [
    "NP",
    "VP",
    "B-X",
    "",
]  # a type may itself contain '-' (conlleval splits at the first one); "" = bare tags


def _label(prefix, kind):
    return f"{prefix}-{kind}" if kind else prefix


@st.composite
def chunkings(draw):
    """A sentence as a list of segments: None (an O token) or (type, length); plus its chunks."""
    segments = draw(
        st.lists(st.one_of(st.none(), st.tuples(st.sampled_from(TYPES), st.integers(1, 4))), max_size=12)
    )
    chunks, position = [], 0
    for segment in segments:
        if segment is None:
            position += 1
        else:
            kind, length = segment
            chunks.append((kind, position, position + length))
            position += length
    return position, chunks


def _iob2_by_hand(length, chunks):
    tags = ["O"] * length
    for kind, start, end in chunks:
        tags[start] = _label("B", kind)
        for t in range(start + 1, end):
            tags[t] = _label("I", kind)
    return tags


@settings(max_examples=200, deadline=None)
@given(chunkings())
def test_scheme_round_trips_keep_spans(case):
    length, chunks = case
    iob2 = _iob2_by_hand(length, chunks)
    assert spans(iob2, "iob2") == chunks
    bioes = convert_tags(iob2, "iob2", "bioes")
    iob1 = convert_tags(iob2, "iob2", "iob1")
    assert convert_tags(bioes, "bioes", "iob2") == iob2
    assert convert_tags(iob1, "iob1", "iob2") == iob2
    assert spans(bioes, "bioes") == chunks
    assert spans(iob1, "iob1") == chunks
    assert convert_tags(bioes, "iobes", "iob1") == iob1  # aliases
    assert convert_tags(iob1, "iob1", "BIO") == iob2
    # BIOES by hand: single-token chunks are S-, longer ones B- … E-
    for kind, start, end in chunks:
        if end - start == 1:
            assert bioes[start] == _label("S", kind)
        else:
            assert bioes[start] == _label("B", kind) and bioes[end - 1] == _label("E", kind)
    # IOB1 by hand: B- only where a chunk follows a chunk of the same type
    for (k1, _, e1), (k2, s2, _) in zip(chunks, chunks[1:]):
        assert iob1[s2].startswith("B") == (e1 == s2 and k1 == k2)
    if chunks and not any(e == s and k == kk for (k, _, e), (kk, s, _) in zip(chunks, chunks[1:])):
        assert not any(tag.startswith("B") for tag in iob1)


def _seqeval_spans(labels):
    from seqeval.metrics.sequence_labeling import get_entities

    # seqeval names a bare tag's type "_" and gives inclusive ends
    return sorted(
        ("" if kind == "_" else kind, start, end + 1) for kind, start, end in get_entities(list(labels))
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["O", "B-NP", "I-NP", "B-VP", "I-VP"]), max_size=15))
def test_spans_of_arbitrary_iob_sequences_equal_seqeval(labels):
    pytest.importorskip("seqeval")
    assert sorted(spans(labels, "iob2")) == _seqeval_spans(labels)
    assert spans(labels, "iob1") == spans(labels, "iob2")  # conlleval reads both the same way


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(["O", "B-NP", "I-NP", "E-NP", "S-NP", "B-VP", "I-VP", "E-VP", "S-VP"]), max_size=15
    )
)
def test_spans_of_arbitrary_bioes_sequences_equal_seqeval(labels):
    pytest.importorskip("seqeval")
    assert sorted(spans(labels, "bioes")) == _seqeval_spans(labels)


@pytest.mark.parametrize(
    "labels, expected",
    [
        # conlleval: an I- after O starts a chunk; a type change starts one; B- always does
        (["I-NP", "I-NP", "O"], [("NP", 0, 2)]),
        (["O", "I-NP", "I-VP"], [("NP", 1, 2), ("VP", 2, 3)]),
        (["B-NP", "I-NP", "B-NP"], [("NP", 0, 2), ("NP", 2, 3)]),
        (["B-NP", "I-VP", "I-VP"], [("NP", 0, 1), ("VP", 1, 3)]),
        (["I-NP", "B-NP", "I-NP", "O", "B-PP"], [("NP", 0, 1), ("NP", 1, 3), ("PP", 4, 5)]),
        (["B", "I", "O", "I", "B"], [("", 0, 2), ("", 3, 4), ("", 4, 5)]),  # CRF++ basenp tags
        (["B-PER-X", "I-PER-X"], [("PER-X", 0, 2)]),
        ([], []),
    ],
)
def test_conlleval_boundaries_hand_worked(labels, expected):
    assert spans(labels, "iob2") == expected


def test_bioes_hand_worked():
    assert spans(["S-A", "S-A", "B-A", "E-A", "E-A"], "bioes") == [
        ("A", 0, 1),
        ("A", 1, 2),
        ("A", 2, 4),
        ("A", 4, 5),
    ]
    assert spans_to_tags(5, [("A", 0, 1), ("A", 1, 3)], "bioes") == ["S-A", "B-A", "E-A", "O", "O"]
    assert spans_to_tags(4, [("A", 0, 1), ("A", 1, 3)], "iob1") == ["I-A", "B-A", "I-A", "O"]


def test_labels_that_are_not_chunk_tags():
    assert split_label("NN") is None and split_label("-LRB-") is None and split_label("B-") is None
    assert (
        split_label("O") == ("O", "") and split_label("B") == ("B", "") and split_label("I-NP") == ("I", "NP")
    )
    assert not is_chunk_labelling(["NN", "VB"], "iob2")
    assert not is_chunk_label("E-NP", "iob2") and is_chunk_label("E-NP", "bioes")
    with pytest.raises(ConfigError, match="'NN' at position 1"):
        spans(["B-NP", "NN"], "iob2")
    with pytest.raises(ConfigError, match="not a iob2"):
        spans(["S-NP"], "iob2")
    with pytest.raises(ConfigError, match="unknown tag scheme"):
        normalise_scheme("iob3")


def test_detect_scheme():
    assert detect_scheme([["B-NP", "I-NP", "O"], ["B-VP"]]) == "iob2"
    assert detect_scheme([["I-NP", "I-NP", "B-NP"]]) == "iob1"
    assert detect_scheme(["B-NP", "E-NP", "S-VP"]) == "bioes"
    assert detect_scheme([["NN", "VB"]]) is None
    assert detect_scheme([]) is None

