"""spaCy DocBin corpora (`.spacy`, as `spacy convert` and `DocBin.to_disk` write them).

One sentence per `doc.sents` where the doc has sentence boundaries (set by `spacy convert -n N`, a
parser or a sentencizer), else one per doc. White-space tokens (spaCy's "\\n\\n") are left out, their
white space kept in `spaces`. Labels come from one annotation, chosen by `labels`:

    tag          token.tag_ (what spaCy's tagger trains on)
    pos          token.pos_ (Universal POS)
    ents         doc.ents, as chunk labels of `scheme` (B-PER I-PER O …)
    spans:KEY    the span group doc.spans[KEY], as chunk labels of `scheme`

A token whose annotation is missing in spaCy's sense (tag_ or pos_ "", entity IOB "") is
`UNLABELLED` (partial annotation, marginalised by training); a doc without the annotation at all
is an error naming the file and the doc's index. A span that crosses a sentence boundary is cut
there; overlapping spans of a group have no chunk labelling and are an error.

`columns[t]` is [text] or, where every token of the doc has a tag and the labels are not the tags,
[text, tag_]: column 1 is what feature presets that read a POS column (`chunking`) read, as the
spaCy component maps it (`features.column_attributes`).

spaCy loads a DocBin whole (zlib, then msgpack): a file of more than MAX_DOCBIN_BYTES, or one that
decompresses to more, is refused before spaCy sees it, so memory stays bounded.
"""

from __future__ import annotations

import bisect
import os
import stat
import sys
import zlib
from collections.abc import Iterator

from gpseq.corpora.lines import Source, source_name
from gpseq.corpora.schemes import normalise_scheme, spans_to_tags
from gpseq.corpora.types import UNLABELLED, Sentence
from gpseq.errors import ConfigError, InputFormatError

MAX_DOCBIN_BYTES = 512 << 20  # on disk, and again once decompressed (what spaCy's msgpack reader holds)
_TOO_LARGE = ("more than the {limit:,} bytes gpseq lets spaCy load (a DocBin is loaded whole): convert it to "
              "JSON Lines, which is read in bounded memory, or split it")
_CHUNK = 1 << 20  # decompressed bytes counted at a time


def parse_label_source(labels: str) -> tuple[str, str | None]:
    """("tag" | "pos" | "ents" | "spans", span group key or None) of a `labels` choice; ConfigError
    for anything else."""
    kind, _, key = str(labels).partition(":")
    if kind in ("tag", "pos", "ents") and not key and ":" not in labels:
        return kind, None
    if kind == "spans" and key:
        return kind, key
    raise ConfigError(f"spaCy labels must be tag, pos, ents or spans:KEY (a span group); got {labels!r}")


def iter_docbin(source: Source, *, labels: str | None = "tag", scheme: str = "iob2", name: str | None = None,
                max_bytes: int | None = None) -> Iterator[Sentence]:
    """Stream the sentences of a DocBin (module docstring); `labels=None` reads tokens only.
    Raises InputFormatError naming the file for a file too large, bytes that are not a DocBin, or a
    doc without the annotation `labels` names; ConfigError for an unknown `labels` or `scheme`."""
    kind, key = parse_label_source(labels) if labels is not None else (None, None)
    scheme = normalise_scheme(scheme)
    return _sentences(source, kind, key, scheme, source_name(source, name),
                      MAX_DOCBIN_BYTES if max_bytes is None else max_bytes)


def read_docbin(source: Source, **settings) -> list[Sentence]:
    """All sentences of a DocBin (see `iter_docbin`)."""
    return list(iter_docbin(source, **settings))


def _sentences(source: Source, kind: str | None, key: str | None, scheme: str, name: str,
               max_bytes: int) -> Iterator[Sentence]:
    from spacy.tokens import DocBin
    from spacy.vocab import Vocab

    data = _read_bytes(source, name, max_bytes)
    _check_decompressed_size(data, name, max_bytes)
    try:
        docbin = DocBin().from_bytes(data)
    except Exception as error:  # zlib, msgpack, KeyError, shape errors: many kinds on foreign bytes
        raise InputFormatError(name, None, f"not a spaCy DocBin ({_reason(error)})") from None
    del data
    docs = docbin.get_docs(Vocab())
    index = 0
    while True:
        try:
            doc = next(docs)
        except StopIteration:
            return
        except Exception as error:
            raise InputFormatError(name, None, f"not a spaCy DocBin: doc index {index} cannot be rebuilt "
                                               f"({_reason(error)})") from None
        yield from doc_sentences(doc, index, kind, key, scheme, name)
        index += 1


def _reason(error: Exception) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text[:200]}" if text else type(error).__name__


def _read_bytes(source: Source, name: str, max_bytes: int) -> bytes:
    """The bytes of `source` (a path or a binary file object), at most `max_bytes`; a regular file
    larger than that is refused before it is read, a stream once `max_bytes` + 1 bytes are read."""
    if isinstance(source, (str, os.PathLike)):
        try:
            info = os.stat(source)
        except OSError as error:
            raise InputFormatError(name, None, error.strerror or "cannot be read") from None
        if stat.S_ISREG(info.st_mode) and info.st_size > max_bytes:
            raise InputFormatError(name, None, f"{info.st_size:,} bytes, " + _TOO_LARGE.format(limit=max_bytes))
        with open(source, "rb") as handle:
            data = handle.read(max_bytes + 1)
    else:
        handle = getattr(source, "buffer", source)  # sys.stdin: its bytes
        data = handle.read(max_bytes + 1)
        if isinstance(data, str):
            raise InputFormatError(name, None, "a DocBin is binary: give a file or a binary stream")
    if len(data) > max_bytes:
        raise InputFormatError(name, None, _TOO_LARGE.format(limit=max_bytes))
    return data


def _check_decompressed_size(data: bytes, name: str, max_bytes: int) -> None:
    """InputFormatError unless `data` is zlib data that decompresses to at most `max_bytes` (counted
    in pieces, never held: a small file can decompress to gigabytes)."""
    inflate = zlib.decompressobj()
    total, pending = 0, data
    try:
        while not inflate.eof:
            out = inflate.decompress(pending, _CHUNK)
            total += len(out)
            if total > max_bytes:
                raise InputFormatError(name, None, "decompresses to " + _TOO_LARGE.format(limit=max_bytes))
            pending = inflate.unconsumed_tail
            if not out and not pending:  # every byte read, nothing more comes out: cut short
                break
    except zlib.error:
        pass
    if not inflate.eof:
        raise InputFormatError(name, None, "not a spaCy DocBin (not zlib-compressed data, or cut short)")


_ANNOTATION = {"tag": ("TAG", "tags (token.tag_)"), "pos": ("POS", "POS tags (token.pos_)"),
               "ents": ("ENT_IOB", "entity annotation (doc.ents)")}


def doc_sentences(doc, index: int, kind: str | None, key: str | None, scheme: str,
                  name: str) -> Iterator[Sentence]:
    """The sentences of one spaCy Doc, as a DocBin's are read: its `sents` where it has sentence
    boundaries, else the whole Doc; whitespace tokens left out; labels from the annotation `kind`
    (`parse_label_source`: "tag", "pos", "ents", "spans" with span group `key`; None: unlabelled),
    chunks in `scheme`; the gold `tag_` as column 1 when every token has one. `index`, `name`: the
    Doc's number and where it comes from, for the errors (the spaCy component's training reads
    its examples' reference Docs through this)."""
    if not any(not token.text.isspace() for token in doc):
        return
    if kind is not None:
        _check_annotated(doc, index, kind, key, name)
    chunks = _chunks(doc, index, kind, key, name) if kind in ("ents", "spans") else None
    ends = [end for _, _, end in chunks] if chunks else []
    with_tags = kind != "tag" and doc.has_annotation("TAG", require_complete=True)
    for sent in doc.sents if doc.has_annotation("SENT_START") else [doc[:]]:
        kept = [token for token in sent if not token.text.isspace()]
        if not kept:
            continue
        spaces = [bool(token.whitespace_) or (token.i + 1 < len(doc) and doc[token.i + 1].text.isspace())
                  for token in kept]
        spaces[-1] = False  # each sentence is its own Doc downstream: no trailing space
        tokens = [token.text for token in kept]
        columns = [[token.text, token.tag_] for token in kept] if with_tags else []
        labels = None
        if kind in ("tag", "pos"):
            labels = [(token.tag_ if kind == "tag" else token.pos_) or UNLABELLED for token in kept]
        elif chunks is not None:
            labels = _chunk_labels(sent, kept, chunks, ends, scheme)
            if kind == "ents":  # IOB "" is spaCy's missing annotation, not O
                labels = [UNLABELLED if token.ent_iob == 0 else label for token, label in zip(kept, labels)]
        if labels is not None:
            labels = [sys.intern(_checked_label(label, index, token, name)) for label, token in zip(labels, kept)]
        yield Sentence(tokens, labels, columns, source=name, spaces=spaces)


def _check_annotated(doc, index: int, kind: str, key: str | None, name: str) -> None:
    """InputFormatError naming the doc when it has none of the annotation the labels come from, with
    the annotations it does have."""
    if kind == "spans" and key in doc.spans or kind != "spans" and doc.has_annotation(_ANNOTATION[kind][0]):
        return
    wanted = f"span group {key!r} (doc.spans)" if kind == "spans" else _ANNOTATION[kind][1]
    present = [choice for choice, (attribute, _) in _ANNOTATION.items() if doc.has_annotation(attribute)]
    present += [f"spans:{group}" for group in doc.spans]
    hint = (f"; it has {', '.join(present)} (choose with --spacy-labels)" if present
            else "; it has no annotation gpseq reads as labels")
    raise InputFormatError(name, None, f"doc index {index} has no {wanted}{hint}")


def _chunks(doc, index: int, kind: str, key: str | None, name: str) -> list[tuple[str, int, int]]:
    """(label, start, end) of the doc's entities or span group, in order; overlapping spans refused."""
    found = sorted(((span.label_, span.start, span.end) for span in (doc.ents if kind == "ents" else doc.spans[key])),
                   key=lambda chunk: (chunk[1], chunk[2]))
    for previous, chunk in zip(found, found[1:]):
        if chunk[1] < previous[2]:
            raise InputFormatError(name, None, f"doc index {index}: spans {previous} and {chunk} of group {key!r} "
                                               "overlap, which chunk labels (one per token) cannot hold")
    return found


def _chunk_labels(sent, kept: list, chunks: list[tuple[str, int, int]], ends: list[int], scheme: str) -> list[str]:
    """Chunk labels of `scheme` for the tokens `kept` of `sent`: the chunks cut to the sentence,
    counted in kept tokens."""
    kept_before = [0]  # kept tokens of the sentence before each of its tokens
    for token in sent:
        kept_before.append(kept_before[-1] + (not token.text.isspace()))
    inside = []
    # from the first chunk that ends after the sentence starts, to the first that starts after it ends
    for position in range(bisect.bisect_right(ends, sent.start), len(chunks)):
        label, start, end = chunks[position]
        if start >= sent.end:
            break
        first = kept_before[max(start, sent.start) - sent.start]
        last = kept_before[min(end, sent.end) - sent.start]
        if last > first:
            inside.append((label, first, last))
    return spans_to_tags(len(kept), inside, scheme)


def _checked_label(label: str, index: int, token, name: str) -> str:
    """`label`, unless it is a label no corpus file can hold (white space in it)."""
    if any(character.isspace() for character in label):
        raise InputFormatError(name, None, f"doc index {index}, token {token.i} ({token.text!r}): label {label!r} "
                                           "holds white space, which a label cannot")
    return label
