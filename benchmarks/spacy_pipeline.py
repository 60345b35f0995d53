"""The pretrained CoNLL-2000 models through spaCy: POS accuracy, chunk F1 with gold and predicted POS,
pipeline throughput, model sizes.

    python benchmarks/spacy_pipeline.py [--quick] [--json PATH] [--pos-model DIR] [--chunk-model DIR]

Reads CoNLL-2000 test from GPSEQ_CORPORA (default ../shared/corpora). The pipeline is the one of
pipelines/en_chunker.cfg (sentencizer → gpseq POS tagger → gpseq chunker reading the predicted
POS from token.tag_), built from that config with the model paths overridden. Accuracy and F1
are measured on the gold tokenisation (Docs built from the corpus words); throughput on raw text
(the test sentences joined with spaces, 20 sentences per text, spaCy tokenizer included). The
peer, in the same process, is the library path `Tagger.tag` on pre-tokenised sentences (POS, then
chunks with the predicted POS as column 1): the cost of the spaCy integration.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _f1(gold_sentences, predicted_sentences) -> float:
    from gpseq.evaluation.evaluate import evaluate

    return evaluate(gold_sentences, predicted_sentences, scheme="iob2").to_dict()["chunk_f1"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="first 300 test sentences")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--pos-model", type=Path, default=ROOT / "models" / "en_pos_conll2000")
    parser.add_argument("--chunk-model", type=Path, default=ROOT / "models" / "en_chunk_conll2000")
    args = parser.parse_args()
    started, load_start = time.perf_counter(), os.getloadavg()[0]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import run_meta

    import spacy
    from spacy.tokens import Doc

    from gpseq.corpora import Sentence, read_conll, spans_to_tags
    from gpseq.tagger import Tagger

    corpora = Path(os.environ.get("GPSEQ_CORPORA", ROOT.parent / "shared" / "corpora"))
    test = read_conll(corpora / "conll2000" / "test.txt")
    if args.quick:
        test = test[:300]
    n_words = sum(len(s.tokens) for s in test)
    config = spacy.util.load_config(ROOT / "pipelines" / "en_chunker.cfg", overrides={
        "paths.pos_model": str(args.pos_model), "paths.chunk_model": str(args.chunk_model)})
    nlp = spacy.util.load_model_from_config(config, auto_fill=True)
    nlp.initialize()
    pos, chunker = nlp.get_pipe("pos"), nlp.get_pipe("chunker")

    def gold_docs(with_pos: bool):
        return [Doc(nlp.vocab, words=s.tokens, sent_starts=[True] + [False] * (len(s.tokens) - 1),
                    tags=[row[1] for row in s.columns] if with_pos else None) for s in test]

    def chunk_labels(docs):
        return [spans_to_tags(len(d), [(s.label_, s.start, s.end) for s in d.spans["chunks"]]) for d in docs]

    gold_chunks = [s.labels for s in test]
    gold_pos = [row[1] for s in test for row in s.columns]
    results: dict = {"test_sentences": len(test), "test_words": n_words}

    # POS accuracy and chunk F1 with the predicted POS: the pipeline on the gold tokenisation.
    docs = list(chunker.pipe(pos.pipe(gold_docs(False))))
    results["pos_accuracy"] = float(np.mean([g == t.tag_ for g, t in zip(gold_pos, (t for d in docs for t in d))]))
    results["chunk_f1_predicted_pos"] = _f1(gold_chunks, chunk_labels(docs))
    # Chunk F1 with gold POS: the chunker alone on Docs whose tag_ is the corpus POS column.
    results["chunk_f1_gold_pos"] = _f1(gold_chunks, chunk_labels(list(chunker.pipe(gold_docs(True)))))

    # Throughput on raw text: tokenizer → sentencizer → POS → chunker (compiled functions already traced).
    texts = [" ".join(w for s in test[i:i + 20] for w in s.tokens) for i in range(0, len(test), 20)]
    started = time.perf_counter()
    piped = list(nlp.pipe(texts, batch_size=64))
    seconds = time.perf_counter() - started
    raw_words = sum(1 for d in piped for t in d if not t.is_space)
    results["pipeline_words_per_s"] = raw_words / seconds
    results["pipeline_mean_words_per_s"] = None
    pos.mean = chunker.mean = True  # the deterministic predictive forced (the default one already)
    list(nlp.pipe(texts[:2]))
    started = time.perf_counter()
    list(nlp.pipe(texts, batch_size=64))
    results["pipeline_mean_words_per_s"] = raw_words / (time.perf_counter() - started)
    pos.mean = chunker.mean = False
    pos.samples = chunker.samples = pos.tagger.config.predict_samples  # Monte Carlo marginals (TensorFlow)
    list(nlp.pipe(texts[:2]))  # trace the sampling functions
    started = time.perf_counter()
    list(nlp.pipe(texts, batch_size=64))
    results["pipeline_mc_words_per_s"] = raw_words / (time.perf_counter() - started)
    pos.samples = chunker.samples = None

    # Peer: the library on pre-tokenised sentences, same models, same Monte Carlo settings.
    pos_tagger, chunk_tagger = Tagger.load(args.pos_model), Tagger.load(args.chunk_model)
    sentences = [Sentence(s.tokens) for s in test]
    pos_tagger.tag(sentences[:8])  # trace the compiled functions before timing
    chunk_tagger.tag([Sentence(["a", "cat"], columns=[["a", "DT"], ["cat", "NN"]])])
    started = time.perf_counter()
    tagged = pos_tagger.tag(sentences, batch_size=256)
    with_pos = [Sentence(s.tokens, columns=[[w, p] for w, p in zip(s.tokens, t.labels)])
                for s, t in zip(sentences, tagged)]
    chunked = chunk_tagger.tag(with_pos, batch_size=256)
    results["library_words_per_s"] = n_words / (time.perf_counter() - started)
    results["library_chunk_f1_predicted_pos"] = _f1(gold_chunks, [t.labels for t in chunked])

    results["pos_model_bytes"] = _size(args.pos_model)
    results["chunk_model_bytes"] = _size(args.chunk_model)
    results["pos_features"] = pos.tagger.featurizer.n_features
    results["chunk_features"] = chunker.tagger.featurizer.n_features
    results["predict_samples"] = pos.tagger.config.predict_samples

    rows = [
        ("POS accuracy (CoNLL-2000 test, gold tokens)", f"{results['pos_accuracy']:.4f}"),
        ("chunk F1, gold POS", f"{results['chunk_f1_gold_pos']:.4f}"),
        ("chunk F1, predicted POS (pipeline)", f"{results['chunk_f1_predicted_pos']:.4f}"),
        ("chunk F1, predicted POS (library peer)", f"{results['library_chunk_f1_predicted_pos']:.4f}"),
        ("pipeline words/s, raw text (default calibrated marginals)", f"{results['pipeline_words_per_s']:,.0f}"),
        ("pipeline words/s, raw text, mean = true", f"{results['pipeline_mean_words_per_s']:,.0f}"),
        (f"pipeline words/s, raw text, Monte Carlo S = {results['predict_samples']}",
         f"{results['pipeline_mc_words_per_s']:,.0f}"),
        ("library Tagger.tag words/s (peer)", f"{results['library_words_per_s']:,.0f}"),
        ("POS model size (MB)", f"{results['pos_model_bytes'] / 1e6:.2f}"),
        ("chunk model size (MB)", f"{results['chunk_model_bytes'] / 1e6:.2f}"),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"{len(test)} test sentences, {n_words:,} words")
    for name, value in rows:
        print(f"{name:<{width}}  {value:>10}")
    results["meta/load_average_1min_start"], results["meta/load_average_1min_end"] = load_start, os.getloadavg()[0]
    results.update(run_meta("spacy_pipeline.py", args.quick, started))
    print(f"load average (1 min) {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    sys.exit(main())
