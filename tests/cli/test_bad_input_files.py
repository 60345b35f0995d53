"""Bad input files to `train`, `tag` and `evaluate` (ragged columns, wrong encodings, binary data, a
missing column, an empty file): one line `error: FILE:LINE: problem`, nothing written; a byte-order
mark and CRLF line ends are read as plain lines. The tiny model of `helpers.tiny_model` is trained
once for the module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.cli import invoke, one_line
from helpers.files import sha, snapshot
from helpers.tiny_model import TINY, corpus, model  # noqa: F401


PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


# case → (file content, {command: (line named, problem)}); a command absent here accepts the file
BAD_INPUTS = {
    "ragged columns": (b"The DT B-NP\ncat NN\n\n",
                       dict.fromkeys(["train", "tag", "evaluate"], (2, "2 column(s), expected 3 (as on line 1)"))),
    "latin-1 bytes": ("The DT B-NP\ncaf\xe9 NN I-NP\n\n".encode("latin-1"),
                      dict.fromkeys(["train", "tag", "evaluate"], (2, "bytes b'\\xe9' at byte 4 are not valid utf-8"))),
    "utf-16": ("The DT B-NP\n\n".encode("utf-16"),
               dict.fromkeys(["train", "tag", "evaluate"], (1, "bytes b'\\xff' at byte 1 are not valid utf-8"))),
    "binary (png)": (PNG, dict.fromkeys(["train", "tag", "evaluate"], (1, "bytes b'\\x89' at byte 1 are not valid utf-8"))),
    "label column missing": (b"The\ncat\n\n", dict.fromkeys(["train", "evaluate"], (1, "label column missing"))),
    "empty file": (b"", dict.fromkeys(["train", "evaluate"], (None, "no sentences in the file"))),
    "blank lines only": (b"\n \n\t\n", dict.fromkeys(["train", "evaluate"], (None, "no sentences in the file"))),
    "token column missing": (b"The DT B-NP\n\n", {"tag": (1, "token column 5 missing")}),
}


def _command(command: str, model_dir: Path, path: Path, out: Path) -> list:
    if command == "train":
        return ["train", path, "-o", out, *TINY]
    extra = ["--token-column", "5"] if path.name.startswith("token-column") else []
    if command == "tag":
        return ["tag", model_dir, path, "-o", out, "--mean", *extra]
    return ["evaluate", model_dir, path, "--mean"]


@pytest.mark.parametrize("case, command", [(case, command) for case, (_, errors) in BAD_INPUTS.items()
                                           for command in ("train", "tag", "evaluate")
                                           if command in errors or command == "tag"])
def test_bad_input_files_are_one_line_errors(model, tmp_path, case, command):
    """Ragged columns, wrong encodings, binary data, a missing column, an empty file: exit 2 and one
    line `error: FILE:LINE: problem` (no line for a file without sentences), nothing written; or,
    where the command does not need what is missing, exit 0 (the input unchanged either way)."""
    content, errors = BAD_INPUTS[case]
    path = tmp_path / (case.replace(" ", "-").replace("(", "").replace(")", "") + ".conll")
    path.write_bytes(content)
    out = tmp_path / ("model" if command == "train" else "out.conll")
    before = snapshot(tmp_path)
    result = invoke(*_command(command, model, path, out))
    if command not in errors:
        assert result.exit_code == 0, result.stderr
        assert sha(path) == before[path.name]
        return
    line, problem = errors[command]
    assert result.exit_code == 2, result.stderr
    where = f"{path}:{line}" if line is not None else f"{path}"
    assert one_line(result).startswith(f"error: {where}: {problem}"), one_line(result)
    assert snapshot(tmp_path) == before


def test_bom_and_crlf_are_read_as_plain_lines(model, tmp_path):
    """A UTF-8 byte-order mark and CRLF line ends: the tokens are the words (no U+FEFF, no CR), for
    tag and evaluate, and the input is unchanged."""
    path = tmp_path / "windows.conll"
    path.write_bytes("\ufeffThe DT B-NP\r\ncommittee NN I-NP\r\n\r\napproved VBD B-VP\r\n\r\n".encode("utf-8"))
    before = sha(path)
    out = tmp_path / "out.jsonl"
    result = invoke("tag", model, path, "-o", out, "--format", "jsonl", "--mean")
    assert result.exit_code == 0, result.stderr
    records = [json.loads(row) for row in out.read_text(encoding="utf-8").splitlines()]
    assert [r["tokens"] for r in records] == [["The", "committee"], ["approved"]]
    assert [r["line"] for r in records] == [1, 4]
    result = invoke("evaluate", model, path, "--mean", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["n_sentences"], report["n_tokens"], report["n_gold_chunks"]) == (2, 3, 2)
    assert report["n_unseen_gold_tokens"] == 0  # the labels have no CR left on them
    assert sha(path) == before
