"""Feature extraction + vectorisation throughput on CoNLL-2000 train (chunking preset), one core.

gpseq's vectorised Featurizer against the usual Python route with the same features: a dict of
feature strings per token read from spaCy Doc tokens, vectorised by scikit-learn's
DictVectorizer (as sklearn-crfsuite/CRF tutorials do). Both run in this process; the peer's
column count is a cross-check that the two build the same feature set.

    python benchmarks/features.py [--quick] [--json PATH] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import cpu_model, peak_rss_mb  # noqa: E402
from gpseq.corpora.types import Sentence  # noqa: E402
from gpseq.features import Featurizer, get_preset  # noqa: E402


def corpora_dir() -> Path:
    env = os.environ.get("GPSEQ_CORPORA")
    return Path(env) if env else ROOT.parent / "shared" / "corpora"


def read_columns(path: Path) -> list[Sentence]:
    """CoNLL-2000 (space-separated columns, blank line between sentences), by the project's reader."""
    from gpseq.corpora import read_conll

    return list(read_conll(path))


def peer_feature_dicts(sentences, config, vocab):
    """The chunking preset's features as per-token dicts, read from spaCy Doc tokens (peer route)."""
    from spacy.tokens import Doc

    def token_values(token, text):
        return {
            "word": text, "lower": token.lower_, "shape": token.shape_,
            **{f"prefix{n}": text[:n] for n in range(1, 5)},
            **{f"suffix{n}": text[-n:] for n in range(1, 5)},
            **{f: str(getattr(token, f)) for f in ("is_title", "is_upper", "is_digit", "like_num", "is_punct")},
        }

    out = []
    for sentence in sentences:
        doc = Doc(vocab, words=sentence.tokens)
        per_token = [token_values(t, t.text) for t in doc]
        for i, row in enumerate(sentence.columns):
            per_token[i][1] = row[1]
        n = len(per_token)

        def value(source, p):
            if p < 0:
                return f"__BOS-{-p}__"
            if p >= n:
                return f"__EOS+{p - n + 1}__"
            return per_token[p][source]

        def name(source):
            return f"col{source}" if isinstance(source, int) else source

        for t in range(n):
            feats = {"bias": 1}
            for source in config.attributes:
                for o in range(-config.window, config.window + 1):
                    feats[f"{name(source)}[{o}]={value(source, t + o)}"] = 1
            for source in config.token_attributes:
                feats[f"{name(source)}[0]={value(source, t)}"] = 1
            for source in config.columns:
                for o in range(-config.column_window, config.column_window + 1):
                    feats[f"{name(source)}[{o}]={value(source, t + o)}"] = 1
            for conj in config.conjunctions:
                key = "|".join(f"{name(s)}[{o}]" for s, o in conj)
                feats[f"{key}={'|'.join(value(s, t + o) for s, o in conj)}"] = 1
            out.append(feats)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="first 2,000 sentences, one repeat")
    parser.add_argument("--json", type=Path, help="write the figures as a flat JSON object")
    parser.add_argument("--repeats", type=int, default=3, help="best-of-N timing (default 3)")
    parser.add_argument("--no-peer", action="store_true", help="skip the DictVectorizer peer")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    repeats = 1 if args.quick else args.repeats

    train_path = corpora_dir() / "conll2000" / "train.txt"
    if not train_path.exists():
        sys.exit(f"CoNLL-2000 not found at {train_path} (set GPSEQ_CORPORA)")
    train = read_columns(train_path)
    test = read_columns(corpora_dir() / "conll2000" / "test.txt")
    if args.quick:
        train, test = train[:2000], test[:500]
    rss_corpus = peak_rss_mb()
    n_train = sum(len(s) for s in train)
    n_test = sum(len(s) for s in test)
    config = get_preset("chunking")

    # loading spaCy's English language data happens once per process: timed on its own
    start = time.perf_counter()
    from gpseq.features.values import blank_vocab

    blank_vocab(config.lang)
    spacy_load_s = time.perf_counter() - start

    # fit (vocabulary) + transform of the training set by a fresh featurizer: every word type's
    # lexical attributes are computed inside the timed region
    fit_s, transform_s, test_s = [], [], []
    for _ in range(repeats):
        featurizer = Featurizer(config)
        start = time.perf_counter()
        featurizer.fit(train)
        fit_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        matrix = featurizer.transform(train)
        transform_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        featurizer.transform(test)
        test_s.append(time.perf_counter() - start)
    start = time.perf_counter()
    matrix.padded_batch(range(min(len(train), 64)))
    padded_s = time.perf_counter() - start
    rss = peak_rss_mb()
    result = {
        "tokens": n_train,
        "sentences": len(train),
        "tokens_per_s": n_train / min(transform_s),
        "fit_tokens_per_s": n_train / min(fit_s),
        "fit_transform_tokens_per_s": n_train / min(f + t for f, t in zip(fit_s, transform_s)),
        # first repeat: spaCy creates every word type's Lexeme inside the timed fit
        "cold_fit_transform_tokens_per_s": n_train / (fit_s[0] + transform_s[0]),
        "test_tokens_per_s": n_test / min(test_s),
        "n_features": featurizer.n_features,
        "nnz_per_row": matrix.rows.nnz / matrix.rows.shape[0],
        "n_templates": len(config.templates()),
        "padded_batch_64_ms": 1000 * padded_s,
        "spacy_blank_load_s": spacy_load_s,
        "peak_rss_mb": rss,
        "rss_after_reading_corpus_mb": rss_corpus,
        "quick": args.quick,
        "cpu": cpu_model(),
    }

    crfpp_template = corpora_dir() / "crfpp" / "chunking" / "template"
    if crfpp_template.exists():
        crfpp = Featurizer(get_preset("crfpp", template=str(crfpp_template)))
        start = time.perf_counter()
        crfpp.fit(train).transform(train)
        result["crfpp_template_fit_transform_tokens_per_s"] = n_train / (time.perf_counter() - start)
        result["crfpp_template_n_features"] = crfpp.n_features

    if not args.no_peer:
        import spacy
        from sklearn.feature_extraction import DictVectorizer

        vocab = spacy.blank("en").vocab
        start = time.perf_counter()
        dicts = peer_feature_dicts(train, config, vocab)
        peer_extract = time.perf_counter() - start
        start = time.perf_counter()
        peer = DictVectorizer(dtype=np.float32).fit(dicts)
        peer_rows = peer.transform(dicts)
        peer_vectorise = time.perf_counter() - start
        result["peer_tokens_per_s"] = n_train / (peer_extract + peer_vectorise)
        result["peer_n_features"] = len(peer.vocabulary_)
        result["peer_nnz_per_row"] = peer_rows.nnz / peer_rows.shape[0]
        result["speedup_vs_peer"] = result["cold_fit_transform_tokens_per_s"] / result["peer_tokens_per_s"]
        result["same_feature_set"] = bool(
            set(peer.vocabulary_) == set(featurizer.feature_names()[1:])
        )

    print(f"CoNLL-2000 train: {len(train):,} sentences, {n_train:,} tokens; chunking preset "
          f"({result['n_templates']} templates); 1 core of {result['cpu']}")
    print(f"{'':38s}{'tokens/s':>12s}")
    print(f"{'gpseq transform (after fit)':38s}{result['tokens_per_s']:>12,.0f}")
    print(f"{'gpseq fit (vocabulary)':38s}{result['fit_tokens_per_s']:>12,.0f}")
    print(f"{'gpseq fit + transform':38s}{result['fit_transform_tokens_per_s']:>12,.0f}")
    print(f"{'gpseq fit + transform, cold lexemes':38s}{result['cold_fit_transform_tokens_per_s']:>12,.0f}")
    print(f"{'gpseq transform, test set':38s}{result['test_tokens_per_s']:>12,.0f}")
    if "crfpp_template_fit_transform_tokens_per_s" in result:
        print(f"{'gpseq CRF++ chunking template, fit+tr':38s}"
              f"{result['crfpp_template_fit_transform_tokens_per_s']:>12,.0f}")
    if "peer_tokens_per_s" in result:
        print(f"{'spaCy Doc dicts + DictVectorizer':38s}{result['peer_tokens_per_s']:>12,.0f}")
        print(f"D = {result['n_features']:,} (peer {result['peer_n_features']:,} + PAD), nnz/row = "
              f"{result['nnz_per_row']:.1f} (peer {result['peer_nnz_per_row']:.1f}), same feature set: "
              f"{result['same_feature_set']}, speed-up (cold fit+transform) {result['speedup_vs_peer']:.1f}x")
    else:
        print(f"D = {result['n_features']:,}, nnz/row = {result['nnz_per_row']:.1f}")
    print(f"peak RSS (gpseq part) {rss:.0f} MB, of which {rss_corpus:.0f} MB after reading the corpus")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
