"""Long sentences in prediction: tagged in overlapping windows and stitched (the library and the
spaCy component), in batches bounded by construction, and the peak memory of real runs on long
inputs (wrapped text without a sentence boundary, a 50,000-token line, a 20,000-token Doc).

A tiny model of the default training (`default_model`) is trained once for the module, on the
corpus of `helpers.tiny_model`."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT, SAMPLE
from helpers.cli import invoke
from helpers.peak_rss import PEAK_RSS_BOUND_MB, peak_rss_mb
from helpers.tiny_model import corpus  # noqa: F401


# The default training (MAP + Laplace, linear kernel), converged on the tiny corpus: its transitions
# are strong enough that the context across a cut matters (checked below), unlike 2 SVI steps'.
# float64, so that the whole-sentence reference of a few thousand tokens is itself accurate.
DEFAULT_TINY = ["--features", "ner", "--seed", "3", "--max-steps", "40", "--set", "training.dev_fraction=0",
                "--set", "dtype=float64"]


@pytest.fixture(scope="module")
def default_model(corpus, tmp_path_factory) -> Path:
    """A tiny model of the default training; do not modify."""
    model_dir = tmp_path_factory.mktemp("tiny_default") / "model"
    result = invoke("train", corpus, "-o", model_dir, *DEFAULT_TINY)
    assert result.exit_code == 0, result.stderr
    return model_dir


@pytest.fixture(scope="module")
def default_tagger(default_model):
    from gpseq.tagger import Tagger

    return Tagger.load(default_model)


@pytest.fixture(scope="module")
def long_sentence():
    """The bundled sample's sentences run together: one labelled sentence of a few hundred tokens."""
    from gpseq.corpora import Sentence, read_conll

    sentences = read_conll(SAMPLE / "train.conll")
    tokens = [token for s in sentences for token in s.tokens]
    labels = [label for s in sentences for label in s.labels]
    assert len(tokens) > 400
    return Sentence(tokens=tokens, labels=labels)


def test_long_sentence_windows_match_the_whole_sentence(default_tagger, long_sentence):
    """A sentence of a few hundred tokens in windows of 200 (50 tokens of context each side) against
    the same sentence tagged whole (max_tokens above its length): every token's marginals agree to
    1e-6 (linear-chain marginals forget a cut geometrically fast), the labels agree, and the stitched path's log-probability and the gold path's
    are the whole sentence's. The check has teeth: cutting the sentence at a window edge instead
    moves the marginals next to the cut by far more than the tolerance."""
    from gpseq.corpora import Sentence

    tokens = long_sentence.tokens
    whole = default_tagger.tag([tokens], max_tokens=10**6)[0]
    windowed = default_tagger.tag([tokens], max_tokens=200)[0]
    assert windowed.probabilities.shape == whole.probabilities.shape == (len(tokens), len(default_tagger.labels))
    assert np.abs(windowed.probabilities - whole.probabilities).max() < 1e-6
    agree = np.mean([a == b for a, b in zip(windowed.labels, whole.labels)])
    assert agree >= 0.98, agree
    assert windowed.sequence_log_prob == pytest.approx(whole.sequence_log_prob, rel=1e-9, abs=1e-6)
    gold = Sentence(tokens, [label if label in default_tagger.label_index else "O" for label in long_sentence.labels])
    gold_whole, gold_windowed = (default_tagger.gold_log_probs([gold], max_tokens=m)[0] for m in (10**6, 200))
    assert np.isfinite(gold_whole) and gold_windowed == pytest.approx(gold_whole, rel=1e-9, abs=1e-6)
    # without the windows' context: the first 200 tokens alone differ from the whole near their end
    cut = default_tagger.tag([tokens[:200]], max_tokens=10**6)[0]
    assert np.abs(cut.probabilities[-5:] - whole.probabilities[195:200]).max() > 0.01


def test_short_sentences_are_unchanged_when_a_long_one_is_windowed(default_tagger, long_sentence):
    """Sentences up to max_tokens are tagged exactly as without the long one (bit for bit: the same
    batches); Monte Carlo marginals of a windowed sentence are distributions and its labels are the
    deterministic predictive's (both Viterbi on the posterior-mean potentials)."""
    shorts = [long_sentence.tokens[:60], long_sentence.tokens[100:300]]  # 60 and 200 (= max_tokens) tokens
    alone = default_tagger.tag(shorts, max_tokens=200)
    together = default_tagger.tag([shorts[0], long_sentence.tokens, shorts[1]], max_tokens=200)
    for result, want in zip((together[0], together[2]), alone):
        assert result.labels == want.labels
        assert np.array_equal(result.probabilities, want.probabilities)
        assert result.sequence_log_prob == want.sequence_log_prob
    mc = default_tagger.tag([long_sentence.tokens], samples=2, max_tokens=200)[0]
    assert np.allclose(mc.probabilities.sum(-1), 1.0) and np.isfinite(mc.sequence_log_prob)
    assert mc.sequence_log_prob <= 0.0
    assert mc.labels == together[1].labels


def test_window_settings_are_checked(default_tagger, long_sentence):
    from gpseq.errors import ConfigError
    from gpseq.tagger import TaggerConfig

    with pytest.raises(ConfigError, match=r"predict_max_tokens must be > 2 \* predict_overlap \(100\), got 100"):
        default_tagger.tag([long_sentence.tokens], max_tokens=100)
    with pytest.raises(ConfigError, match="predict_overlap must be >= 1, got 0"):
        TaggerConfig(predict_overlap=0).validate()


def test_spacy_component_windows_a_long_doc(default_model, default_tagger, long_sentence):
    """A Doc without sentence boundaries, longer than the component's max_tokens: its token
    distributions are the whole sentence's (Tagger.tag unwindowed)."""
    spacy = pytest.importorskip("spacy")
    from spacy.tokens import Doc

    from gpseq.errors import ConfigError

    nlp = spacy.blank("en")
    nlp.add_pipe("gpseq", name="windowed", config={"model": str(default_model), "max_tokens": 150, "task": "tag",
                                                   "extension": "windowed_probs"})
    doc = nlp(Doc(nlp.vocab, words=long_sentence.tokens))
    whole = default_tagger.tag([long_sentence.tokens], max_tokens=10**6)[0]
    probs = np.array([[token._.windowed_probs[label] for label in default_tagger.labels] for token in doc])
    assert np.abs(probs - whole.probabilities).max() < 1e-6
    assert np.mean([token.tag_ == label for token, label in zip(doc, whole.labels)]) >= 0.98
    bad = spacy.blank("en")
    bad.add_pipe("gpseq", config={"model": str(default_model), "max_tokens": 100, "extension": "bad_probs"})
    with pytest.raises(ConfigError, match=r"max_tokens must be > 2 × the model's predict_overlap \(100\), got 100"):
        bad(Doc(bad.vocab, words=["a", "b"]))


# ---- memory bounded by construction: batches, and the peak RSS of real runs on long inputs


def test_prediction_batches_are_bounded_whatever_the_sentence_length(default_tagger, long_sentence, monkeypatch):
    """Every batch that reaches the compiled prediction and scoring functions (or the default
    model's NumPy predictive) holds at most PREDICT_TOKENS padded tokens and sequences of at most
    max_tokens tokens, for sentences of thousands of tokens tagged and scored next to short ones:
    memory bounded by construction."""
    import gpseq.predict.predictor as prediction_module
    from gpseq.corpora import Sentence
    from gpseq.predict.linear import LinearPredictive

    shapes = []
    real_make_batch, real_padded = prediction_module.make_batch, LinearPredictive._padded

    def make_batch(data, ids, **kwargs):
        batch = real_make_batch(data, ids, **kwargs)
        shapes.append(batch["labels"].shape)  # [B, T]
        return batch

    def padded(self, data, ids):
        out = real_padded(self, data, ids)
        shapes.append(out[0].shape[:2])  # [B, T]
        return out

    monkeypatch.setattr(prediction_module, "make_batch", make_batch)
    monkeypatch.setattr(LinearPredictive, "_padded", padded)
    tokens = long_sentence.tokens  # about 3,400 tokens
    default_tagger.tag([tokens, tokens[:30], tokens[:7]], max_tokens=300)
    default_tagger.gold_log_probs([long_sentence, long_sentence], max_tokens=300)
    assert len(shapes) >= 4
    assert max(T for _, T in shapes) <= 300
    assert max(B * T for B, T in shapes) <= prediction_module.PREDICT_TOKENS
    # Monte Carlo: S draws of every token, so at most PREDICT_TOKEN_DRAWS tokens × draws a batch, or
    # one sentence or window alone (at S = 100 a batch of PREDICT_TOKENS tokens held 12 GB with 44 labels)
    shapes.clear()
    samples = 100
    sentences = [tokens[:40]] * 30 + [tokens]
    default_tagger.tag(sentences, samples=samples, max_tokens=300)
    short = Sentence(tokens=tokens[:40], labels=long_sentence.labels[:40])
    default_tagger.gold_log_probs([long_sentence] + [short] * 30, samples=samples, max_tokens=300)
    assert len(shapes) >= 8
    assert all(B * T * samples <= prediction_module.PREDICT_TOKEN_DRAWS or B == 1 for B, T in shapes), shapes
    assert max(T for _, T in shapes) <= 300


def _unpunctuated_words(n_words: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ["committee", "budget", "approved", "three", "small", "projects", "fund", "the", "on", "Tuesday"]
    return [rng.choice(words) for _ in range(n_words)]


@pytest.mark.slow
def test_peak_rss_tagging_1mb_of_unpunctuated_text(default_model, tmp_path):
    """`gpseq tag` at default settings on 1 MB of wrapped text without a sentence boundary (one
    sentence of 150,000 words unless the tagger cuts it): under the bound, every word tagged."""
    words = _unpunctuated_words(150_000)
    lines = [" ".join(words[i:i + 12]) for i in range(0, len(words), 12)]
    text = tmp_path / "wrapped.txt"
    text.write_text("\n".join(lines)[:1_000_000] + "\n", encoding="utf-8")
    out = tmp_path / "out.conll"
    code, peak, stderr = peak_rss_mb([sys.executable, ROOT / "cli.py", "tag", default_model, text, "-o", out])
    assert code == 0, stderr
    print(f"peak RSS tagging 1 MB of unpunctuated text: {peak:.0f} MB")
    assert peak < PEAK_RSS_BOUND_MB
    tagged = [line.split("\t")[0] for line in out.read_text(encoding="utf-8").splitlines() if line]
    assert tagged == text.read_text(encoding="utf-8").split()


@pytest.mark.slow
@pytest.mark.parametrize("form", ["text line", "conll sentence"])
def test_peak_rss_tagging_a_50k_token_line(default_model, tmp_path, form):
    """A 50,000-token line of raw text (cut into sentences of --text-max-tokens) and a 50,000-token
    CoNLL sentence (tagged in windows of predict_max_tokens): under the bound at default settings."""
    words = _unpunctuated_words(50_000, seed=1)
    if form == "text line":
        path = tmp_path / "line.txt"
        path.write_text(" ".join(words) + "\n", encoding="utf-8")
    else:
        path = tmp_path / "sentence.conll"
        path.write_text("\n".join(words) + "\n\n", encoding="utf-8")
    out = tmp_path / "out.conll"
    code, peak, stderr = peak_rss_mb([sys.executable, ROOT / "cli.py", "tag", default_model, path, "-o", out])
    assert code == 0, stderr
    print(f"peak RSS tagging a 50k-token {form}: {peak:.0f} MB")
    assert peak < PEAK_RSS_BOUND_MB
    assert sum(1 for line in out.read_text(encoding="utf-8").splitlines() if line) == 50_000


SPACY_DOC_SCRIPT = """
import sys
import spacy
from spacy.tokens import Doc
nlp = spacy.blank("en")
nlp.add_pipe("gpseq", config={"model": sys.argv[1], "task": "tag"})
words = open(sys.argv[2], encoding="utf-8").read().split()
doc = nlp(Doc(nlp.vocab, words=words))
assert len(doc) == len(words) and all(token.tag_ for token in doc)
"""


@pytest.mark.slow
def test_peak_rss_spacy_component_on_a_20k_token_doc(default_model, tmp_path):
    """A 20,000-token Doc without sentence boundaries through the component (5.35 GB before):
    under the bound, every token tagged."""
    pytest.importorskip("spacy")
    words = tmp_path / "words.txt"
    words.write_text(" ".join(_unpunctuated_words(20_000, seed=2)), encoding="utf-8")
    code, peak, stderr = peak_rss_mb([sys.executable, "-c", SPACY_DOC_SCRIPT, default_model, words])
    assert code == 0, stderr
    print(f"peak RSS of the spaCy component on a 20k-token Doc: {peak:.0f} MB")
    assert peak < PEAK_RSS_BOUND_MB
