"""Tagged output: CoNLL, JSONL and spaCy DocBin writers, chunk-span records, labels into spaCy Docs.

`gpseq tag` writes through the writers; the spaCy component writes Docs through `doc_spans` and
`set_tags`, so a span's probability and a token's tag mean the same in both: P(this exact span |
X) from `Tagger.tag` (`TaggedSentence.spans`). With an abstention threshold (`gpseq tag
--abstain-below P`) every format marks the tokens and spans below it (ABSTAIN); labels are never
changed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Sequence

from gpseq.corpora.schemes import spans
from gpseq.corpora.types import Sentence


def result_spans(result, scheme: str | None) -> list[list]:
    """[type, start, end_exclusive, probability] per chunk of a `TaggedSentence` (none without a
    scheme): its `spans`, scored as `Tagger.tag` did (exact unless asked for the product)."""
    if scheme is None:
        return []
    return [[kind, start, end, float(p)] for kind, start, end, p in result.spans]


def span_records(labels: Sequence[str], confidences: Sequence[float], scheme: str | None) -> list[list]:
    """[type, start, end_exclusive, probability] per chunk of `labels` (none without a scheme), with
    probability = Π_t p(y_t = label_t | X) over the span's tokens: the product of the token
    marginals, an approximation that ignores the correlation of neighbouring labels (kept for
    comparison; `result_spans` gives the exact probabilities)."""
    if scheme is None:
        return []
    records = []
    for type_, start, end in spans(labels, scheme):
        probability = 1.0
        for t in range(start, end):
            probability *= confidences[t]
        records.append([type_, start, end, probability])
    return records


def doc_spans(doc, records: list[list], positions: Sequence[int] | None = None) -> list:
    """spaCy Spans of `records`; `positions[t]` is the Doc index of sequence token t (default t)."""
    from spacy.tokens import Span

    at = (lambda t: t) if positions is None else positions.__getitem__
    return [Span(doc, at(start), at(end - 1) + 1, label=type_ or "CHUNK") for type_, start, end, _ in records]


def set_tags(tokens, labels: Sequence[str], upos: dict[str, str] | None = None) -> None:
    """token.tag_ = label (and token.pos_ = upos[label] when a mapping is given)."""
    for token, label in zip(tokens, labels):
        token.tag_ = label
        if upos is not None:
            token.pos_ = upos[label]


def sentence_record(sentence: Sentence, result, scheme: str | None, distributions: bool = True) -> dict:
    """The JSON object of one tagged sentence (a line of `gpseq tag --format jsonl`, a sentence of
    `gpseq serve`'s POST /tag): source, line, tokens, labels, confidences, distributions (per
    token: label -> p; left out when `distributions` is false), spans [type, start,
    end_exclusive, probability] (P(this exact span | X)), span_probability ("exact" or "product"),
    sequence_log_prob; with an abstention threshold "abstain_below", "abstain" (per token) and
    "span_abstain" (per span) flags; with n-best, "nbest": [{"labels", "probability"}]; from a
    model chain, "chain": [{"model", "labels"}] of the models before the last.
    Probabilities rounded to 6 decimals."""
    confidences = result.confidences
    record = {
        "source": sentence.source,
        "line": sentence.line,
        "tokens": result.tokens,
        "labels": result.labels,
        "confidences": [round(p, 6) for p in confidences],
    }
    if distributions:
        record["distributions"] = [
            {name: round(float(q), 6) for name, q in zip(result.label_set, row)} for row in result.probabilities
        ]
    found = result_spans(result, scheme)
    record["spans"] = [[t, s, e, round(p, 6)] for t, s, e, p in found]
    return add_record_tail(record, result, found, result.sequence_log_prob)


def add_record_tail(record: dict, result, found: list, sequence_log_prob) -> dict:
    """The fields of a sentence record after its spans (`found`: its (type, start, end, p)):
    span_probability (when it has spans), `sequence_log_prob`, the abstention flags, the n-best and
    the earlier models' labels of a chain."""
    if found:
        record["span_probability"] = result.span_probability
    record["sequence_log_prob"] = sequence_log_prob
    if result.abstain_below is not None:
        record["abstain_below"] = result.abstain_below
        record["abstain"] = result.abstained
        record["span_abstain"] = [p < result.abstain_below for *_, p in found]
    if result.nbest is not None:
        record["nbest"] = [{"labels": labels, "probability": round(p, 6)} for labels, p in result.nbest]
    if result.chain:
        record["chain"] = chain_records(result)
    return record


def chain_records(result) -> list[dict]:
    """[{"model", "labels"}] of each model before the last of a chain (`TaggedSentence.chain`)."""
    return [{"model": name, "labels": labels} for name, labels in result.chain]


def _fmt(p: float) -> str:
    return f"{p:.6g}"


_LINE_OR_FIELD_BREAK = re.compile(r"[\t\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")


def check_conll_tokens(sentence: Sentence, tokens: Sequence[str]) -> None:
    """InputFormatError (naming the input and line) for a token with a tab or a line break (JSON Lines
    input can hold one), which a line of tab-separated fields cannot carry: it would shift the
    fields or split the line."""
    if not any(map(_LINE_OR_FIELD_BREAK.search, tokens)):
        return
    from gpseq.errors import InputFormatError

    position, token = next((t, token) for t, token in enumerate(tokens, start=1) if _LINE_OR_FIELD_BREAK.search(token))
    raise InputFormatError(sentence.source or "<input>", sentence.line,
                           f"token {position} ({token!r}) holds a tab or a line break, which the conll output "
                           "(one token per line, tab-separated fields) cannot carry; use --format jsonl or spacy")


class ConllWriter:
    """token, label, p(label) per line (tab-separated), a blank line between sentences; from a model
    chain, the earlier models' labels between the token and the label (token POS CHUNK p, as a
    CoNLL-2000 line reads); with an abstention threshold a field after p(label), ABSTAIN or -
    (kept); with `full_distribution`, LABEL=p for every label; with n-best, one comment line per
    path before the sentence: `# nbest RANK PROBABILITY LABEL LABEL …`."""

    def __init__(self, stream, full_distribution: bool):
        self.stream, self.full = stream, full_distribution

    def write(self, sentence: Sentence, result, scheme: str | None) -> None:
        check_conll_tokens(sentence, result.tokens)
        lines = [f"# nbest\t{rank}\t{_fmt(p)}\t{' '.join(labels)}" for rank, (labels, p) in
                 enumerate(result.nbest or [], start=1)]
        abstained = result.abstained
        for t, (token, label, p) in enumerate(zip(result.tokens, result.labels, result.confidences)):
            fields = [token, *(labels[t] for _, labels in result.chain), label, _fmt(p)]
            if result.abstain_below is not None:
                fields.append("ABSTAIN" if abstained[t] else "-")
            if self.full:
                fields += [f"{name}={_fmt(q)}" for name, q in zip(result.label_set, result.probabilities[t])]
            lines.append("\t".join(fields))
        self.stream.write("\n".join(lines) + "\n\n")

    def close(self) -> None:
        self.stream.flush()


class JsonlWriter:
    """One JSON object per sentence: source, line, tokens, labels, confidences, distributions,
    spans [type, start, end_exclusive, probability], sequence_log_prob."""

    def __init__(self, stream, full_distribution: bool):
        self.stream = stream

    def write(self, sentence: Sentence, result, scheme: str | None) -> None:
        self.stream.write(json.dumps(sentence_record(sentence, result, scheme), ensure_ascii=False) + "\n")

    def close(self) -> None:
        self.stream.flush()


def column_read(sentence: Sentence, result, column: int) -> list[str] | None:
    """Field `column` of each token as the model that gave `result` read it: the input's own fields, then
    the labels of the models before it in a chain (`gpseq.chain_models`); None where a token lacks it."""
    values = []
    for t, row in enumerate(sentence.columns):
        fields = [*row, *(labels[t] for _, labels in result.chain)]
        if len(fields) <= column:
            return None
        values.append(fields[column])
    return values


class DocBinWriter:
    """Tagged sentences as spaCy Docs in a DocBin (written to `path` at `close`):
    doc.user_data["gpseq"] holds labels and confidences (and "abstain_below", "abstain",
    "span_abstain", "nbest" when asked for; "chain" from a model chain), chunk spans go to
    doc.spans["gpseq"] (P(exact span) as attrs["scores"], the abstention flags as
    attrs["abstain"]) and doc.ents, other labels to token.tag_.

    With chunk labels and `tag_column` (1 for a model whose features read column 1), token.tag_
    holds that field of the tokens the model read (the input's POS column, or on raw text the
    first model's labels of a chain), where every token has one: read back as a corpus
    (`gpseq.corpora.docbin`: tag_ is column 1), the DocBin gives the model the columns it tagged
    from, so `gpseq evaluate MODEL out.spacy --spacy-labels ents` scores the written labels as
    correct."""

    def __init__(self, path: Path, lang: str, full_distribution: bool, tag_column: int | None = None):
        import spacy
        from spacy.tokens import DocBin

        self.path, self.full, self.tag_column = path, full_distribution, tag_column
        self.vocab = spacy.blank(lang).vocab
        self.docbin = DocBin(store_user_data=True)

    def write(self, sentence: Sentence, result, scheme: str | None) -> None:
        from spacy.tokens import Doc

        spaces = sentence.spaces or [True] * (len(result.tokens) - 1) + [False]
        doc = Doc(self.vocab, words=result.tokens, spaces=spaces)
        data = {
            "labels": result.labels,
            "confidences": result.confidences,
            "sequence_log_prob": result.sequence_log_prob,
            "source": sentence.source,
            "line": sentence.line,
        }
        if self.full:
            data["label_set"] = list(result.label_set)
            data["probabilities"] = result.probabilities.tolist()
        records = result_spans(result, scheme)
        if result.abstain_below is not None:
            data.update(abstain_below=result.abstain_below, abstain=result.abstained,
                        span_abstain=[p < result.abstain_below for *_, p in records])
        if result.nbest is not None:
            data["nbest"] = [{"labels": labels, "probability": p} for labels, p in result.nbest]
        if result.chain:
            data["chain"] = chain_records(result)
        doc.user_data["gpseq"] = data
        if scheme is not None:
            group = doc_spans(doc, records)
            doc.spans["gpseq"] = group
            doc.spans["gpseq"].attrs["scores"] = [p for *_, p in records]
            if result.abstain_below is not None:
                doc.spans["gpseq"].attrs["abstain"] = data["span_abstain"]
            doc.ents = group
            tags = None if self.tag_column is None else column_read(sentence, result, self.tag_column)
            if tags is not None:
                set_tags(doc, tags)
        else:
            set_tags(doc, result.labels)
        self.docbin.add(doc)

    def close(self) -> None:
        self.docbin.to_disk(self.path)  # `gpseq tag` gives a temporary file, renamed into place after


WRITERS = {"conll": ConllWriter, "jsonl": JsonlWriter, "spacy": DocBinWriter}
