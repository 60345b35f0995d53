"""k-best Viterbi (`gpseq tag --nbest K`, the service's "nbest") on CoNLL-2000 test sentences.

    python benchmarks/nbest.py [--sentences 1000] [--k 0 5 20] [--json PATH]

Loads the pretrained models in models/ (chunker, POS tagger), traces each once on 8 sentences,
then times `Tagger.tag(sentences, nbest=K)` on the first N sentences of conll2000/test.txt for each
K (K = 0: no n-best, the same call's baseline), and reports seconds and sentences/s. The n-best
lists come from the deterministic predictive's mean potentials; their probabilities from the same
chains. No peer: CRFsuite's Python bindings have no n-best.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import corpora_root, machine  # noqa: E402

MODELS = ("en_chunk_conll2000", "en_pos_conll2000")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--k", type=int, nargs="+", default=[0, 5, 20])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from gpseq.corpora import read_conll
    from gpseq.tagger import Tagger

    sentences = read_conll(corpora_root() / "conll2000" / "test.txt")[: args.sentences]
    results = {"meta": {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"), "sentences": len(sentences),
                        "tokens": sum(len(s) for s in sentences)}}
    for name in MODELS:
        tagger = Tagger.load(ROOT / "models" / name)
        tagger.tag(sentences[:8], nbest=max(args.k))
        for k in args.k:
            start = time.perf_counter()
            tagger.tag(sentences, nbest=k)
            seconds = time.perf_counter() - start
            results[f"{name}/nbest{k}/seconds"] = seconds
            results[f"{name}/nbest{k}/sentences_per_s"] = len(sentences) / seconds
            print(f"{name} nbest {k:>2}: {seconds:6.2f} s, {len(sentences) / seconds:7.0f} sentences/s", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
