"""The spaCy component's Doc glue: the token sequences of Docs it tags (each sentence where the
Doc has sentence boundaries, else the whole Doc; whitespace tokens left out and untagged, as `gpseq
tag` does), the batched prediction over them, and what it writes back — `token.tag_` / `pos_`,
`doc.spans[spans_key]` or `doc.ents`, the marginals and span probabilities in the extensions
(`gpseq.spacy.extensions`). A sequence longer than `max_tokens` (default: the model's
`predict_max_tokens`) is tagged in overlapping windows and stitched, as `Tagger.tag` documents, so a
Doc of any length is tagged in bounded memory. `component`: the `GpseqComponent` whose settings
and tagger these use."""

from __future__ import annotations

import numpy as np
from spacy.tokens import Doc, Span, Token

from gpseq.errors import ConfigError
from gpseq.predict.writers import doc_spans, set_tags, span_records
from gpseq.spacy.extensions import store_probabilities


def doc_sequences(component, docs: list[Doc]) -> tuple[list[list[Token]], list[int]]:
    """The token lists to tag (sentences without whitespace tokens) and the Doc each belongs to."""
    sequences, owners = [], []
    for number, doc in enumerate(docs):
        # A Doc of whitespace only has nothing to tag, here or in an earlier gpseq component (which
        # then set no annotation): not a missing component.
        has_words = any(not token.is_space for token in doc)
        missing = [name for name in component.annotations if has_words and not doc.has_annotation(name)]
        if missing:
            raise ConfigError(
                f"gpseq component {component.name!r}: the model's features read token annotation {missing} "
                "that no earlier component set; add a component that sets it before this one "
                "(e.g. a gpseq POS tagger before a chunker)"
            )
        parts = doc.sents if doc.has_annotation("SENT_START") else [doc[:]]
        for part in parts:
            tokens = [token for token in part if not token.is_space]
            if tokens:
                sequences.append(tokens)
                owners.append(number)
    return sequences, owners


def annotate(component, docs: list[Doc]) -> None:
    """Tag the `docs` with the component's tagger (one feature matrix and one batched prediction for
    them all) and write what its task writes: tags, spans or entities, the marginals and span
    probabilities in the extensions."""
    tagger = component.tagger
    sequences, owners = doc_sequences(component, docs)
    V = len(tagger.labels)
    probs = [np.full((len(doc), V), np.nan) for doc in docs]  # [N_doc, V] per Doc; NaN = untagged
    returned = [np.full(len(doc), -1, dtype=np.int64) for doc in docs]  # [N_doc] returned label ids
    spans: list[list[Span]] = [[] for _ in docs]
    span_scores: list[list[float]] = [[] for _ in docs]
    chunks: list[list[tuple]] = [[] for _ in docs]  # (type, start_char, end_char, P) per Doc
    if sequences:
        # transform_docs reads len() and the tokens of each item, so token lists stand in for Docs.
        matrix = tagger.featurizer.transform_docs(sequences)
        decode = component.decode or tagger.config.decoder  # the model's own may be span-f1
        span_f1 = decode == "span-f1"
        if span_f1:
            from gpseq.predict.decode import TagOptions

            try:
                TagOptions.checked(decode, "exact", 0, None, tagger.span_scheme)
            except ConfigError as error:
                raise ConfigError(f"gpseq component {component.name!r}: {error}") from None
        for ids, marginals, paths, _, *rest in tagger.predict_features(
            matrix, samples=component.samples, mean=component.mean or None, batch_size=component.batch_size,
            seed=component.seed, max_tokens=component.max_tokens, chains=component.task != "tag" or span_f1,
        ):
            if span_f1:  # the chunks maximising the expected chunk F1, as Tagger.tag chooses them
                chosen, exact = _span_f1(tagger, rest[0], [len(sequences[index]) for index in ids])
            else:
                exact = _span_probabilities(tagger, rest[0], ids, sequences, marginals, paths, decode) \
                    if rest else None
            for row, index in enumerate(ids):
                tokens = sequences[index]
                T = len(tokens)
                p = marginals[row, :T].astype(np.float64)  # [T, V]
                p /= np.maximum(p.sum(-1, keepdims=True), 1e-300)
                if span_f1:
                    best = chosen[row]
                else:
                    best = p.argmax(-1) if decode == "max-marginal" else paths[row, :T]
                number = owners[index]
                positions = [token.i for token in tokens]
                probs[number][positions] = p
                returned[number][positions] = best
                records = _write(component, tokens, p, best, None if exact is None else exact[row])
                spans[number].extend(doc_spans(docs[number], records, positions))
                span_scores[number].extend(float(probability) for *_, probability in records)
                chunks[number].extend((kind, tokens[start].idx, tokens[end - 1].idx + len(tokens[end - 1]),
                                       float(probability)) for kind, start, end, probability in records)
    for doc, p, ids, found, scores, own in zip(docs, probs, returned, spans, span_scores, chunks):
        order = sorted(range(len(found)), key=lambda k: (found[k].start, found[k].end))
        found, scores = [found[k] for k in order], [scores[k] for k in order]
        store_probabilities(doc, component.extension, tagger.labels, p, ids, own)
        if component.task == "spans":
            doc.spans[component.spans_key] = found
            doc.spans[component.spans_key].attrs["scores"] = scores
        elif component.task == "ents":
            # Entities set by an earlier component (an entity_ruler) are kept and predictions that
            # overlap one are dropped, as spaCy's own ner respects them.
            taken = np.zeros(len(doc), dtype=bool)
            for entity in doc.ents:
                taken[entity.start:entity.end] = True
            kept = [k for k, span in enumerate(found) if not taken[span.start:span.end].any()]
            found, scores = [found[k] for k in kept], [scores[k] for k in kept]
            doc.ents = sorted([*doc.ents, *found], key=lambda span: span.start)
        for span, score in zip(found, scores):
            span._.set(component.span_extension, score)


def _span_f1(tagger, posterior, lengths: list[int]) -> tuple[list[np.ndarray], list[list[float]]]:
    """Span-F1 decoding of a batch (`gpseq.predict.decode.span_f1_decode`): the label ids `[T]` that render
    each sequence's chosen chunks and their P(exact span | X), in the order of their starts."""
    from gpseq.predict.decode import span_f1_decode

    found, best = span_f1_decode(tagger.span_scheme, {label: i for i, label in enumerate(tagger.labels)},
                                 posterior, lengths)
    return best, [[p for *_, p in sorted(chunks, key=lambda chunk: chunk[1])] for chunks in found]


def _span_probabilities(tagger, posterior, ids, sequences, marginals, paths, decode) -> list[list[float]]:
    """P(exact span | X) of the chunks of each returned label sequence of a batch `[B][chunks]`."""
    from gpseq.structured.spans import span_queries

    best = []
    for row, index in enumerate(ids):
        T = len(sequences[index])
        best.append(marginals[row, :T].argmax(-1) if decode == "max-marginal" else paths[row, :T])
    found = tagger.span_scheme.chunks(best)
    probs = posterior.span_probs(tagger.span_scheme, span_queries(tagger.span_scheme, found))
    out, position = [], 0
    for chunks in found:
        out.append(probs[position:position + len(chunks)].tolist())
        position += len(chunks)
    return out


def _write(component, tokens: list[Token], p: np.ndarray, best: np.ndarray,
           exact: list[float] | None = None) -> list[list]:
    """Labels of one sequence: set as tags, or returned as its chunks [type, start, end, P] over the
    sequence (`exact`: P(exact span) per chunk; None: the product of the token marginals)."""
    labels = [component.tagger.labels[i] for i in best]
    if component.task == "tag":
        set_tags(tokens, labels, component.upos)
        return []
    confidence = p[np.arange(len(tokens)), best].tolist()  # [T] p(y_t = predicted label_t)
    records = span_records(labels, confidence, component.tagger.config.tag_scheme)
    if exact is not None:
        records = [[*record[:3], probability] for record, probability in zip(records, exact)]
    return records
