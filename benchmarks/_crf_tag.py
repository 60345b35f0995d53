"""CRFsuite tagging as its own process, for `memory.py` (run: `_crf_tag.py SPEC INPUT OUTPUT`).

SPEC is the `_crf_train.py` spec of a trained model (its model_path and featurizer_dir, or its
feature_config "reference" and pos_column). The CoNLL INPUT is streamed in batches of 1,000
sentences, as `gpseq tag` streams: each sentence's features are gpseq's feature strings
(`_common.crfsuite_features`; with "reference", `_common.reference_features`), its labels
CRFsuite's Viterbi path and, as gpseq writes its calibrated probabilities, each token's marginal
of that label; OUTPUT gets one `word label probability` line per token. Interpreter start,
imports and reading included in the process's time and peak RSS, like `gpseq tag`'s.
"""

import itertools
import json
import sys
from functools import partial
from pathlib import Path

import pycrfsuite

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REFERENCE_FEATURES, crfsuite_features, reference_features  # noqa: E402
from gpseq.corpora import iter_conll  # noqa: E402
from gpseq.features import Featurizer  # noqa: E402

BATCH = 1000


def main(spec_path: str, input_path: str, output_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    if spec["feature_config"] == REFERENCE_FEATURES:
        featurise = partial(reference_features, pos_column=spec.get("pos_column"))
    else:
        featurise = partial(crfsuite_features, Featurizer.load(spec["featurizer_dir"]))
    tagger = pycrfsuite.Tagger()
    tagger.open(spec["model_path"])
    sentences = iter_conll(input_path)
    with open(output_path, "w", encoding="utf-8") as out:
        while batch := list(itertools.islice(sentences, BATCH)):
            for sentence, x in zip(batch, featurise(batch)):
                tagger.set(x)
                labels = tagger.tag()
                for t, (word, label) in enumerate(zip(sentence.tokens, labels)):
                    out.write(f"{word} {label} {tagger.marginal(label, t):.4f}\n")
                out.write("\n")


if __name__ == "__main__":
    main(*sys.argv[1:4])
