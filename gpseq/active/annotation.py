"""Picked sentences (`gpseq.active.selection.Selected`) as files annotation tools import, each with its
score and the current model's labels to correct:

- `conll`: per sentence a `-DOCSTART-` line carrying `rank=… score=… strategy=… source=FILE:LINE`
  (gpseq's CoNLL reader, and most CoNLL tools, take it as a document separator), then the pool's
  columns with the predicted label appended: once corrected, the file trains as it is
  (`gpseq train picked.conll --init MODEL`, label = last column);
- `jsonl`: `gpseq tag --format jsonl`'s record (`gpseq.predict.writers.sentence_record`) plus "select":
  {rank, score, strategy, index};
- `prodigy`: a Prodigy task stream (JSONL) for the `ner_manual` / `spans_manual` interfaces:
  "text", "tokens" [{text, start, end, id, ws}], "spans" [{start, end, token_start, token_end
  (inclusive), label, text, score}] (score: P(this exact span | X) for chunk labels, the token's
  marginal otherwise), "meta" {score, strategy, rank, source} (shown in Prodigy's UI);
- `labelstudio`: a Label Studio import file (a JSON list of tasks) with pre-annotations:
  {"data": {"text", "gpseq_score", "gpseq_rank"}, "predictions": [{"model_version", "score"
  (P(the predicted labels | X): Label Studio sorts tasks by it), "result": [{"id", "from_name",
  "to_name", "type": "labels", "value": {"start", "end", "text", "labels": [label], "score"}}]}]}
  for the Named Entity Recognition template (`<Labels name="label" toName="text">`).

Character offsets: tokens are joined by one space, or by the whitespace raw text had
(`Sentence.spaces`).
"""

from __future__ import annotations

import json
import math
import re

from gpseq.corpora.conll import DOCSTART
from gpseq.errors import InputFormatError
from gpseq.predict.writers import sentence_record

# what a field of a CoNLL line cannot hold: gpseq's reader splits fields on ASCII spaces and tabs (a
# U+3000 token is fine) and lines on line breaks
_NOT_IN_FIELD = re.compile(r"[ \t\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")

FORMATS = ("conll", "jsonl", "prodigy", "labelstudio")


def token_offsets(sentence, tokens) -> tuple[str, list[tuple[int, int]], list[bool]]:
    """(text, [(start, end)] per token, whitespace after each token)."""
    spaces = sentence.spaces if sentence.spaces is not None and len(sentence.spaces) == len(tokens) else \
        [True] * (len(tokens) - 1) + [False]
    text, offsets = [], []
    position = 0
    for token, space in zip(tokens, spaces):
        offsets.append((position, position + len(token)))
        text.append(token + (" " if space else ""))
        position += len(token) + (1 if space else 0)
    return "".join(text), offsets, list(spaces)


def labelled_spans(tagged, scheme: str | None) -> list[tuple[str, int, int, float]]:
    """(label, start token, end token exclusive, probability): the chunks with their exact span
    probabilities for chunk labels, every token with its label's marginal otherwise."""
    if scheme is not None:
        return [(kind, start, end, float(p)) for kind, start, end, p in tagged.spans]
    return [(label, t, t + 1, float(p)) for t, (label, p) in enumerate(zip(tagged.labels, tagged.confidences))]


def _rounded(x: float) -> float:
    """`x` to 6 significant digits (scores of a confident model are 1e-6 and below: 6 decimals made
    them all 0)."""
    return float(f"{x:.6g}")


def _source(sentence) -> str | None:
    return None if sentence.source is None else f"{sentence.source}:{sentence.line}"


def prodigy_task(item, rank: int, strategy: str, scheme: str | None) -> dict:
    tagged = item.tagged
    text, offsets, spaces = token_offsets(item.sentence, tagged.tokens)
    tokens = [{"text": token, "start": start, "end": end, "id": i, "ws": space}
              for i, (token, (start, end), space) in enumerate(zip(tagged.tokens, offsets, spaces))]
    spans = [{"start": offsets[i][0], "end": offsets[j - 1][1], "token_start": i, "token_end": j - 1,
              "label": label, "text": text[offsets[i][0]:offsets[j - 1][1]], "score": _rounded(p)}
             for label, i, j, p in labelled_spans(tagged, scheme)]
    meta = {"score": _rounded(item.score), "strategy": strategy, "rank": rank}
    if _source(item.sentence):
        meta["source"] = _source(item.sentence)
    return {"text": text, "tokens": tokens, "spans": spans, "meta": meta}


def labelstudio_task(item, rank: int, strategy: str, scheme: str | None, *, model_version: str,
                     from_name: str = "label", to_name: str = "text") -> dict:
    tagged = item.tagged
    text, offsets, _ = token_offsets(item.sentence, tagged.tokens)
    result = [{"id": f"r{rank}-{n}", "from_name": from_name, "to_name": to_name, "type": "labels",
               "value": {"start": offsets[i][0], "end": offsets[j - 1][1],
                         "text": text[offsets[i][0]:offsets[j - 1][1]], "labels": [label], "score": _rounded(p)}}
              for n, (label, i, j, p) in enumerate(labelled_spans(tagged, scheme))]
    confidence = math.exp(tagged.sequence_log_prob) if math.isfinite(tagged.sequence_log_prob) else 0.0
    data = {"text": text, "gpseq_score": _rounded(item.score), "gpseq_rank": rank, "gpseq_strategy": strategy}
    if _source(item.sentence):
        data["gpseq_source"] = _source(item.sentence)
    return {"data": data, "predictions": [{"model_version": model_version, "score": _rounded(confidence),
                                           "result": result}]}


def conll_block(item, rank: int, strategy: str) -> str:
    header = f"-DOCSTART- rank={rank} score={item.score:.6g} strategy={strategy}"
    if _source(item.sentence):
        header += f" source={_source(item.sentence)}"
    for position, columns in enumerate(item.sentence.columns, start=1):
        if columns and columns[0] == DOCSTART:  # the row would read back as a document separator
            raise InputFormatError(item.sentence.source or "<pool>", item.sentence.line,
                                   f"token {position}: a row starting with {DOCSTART} reads back as a document "
                                   "separator, not a token (the file would not read back as these tokens); "
                                   "use --format jsonl")
        for field in columns:
            if not field or _NOT_IN_FIELD.search(field):
                raise InputFormatError(item.sentence.source or "<pool>", item.sentence.line,
                                       f"token {position}: field {field!r} is empty or holds white space, which a "
                                       "CoNLL line cannot carry (the file would not read back as these tokens); "
                                       "use --format jsonl")
    rows = [" ".join([*columns, label]) for columns, label in zip(item.sentence.columns, item.tagged.labels)]
    return "\n".join([header, "", *rows]) + "\n\n"


def write_selection(stream, picked, fmt: str, strategy: str, scheme: str | None, *, model_version: str = "gpseq",
                    from_name: str = "label", to_name: str = "text") -> None:
    """Write `picked` (`Selected` with their tagging), best first, to a text stream in `fmt`."""
    if fmt == "labelstudio":
        tasks = [labelstudio_task(item, rank, strategy, scheme, model_version=model_version, from_name=from_name,
                                  to_name=to_name) for rank, item in enumerate(picked, start=1)]
        json.dump(tasks, stream, ensure_ascii=False, indent=1)
        stream.write("\n")
        return
    for rank, item in enumerate(picked, start=1):
        if fmt == "conll":
            stream.write(conll_block(item, rank, strategy))
        elif fmt == "prodigy":
            stream.write(json.dumps(prodigy_task(item, rank, strategy, scheme), ensure_ascii=False) + "\n")
        else:
            record = sentence_record(item.sentence, item.tagged, scheme)
            record["select"] = {"rank": rank, "score": item.score, "strategy": strategy, "index": item.index}
            stream.write(json.dumps(record, ensure_ascii=False) + "\n")
