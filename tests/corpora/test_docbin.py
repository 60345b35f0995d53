"""spaCy DocBin corpora (`.spacy`) and output formats chosen by the suffix of `-o`.

The DocBins are built with spaCy itself (`Doc` with tags, POS, entities, span groups and
sentence starts; spaCy's own CoNLL NER converter) and the labels gpseq reads are compared with
labels written out by hand or with the converter's input text. The commands' outputs are read
back with spaCy's DocBin reader and `json.loads`, and compared with the library's `Tagger`.
"""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import ROOT

sys.path.insert(0, str(ROOT))

import cli  # noqa: E402  (the top-level typer app, as `python cli.py` runs it)
from gpseq.corpora import read_corpus  # noqa: E402
from gpseq.corpora import docbin as docbin_module  # noqa: E402
from gpseq.errors import ConfigError, InputFormatError  # noqa: E402

spacy = pytest.importorskip("spacy")
from spacy.tokens import Doc, DocBin, Span  # noqa: E402

runner = CliRunner()


def invoke(*args):
    return runner.invoke(cli.app, [str(a) for a in args], catch_exceptions=False)


def write_docbin(path: Path, docs: list) -> Path:
    DocBin(docs=docs, store_user_data=True).to_disk(path)
    return path


def annotated_doc(vocab) -> Doc:
    """Two sentences, a white-space token between them, a token without POS and without entity
    annotation, entities, and span groups ("np"; "cross" has a span across the sentence boundary)."""
    doc = Doc(vocab, words=["Maya", "Castellano", "visited", "New", "York", ".", "\n\n", "She", "left", "."],
              spaces=[True, True, True, True, False, False, False, True, False, False],
              sent_starts=[True, False, False, False, False, False, False, True, False, False],
              tags=["NNP", "NNP", "VBD", "NNP", "NNP", ".", "_SP", "PRP", "VBD", "."],
              pos=["PROPN", "PROPN", "VERB", "PROPN", "PROPN", "PUNCT", "SPACE", "PRON", "VERB", ""],
              ents=["B-PER", "I-PER", "O", "B-GPE", "I-GPE", "O", "O", "O", "O", ""])
    doc.spans["np"] = [Span(doc, 0, 2, "NP"), Span(doc, 3, 5, "NP"), Span(doc, 7, 8, "NP")]
    doc.spans["cross"] = [Span(doc, 4, 8, "X")]
    return doc


# labels written out by hand for `annotated_doc`: its two sentences without the white-space token
BY_HAND = {
    ("tag", "iob2"): [["NNP", "NNP", "VBD", "NNP", "NNP", "."], ["PRP", "VBD", "."]],
    ("pos", "iob2"): [["PROPN", "PROPN", "VERB", "PROPN", "PROPN", "PUNCT"], ["PRON", "VERB", "?"]],
    ("ents", "iob2"): [["B-PER", "I-PER", "O", "B-GPE", "I-GPE", "O"], ["O", "O", "?"]],
    ("ents", "bioes"): [["B-PER", "E-PER", "O", "B-GPE", "E-GPE", "O"], ["O", "O", "?"]],
    ("ents", "iob1"): [["I-PER", "I-PER", "O", "I-GPE", "I-GPE", "O"], ["O", "O", "?"]],
    ("spans:np", "bio"): [["B-NP", "I-NP", "O", "B-NP", "I-NP", "O"], ["B-NP", "O", "O"]],
    ("spans:np", "iobes"): [["B-NP", "E-NP", "O", "B-NP", "E-NP", "O"], ["S-NP", "O", "O"]],
    ("spans:cross", "iob2"): [["O", "O", "O", "O", "B-X", "I-X"], ["B-X", "O", "O"]],
}


@pytest.mark.parametrize("labels, scheme", list(BY_HAND))
def test_tags_pos_entities_and_span_groups_read_as_labelled_by_hand(tmp_path, labels, scheme):
    path = write_docbin(tmp_path / "gold.spacy", [annotated_doc(spacy.blank("en").vocab)])
    sentences = read_corpus(path, spacy_labels=labels, tag_scheme=scheme)
    assert [s.tokens for s in sentences] == [["Maya", "Castellano", "visited", "New", "York", "."],
                                             ["She", "left", "."]]
    assert [s.labels for s in sentences] == BY_HAND[labels, scheme]
    # the white space of the text, the "\n\n" token's included; none after a sentence's last token
    assert [s.spaces for s in sentences] == [[True, True, True, True, False, False], [True, False, False]]
    # column 1 is token.tag_ where the labels are not the tags (what the chunking preset reads)
    tags = BY_HAND["tag", "iob2"]
    expected_columns = ([[[t] for t in s.tokens] for s in sentences] if labels == "tag" else
                        [[[t, tag] for t, tag in zip(s.tokens, sentence_tags)]
                         for s, sentence_tags in zip(sentences, tags)])
    assert [s.columns for s in sentences] == expected_columns
    assert all(s.source == str(path) for s in sentences)


def test_spacy_convert_docs_of_n_sentences_read_back_as_the_conll_sentences(tmp_path):
    """What `spacy convert -c ner -n 2` makes of a CoNLL file (docs of two sentences, sentence starts
    set, the POS column as tags) reads back as the file's sentences, labels and POS column."""
    from spacy.training.converters import conll_ner_to_docs

    sentences = [[("Maya", "NNP", "B-PER"), ("Castellano", "NNP", "I-PER"), ("hired", "VBD", "O")],
                 [("Omar", "NNP", "B-PER"), ("left", "VBD", "O"), ("Lima", "NNP", "B-LOC")],
                 [("It", "PRP", "O"), ("rained", "VBD", "O")],
                 [("The", "DT", "O"), ("Bank", "NNP", "B-ORG"), ("of", "IN", "I-ORG"), ("Oslo", "NNP", "I-ORG")],
                 [("Fine", "JJ", "O")]]
    text = "\n\n".join("\n".join(" ".join(row) for row in sentence) for sentence in sentences) + "\n"
    docs = list(conll_ner_to_docs(text, n_sents=2, no_print=True))
    assert len(docs) == 3  # the converter's grouping: 2 + 2 + 1 sentences
    path = write_docbin(tmp_path / "converted.spacy", docs)

    ents = read_corpus(path, spacy_labels="ents")
    assert [s.tokens for s in ents] == [[word for word, _, _ in sentence] for sentence in sentences]
    assert [s.labels for s in ents] == [[label for _, _, label in sentence] for sentence in sentences]
    assert [[row[1] for row in s.columns] for s in ents] == [[pos for _, pos, _ in sentence] for sentence in sentences]
    tags = read_corpus(path)  # the default: token.tag_
    assert [s.labels for s in tags] == [[pos for _, pos, _ in sentence] for sentence in sentences]


def test_a_doc_without_sentence_boundaries_is_one_sentence(tmp_path):
    vocab = spacy.blank("en").vocab
    first = Doc(vocab, words=["Maya", "hired", "Omar", ".", "Omar", "left", "."],
                tags=["N", "V", "N", ".", "N", "V", "."])
    second = Doc(vocab, words=["Fine"], tags=["J"])
    sentences = read_corpus(write_docbin(tmp_path / "docs.spacy", [first, second]))
    assert [s.tokens for s in sentences] == [["Maya", "hired", "Omar", ".", "Omar", "left", "."], ["Fine"]]
    assert [s.labels for s in sentences] == [["N", "V", "N", ".", "N", "V", "."], ["J"]]


def test_a_doc_without_the_labels_is_an_error_naming_file_and_doc_index_and_unlabelled_reading_ignores_them(tmp_path):
    vocab = spacy.blank("en").vocab
    labelled = Doc(vocab, words=["Maya", "left"], ents=["B-PER", "O"])
    bare = Doc(vocab, words=["Omar", "stayed"], tags=["NNP", "VBD"])
    path = write_docbin(tmp_path / "mixed.spacy", [labelled, bare])
    with pytest.raises(InputFormatError) as error:
        read_corpus(path, spacy_labels="ents")
    assert str(error.value) == (f"{path}: doc index 1 has no entity annotation (doc.ents); it has tag (choose "
                                "with --spacy-labels)")
    with pytest.raises(InputFormatError, match=r"doc index 0 has no span group 'np' \(doc.spans\); it has ents"):
        read_corpus(path, spacy_labels="spans:np")
    unlabelled = read_corpus(path, labelled=False, spacy_labels="spans:np")
    assert [(s.tokens, s.labels) for s in unlabelled] == [(["Maya", "left"], None), (["Omar", "stayed"], None)]


def test_overlapping_spans_and_unknown_label_sources_are_refused(tmp_path):
    vocab = spacy.blank("en").vocab
    doc = Doc(vocab, words=["New", "York", "City"])
    doc.spans["loc"] = [Span(doc, 0, 2, "GPE"), Span(doc, 1, 3, "LOC")]
    path = write_docbin(tmp_path / "overlap.spacy", [doc])
    with pytest.raises(InputFormatError, match=r"doc index 0: spans \('GPE', 0, 2\) and \('LOC', 1, 3\) of group "
                                               r"'loc' overlap"):
        read_corpus(path, spacy_labels="spans:loc")
    for choice in ("ent", "spans", "spans:", "tag:x", "TAG"):
        with pytest.raises(ConfigError, match="spaCy labels must be tag, pos, ents or spans:KEY"):
            read_corpus(path, spacy_labels=choice)


def test_malformed_truncated_and_oversized_docbins_are_one_line_errors_naming_the_file(tmp_path, monkeypatch):
    good = DocBin(docs=[Doc(spacy.blank("en").vocab, words=["a", "b"], tags=["X", "Y"])]).to_bytes()
    cases = {
        "garbage.spacy": (b"not a DocBin at all", "not a spaCy DocBin (not zlib-compressed data, or cut short)"),
        "cut.spacy": (good[: len(good) // 2], "not a spaCy DocBin (not zlib-compressed data, or cut short)"),
        "foreign.spacy": (zlib.compress(json.dumps({"tokens": []}).encode()), "not a spaCy DocBin ("),
        "empty.spacy": (b"", "not a spaCy DocBin"),
    }
    for name, (content, problem) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(InputFormatError) as error:
            read_corpus(path)
        assert str(error.value).startswith(f"{path}: {problem}") and "\n" not in str(error.value)

    monkeypatch.setattr(docbin_module, "MAX_DOCBIN_BYTES", 4096)
    large = tmp_path / "large.spacy"
    large.write_bytes(good + b"\0" * 4096)
    with pytest.raises(InputFormatError, match=rf"^{large}: {large.stat().st_size:,} bytes, more than the 4,096 "
                                               r"bytes gpseq lets spaCy load \(a DocBin is loaded whole\)"):
        read_corpus(large)
    bomb = tmp_path / "bomb.spacy"
    bomb.write_bytes(zlib.compress(b"\0" * 100_000))  # about 100 bytes on disk
    with pytest.raises(InputFormatError, match=rf"^{bomb}: decompresses to more than the 4,096 bytes"):
        read_corpus(bomb)


# ---------------------------------------------------------------------------------------------
# the commands: train on a DocBin, tag and select into files whose suffix chooses the format
# ---------------------------------------------------------------------------------------------

PEOPLE = [["Maya", "Castellano"], ["Omar"], ["Ines", "Ruiz"], ["Karl"], ["Lena"], ["Tom", "Baker"]]
CITIES = [["Paris"], ["New", "York"], ["Oslo"], ["Lima"]]


def ner_docs(vocab, n_docs: int = 6, per_doc: int = 4) -> tuple[list, list[list[str]]]:
    """Docs of `per_doc` sentences "PERSON lives in CITY ." with their entities and sentence starts,
    and every sentence's tokens."""
    docs, sentences = [], []
    for d in range(n_docs):
        words, ents, starts = [], [], []
        for s in range(per_doc):
            person, city = PEOPLE[(d + s) % len(PEOPLE)], CITIES[(d * per_doc + s) % len(CITIES)]
            sentence = [*person, "lives", "in", *city, "."]
            words += sentence
            ents += (["B-PER"] + ["I-PER"] * (len(person) - 1) + ["O", "O"] + ["B-LOC"] + ["I-LOC"] * (len(city) - 1)
                     + ["O"])
            starts += [True] + [False] * (len(sentence) - 1)
            sentences.append(sentence)
        docs.append(Doc(vocab, words=words, ents=ents, sent_starts=starts))
    return docs, sentences


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(model directory, training DocBin, its sentences): `gpseq train` on a DocBin's entities, in
    the BIOES scheme (so that reading must follow the scheme)."""
    base = tmp_path_factory.mktemp("spacy")
    docs, sentences = ner_docs(spacy.blank("en").vocab)
    corpus = write_docbin(base / "train.spacy", docs)
    model = base / "model"
    result = invoke("train", corpus, "-o", model, "--features", "ner", "--spacy-labels", "ents",
                    "--tag-scheme", "bioes")
    assert result.exit_code == 0, result.stderr
    return model, corpus, sentences


def test_train_on_a_docbin_learns_its_entities_in_the_tag_scheme(trained):
    model, corpus, sentences = trained
    meta = json.loads((model / "tagger.json").read_text())
    assert sorted(meta["labels"]) == ["B-LOC", "B-PER", "E-LOC", "E-PER", "O", "S-LOC", "S-PER"]
    assert meta["config"]["tag_scheme"] == "bioes"
    result = invoke("evaluate", model, corpus, "--spacy-labels", "ents", "--json")
    assert result.exit_code == 0, result.stderr
    metrics = json.loads(result.stdout)
    assert (metrics["n_sentences"], metrics["n_tokens"]) == (len(sentences), sum(map(len, sentences)))
    assert metrics["token_accuracy"] > 0.9  # gold read as BIOES, as the model labels


def test_tag_output_follows_the_suffix_and_a_docbin_round_trips(trained, tmp_path):
    from gpseq.tagger import Tagger

    model, corpus, sentences = trained
    direct = Tagger.load(model).tag(sentences)

    out = tmp_path / "tagged.spacy"
    assert invoke("tag", model, corpus, "-o", out).exit_code == 0
    docs = list(DocBin().from_disk(out).get_docs(spacy.blank("en").vocab))
    assert [[t.text for t in doc] for doc in docs] == sentences
    assert [doc.text for doc in docs[:2]] == ["Maya Castellano lives in Paris .", "Omar lives in New York ."]
    for doc, tagged in zip(docs, direct):
        assert list(doc.user_data["gpseq"]["labels"]) == tagged.labels
        assert [(e.label_, e.start, e.end) for e in doc.ents] == [(k, s, e) for k, s, e, _ in tagged.spans]
    back = read_corpus(out, spacy_labels="ents", tag_scheme="bioes")  # the output is a corpus again
    assert [s.labels for s in back] == [tagged.labels for tagged in direct]

    jsonl = tmp_path / "tagged.jsonl"
    assert invoke("tag", model, corpus, "-o", jsonl).exit_code == 0
    records = [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines()]
    assert [r["labels"] for r in records] == [tagged.labels for tagged in direct]

    conll = tmp_path / "tagged.conll"
    assert invoke("tag", model, corpus, "-o", conll).exit_code == 0
    first = conll.read_text(encoding="utf-8").split("\n\n")[0].splitlines()
    assert [row.split("\t")[:2] for row in first] == [[w, y] for w, y in zip(sentences[0], direct[0].labels)]


@pytest.mark.parametrize("command, options, output, written", [
    ("tag", ["--format", "conll"], "out.jsonl", "jsonl"),
    ("tag", ["--format", "jsonl"], "out.spacy", "spacy"),
    ("tag", ["--format", "spacy"], "out.conll", "conll"),
    ("select", ["-n", "1", "--format", "conll"], "picks.jsonl", "jsonl"),
    ("select", ["-n", "1", "--format", "labelstudio"], "picks.jsonl", "jsonl"),
])
def test_an_explicit_format_that_contradicts_the_suffix_is_refused(trained, tmp_path, command, options, output,
                                                                    written):
    model, corpus, _ = trained
    result = invoke(command, model, corpus, *options, "-o", tmp_path / output)
    assert result.exit_code == 4
    given = options[-1]
    assert result.stderr.strip() == (f"error: --format {given} does not match -o {tmp_path / output}: a "
                                     f"{Path(output).suffix} file is written as {written}; leave out --format, or "
                                     f"give the file a name for {given}")
    assert not (tmp_path / output).exists()


def test_an_explicit_format_with_an_unknown_suffix_is_written(trained, tmp_path):
    model, corpus, sentences = trained
    out = tmp_path / "tagged.txt"
    assert invoke("tag", model, corpus, "--format", "jsonl", "-o", out).exit_code == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == len(sentences)


def test_select_writes_json_lines_for_a_jsonl_output_from_an_unlabelled_docbin_pool(trained, tmp_path):
    """The pool's docs have no annotation at all: unlabelled reading ignores labels."""
    model, _, _ = trained
    vocab = spacy.blank("en").vocab
    pool_sentences = [["Karl", "lives", "in", "Oslo", "."], ["Lena", "Ruiz", "lives", "in", "Lima", "."],
                      ["Tom", "lives", "in", "Paris", "."]]
    pool = write_docbin(tmp_path / "pool.spacy", [Doc(vocab, words=words) for words in pool_sentences])
    picks = tmp_path / "picks.jsonl"
    result = invoke("select", model, pool, "-n", "2", "--strategy", "entropy", "-o", picks)
    assert result.exit_code == 0, result.stderr
    records = [json.loads(line) for line in picks.read_text(encoding="utf-8").splitlines()]
    assert [r["select"]["rank"] for r in records] == [1, 2]
    assert all(r["tokens"] in pool_sentences for r in records)
    prodigy = tmp_path / "tasks.jsonl"  # prodigy tasks are JSON Lines too
    result = invoke("select", model, pool, "-n", "1", "--strategy", "entropy", "--format", "prodigy", "-o", prodigy)
    assert result.exit_code == 0, result.stderr
    assert "meta" in json.loads(prodigy.read_text(encoding="utf-8").splitlines()[0])


# ---------------------------------------------------------------------------------------------
# DocBin round trip: what `gpseq tag -o out.spacy` writes, `gpseq evaluate` reads back as tagged
# ---------------------------------------------------------------------------------------------

SHIPPED_POS, SHIPPED_CHUNK = ROOT / "models" / "en_pos_conll2000", ROOT / "models" / "en_chunk_conll2000"


@pytest.fixture(scope="module")
def shipped_models():
    if not (SHIPPED_POS / "tagger.json").is_file() or not (SHIPPED_CHUNK / "tagger.json").is_file():
        pytest.skip("the shipped models are absent")
    return SHIPPED_POS, SHIPPED_CHUNK


def evaluate_json(*args) -> dict:
    result = invoke("evaluate", *args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_a_docbin_written_by_tag_evaluates_as_its_own_labels(shipped_models, tmp_path):
    """`gpseq tag MODEL in.conll -o out.spacy`, then `gpseq evaluate MODEL out.spacy`: accuracy and chunk F1 1.0.
    The POS tagger's labels are token.tag_ (--spacy-labels tag); the chunker's are doc.ents (--spacy-labels
    ents), with the input's POS column, which its features read, in token.tag_."""
    from gpseq.tagger import Tagger

    pos, chunk = shipped_models
    sentences = read_corpus(ROOT / "corpora" / "sample" / "test.conll")[:20]
    conll = tmp_path / "in.conll"
    conll.write_text("".join("".join(" ".join(row) + "\n" for row in s.columns) + "\n" for s in sentences),
                     encoding="utf-8")
    for model, labels in ((pos, "tag"), (chunk, "ents")):
        out = tmp_path / f"{model.name}.spacy"
        assert invoke("tag", model, conll, "-o", out).exit_code == 0
        expected = Tagger.load(model).tag(sentences)
        docs = list(DocBin().from_disk(out).get_docs(spacy.blank("en").vocab))
        if labels == "tag":
            assert [[t.tag_ for t in doc] for doc in docs] == [r.labels for r in expected]
        else:
            assert [[(e.label_, e.start, e.end) for e in doc.ents] for doc in docs] == \
                   [[span[:3] for span in r.spans] for r in expected]
            assert [[t.tag_ for t in doc] for doc in docs] == [[row[1] for row in s.columns] for s in sentences]
        metrics = evaluate_json(model, out, "--spacy-labels", labels)
        assert (metrics["n_sentences"], metrics["n_tokens"]) == (20, sum(map(len, sentences)))
        assert metrics["token_accuracy"] == 1.0
        if labels == "ents":
            assert metrics["chunk_f1"] == 1.0 and metrics["n_gold_chunks"] > 20


def test_a_docbin_written_by_a_chain_on_raw_text_evaluates_as_both_models_labels(shipped_models, tmp_path):
    """`gpseq tag POS CHUNK notes.txt -o out.spacy`: the POS tagger's labels are token.tag_ (column 1 of what the
    chunker read), so each model evaluated on the file finds its own labels."""
    pos, chunk = shipped_models
    notes = tmp_path / "notes.txt"
    notes.write_text("The committee approved the new budget on Tuesday. It will fund three small projects.\n",
                     encoding="utf-8")
    out = tmp_path / "chain.spacy"
    assert invoke("tag", pos, chunk, notes, "-o", out).exit_code == 0
    docs = list(DocBin(store_user_data=True).from_disk(out).get_docs(spacy.blank("en").vocab))
    chained = [list(doc.user_data["gpseq"]["chain"][0]["labels"]) for doc in docs]  # the POS tagger's labels
    assert [[t.tag_ for t in doc] for doc in docs] == chained
    assert evaluate_json(pos, out, "--spacy-labels", "tag")["token_accuracy"] == 1.0
    metrics = evaluate_json(chunk, out, "--spacy-labels", "ents")
    assert (metrics["token_accuracy"], metrics["chunk_f1"]) == (1.0, 1.0)


def test_evaluate_on_a_bad_docbin_is_a_one_line_error_naming_the_file(trained, tmp_path):
    model, _, _ = trained
    vocab = spacy.blank("en").vocab
    garbage = tmp_path / "garbage.spacy"
    garbage.write_bytes(b"not a DocBin at all")
    untagged = write_docbin(tmp_path / "untagged.spacy", [Doc(vocab, words=["Omar", "left"], ents=["B-PER", "O"])])
    overlapping = Doc(vocab, words=["New", "York", "City"])
    overlapping.spans["loc"] = [Span(overlapping, 0, 2, "LOC"), Span(overlapping, 1, 3, "LOC")]
    overlap = write_docbin(tmp_path / "overlap.spacy", [overlapping])
    for path, labels, problem in (
            (garbage, "ents", "not a spaCy DocBin (not zlib-compressed data, or cut short)"),
            (untagged, "tag", "doc index 0 has no tags (token.tag_); it has ents (choose with --spacy-labels)"),
            (overlap, "spans:loc", "doc index 0: spans ('LOC', 0, 2) and ('LOC', 1, 3) of group 'loc' overlap")):
        result = invoke("evaluate", model, path, "--spacy-labels", labels)
        assert result.exit_code == 2
        assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"error: {path}: {problem}"), \
            result.stderr
