"""`nlp.to_disk` with the gpseq component (gpseq/spacy/component.py): it replaces only a model
directory gpseq wrote, atomically, and copies only what gpseq wrote. The tiny model of
`helpers.tiny_model` is trained once for the module."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from helpers.files import snapshot
from helpers.tiny_model import copy, corpus, model  # noqa: F401


def _component_nlp(model_dir: Path, name: str = "chunker"):
    spacy = pytest.importorskip("spacy")
    nlp = spacy.blank("en")
    nlp.add_pipe("gpseq", name=name, config={"model": str(model_dir), "extension": f"{name}_probs",
                                             "span_extension": f"{name}_prob"})
    return nlp


@pytest.mark.parametrize("loaded", [False, True], ids=["copied", "saved"])
@pytest.mark.parametrize("case", ["foreign-file", "not-a-model", "changed-file", "symlink"])
def test_component_to_disk_refuses_to_replace_what_gpseq_did_not_write(model, tmp_path, case, loaded):
    """<pipeline>/<component>/model already there and not (only) what gpseq wrote: OutputError naming
    it and the problem, every file around unchanged, no temporary left; the model not yet loaded
    (copied) or loaded (saved by Tagger.save) alike."""
    from gpseq.errors import OutputError

    nlp = _component_nlp(model)
    if loaded:
        assert nlp.get_pipe("chunker").tagger is not None
    pipeline = tmp_path / "pipeline"
    nlp.to_disk(pipeline)
    target = pipeline / "chunker" / "model"
    problem = {"foreign-file": "holds thesis.tex, which gpseq did not write",
               "not-a-model": "exists and is not a gpseq model directory (no tagger.json)",
               "changed-file": "holds arrays.npz, changed since gpseq wrote it",
               "symlink": "is a symbolic link"}[case]
    if case == "foreign-file":
        (target / "thesis.tex").write_text("years of work\n")
    elif case == "not-a-model":
        shutil.rmtree(target)
        target.mkdir()
        (target / "thesis.tex").write_text("years of work\n")
    elif case == "changed-file":
        with open(target / "arrays.npz", "ab") as handle:
            handle.write(b"appended")
    else:
        elsewhere = tmp_path / "elsewhere"
        shutil.move(target, elsewhere)
        target.symlink_to(elsewhere, target_is_directory=True)
    before = snapshot(tmp_path)
    with pytest.raises(OutputError) as caught:
        nlp.to_disk(pipeline)
    assert str(caught.value).splitlines()[0].startswith(f"{target}: {problem}"), str(caught.value)
    assert snapshot(tmp_path) == before


def test_component_to_disk_replaces_its_own_model_and_copies_only_what_gpseq_wrote(copy, tmp_path):
    """A second to_disk replaces the model directory the first wrote (the rest of the pipeline
    directory untouched); a foreign file in the source model directory is not copied; the
    result loads with spaCy and has the source model's files, byte for byte."""
    spacy = pytest.importorskip("spacy")
    source = copy("source")
    (source / "my-notes.txt").write_text("not part of the model\n")
    nlp = _component_nlp(source)
    pipeline = tmp_path / "pipeline"
    nlp.to_disk(pipeline)
    (pipeline / "chunker" / "README.txt").write_text("mine\n")  # beside the model: not gpseq's to touch
    nlp.to_disk(pipeline)
    target = pipeline / "chunker" / "model"
    want = {name: digest for name, digest in snapshot(source).items() if name != "my-notes.txt"}
    assert snapshot(target) == want
    assert (pipeline / "chunker" / "README.txt").read_text() == "mine\n"
    assert sorted(p.name for p in (pipeline / "chunker").iterdir()) == ["README.txt", "model"]
    loaded = spacy.load(pipeline)
    assert loaded.get_pipe("chunker").labels == nlp.get_pipe("chunker").labels
