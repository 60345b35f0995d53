"""Corpora: CoNLL column files, CRF++, CoNLL-U, JSON Lines, spaCy DocBins and raw text behind
`read_corpus`, tag schemes and spans, splits, the public-corpus catalogue."""

from gpseq.corpora.catalogue import (
    corpora_root,
    corpus_path,
    fetch_corpus,
    get_corpus,
    list_corpora,
    load_corpus,
    sha256_file,
)
from gpseq.corpora.conll import iter_conll, read_conll, split_columns, write_conll
from gpseq.corpora.conllu import iter_conllu, read_conllu
from gpseq.corpora.docbin import iter_docbin, read_docbin
from gpseq.corpora.formats import (FORMATS, CorpusFile, ReadOptions, detect_format, iter_corpus, read_corpus,
                                   register_format)
from gpseq.corpora.jsonl import iter_jsonl, read_jsonl
from gpseq.corpora.schemes import (
    SCHEMES,
    convert_tags,
    detect_scheme,
    is_chunk_label,
    is_chunk_labelling,
    normalise_scheme,
    spans,
    spans_to_tags,
    split_label,
)
from gpseq.corpora.splits import kfold_indices, train_dev_split
from gpseq.corpora.types import UNLABELLED, Sentence, TokenRows

__all__ = [
    "CorpusFile",
    "FORMATS",
    "ReadOptions",
    "SCHEMES",
    "Sentence",
    "TokenRows",
    "UNLABELLED",
    "convert_tags",
    "corpora_root",
    "corpus_path",
    "detect_format",
    "detect_scheme",
    "fetch_corpus",
    "get_corpus",
    "is_chunk_label",
    "is_chunk_labelling",
    "iter_conll",
    "iter_conllu",
    "iter_corpus",
    "iter_docbin",
    "iter_jsonl",
    "kfold_indices",
    "list_corpora",
    "load_corpus",
    "normalise_scheme",
    "read_conll",
    "read_conllu",
    "read_corpus",
    "read_docbin",
    "read_jsonl",
    "register_format",
    "sha256_file",
    "spans",
    "spans_to_tags",
    "split_columns",
    "split_label",
    "train_dev_split",
    "write_conll",
]
