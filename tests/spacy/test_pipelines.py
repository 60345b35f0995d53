"""Edge cases of the spaCy component and of `gpseq evaluate`: whitespace-only Docs in a POS → chunker
pipeline, span extensions already registered by someone else, option errors of the command."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import train_sample_pos_and_chunker

spacy = pytest.importorskip("spacy")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    """Tiny models trained on the bundled sample: a POS tagger (column 1) and a chunker (POS features)."""
    from gpseq.structured.model import ModelConfig

    return train_sample_pos_and_chunker(tmp_path_factory.mktemp("review_models"), ModelConfig(kernel="linear"))


def _pipeline(models, **chunk_config):
    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    nlp.add_pipe("gpseq", name="pos", config={"model": str(models["pos"]), "extension": "pos_probs", "mean": True})
    nlp.add_pipe("gpseq", name="chunker", config={"model": str(models["chunk"]), "mean": True, **chunk_config})
    return nlp


def test_a_whitespace_only_doc_passes_through_a_pos_then_chunker_pipeline(models):
    """The POS tagger has no token to tag in "   \\n\\n ", so it sets no TAG; the chunker took that for a
    missing POS component and raised, stopping `nlp.pipe` over a corpus at its first blank text."""
    nlp = _pipeline(models)
    texts = ["The company said sales fell .", "   \n\n ", "", "Profits rose ."]
    docs = list(nlp.pipe(texts, batch_size=2))
    blank = docs[1]
    assert len(blank) > 0 and all(token.is_space for token in blank)
    assert list(blank.spans["gpseq"]) == []
    assert all(token.tag_ == "" and token._.gpseq_probs is None and token._.pos_probs is None for token in blank)
    for text, doc in zip(texts, docs):  # the other Docs as when tagged alone
        alone = nlp(text) if text.strip() else None
        if alone is not None:
            assert [t.tag_ for t in doc] == [t.tag_ for t in alone]
            assert [(s.start, s.end, s.label_) for s in doc.spans["gpseq"]] == \
                   [(s.start, s.end, s.label_) for s in alone.spans["gpseq"]]
    # A Doc with words and no POS component before the chunker is still the clear error.
    from gpseq.errors import ConfigError

    alone = spacy.blank("en")
    alone.add_pipe("gpseq", config={"model": str(models["chunk"])})
    with pytest.raises(ConfigError, match="TAG"):
        alone("The cat sat .")


@pytest.mark.parametrize("how", [{"getter": lambda span: 1.0}, {"method": lambda span: 1.0},
                                 {"default": 0.5}])
def test_a_span_extension_someone_else_set_is_refused(models, how):
    """A Span extension of that name with a getter or method (not only a default) was accepted: the
    component then wrote its probabilities where `span._.<name>` never reads them (the other getter
    answered 1.0 for every span)."""
    from spacy.tokens import Span

    from gpseq.errors import ConfigError

    name = f"review_span_prob_{next(iter(how))}"
    Span.set_extension(name, **how)
    try:
        with pytest.raises(ConfigError, match=name):
            _pipeline(models, span_extension=name)
    finally:
        Span.remove_extension(name)
    # Ours, registered once, is shared by a second component with the same setting.
    nlp = _pipeline(models, span_extension="review_span_prob")
    nlp.add_pipe("gpseq", name="chunker2", config={"model": str(models["chunk"]), "mean": True,
                                                    "spans_key": "other", "span_extension": "review_span_prob",
                                                    "extension": "chunk2_probs"})
    doc = nlp("The company said sales fell sharply .")
    assert len(doc.spans["gpseq"]) > 0
    assert all(0.0 < span._.review_span_prob <= 1.0 for span in doc.spans["other"])


@pytest.mark.parametrize("samples", ["-2", "0"])
def test_evaluate_refuses_a_non_positive_samples_in_one_line(models, tmp_path, samples):
    """`gpseq evaluate --samples -2` ended in a TensorFlow traceback ("Dimension -2 must be >= 0") and
    exit 1; `--samples 0` silently used the model's default draws. Now one line and exit 4, as `tag`."""
    from typer.testing import CliRunner

    from gpseq import cli

    corpus = tmp_path / "test.conll"
    corpus.write_text("The DT B-NP\ncat NN I-NP\nsat VBD B-VP\n\n", encoding="utf-8")
    before = corpus.read_bytes()
    result = CliRunner().invoke(cli.app, ["evaluate", str(models["chunk"]), str(corpus), "--samples", samples])
    assert result.exit_code == 4, result.output
    lines = result.output.strip().splitlines()
    assert lines == [f"error: --samples must be in [1, 1,000] (Monte Carlo draws; memory grows with them); "
                     f"got {samples}"]
    assert corpus.read_bytes() == before


def test_evaluate_refuses_bins_below_one_before_tagging(models, tmp_path):
    """`--bins 0` failed only after the whole corpus was tagged, with "n_bins must be >= 1" (no option
    named); now at once, naming --bins."""
    from typer.testing import CliRunner

    from gpseq import cli

    corpus = tmp_path / "test.conll"
    corpus.write_text("The DT B-NP\ncat NN I-NP\n\n", encoding="utf-8")
    result = CliRunner().invoke(cli.app, ["evaluate", str(models["chunk"]), str(corpus), "--bins", "0"])
    assert result.exit_code == 4, result.output
    assert result.output.strip().splitlines() == ["error: --bins must be in [1, 10,000]; got 0"]


def test_report_reliability_diagram_uses_the_report_bins(tmp_path, monkeypatch):
    """A report made with n_bins=10 drew its diagram with 15 bins unless told again: the 10 bins'
    mean confidences were re-binned, and the plot's ECE was not the report's. Hand-computed: two
    tokens, p(returned) 0.48 (correct) and 0.52 (wrong), lie in 10-bin bins (0.4, 0.5] and (0.5, 0.6],
    ECE = ½·|1 − 0.48| + ½·|0 − 0.52| = 0.52 (15 bins would merge them: ECE 0)."""
    import gpseq.evaluation.evaluate as evaluate_module
    from gpseq.evaluation.metrics import expected_calibration_error

    probabilities = [np.array([[0.48, 0.52], [0.48, 0.52]])]
    report = evaluate_module.evaluate([["A", "A"]], [["A", "B"]], labels=["A", "B"], probabilities=probabilities,
                                      scheme=None, n_bins=10)
    assert report.ece == pytest.approx(0.52, abs=1e-12)
    seen = {}

    def spy(confidence, correct, path, n_bins=15, **_):
        seen["ece"] = expected_calibration_error(confidence, correct, n_bins)
        return path

    monkeypatch.setattr(evaluate_module, "reliability_diagram", spy)
    report.reliability_diagram(tmp_path / "r.png")
    assert seen["ece"] == pytest.approx(0.52, abs=1e-12)


def test_ents_task_keeps_the_entities_of_an_earlier_entity_ruler(models):
    """`task: ents` replaced doc.ents wholesale, deleting what an entity_ruler before it had set
    (spaCy's own ner keeps them). Now the ruler's entities stay and the predicted chunks that do not
    overlap them are added: those of the same pipeline's `spans` output, minus the overlapping ones."""
    text = "The company said sales fell sharply in the third quarter ."
    reference = _pipeline(models)(text)  # task spans: every predicted chunk
    chunks = [(s.start, s.end, s.label_) for s in reference.spans["gpseq"]]
    ruled = next(c for c in chunks if c[1] - c[0] >= 2)  # a multi-token chunk; the ruler claims its last token
    nlp = _pipeline(models, task="ents", span_extension="review_ent_prob")
    ruler = nlp.add_pipe("entity_ruler", before="chunker")
    word = reference[ruled[1] - 1].text
    ruler.add_patterns([{"label": "RULED", "pattern": word}])
    doc = nlp(text)
    got = [(e.start, e.end, e.label_) for e in doc.ents]
    from_ruler = [(t.i, t.i + 1, "RULED") for t in doc if t.text == word]
    taken = {i for start, end, _ in from_ruler for i in range(start, end)}
    expected = sorted(from_ruler + [c for c in chunks if not taken & set(range(c[0], c[1]))])
    assert got == expected
    assert ruled not in got
    assert all((e._.review_ent_prob is None) == (e.label_ == "RULED") for e in doc.ents)


def test_token_probabilities_follow_the_tokens_when_a_later_component_merges_some(models):
    """`merge_entities` after the component shifted token indices, and `token._.<extension>` read the
    row of whatever token used to have that index: 'said' got the distribution of 'company'. Each
    unmerged token must keep the distribution of the token with the same characters in the Doc before
    merging; a merged token has none."""
    from gpseq.spacy.extensions import token_probabilities

    text = "The company said sales fell sharply in the third quarter .  Profits rose ."
    plain = _pipeline(models, task="ents")
    reference = {(t.idx, len(t)): t._.pos_probs for t in plain(text)}
    merging = _pipeline(models, task="ents")
    merging.add_pipe("merge_entities")
    doc = merging(text)
    assert any(len(t) > len(t.text.split()[0]) for t in doc)  # something was merged
    labels, rows = token_probabilities(doc, "pos_probs")
    assert rows.shape == (len(doc), len(labels))
    for token in doc:
        expected = reference.get((token.idx, len(token)))
        assert token._.pos_probs == expected, token.text
        if expected is None:
            assert np.isnan(rows[token.i]).all()
        else:
            np.testing.assert_array_equal(rows[token.i], list(expected.values()))


def test_evaluate_plot_never_replaces_a_pipe_and_writes_through_a_symlink(models, tmp_path):
    """`--plot` wrote by renaming a temporary file onto the path: a FIFO (or a device such as
    /dev/null) given there was replaced by a regular file, and a symlink by a file while its target
    kept the old image. Now a pipe or device is refused in one line before any work, and a symlink
    is written through (the link kept), as `-o` does."""
    import os
    import stat

    from typer.testing import CliRunner

    from gpseq import cli
    from gpseq.cli.outputs import PNG_SIGNATURE

    corpus = tmp_path / "test.conll"
    corpus.write_text("The DT B-NP\ncat NN I-NP\nsat VBD B-VP\n\n", encoding="utf-8")
    fifo = tmp_path / "fifo.png"
    os.mkfifo(fifo)
    result = CliRunner().invoke(cli.app, ["evaluate", str(models["chunk"]), str(corpus), "--plot", str(fifo)])
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        f"error: {fifo}: is not a regular file (a device or a pipe); --plot writes a PNG file there"]

    real = tmp_path / "images" / "real.png"
    real.parent.mkdir()
    real.write_bytes(PNG_SIGNATURE)  # an earlier (stub) image
    link = tmp_path / "link.png"
    link.symlink_to(real)
    result = CliRunner().invoke(cli.app, ["evaluate", str(models["chunk"]), str(corpus), "--plot", str(link)])
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_bytes().startswith(PNG_SIGNATURE) and real.stat().st_size > 1000


def test_two_components_with_the_same_token_extension_are_refused(models):
    """A POS tagger and a chunker both left at the default `extension` wrote their marginals under one
    key: the chunker's replaced the POS tagger's, and `token._.gpseq_probs` silently held chunk labels
    only. Now the second component is a ConfigError naming the first."""
    from gpseq.errors import ConfigError

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    nlp.add_pipe("gpseq", name="pos", config={"model": str(models["pos"])})
    with pytest.raises(ConfigError, match="'pos'"):
        nlp.add_pipe("gpseq", name="chunker", config={"model": str(models["chunk"])})
    nlp.add_pipe("gpseq", name="chunker", config={"model": str(models["chunk"]), "extension": "chunk_probs"})
    doc = nlp("The company said sales fell .")
    assert list(doc[0]._.gpseq_probs) == json.loads((models["pos"] / "tagger.json").read_text())["labels"]
    assert list(doc[0]._.chunk_probs) == json.loads((models["chunk"] / "tagger.json").read_text())["labels"]


@pytest.mark.parametrize("setting, value", [("seed", 2**32), ("seed", -2**31 - 1), ("samples", "4")])
def test_component_refuses_a_seed_outside_int32_and_a_non_integer_samples(models, setting, value):
    """`seed: 4294967296` drew the same Monte Carlo samples as `seed: 0` (the draws' seed is an int32,
    and wraps), with no error; `samples: "4"` ended in a TypeError from a comparison. Both are now a
    ConfigError naming the setting, as `gpseq select --seed` is."""
    from gpseq.errors import ConfigError

    nlp = spacy.blank("en")
    config = {"model": str(models["pos"]), "samples": 3, setting: value}
    with pytest.raises(ConfigError, match=setting):
        nlp.add_pipe("gpseq", name=f"review_{setting}", config={**config, "extension": f"review_{setting}_probs"})
