"""Token attributes between gpseq and spaCy: which annotations a model's features read from a Doc
(so that a missing earlier component is a clear error, not a silent empty feature), and the
Universal POS tags a POS model's labels stand for (`token.pos_`).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpseq.errors import ModelFormatError

__all__ = ["UPOS_FROM_PTB", "annotations_read", "upos_tags"]

# Penn Treebank → Universal POS (the usual UD conversion; CoNLL-2000 spells brackets "(" ")").
UPOS_FROM_PTB = {
    "#": "SYM", "$": "SYM", "''": "PUNCT", "``": "PUNCT", ",": "PUNCT", ".": "PUNCT", ":": "PUNCT",
    "(": "PUNCT", ")": "PUNCT", "-LRB-": "PUNCT", "-RRB-": "PUNCT", "HYPH": "PUNCT", "NFP": "PUNCT",
    "AFX": "ADJ", "CC": "CCONJ", "CD": "NUM", "DT": "DET", "EX": "PRON", "FW": "X", "IN": "ADP",
    "JJ": "ADJ", "JJR": "ADJ", "JJS": "ADJ", "LS": "X", "MD": "AUX", "NN": "NOUN", "NNS": "NOUN",
    "NNP": "PROPN", "NNPS": "PROPN", "PDT": "DET", "POS": "PART", "PRP": "PRON", "PRP$": "PRON",
    "RB": "ADV", "RBR": "ADV", "RBS": "ADV", "RP": "ADP", "SYM": "SYM", "TO": "PART", "UH": "INTJ",
    "VB": "VERB", "VBD": "VERB", "VBG": "VERB", "VBN": "VERB", "VBP": "VERB", "VBZ": "VERB",
    "WDT": "PRON", "WP": "PRON", "WP$": "PRON", "WRB": "ADV", "ADD": "X", "GW": "X", "XX": "X",
    "NIL": "X", "-NONE-": "X", "_SP": "SPACE",
}
# Token attribute a feature may read → the name `Doc.has_annotation` knows it by.
_ANNOTATION = {"tag_": "TAG", "tag": "TAG", "pos_": "POS", "pos": "POS", "lemma_": "LEMMA", "lemma": "LEMMA",
               "dep_": "DEP", "dep": "DEP", "ent_type_": "ENT_IOB", "ent_iob_": "ENT_IOB", "morph": "MORPH"}


def annotations_read(features, component: str) -> list[str]:
    """The `Doc.has_annotation` names of the token attributes `features` (a `FeatureConfig`) read,
    sorted; a corpus column with no spaCy token attribute is a `ModelFormatError` naming the
    `component`."""
    attributes = []
    for source in features.sources():
        attribute = features.column_attributes.get(source, "word" if source == 0 else None) \
            if isinstance(source, int) else source
        if attribute is None:
            raise ModelFormatError(
                f"gpseq component {component!r}: the model reads corpus column {source}, which has no "
                "spaCy token attribute (features.column_attributes); it cannot tag spaCy Docs"
            )
        attributes.append(attribute)
    return sorted({_ANNOTATION[a] for a in attributes if a in _ANNOTATION})


def upos_tags(labels: Sequence[str]) -> dict[str, str] | None:
    """{label: Universal POS tag} when every label is a Universal POS tag or every label a Penn
    Treebank tag (`UPOS_FROM_PTB`); None otherwise."""
    from spacy.parts_of_speech import IDS as UPOS_IDS

    if all(label in UPOS_IDS for label in labels):
        return {label: label for label in labels}
    if all(label in UPOS_FROM_PTB for label in labels):
        return {label: UPOS_FROM_PTB[label] for label in labels}
    return None
