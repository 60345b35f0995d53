"""The spaCy component among others in a pipeline: whitespace-only Docs in a POS → chunker pipeline,
span and token extensions already registered by someone else or by a second component, the entities
of an earlier entity_ruler, a later component merging tokens, and settings out of range."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.sample_models import models  # noqa: F401

spacy = pytest.importorskip("spacy")


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
