"""The annotation-tool outputs (`gpseq.active.annotation`) against the fields Prodigy and Label Studio
document: what `gpseq select` writes imports into both, small scores keep their digits, and Label
Studio's model version names the model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.active import cli_model, run_select, saved  # noqa: F401


def check_prodigy_task(task: dict) -> None:
    """The fields of Prodigy's task format for ner_manual / spans_manual: text; tokens with text,
    start, end (character offsets into text), id (0, 1, …) and ws; spans with start, end,
    token_start, token_end (inclusive) and label, aligned with the tokens; meta of scalars."""
    assert isinstance(task["text"], str) and task["text"]
    tokens = task["tokens"]
    for i, token in enumerate(tokens):
        assert set(token) >= {"text", "start", "end", "id", "ws"}
        assert token["id"] == i and isinstance(token["ws"], bool)
        assert task["text"][token["start"]:token["end"]] == token["text"]
        if i + 1 < len(tokens):
            assert tokens[i + 1]["start"] == token["end"] + (1 if token["ws"] else 0)
    for span in task["spans"]:
        assert set(span) >= {"start", "end", "token_start", "token_end", "label"}
        assert isinstance(span["label"], str) and span["label"]
        assert 0 <= span["token_start"] <= span["token_end"] < len(tokens)
        assert span["start"] == tokens[span["token_start"]]["start"]
        assert span["end"] == tokens[span["token_end"]]["end"]
        assert span["text"] == task["text"][span["start"]:span["end"]]
        assert 0.0 <= span["score"] <= 1.0
    assert all(isinstance(v, (str, int, float)) for v in task["meta"].values())
    assert isinstance(task["meta"]["score"], float)


def check_labelstudio_tasks(tasks: list, from_name="label", to_name="text") -> None:
    """Label Studio's import format with pre-annotations ("Import pre-annotated data"): a list of
    tasks, each {"data": {...the Text object's value key...}, "predictions": [{"model_version",
    "score", "result": [{"id", "from_name", "to_name", "type": "labels", "value": {"start", "end",
    "text", "labels": [...], "score"}}]}]}; result ids unique."""
    assert isinstance(tasks, list) and tasks
    ids = set()
    for task in tasks:
        text = task["data"][to_name]
        assert isinstance(text, str) and text
        for prediction in task["predictions"]:
            assert isinstance(prediction["model_version"], str)
            assert 0.0 <= prediction["score"] <= 1.0
            for region in prediction["result"]:
                assert region["from_name"] == from_name and region["to_name"] == to_name
                assert region["type"] == "labels"
                assert region["id"] not in ids
                ids.add(region["id"])
                value = region["value"]
                assert 0 <= value["start"] < value["end"] <= len(text)
                assert text[value["start"]:value["end"]] == value["text"]
                assert isinstance(value["labels"], list) and len(value["labels"]) == 1
                assert 0.0 <= value["score"] <= 1.0


def test_select_command_writes_what_prodigy_and_label_studio_import(cli_model):
    model, pool, base = cli_model
    out = base / "tasks.jsonl"
    result = run_select(model, pool, "-n", 3, "--format", "prodigy", "-o", out)
    assert result.exit_code == 0, result.output
    tasks = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(tasks) == 3
    for task in tasks:
        check_prodigy_task(task)
    assert [t["meta"]["rank"] for t in tasks] == [1, 2, 3]
    assert [t["meta"]["score"] for t in tasks] == sorted((t["meta"]["score"] for t in tasks), reverse=True)
    out = base / "tasks.json"
    result = run_select(model, pool, "-n", 3, "--format", "labelstudio", "-o", out, "--strategy", "margin")
    assert result.exit_code == 0, result.output
    check_labelstudio_tasks(json.loads(out.read_text(encoding="utf-8")))
    # the span scores are the exact span probabilities of Tagger.tag of the task's tokens
    from gpseq.tagger import Tagger

    tagger = Tagger.load(model)
    for task in tasks:
        tagged = tagger.tag([[token["text"] for token in task["tokens"]]])[0]
        assert [(s["label"], s["token_start"], s["token_end"] + 1) for s in task["spans"]] == [
            span[:3] for span in tagged.spans]
        assert [s["score"] for s in task["spans"]] == pytest.approx([span[3] for span in tagged.spans], abs=1e-5)


def test_tool_outputs_keep_small_scores():
    """Prodigy's meta score and Label Studio's gpseq_score and prediction score were rounded to 6
    decimals: a BALD score of a confident model (1e-6 and below) and P(labels | X) of a long sentence
    came out 0.0 for every task, their order lost. They keep 6 significant digits."""
    from types import SimpleNamespace

    from gpseq.active.annotation import labelstudio_task, prodigy_task
    from gpseq.active.selection import Selected
    from gpseq.corpora.types import Sentence

    sentence = Sentence(tokens=["Acme", "rose", "."])
    tagged = SimpleNamespace(tokens=sentence.tokens, labels=["B-NP", "B-VP", "O"], confidences=[0.9, 0.8, 1.0],
                             spans=[("NP", 0, 1, 3.5e-8), ("VP", 1, 2, 0.75)], sequence_log_prob=-30.0)
    item = Selected(0, sentence, 3.25e-9, tagged)
    task = prodigy_task(item, 1, "bald", "iob2")
    assert task["meta"]["score"] == pytest.approx(3.25e-9, rel=1e-5)
    assert [span["score"] for span in task["spans"]] == pytest.approx([3.5e-8, 0.75], rel=1e-5)
    task = labelstudio_task(item, 1, "bald", "iob2", model_version="m")
    assert task["data"]["gpseq_score"] == pytest.approx(3.25e-9, rel=1e-5)
    assert task["predictions"][0]["score"] == pytest.approx(np.exp(-30.0), rel=1e-5)
    assert [r["value"]["score"] for r in task["predictions"][0]["result"]] == pytest.approx([3.5e-8, 0.75], rel=1e-5)


def test_label_studio_model_version_names_the_model_given_as_dot(saved, tmp_path, monkeypatch):
    """model_version defaults to the model directory's name, but `gpseq select . pool` (run inside
    the model directory) wrote "" (Path(".").name): every round's predictions under one blank version."""
    from typer.testing import CliRunner

    from gpseq.cli import app

    directory, _ = saved
    pool = tmp_path / "pool.conll"
    pool.write_text("Shares NNS\nrose VBD\n. .\n", encoding="utf-8")
    out = tmp_path / "tasks.json"
    monkeypatch.chdir(directory)
    result = CliRunner().invoke(app, ["select", ".", str(pool), "-n", "1", "--format", "labelstudio", "-o", str(out)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text(encoding="utf-8"))[0]["predictions"][0]["model_version"] == directory.name
