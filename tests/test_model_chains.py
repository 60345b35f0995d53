"""Models that feed one another (`gpseq.chain_models.ModelChain`; `gpseq tag MODEL MODEL FILE`,
`gpseq select`, `gpseq serve DIR+DIR`).

Two tiny models of the default training on the bundled sample (`helpers.sample_models.train_sample_pos_and_chunker`):
a POS tagger whose features read the words only, and a chunker whose features read column 1 (POS).
A chain's output is checked against an independent path: the POS tagger alone, its labels written
here by hand as column 1 of a CoNLL file, and the chunker alone on that file. The server is
contacted on 127.0.0.1 only, every wait bounded.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import ROOT
from helpers.cli import parse_conll_output
from helpers.sample_models import train_sample_pos_and_chunker

TEXT = "The committee approved the new budget on Tuesday. It will fund three small projects.\n\nA second paragraph follows here."
WAIT = 60.0  # seconds a test waits for the server, at most

runner = CliRunner()


def invoke(*args):
    from gpseq.cli import app

    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from gpseq.structured.model import ModelConfig

    return train_sample_pos_and_chunker(tmp_path_factory.mktemp("chain_models"), ModelConfig())


@pytest.fixture()
def text_file(tmp_path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def pos_column_file(models, text_file: Path, tmp_path: Path) -> tuple[Path, list[list[list[str]]]]:
    """The POS tagger alone on `text_file` (CoNLL output), and a file written here with its labels as
    column 1 (`token<TAB>POS` lines): the input the chunker reads in the chain."""
    alone = invoke("tag", models["pos"], text_file)
    assert alone.exit_code == 0, alone.stderr
    tagged = parse_conll_output(alone.stdout)
    path = tmp_path / "with_pos.conll"
    path.write_text("".join("".join(f"{row[0]}\t{row[1]}\n" for row in sentence) + "\n" for sentence in tagged),
                    encoding="utf-8")
    return path, tagged


# ---- (1) a chain equals its models run one after the other ---------------------------------------
def test_chain_on_raw_text_equals_the_chunker_on_a_file_of_the_pos_labels(models, text_file, tmp_path):
    column_file, pos_alone = pos_column_file(models, text_file, tmp_path)
    chunk_alone = invoke("tag", models["chunk"], column_file)
    assert chunk_alone.exit_code == 0, chunk_alone.stderr
    reference = parse_conll_output(chunk_alone.stdout)

    chained = invoke("tag", models["pos"], models["chunk"], text_file)
    assert chained.exit_code == 0, chained.stderr
    rows = parse_conll_output(chained.stdout)
    assert len(rows) == len(reference) == len(pos_alone) == 3
    for sentence, chunks, tags in zip(rows, reference, pos_alone, strict=True):
        assert all(len(row) == 4 for row in sentence)  # token, POS, chunk label, p(label)
        assert [row[0] for row in sentence] == [row[0] for row in chunks] == [row[0] for row in tags]
        assert [row[1] for row in sentence] == [row[1] for row in tags]  # the POS tagger's labels
        assert [row[2] for row in sentence] == [row[1] for row in chunks]  # the chunker's on them
        for row, alone in zip(sentence, chunks):
            assert math.isclose(float(row[3]), float(alone[2]), rel_tol=1e-5)

    as_json = invoke("tag", models["pos"], models["chunk"], text_file, "--format", "jsonl")
    assert as_json.exit_code == 0, as_json.stderr
    records = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [r["labels"] for r in records] == [[row[1] for row in s] for s in reference]
    assert [r["chain"] for r in records] == [[{"model": "pos", "labels": [row[1] for row in s]}] for s in pos_alone]
    assert all(r["spans"] for r in records)  # chunk labels: spans with their probabilities


def test_the_library_chain_equals_the_chunker_on_the_pos_labels(models):
    from gpseq import ModelChain
    from gpseq.corpora import Sentence

    sentences = [["The", "bank", "reported", "a", "loss", "."], ["Prices", "rose", "sharply", "."]]
    pos, chunk = models["pos_tagger"], models["chunk_tagger"]
    tags = [result.labels for result in pos.tag(sentences)]
    reference = chunk.tag([Sentence(tokens, columns=[[t, p] for t, p in zip(tokens, labels)])
                           for tokens, labels in zip(sentences, tags)])
    chain = ModelChain.load([models["pos"], models["chunk"]])
    results = chain.tag(sentences)
    assert chain.names == ["pos", "chunk"] and chain.input_width == 1
    assert [r.labels for r in results] == [r.labels for r in reference]
    assert [r.chain for r in results] == [[("pos", labels)] for labels in tags]
    for result, alone in zip(results, reference):
        assert abs(result.probabilities - alone.probabilities).max() < 1e-6


def test_a_column_the_input_has_is_read_and_the_labels_come_after_it(models, caplog):
    """Sentences with their own POS column 1: the chunker reads it, the POS tagger's labels are
    column 2 (read by no later model: a warning says so)."""
    from gpseq import ModelChain
    from gpseq.corpora import Sentence

    rows = [[["The", "NN"], ["bank", "NN"], ["failed", "NN"], [".", "NN"]]]  # deliberately wrong POS
    sentences = [Sentence([row[0] for row in s], columns=s) for s in rows]
    chain = ModelChain([models["pos_tagger"], models["chunk_tagger"]], ["pos", "chunk"])
    with caplog.at_level("WARNING", logger="gpseq"):
        results = chain.tag(sentences)
    assert [r.labels for r in results] == [r.labels for r in models["chunk_tagger"].tag(sentences)]
    assert results[0].chain == [("pos", models["pos_tagger"].tag(sentences)[0].labels)]
    assert "'pos' are column 2" in caplog.text and "no later model reads it" in caplog.text


# ---- (2) one model: as before --------------------------------------------------------------------
def test_one_model_tags_as_before(models, text_file, tmp_path):
    from gpseq.corpora import read_corpus

    single = invoke("tag", models["pos"], text_file)
    assert single.exit_code == 0, single.stderr
    rows = parse_conll_output(single.stdout)
    assert all(len(row) == 3 for sentence in rows for row in sentence)  # token, label, p(label): no chain column
    sentences = read_corpus(text_file, "text", labelled=False)
    expected = models["pos_tagger"].tag(sentences)
    assert [[row[1] for row in s] for s in rows] == [r.labels for r in expected]
    as_json = invoke("tag", models["pos"], text_file, "--format", "jsonl")
    assert all("chain" not in json.loads(line) for line in as_json.stdout.splitlines())

    # the chunker alone: a column file works, raw text is refused as before
    column_file, _ = pos_column_file(models, text_file, tmp_path)
    assert invoke("tag", models["chunk"], column_file).exit_code == 0
    refused = invoke("tag", models["chunk"], text_file)
    assert refused.exit_code == 4
    assert "raw text has only tokens" in one_line(refused) and "column(s) [1]" in one_line(refused)


def test_the_last_positional_model_needs_an_input_after_it(models):
    result = invoke("tag", models["pos"], models["chunk"])
    assert result.exit_code == 2
    assert str(models["chunk"]) in one_line(result) and "no input file" in one_line(result)


# ---- (3) a column no input or earlier model gives -----------------------------------------------
def test_a_missing_column_is_one_line_naming_the_model_and_the_column(models, text_file, tmp_path):
    # raw text: refused before tagging, with the exit code of the one-model refusal of raw text
    single = invoke("tag", models["chunk"], text_file)
    chained = invoke("tag", models["chunk"], models["pos"], text_file)
    assert chained.exit_code == single.exit_code == 4
    line = one_line(chained)
    assert "model 'chunk'" in line and "column(s) [1]" in line and str(text_file) in line

    # a column file without the column: the exit code of the one model's missing column, naming file:line
    tokens_only = tmp_path / "tokens.conll"
    tokens_only.write_text("The\nbank\nfailed\n.\n\n", encoding="utf-8")
    single = invoke("tag", models["chunk"], tokens_only)
    chained = invoke("tag", models["chunk"], models["pos"], tokens_only)
    assert chained.exit_code == single.exit_code == 2
    line = one_line(chained)
    assert f"{tokens_only}:1:" in line and "model 'chunk' reads column 1" in line


# ---- select: the last model's scores on what the earlier models fed ------------------------------
def test_select_with_a_chain_scores_by_the_last_model(models, text_file, tmp_path):
    column_file, pos_alone = pos_column_file(models, text_file, tmp_path)
    options = ["-n", "2", "--strategy", "entropy", "--format", "jsonl"]
    alone = invoke("select", models["chunk"], column_file, *options)
    chained = invoke("select", models["pos"], models["chunk"], text_file, *options)
    assert alone.exit_code == 0 and chained.exit_code == 0, alone.stderr + chained.stderr
    picked = [json.loads(line) for line in chained.stdout.splitlines()]
    reference = [json.loads(line) for line in alone.stdout.splitlines()]
    assert [r["select"]["index"] for r in picked] == [r["select"]["index"] for r in reference]
    for record, expected in zip(picked, reference, strict=True):
        assert math.isclose(record["select"]["score"], expected["select"]["score"], rel_tol=1e-5)
        assert record["labels"] == expected["labels"]
        index = record["select"]["index"]
        assert record["chain"] == [{"model": "pos", "labels": [row[1] for row in pos_alone[index]]}]


# ---- (4) serve: a chained model over 127.0.0.1 ---------------------------------------------------
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_serve_a_chain_answers_as_the_command_line_tags(models, text_file):
    pytest.importorskip("fastapi")
    uvicorn = pytest.importorskip("uvicorn")
    pytest.importorskip("prometheus_client")
    httpx = pytest.importorskip("httpx")
    from gpseq.serve.app import create_app
    from gpseq.serve.models import load_models, parse_served_spec
    from gpseq.serve.process import absolute_spec
    from gpseq.serve.settings import ServeSettings
    from gpseq.tagger import Tagger

    spec = f"{models['pos']}+{models['chunk']}"
    assert parse_served_spec(spec) == ("chunk", [Path(models["pos"]), Path(models["chunk"])])
    assert parse_served_spec(f"np={spec}")[0] == "np"
    assert absolute_spec(spec) == ["chunk", [str(Path(models["pos"]).resolve()), str(Path(models["chunk"]).resolve())]]

    served = load_models([absolute_spec(spec), f"pos={models['pos']}"], Tagger.load)  # the workers' form, and one model
    app = create_app(served, ServeSettings(request_timeout=WAIT))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + WAIT
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        reply = httpx.post(f"http://127.0.0.1:{port}/tag", json={"text": TEXT}, timeout=WAIT)
        listed = httpx.get(f"http://127.0.0.1:{port}/models", timeout=WAIT).json()["models"]
    finally:
        server.should_exit = True
        thread.join(WAIT)
    assert not thread.is_alive()
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["model"] == "chunk"

    cli = invoke("tag", models["pos"], models["chunk"], text_file, "--format", "jsonl")
    expected = [json.loads(line) for line in cli.stdout.splitlines()]
    assert [r["tokens"] for r in body["sentences"]] == [r["tokens"] for r in expected]
    assert [r["labels"] for r in body["sentences"]] == [r["labels"] for r in expected]
    assert [r["chain"] for r in body["sentences"]] == [r["chain"] for r in expected]
    chain = next(m for m in listed if m["name"] == "chunk")
    assert chain["chain"] == ["pos", "chunk"] and chain["input"]["text"] is True
    assert "chain" not in next(m for m in listed if m["name"] == "pos")


def test_chain_specs_are_checked_before_serving(models, tmp_path):
    from gpseq.errors import ConfigError, InputFormatError
    from gpseq.serve.models import parse_served_spec
    from gpseq.serve.process import check_model_specs

    check_model_specs([f"{models['pos']}+{models['chunk']}", str(models["pos"])])  # names chunk, pos: no error
    with pytest.raises(InputFormatError, match="no such model directory"):
        check_model_specs([f"{models['pos']}+{tmp_path / 'missing'}"])
    with pytest.raises(ConfigError, match="empty model directory"):
        check_model_specs([f"{models['pos']}+"])
    with pytest.raises(ConfigError, match="two models named 'chunk'"):
        check_model_specs([f"{models['pos']}+{models['chunk']}", str(models["chunk"])])
    odd = tmp_path / "a+b"
    odd.mkdir()
    assert parse_served_spec(str(odd)) == ("a+b", [odd])  # an existing directory is one model


# ---- the shipped models ---------------------------------------------------------------------------
def test_the_shipped_pos_tagger_feeds_the_shipped_chunker_on_raw_text(tmp_path):
    pos, chunk = ROOT / "models" / "en_pos_conll2000", ROOT / "models" / "en_chunk_conll2000"
    if not (pos / "tagger.json").is_file() or not (chunk / "tagger.json").is_file():
        pytest.skip("the shipped models are absent")
    notes = tmp_path / "notes.txt"
    notes.write_text("The cat sat on the mat. He reckons the current account deficit will narrow.\n", encoding="utf-8")
    result = invoke("tag", pos, chunk, notes)
    assert result.exit_code == 0, result.stderr
    rows = parse_conll_output(result.stdout)
    assert len(rows) == 2
    chunk_labels = set(json.loads((chunk / "tagger.json").read_text())["labels"])
    assert {row[2] for s in rows for row in s} <= chunk_labels
    assert [row[:3] for row in rows[0]] == [["The", "DT", "B-NP"], ["cat", "NN", "I-NP"], ["sat", "VBD", "B-VP"],
                                            ["on", "IN", "B-PP"], ["the", "DT", "B-NP"], ["mat", "NN", "I-NP"],
                                            [".", ".", "O"]]


def test_the_shipped_chain_on_raw_text_gives_the_chunks_of_the_spacy_pipeline_of_en_chunker_cfg():
    """`gpseq tag models/en_pos_conll2000 models/en_chunk_conll2000 example.txt` and pipelines/en_chunker.cfg
    (spaCy's blank English tokenizer and sentencizer, the same two models as components) on the same lines of raw
    text: the same tokens, POS tags, chunks and p(chunk label), token by token. Both tokenise with
    `spacy.blank("en")` and a sentencizer, a line at a time (the pipeline is given each line)."""
    spacy = pytest.importorskip("spacy")
    from gpseq.corpora import spans

    pos, chunk = ROOT / "models" / "en_pos_conll2000", ROOT / "models" / "en_chunk_conll2000"
    if not (pos / "tagger.json").is_file() or not (chunk / "tagger.json").is_file():
        pytest.skip("the shipped models are absent")
    text = ROOT / "corpora" / "sample" / "example.txt"
    result = invoke("tag", pos, chunk, text)
    assert result.exit_code == 0, result.stderr
    chain = parse_conll_output(result.stdout)

    config = spacy.util.load_config(ROOT / "pipelines" / "en_chunker.cfg",
                                    overrides={"paths.pos_model": str(pos), "paths.chunk_model": str(chunk)})
    nlp = spacy.util.load_model_from_config(config, auto_fill=True)
    lines = [line for line in text.read_text(encoding="utf-8").splitlines() if line.strip()]
    sents = [sent for doc in nlp.pipe(lines) for sent in doc.sents]
    assert len(sents) == len(chain) == 10
    for rows, sent in zip(chain, sents):
        assert [row[0] for row in rows] == [t.text for t in sent]
        assert [row[1] for row in rows] == [t.tag_ for t in sent]
        pipeline_chunks = [(s.label_, s.start - sent.start, s.end - sent.start) for s in sent.doc.spans["chunks"]
                           if sent.start <= s.start < sent.end]
        assert spans([row[2] for row in rows]) == pipeline_chunks
        assert [float(row[3]) for row in rows] == \
               pytest.approx([t._.chunk_probs[row[2]] for row, t in zip(rows, sent)], rel=1e-5)  # 6 digits printed
