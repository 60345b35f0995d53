"""What a gpseq component's `score` reports (spaCy's `Scorer` calls it from `nlp.evaluate`, `spacy
evaluate` and the evaluations of `spacy train`): spaCy's own figures for the annotation the component
writes, and gpseq's calibration figures (`gpseq.evaluation.evaluate.evaluate`, the code of `gpseq evaluate`)
under the same prefix:

    labels   spaCy's figures                  gpseq's figures
    ents     ents_p ents_r ents_f …           ents_token_nll ents_ece ents_brier ents_aurc
                                              ents_entity_ece ents_entity_brier ents_entity_aurc
    spans:K  spans_K_p spans_K_r spans_K_f …  spans_K_token_nll … spans_K_entity_ece …
    tag      tag_acc                          tag_token_nll tag_ece tag_brier tag_aurc
    pos      pos_acc                          pos_token_nll pos_ece pos_brier pos_aurc

gpseq's figures measure the component's own decisions as it stored them on each predicted Doc (its
label path, marginals and span probabilities, `extensions.stored_predictions`), sentence by
sentence as it tagged them, against the reference Doc's annotation turned into labels of the model's
tag scheme as `gpseq.corpora.docbin` reads a DocBin. A sentence with a token that is not one
reference token (another tokenisation) or whose gold annotation is missing has no gold path: it is
left out, as `gpseq evaluate` leaves out sentences with unlabelled tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
from spacy.tokens import Doc, Token
from spacy.training import Example

from gpseq.corpora.schemes import spans as chunks_of
from gpseq.corpora.schemes import spans_to_tags
from gpseq.corpora.types import UNLABELLED
from gpseq.spacy.extensions import stored_predictions

__all__ = ["CALIBRATION_KEYS", "ENTITY_KEYS", "gpseq_scores", "score_prefix", "spacy_scores"]

CALIBRATION_KEYS = ("token_nll", "ece", "brier", "aurc")  # of every labelling
ENTITY_KEYS = ("entity_ece", "entity_brier", "entity_aurc")  # of chunk labels: the predicted spans


def score_prefix(kind: str, key: str | None) -> str:
    """The prefix of the scores of an annotation: "ents", "tag", "pos", "spans_<key>" (as spaCy's)."""
    return f"spans_{key}" if kind == "spans" else kind


def spacy_scores(examples: Iterable[Example], kind: str, key: str | None, **cfg) -> dict:
    """spaCy's figures for that annotation, by the scorers of spaCy's own components (ner, tagger,
    morphologizer, spancat)."""
    from spacy.scorer import Scorer, get_ner_prf

    if kind == "ents":
        return get_ner_prf(examples)
    if kind in ("tag", "pos"):
        return Scorer.score_token_attr(examples, kind, **cfg)
    return Scorer.score_spans(examples, f"spans_{key}", getter=lambda doc, _: doc.spans.get(key, []),
                              has_annotation=lambda doc: key in doc.spans, allow_overlap=True)


def gpseq_scores(examples: Iterable[Example], *, kind: str, key: str | None, scheme: str, extension: str,
                 sequences: Callable[[Doc], list[list[Token]]], n_bins: int = 15) -> dict:
    """{<prefix>_<metric>: value} of `gpseq.evaluation.evaluate.evaluate` on the component's stored decisions
    (module docstring); empty when no sentence has a gold path. `sequences(doc)`: the token lists
    the component tagged in a Doc."""
    from gpseq.evaluation.evaluate import evaluate

    gold, predicted, probabilities, spans = [], [], [], []
    label_set = None
    for example in examples:
        stored = stored_predictions(example.predicted, extension)
        if stored is None:
            continue
        label_set, probs, chosen, chunk_probs = stored
        reference, to_reference = example.reference, _one_to_one(example)
        reference_chunks = _reference_chunks(reference, kind, key)
        for tokens in sequences(example.predicted):
            positions = np.fromiter((token.i for token in tokens), dtype=np.int64, count=len(tokens))
            if (chosen[positions] < 0).any():  # a token the component did not tag (merged since)
                continue
            labels = _gold(reference, to_reference[positions], kind, reference_chunks, scheme)
            if UNLABELLED in labels:
                continue
            returned = [label_set[i] for i in chosen[positions]]
            found = []
            if kind in ("ents", "spans"):
                for chunk_type, start, end in chunks_of(returned, scheme):
                    start_char, end_char = tokens[start].idx, tokens[end - 1].idx + len(tokens[end - 1])
                    found.append((chunk_type, start, end, chunk_probs.get((start_char, end_char, chunk_type))))
                if any(chunk[3] is None for chunk in found):  # tokens changed since the component ran
                    continue
            gold.append(labels)
            predicted.append(returned)
            probabilities.append(probs[positions])
            spans.append(found)
    if not gold:
        return {}
    report = evaluate(gold, predicted, labels=label_set, probabilities=probabilities, scheme=scheme, n_bins=n_bins,
                      spans=spans if kind in ("ents", "spans") else None).to_dict()
    prefix = score_prefix(kind, key)
    return {f"{prefix}_{name}": report[name] for name in (*CALIBRATION_KEYS, *ENTITY_KEYS) if name in report}


def _one_to_one(example: Example) -> np.ndarray:
    """[N_predicted] the reference token each predicted token is, −1 where the alignment is not one
    token to one token."""
    alignment = example.alignment
    lengths, data = np.asarray(alignment.x2y.lengths), np.asarray(alignment.x2y.data)
    target = np.full(len(lengths), -1, dtype=np.int64)
    single = lengths == 1
    target[single] = data[(np.cumsum(lengths) - lengths)[single]]
    back = np.asarray(alignment.y2x.lengths)
    target[single] = np.where(back[target[single]] == 1, target[single], -1)
    return target


def _reference_chunks(reference: Doc, kind: str, key: str | None) -> tuple[np.ndarray, list[str]] | None:
    """([N_reference] the gold chunk each reference token is in, −1 outside; the chunks' types) of the
    entities or the span group `key`; None for tags, or a reference without that span group."""
    if kind in ("tag", "pos") or kind == "spans" and key not in reference.spans:
        return None
    group = reference.ents if kind == "ents" else reference.spans[key]
    inside = np.full(len(reference), -1, dtype=np.int64)
    for number, span in enumerate(group):
        inside[span.start:span.end] = number
    return inside, [span.label_ for span in group]


def _gold(reference: Doc, tokens: np.ndarray, kind: str, chunks: tuple[np.ndarray, list[str]] | None,
          scheme: str) -> list[str]:
    """The gold labels `[T]` of a sentence whose tokens are the reference tokens `tokens` (−1: none):
    tags, or the gold chunks cut to the sentence as labels of `scheme`; UNLABELLED where the token or
    its annotation is missing (spaCy's "" tag, entity IOB "", no such span group)."""
    if kind in ("tag", "pos"):
        return [(getattr(reference[int(t)], f"{kind}_") or UNLABELLED) if t >= 0 else UNLABELLED for t in tokens]
    if chunks is None:
        return [UNLABELLED] * len(tokens)
    inside, types = chunks
    found, position = [], 0
    while position < len(tokens):
        number = inside[tokens[position]] if tokens[position] >= 0 else -1
        end = position + 1
        if number >= 0:
            while end < len(tokens) and tokens[end] >= 0 and inside[tokens[end]] == number:
                end += 1
            found.append((types[number], position, end))
        position = end
    labels = spans_to_tags(len(tokens), found, scheme)
    return [UNLABELLED if t < 0 or kind == "ents" and reference[int(t)].ent_iob == 0 else label
            for t, label in zip(tokens, labels)]
