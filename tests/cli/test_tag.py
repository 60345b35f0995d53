"""`gpseq tag`: raw text, CoNLL, JSON Lines and spaCy DocBin inputs and outputs against the library's
`Tagger` called directly, seqeval's span extraction and spaCy's sentencizer; distributions, n-best
lists, abstention; named pipes, tokens the CoNLL output cannot hold, a reader that closes the pipe,
and the installed console script.

One tiny model is trained once for the module on the bundled sample corpus (`helpers.cli`)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.cli import (TEXT, invoke, library_tagger, one_line, parse_conll_output, read_first_columns,  # noqa: F401
                         run, sample, spacy_sentences, text_file, trained)


def test_tag_raw_text_conll_matches_the_library(trained, library_tagger, text_file):
    model_dir, _ = trained
    result = invoke("tag", model_dir, text_file, "--mean")
    assert result.exit_code == 0, result.stderr
    sentences = parse_conll_output(result.stdout)
    expected_tokens = spacy_sentences(TEXT)
    assert [[row[0] for row in s] for s in sentences] == expected_tokens
    direct = library_tagger.tag(expected_tokens, mean=True)
    for rows, tagged in zip(sentences, direct):
        assert [row[1] for row in rows] == tagged.labels
        np.testing.assert_allclose([float(row[2]) for row in rows], tagged.confidences, rtol=1e-5, atol=1e-6)


def test_tag_full_distribution_rows_sum_to_one(trained, library_tagger, text_file):
    model_dir, _ = trained
    result = invoke("tag", model_dir, text_file, "--mean", "--full-distribution")
    assert result.exit_code == 0, result.stderr
    labels = library_tagger.labels
    for sentence in parse_conll_output(result.stdout):
        for row in sentence:
            assert len(row) == 3 + len(labels)
            distribution = dict(field.rsplit("=", 1) for field in row[3:])
            assert list(distribution) == labels
            probabilities = {k: float(v) for k, v in distribution.items()}
            assert math.isclose(sum(probabilities.values()), 1.0, abs_tol=1e-4)
            assert math.isclose(probabilities[row[1]], float(row[2]), rel_tol=1e-5)


def test_tag_conll_input_jsonl_spans_agree_with_seqeval(trained, library_tagger, sample):
    from seqeval.metrics.sequence_labeling import get_entities

    model_dir, _ = trained
    result = invoke("tag", model_dir, sample / "test.conll", "--input-format", "conll", "--format", "jsonl", "--mean")
    assert result.exit_code == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    gold = read_first_columns(sample / "test.conll")
    assert [r["tokens"] for r in records] == [[row[0] for row in s] for s in gold]
    chunky = all(label == "O" or label[:2] in ("B-", "I-") for label in library_tagger.labels)
    # the library on the same sentences, with their extra columns (features may read them)
    from gpseq.corpora.types import Sentence

    direct = library_tagger.tag([Sentence([row[0] for row in s], columns=s) for s in gold], mean=True)
    for record, tagged, rows in zip(records, direct, gold):
        assert record["labels"] == tagged.labels
        assert record["source"] == str(sample / "test.conll")
        assert record["sequence_log_prob"] == pytest.approx(tagged.sequence_log_prob, rel=1e-5, abs=1e-5)
        assert record["sequence_log_prob"] <= 1e-6
        for t, distribution in enumerate(record["distributions"]):
            assert sum(distribution.values()) == pytest.approx(1.0, abs=1e-4)
            assert distribution[record["labels"][t]] == pytest.approx(record["confidences"][t], abs=2e-6)
        if chunky:
            expected = [(kind, start, end + 1) for kind, start, end in get_entities(record["labels"])]
            assert [(k, s, e) for k, s, e, _ in record["spans"]] == expected
            assert [p for *_, p in record["spans"]] == pytest.approx([p for *_, p in tagged.spans], abs=2e-6)
            assert record["span_probability"] == "exact" or not record["spans"]
    if chunky:
        assert any(r["spans"] for r in records)
        product = invoke("tag", model_dir, sample / "test.conll", "--input-format", "conll", "--format", "jsonl",
                         "--mean", "--span-probs", "product")
        for line in product.stdout.splitlines():
            record = json.loads(line)
            for _, start, end, probability in record["spans"]:
                assert probability == pytest.approx(np.prod(record["confidences"][start:end]), rel=1e-4, abs=1e-6)


def test_tag_stdin_and_batch_size_do_not_change_the_output(trained, text_file):
    model_dir, _ = trained
    from_file = invoke("tag", model_dir, text_file, "--mean", "--format", "jsonl", "--batch-size", "256")
    from_stdin = invoke("tag", model_dir, "-", "--mean", "--format", "jsonl", "--batch-size", "1", input=TEXT)
    assert from_file.exit_code == 0 and from_stdin.exit_code == 0, from_stdin.stderr
    strip = lambda out: [{k: v for k, v in json.loads(l).items() if k != "source"} for l in out.splitlines()]  # noqa: E731
    a, b = strip(from_file.stdout), strip(from_stdin.stdout)
    assert len(a) == len(spacy_sentences(TEXT))
    assert [r["labels"] for r in a] == [r["labels"] for r in b]
    assert [r["line"] for r in a] == [1, 1, 3]
    for x, y in zip(a, b):
        np.testing.assert_allclose(x["confidences"], y["confidences"], rtol=1e-5, atol=1e-6)


def test_tag_sampled_marginals_are_distributions(trained, text_file):
    model_dir, _ = trained
    result = invoke("tag", model_dir, text_file, "--samples", "3", "--format", "jsonl")
    assert result.exit_code == 0, result.stderr
    for line in result.stdout.splitlines():
        record = json.loads(line)
        for distribution in record["distributions"]:
            assert sum(distribution.values()) == pytest.approx(1.0, abs=1e-4)
            assert all(0.0 <= p <= 1.0 for p in distribution.values())


def test_tag_spacy_docbin(trained, library_tagger, text_file, tmp_path):
    import spacy
    from spacy.tokens import DocBin

    model_dir, _ = trained
    out = tmp_path / "tagged.spacy"
    result = invoke("tag", model_dir, text_file, "--mean", "--format", "spacy", "-o", out)
    assert result.exit_code == 0, result.stderr
    docs = list(DocBin().from_disk(out).get_docs(spacy.blank("en").vocab))
    expected = spacy_sentences(TEXT)
    assert [[t.text for t in doc] for doc in docs] == expected
    assert docs[0].text == "The committee approved the new budget on Tuesday."
    direct = library_tagger.tag(expected, mean=True)
    for doc, tagged in zip(docs, direct):
        assert list(doc.user_data["gpseq"]["labels"]) == tagged.labels
        if "gpseq" in doc.spans:
            from seqeval.metrics.sequence_labeling import get_entities

            got = [(span.label_ if span.label_ != "CHUNK" else "", span.start, span.end) for span in doc.spans["gpseq"]]
            assert got == [(k, s, e + 1) for k, s, e in get_entities(tagged.labels)]
            assert len(doc.spans["gpseq"].attrs["scores"]) == len(got)
        else:
            assert [t.tag_ for t in doc] == tagged.labels


def test_tag_abstain_below_flags_in_every_format_and_never_changes_a_label(trained, sample, tmp_path):
    """--abstain-below P: ABSTAIN exactly where p(label) < P (spans: P(span) < P), labels as without it."""
    import spacy
    from spacy.tokens import DocBin

    model_dir, _ = trained
    test = sample / "test.conll"
    plain = parse_conll_output(invoke("tag", model_dir, test, "--input-format", "conll").stdout)
    conll = invoke("tag", model_dir, test, "--input-format", "conll", "--abstain-below", "0.97")
    assert conll.exit_code == 0, conll.stderr
    flagged = parse_conll_output(conll.stdout)
    assert [[row[:3] for row in s] for s in flagged] == plain
    rows = [row for s in flagged for row in s]
    assert {row[3] for row in rows} <= {"ABSTAIN", "-"}
    assert all((row[3] == "ABSTAIN") == (float(row[2]) < 0.97) for row in rows)
    assert any(row[3] == "ABSTAIN" for row in rows) and any(row[3] == "-" for row in rows)
    jsonl = invoke("tag", model_dir, test, "--input-format", "conll", "--format", "jsonl", "--abstain-below", "0.97")
    records = [json.loads(line) for line in jsonl.stdout.splitlines()]
    assert [r["labels"] for r in records] == [[row[1] for row in s] for s in plain]
    for record in records:
        assert record["abstain"] == [p < 0.97 for p in record["confidences"]]
        assert record["span_abstain"] == [p < 0.97 for *_, p in record["spans"]]
    out = tmp_path / "flagged.spacy"
    assert invoke("tag", model_dir, test, "--input-format", "conll", "--format", "spacy", "-o", out,
                  "--abstain-below", "0.97").exit_code == 0
    for doc, record in zip(DocBin().from_disk(out).get_docs(spacy.blank("en").vocab), records):
        assert list(doc.user_data["gpseq"]["labels"]) == record["labels"]
        assert list(doc.user_data["gpseq"]["abstain"]) == record["abstain"]
        if "gpseq" in doc.spans:
            assert list(doc.spans["gpseq"].attrs["abstain"]) == record["span_abstain"]
    bad = invoke("tag", model_dir, test, "--abstain-below", "1.5")
    assert bad.exit_code == 4 and "--abstain-below must be a probability" in bad.stderr


def test_tag_nbest_lists_the_most_probable_paths_first(trained, sample):
    model_dir, _ = trained
    result = invoke("tag", model_dir, sample / "test.conll", "--input-format", "conll", "--format", "jsonl",
                    "--nbest", "3")
    assert result.exit_code == 0, result.stderr
    for line in result.stdout.splitlines():
        record = json.loads(line)
        probabilities = [entry["probability"] for entry in record["nbest"]]
        assert probabilities == sorted(probabilities, reverse=True) and sum(probabilities) <= 1 + 1e-6
        assert len({tuple(entry["labels"]) for entry in record["nbest"]}) == len(record["nbest"])
        assert all(len(entry["labels"]) == len(record["tokens"]) for entry in record["nbest"])
    conll = invoke("tag", model_dir, sample / "test.conll", "--input-format", "conll", "--nbest", "2")
    assert conll.stdout.startswith("# nbest\t1\t")


def test_tag_spacy_needs_output(trained, text_file):
    result = invoke("tag", trained[0], text_file, "--format", "spacy")
    assert result.exit_code == 4
    assert result.stderr.strip() == "error: --format spacy writes a binary DocBin: give -o FILE"


@pytest.mark.slow
def test_model_reading_the_pos_column_tags_conll_and_refuses_raw_text(sample, tmp_path, text_file):
    """The chunking preset reads column 1 (POS): CoNLL input with that column works, raw text is exit 4."""
    model_dir = tmp_path / "chunking"
    result = invoke("train", sample / "train.conll", "-o", model_dir, "--features", "chunking", "--inducing", "4",
                    "--max-steps", "2", "--set", "training.dev_fraction=0", "--set", "predict_samples=2")
    assert result.exit_code == 0, result.stderr
    tagged = invoke("tag", model_dir, sample / "test.conll", "--mean")
    assert tagged.exit_code == 0, tagged.stderr
    gold = read_first_columns(sample / "test.conll")
    assert [[row[0] for row in s] for s in parse_conll_output(tagged.stdout)] == [[r[0] for r in s] for s in gold]
    refused = invoke("tag", model_dir, text_file)
    assert refused.exit_code == 4
    assert "column(s) [1]" in one_line(refused)


def test_tag_reads_a_named_pipe(trained, library_tagger, tmp_path):
    """`gpseq tag MODEL <(zcat notes.txt.gz)`: the shell passes a named pipe (/dev/fd/N), which is read
    as a file is (it was refused as 'no such file'); a directory or a missing path still are."""
    model_dir, _ = trained
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    def feed():
        with open(fifo, "w", encoding="utf-8") as handle:
            handle.write(TEXT)

    import threading

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    result = invoke("tag", model_dir, fifo, "--mean", "--input-format", "text")
    writer.join(10)
    assert result.exit_code == 0, result.stderr
    sentences = parse_conll_output(result.stdout)
    assert [[row[0] for row in s] for s in sentences] == spacy_sentences(TEXT)
    assert [[row[1] for row in s] for s in sentences] == [t.labels for t in library_tagger.tag(
        spacy_sentences(TEXT), mean=True)]
    refused = invoke("tag", model_dir, tmp_path)
    assert refused.exit_code == 2 and "is a directory" in one_line(refused)
    refused = invoke("tag", model_dir, tmp_path / "absent.txt")
    assert refused.exit_code == 2 and "no such file" in one_line(refused)


def test_tag_conll_output_refuses_a_token_with_a_tab_or_line_break(trained, tmp_path):
    """JSON Lines input may hold a token with a tab or a newline; written into the conll output it
    shifted the fields or split the line (silently). Exit 2 naming the input line, nothing written;
    jsonl output carries such tokens."""
    model_dir, _ = trained
    path = tmp_path / "odd.jsonl"
    path.write_text('{"tokens": ["The", "cat"]}\n{"tokens": ["New York", "a\\tb", "c\\nd"]}\n', encoding="utf-8")
    out = tmp_path / "out.conll"
    out.write_text("kept\n", encoding="utf-8")
    refused = invoke("tag", model_dir, path, "--mean", "-o", out)
    assert refused.exit_code == 2
    assert f"{path}:2: token 2 ('a\\tb') holds a tab or a line break" in one_line(refused)
    assert out.read_text(encoding="utf-8") == "kept\n"
    for token in ("x\ry", "x\u2028y"):
        path.write_text(json.dumps({"tokens": ["ok", token]}) + "\n", encoding="utf-8")
        assert invoke("tag", model_dir, path, "--mean").exit_code == 2
    path.write_text('{"tokens": ["New York", "a\\tb", "c\\nd"]}\n', encoding="utf-8")
    jsonl = invoke("tag", model_dir, path, "--mean", "--format", "jsonl")
    assert jsonl.exit_code == 0, jsonl.stderr
    assert json.loads(jsonl.stdout)["tokens"] == ["New York", "a\tb", "c\nd"]
    path.write_text('{"tokens": ["New York", "city"]}\n', encoding="utf-8")  # a space: the fields are tab-separated
    conll = invoke("tag", model_dir, path, "--mean")
    assert conll.exit_code == 0 and [row[0] for row in parse_conll_output(conll.stdout)[0]] == ["New York", "city"]


def test_tag_into_a_closed_pipe_stops_quietly(trained, tmp_path):
    """`gpseq tag MODEL text | head -1`: when the reader closes the pipe, gpseq stops with exit 141
    and no message (it printed 'error: ?: Broken pipe' and exited 1)."""
    model_dir, _ = trained
    text = tmp_path / "long.txt"
    text.write_text(("The committee approved the new budget on Tuesday. " * 2000) + "\n", encoding="utf-8")
    process = subprocess.Popen([sys.executable, "-m", "gpseq", "tag", str(model_dir), str(text)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = process.stdout.readline()  # 16,000 tokens of output: far more than a pipe holds
    process.stdout.close()
    stderr = process.stderr.read().decode()
    code = process.wait(timeout=120)
    assert first.strip()
    assert code == 141, stderr
    assert not re.search(r"^error:|Broken pipe|Traceback", stderr, re.MULTILINE), stderr


def test_console_script_tags_like_the_in_process_app(trained, text_file):
    script = Path(sys.executable).with_name("gpseq")
    if not script.exists():
        pytest.skip("no gpseq console script beside this Python")
    model_dir, _ = trained
    result = run(script, "tag", model_dir, text_file, "--mean", "--format", "jsonl")
    assert result.returncode == 0, result.stderr
    in_process = invoke("tag", model_dir, text_file, "--mean", "--format", "jsonl")
    a = [json.loads(line) for line in result.stdout.splitlines()]
    b = [json.loads(line) for line in in_process.stdout.splitlines()]
    assert [r["labels"] for r in a] == [r["labels"] for r in b]
    missing = run(script, "tag", model_dir, text_file.with_name("missing.txt"))
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [f"error: {text_file.with_name('missing.txt')}: no such file"]
