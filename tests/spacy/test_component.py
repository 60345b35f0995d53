"""The spaCy component `gpseq`: factory by entry point, tags/spans/ents against `Tagger.tag` on the
same tokens, distributions, `nlp.pipe`, to_disk/from_disk and to_bytes round trips, `spacy assemble`
on pipelines/en_chunker.cfg, and (slow) the pretrained CoNLL-2000 models of models/."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from helpers import ROOT
from helpers.sample_models import train_sample_pos_and_chunker

spacy = pytest.importorskip("spacy")


PIPELINE_CFG = ROOT / "pipelines" / "en_chunker.cfg"


PRETRAINED_POS = ROOT / "models" / "en_pos_conll2000"


PRETRAINED_CHUNK = ROOT / "models" / "en_chunk_conll2000"


TEXTS = [
    "The company said sales fell sharply in the third quarter.  Profits rose.",
    "Analysts expect a loss of $ 12 million for the year.\n\nThe board will meet on Tuesday.",
    "It was a quiet day.",
    "Shares of the bank closed at 45 cents , down 2 cents .",
]


def _env() -> dict:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    """Tiny models trained on the bundled sample: a POS tagger (column 1) and a chunker (POS features)."""
    from gpseq.structured.model import ModelConfig

    return train_sample_pos_and_chunker(tmp_path_factory.mktemp("spacy_models"), ModelConfig(kernel="linear+rbf", num_inducing=8))


def _pipeline(models, *, mean=False, chunker=True, **chunk_config):
    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    nlp.add_pipe("gpseq", name="pos", config={"model": str(models["pos"]), "extension": "pos_probs", "mean": mean})
    if chunker:
        config = {"model": str(models["chunk"]), "mean": mean, **chunk_config}
        nlp.add_pipe("gpseq", name="chunker", config=config)
    return nlp


def _reference(tagger, docs, *, mean, columns=None):
    """`Tagger.tag` on the non-space tokens of each sentence (Sentence path: `featurizer.transform`)."""
    from gpseq.corpora import Sentence

    sentences, where = [], []
    for d, doc in enumerate(docs):
        for sent in doc.sents:
            tokens = [t for t in sent if not t.is_space]
            rows = [[t.text, columns(t)] for t in tokens] if columns else [[t.text] for t in tokens]
            sentences.append(Sentence([t.text for t in tokens], columns=rows))
            where.append((d, [t.i for t in tokens]))
    return tagger.tag(sentences, mean=mean), where


def _state(doc, extension: str, key: str = "gpseq"):
    """Everything the components wrote on a Doc, for exact comparisons."""
    probs = doc.user_data[("gpseq", extension)]["probs"]
    spans = [(s.start, s.end, s.label_, s._.gpseq_prob) for s in doc.spans.get(key, [])]
    return [t.tag_ for t in doc], [t.pos_ for t in doc], probs, spans


def test_factory_comes_from_the_entry_point_without_importing_gpseq():
    code = (
        "import sys, spacy\n"
        "nlp = spacy.blank('en')\n"
        "pipe = nlp.add_pipe('gpseq', config={'model': 'nowhere'})\n"
        "assert type(pipe).__module__ == 'gpseq.spacy.component', type(pipe)\n"
        "print('tensorflow imported:', 'tensorflow' in sys.modules)\n"
        "try:\n"
        "    pipe.initialize()\n"
        "except Exception as error:\n"
        "    print(type(error).__name__, error)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=ROOT,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ModelFormatError nowhere: not a gpseq model directory" in result.stdout
    # The model (and TensorFlow) load lazily; nlp.initialize() would import TensorFlow through thinc.
    assert "tensorflow imported: False" in result.stdout


def test_pos_component_matches_tagger_on_the_same_tokens(models):
    nlp = _pipeline(models, mean=True, chunker=False)
    docs = [nlp(text) for text in TEXTS]
    results, where = _reference(models["pos_tagger"], docs, mean=True)
    labels = models["pos_tagger"].labels
    for result, (d, positions) in zip(results, where):
        doc = docs[d]
        assert [doc[i].tag_ for i in positions] == result.labels
        for t, i in enumerate(positions):
            distribution = doc[i]._.pos_probs
            assert list(distribution) == labels
            np.testing.assert_allclose(list(distribution.values()), result.probabilities[t], rtol=1e-5, atol=1e-7)
    from gpseq.spacy.component import UPOS_FROM_PTB

    for doc in docs:
        for token in doc:
            if token.is_space:  # left out of the sequence, untagged
                assert token.tag_ == "" and token._.pos_probs is None
            else:
                assert token.pos_ == UPOS_FROM_PTB[token.tag_]
    assert any(t.is_space for doc in docs for t in doc)  # the texts do exercise whitespace tokens


def test_distributions_sum_to_one_and_span_scores_are_bounded_by_type_marginals(models):
    nlp = _pipeline(models)  # Monte Carlo marginals (the default)
    n_spans = 0
    for doc in nlp.pipe(TEXTS, batch_size=2):
        for token in doc:
            for extension in ("pos_probs", "gpseq_probs"):
                distribution = token._.get(extension)
                if token.is_space:
                    assert distribution is None
                    continue
                values = np.array(list(distribution.values()))
                assert np.all(values >= 0) and abs(values.sum() - 1.0) < 1e-9
        group = doc.spans["gpseq"]
        assert group.attrs["scores"] == [s._.gpseq_prob for s in group]
        assert [(s.start, s.end) for s in group] == sorted((s.start, s.end) for s in group)
        for span in group:  # P(exact span) ≤ P(every token of it has the span's type)
            n_spans += 1
            tokens = [t for t in span if not t.is_space]
            of_type = [sum(t._.gpseq_probs.get(f"{prefix}-{span.label_}", 0.0) for prefix in "BI") for t in tokens]
            assert 0.0 < span._.gpseq_prob <= min(of_type) + 1e-6
    assert n_spans > 10


def test_chunker_reads_the_predicted_pos_of_the_earlier_component(models):
    nlp = _pipeline(models, mean=True)
    docs = list(nlp.pipe(TEXTS))
    results, where = _reference(models["chunk_tagger"], docs, mean=True, columns=lambda t: t.tag_)
    from gpseq.corpora import spans as chunk_spans

    for result, (d, positions) in zip(results, where):
        doc = docs[d]
        expected = [(positions[s], positions[e - 1] + 1, type_, p) for type_, s, e, p in result.spans]
        assert [(t, s, e) for t, s, e, _ in result.spans] == chunk_spans(result.labels)  # exact P(span)
        got = [(s.start, s.end, s.label_, s._.gpseq_prob) for s in doc.spans["gpseq"]
               if positions[0] <= s.start < positions[-1] + 1]
        assert [g[:3] for g in got] == [e[:3] for e in expected]
        np.testing.assert_allclose([g[3] for g in got], [e[3] for e in expected], rtol=1e-5)
    # Without the POS tagger the chunker's POS features would be empty: a clear error, not garbage.
    alone = spacy.blank("en")
    alone.add_pipe("gpseq", config={"model": str(models["chunk"])})
    from gpseq.errors import ConfigError

    with pytest.raises(ConfigError, match="TAG"):
        alone("The cat sat .")


def test_pipe_batches_equal_single_calls_and_ents_task(models):
    nlp = _pipeline(models, mean=True)
    piped = list(nlp.pipe(TEXTS * 3, batch_size=5))
    single = [nlp(text) for text in TEXTS * 3]
    for a, b in zip(piped, single):
        tags_a, pos_a, probs_a, spans_a = _state(a, "gpseq_probs")
        tags_b, pos_b, probs_b, spans_b = _state(b, "gpseq_probs")
        assert tags_a == tags_b and pos_a == pos_b
        assert [s[:3] for s in spans_a] == [s[:3] for s in spans_b]
        np.testing.assert_allclose(probs_a, probs_b, rtol=1e-5, atol=1e-7)
    ents = _pipeline(models, mean=True, task="ents", span_extension="ent_prob")
    for doc, reference in zip(ents.pipe(TEXTS), single):
        assert [(e.start, e.end, e.label_) for e in doc.ents] == [(s.start, s.end, s.label_)
                                                                   for s in reference.spans["gpseq"]]
        assert all(0.0 < e._.ent_prob <= 1.0 for e in doc.ents)


def test_to_disk_and_load_round_trip_without_the_original_models(models, tmp_path):
    copies = {}
    for name in ("pos", "chunk"):
        copies[name] = tmp_path / f"copy_{name}"
        shutil.copytree(models[name], copies[name])
    nlp = _pipeline(copies)  # Monte Carlo marginals: seeded, so repeatable
    before = [_state(doc, "gpseq_probs") for doc in nlp.pipe(TEXTS)]
    nlp.to_disk(tmp_path / "pipeline")
    for path in copies.values():
        shutil.rmtree(path)
    loaded = spacy.load(tmp_path / "pipeline")
    assert loaded.pipe_names == ["sentencizer", "pos", "chunker"]
    after = [_state(doc, "gpseq_probs") for doc in loaded.pipe(TEXTS)]
    for (t1, p1, probs1, s1), (t2, p2, probs2, s2) in zip(before, after):
        assert t1 == t2 and p1 == p2 and s1 == s2
        np.testing.assert_array_equal(probs1, probs2)
    restored = _pipeline(models)
    restored.from_bytes(loaded.to_bytes())
    again = [_state(doc, "gpseq_probs") for doc in restored.pipe(TEXTS)]
    for (t1, _, probs1, s1), (t2, _, probs2, s2) in zip(before, again):
        assert t1 == t2 and s1 == s2
        np.testing.assert_array_equal(probs1, probs2)


def test_one_token_doc(models):
    nlp = _pipeline(models, chunker=False)
    doc = nlp("Hello")
    assert doc[0].tag_ in models["pos_tagger"].labels
    assert abs(sum(doc[0]._.pos_probs.values()) - 1.0) < 1e-9


def test_config_errors(models):
    from gpseq.errors import ConfigError

    nlp = spacy.blank("en")
    with pytest.raises(ConfigError, match="task"):
        nlp.add_pipe("gpseq", config={"model": str(models["pos"]), "task": "parse"})
    pipe = nlp.add_pipe("gpseq", name="p2", config={"model": str(models["pos"]), "task": "spans"})
    with pytest.raises(ConfigError, match="chunk labels"):
        pipe.initialize()
        pipe.tagger  # noqa: B018


def test_spacy_assemble_en_chunker_cfg_then_load(models, tmp_path):
    """`spacy assemble pipelines/en_chunker.cfg` (tiny models via --paths overrides) → spacy.load works."""
    out = tmp_path / "en_chunker"
    result = subprocess.run(
        [sys.executable, "-m", "spacy", "assemble", str(PIPELINE_CFG), str(out),
         "--paths.pos_model", str(models["pos"]), "--paths.chunk_model", str(models["chunk"])],
        capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    nlp = spacy.load(out)
    assert nlp.pipe_names == ["sentencizer", "pos", "chunker"]
    meta = json.loads((out / "chunker" / "model" / "tagger.json").read_text())
    assert meta["labels"] == models["chunk_tagger"].labels
    doc = nlp("The company said sales fell sharply .")
    assert all(t.tag_ in models["pos_tagger"].labels for t in doc)
    assert len(doc.spans["chunks"]) > 0 and all(s._.chunk_prob is not None for s in doc.spans["chunks"])
    assert abs(sum(doc[0]._.chunk_probs.values()) - 1.0) < 1e-9


@pytest.mark.slow
@pytest.mark.corpora
def test_pretrained_pipeline_on_conll2000_test(corpora_dir, tmp_path):
    """The shipped models: size limit, assembled from the repository config, accuracy on CoNLL-2000 test."""
    if not (PRETRAINED_POS / "tagger.json").is_file() or not (PRETRAINED_CHUNK / "tagger.json").is_file():
        pytest.skip("pretrained models absent")
    from spacy.tokens import Doc

    from gpseq.corpora import read_conll, spans as chunk_spans

    for model in (PRETRAINED_POS, PRETRAINED_CHUNK):
        assert sum(f.stat().st_size for f in model.rglob("*") if f.is_file()) <= 25 * 1024 * 1024
    out = tmp_path / "en_chunker"
    result = subprocess.run([sys.executable, "-m", "spacy", "assemble", str(PIPELINE_CFG), str(out)],
                            capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    nlp = spacy.load(out)
    test = read_conll(corpora_dir / "conll2000" / "test.txt")[:300]
    docs = [Doc(nlp.vocab, words=s.tokens, sent_starts=[True] + [False] * (len(s.tokens) - 1)) for s in test]
    docs = list(nlp.pipe(docs))
    gold_pos = [row[1] for s in test for row in s.columns]
    predicted_pos = [t.tag_ for doc in docs for t in doc]
    accuracy = np.mean([g == p for g, p in zip(gold_pos, predicted_pos)])
    gold = {(n, *c) for n, s in enumerate(test) for c in chunk_spans(s.labels)}
    found = {(n, s.label_, s.start, s.end) for n, doc in enumerate(docs) for s in doc.spans["chunks"]}
    precision, recall = len(gold & found) / len(found), len(gold & found) / len(gold)
    f1 = 2 * precision * recall / (precision + recall)
    assert accuracy > 0.94, accuracy
    assert f1 > 0.88, f1


def test_a_model_decoding_span_f1_gives_the_chunks_of_tagger_tag(models, tmp_path):
    """A model whose decoder is span-f1 (`--set decode=span-f1`): the component returns the chunks
    maximising the expected F1 with their exact probabilities, as `Tagger.tag` does (it returned the
    Viterbi path's chunks); `decode: span-f1` in the component's config does the same."""
    from gpseq.tagger import Tagger

    model = tmp_path / "chunk-span-f1"
    shutil.copytree(models["chunk"], model)
    meta = json.loads((model / "tagger.json").read_text(encoding="utf-8"))
    meta["config"]["decode"] = "span-f1"
    (model / "tagger.json").write_text(json.dumps(meta), encoding="utf-8")
    tagger = Tagger.load(model)
    for make in (lambda: _pipeline({**models, "chunk": model}, mean=True),
                 lambda: _pipeline(models, mean=True, decode="span-f1")):
        docs = list(make().pipe(TEXTS))
        results, where = _reference(tagger, docs, mean=True, columns=lambda t: t.tag_)
        viterbi = tagger.tag(list(_sentences(docs)), mean=True, decode="viterbi")
        assert any([c[:3] for c in r.spans] != [c[:3] for c in v.spans] for r, v in zip(results, viterbi))
        for result, (d, positions) in zip(results, where):
            doc = docs[d]
            expected = [(positions[s], positions[e - 1] + 1, type_, p) for type_, s, e, p in result.spans]
            got = [(s.start, s.end, s.label_, s._.gpseq_prob) for s in doc.spans["gpseq"]
                   if positions[0] <= s.start < positions[-1] + 1]
            assert [g[:3] for g in got] == [e[:3] for e in expected]
            np.testing.assert_allclose([g[3] for g in got], [e[3] for e in expected], rtol=1e-5)


def _sentences(docs):
    """The sentences `_reference` tags for a chunker reading the predicted POS (token.tag_)."""
    from gpseq.corpora import Sentence

    for doc in docs:
        for sent in doc.sents:
            tokens = [t for t in sent if not t.is_space]
            yield Sentence([t.text for t in tokens], columns=[[t.text, t.tag_] for t in tokens])


def test_a_pipe_forked_after_tensorflow_started_reports_why_instead_of_hanging():
    """`nlp.pipe(n_process=2)` after the pipeline ran its Monte Carlo predictive (TensorFlow) in the
    parent: TensorFlow does not survive the fork and the workers hung at their first batch. A worker
    now raises the reason at once, and spaCy re-raises it in the parent."""
    code = (
        "import spacy\n"
        f"nlp = spacy.blank('en'); nlp.add_pipe('gpseq', config={{'model': {str(PRETRAINED_POS)!r}, 'samples': 2}})\n"
        "nlp('The cat sat .')\n"
        "list(nlp.pipe(['The cat sat .', 'Dogs bark .'] * 4, n_process=2, batch_size=2))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=ROOT,
                            timeout=180)
    assert result.returncode != 0
    assert "TensorFlow cannot run after a fork" in result.stderr
