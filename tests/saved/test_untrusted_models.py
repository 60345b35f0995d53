"""A model directory from a stranger is data: loading it imports no code it names.

A crafted model names a plug-in likelihood (`config.model.likelihood = "package.module:function"`,
the manifest dropped as a pre-manifest model has none). Every command that loads a model refuses it
with one line naming the plug-in and exit 3, and nothing the name points at runs: a `payload.py`
beside the model (the working directory of `python -m gpseq`) or inside it would create a sentinel
file, `venv.__main__:main` would turn the model directory into a virtualenv (`pyvenv.cfg`), and
`antigravity:geohash` would open a browser, which `BROWSER` turns into a command creating a
sentinel. The user's own plug-ins still load: allowed by name (`--allow-plugin`,
`Tagger.load(likelihoods=…)`) or registered in their environment (tests/structured/test_likelihood_plugins.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.files import snapshot
from helpers.tiny_model import corpus, model  # noqa: F401  (the tiny model fixtures)

ATTACKS = ["venv.__main__:main", "antigravity:geohash", "payload:run", "payload_in_model.payload:run"]
PAYLOAD = "import pathlib\npathlib.Path({sentinel!r}).write_text('ran')\ndef run(*args):\n    return 0.0\n"


def craft(model_dir: Path, target: Path, likelihood: str) -> Path:
    """A copy of `model_dir` at `target` whose tagger.json names `likelihood` (no manifest), with a
    `payload.py` beside it and a package `payload_in_model/` inside it that write sentinels when run."""
    shutil.copytree(model_dir, target)
    meta = json.loads((target / "tagger.json").read_text())
    meta.pop("files")
    meta["config"]["model"].update(likelihood=likelihood, estimator="score")
    (target / "tagger.json").write_text(json.dumps(meta, indent=2))
    (target.parent / "payload.py").write_text(PAYLOAD.format(sentinel=str(target.parent / "beside-ran")))
    package = target / "payload_in_model"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "payload.py").write_text(PAYLOAD.format(sentinel=str(target.parent / "inside-ran")))
    return target


def gpseq(args, cwd: Path, **env) -> subprocess.CompletedProcess:
    """`python -m gpseq ARGS` in `cwd` (sys.path as a user's: no tests/ directory on it)."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environment.update(env, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-m", "gpseq", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=environment, timeout=300)


@pytest.mark.parametrize("command", ["info", "tag", "evaluate", "select"])
@pytest.mark.parametrize("likelihood", ATTACKS)
def test_a_model_naming_code_is_refused_without_running_it(model, corpus, tmp_path, likelihood, command):
    crafted = craft(model, tmp_path / "m", likelihood)
    sentinel = tmp_path / "browser-ran"
    text = tmp_path / "notes.txt"
    text.write_text("The committee approved the budget .\n")
    before = snapshot(tmp_path)
    args = {"info": ["info", crafted], "tag": ["tag", crafted, text, "-o", tmp_path / "out.conll"],
            "evaluate": ["evaluate", crafted, corpus], "select": ["select", crafted, text, "-n", "1"]}[command]
    result = gpseq(args, cwd=tmp_path, BROWSER=f"touch {sentinel}")
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {crafted / 'tagger.json'}: ") and repr(likelihood) in lines[0]
    assert f"--allow-plugin {likelihood}" in lines[0]
    assert snapshot(tmp_path) == before  # no sentinel, no pyvenv.cfg, no output, the model unchanged
    assert result.stdout == ""


def test_refusal_is_quick_and_small(model, tmp_path):
    """The refusal happens before TensorFlow or the arrays are loaded: peak RSS of `gpseq info` on a
    crafted model under 300 MB."""
    crafted = craft(model, tmp_path / "m", "venv.__main__:main")
    code = ("import resource, subprocess, sys; "
            f"r = subprocess.run([sys.executable, '-m', 'gpseq', 'info', {str(crafted)!r}], capture_output=True); "
            "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    returncode, peak_kib = map(int, out.stdout.split())
    assert returncode == 3
    assert peak_kib < 300 * 1024, peak_kib


def test_tagger_load_refuses_and_accepts_what_the_user_gives(model, tmp_path, monkeypatch):
    """In-process, with the model's parent first on sys.path (a script run from there): refused, the
    payload not imported; given `likelihoods={name: function}` by the user, the model loads with it."""
    from gpseq.errors import ModelFormatError
    from gpseq.tagger import Tagger

    crafted = craft(model, tmp_path / "m", "payload:run")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelFormatError, match=r"names the plug-in likelihood 'payload:run'.*likelihoods="):
        Tagger.load(crafted)
    assert "payload" not in sys.modules and not (tmp_path / "beside-ran").exists()

    def mine(labels, unary, pairwise, lengths):
        return unary.sum(axis=(-1, -2))

    tagger = Tagger.load(crafted, likelihoods={"payload:run": mine})
    assert tagger.config.model.likelihood == "payload:run"
    assert not (tmp_path / "beside-ran").exists()


def test_spacy_component_refuses_a_model_naming_code(model, tmp_path, monkeypatch):
    spacy = pytest.importorskip("spacy")
    from gpseq.errors import ModelFormatError

    crafted = craft(model, tmp_path / "m", "payload:run")
    monkeypatch.syspath_prepend(str(tmp_path))
    nlp = spacy.blank("en")
    with pytest.raises(ModelFormatError, match="names the plug-in likelihood 'payload:run'"):
        nlp.add_pipe("gpseq", config={"model": str(crafted)})
        nlp("The budget .")
    assert not (tmp_path / "beside-ran").exists()


def test_python_m_gpseq_does_not_import_from_the_working_directory(tmp_path):
    """A module in the working directory named like one gpseq imports after start-up (`rich`, which
    every command's output uses) is not imported by `python -m gpseq` in its place."""
    (tmp_path / "rich.py").write_text(PAYLOAD.format(sentinel=str(tmp_path / "shadow-ran")))
    result = gpseq(["--help"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "shadow-ran").exists()



@pytest.mark.parametrize("payload", [
    b"\x00\x01garbage",  # not msgpack
    b"\x93\x01\x02",  # msgpack, not a map
    "map-without-files", "files-not-a-map", "file-content-not-bytes", "name-not-a-string", "escaping-name",
    "too-many-files",
])
def test_spacy_component_from_bytes_refuses_malformed_payloads_in_one_line(model, tmp_path, payload):
    """Bytes handed to the spaCy component (`nlp.from_bytes`) are data: anything but a gpseq
    component's payload is a one-line ModelFormatError, no traceback of msgpack or KeyError, and no
    file written outside the component's temporary directory."""
    spacy = pytest.importorskip("spacy")
    import srsly

    from gpseq.errors import ModelFormatError

    good = {"format": "gpseq-component", "files": {"tagger.json": b"{}"}}
    crafted = {
        "map-without-files": {"format": "gpseq-component"},
        "files-not-a-map": {**good, "files": [1, 2]},
        "file-content-not-bytes": {**good, "files": {"tagger.json": 3}},
        "name-not-a-string": {**good, "files": {7: b"x"}},
        "escaping-name": {**good, "files": {"../../escaped.txt": b"x"}},
        "too-many-files": {**good, "files": {f"f{i}": b"x" for i in range(100)}},
    }
    data = payload if isinstance(payload, bytes) else srsly.msgpack_dumps(crafted[payload])
    nlp = spacy.blank("en")
    component = nlp.add_pipe("gpseq", config={"model": str(model)})
    before = snapshot(tmp_path)
    with pytest.raises(ModelFormatError) as caught:
        component.from_bytes(data)
    assert "\n" not in str(caught.value) and "gpseq component" in str(caught.value)
    assert snapshot(tmp_path) == before
