"""CRFsuite's training as a user runs it: one process that reads the training file, featurises
it, trains and writes the model (and, tempered, fits T on a dev split carved from the file).

    python benchmarks/_crf_train.py SPEC.json

`versus_crf.py` times this process from its start to its exit, exactly as it times `gpseq train`
(interpreter start, imports, reading the corpus and writing the model included for both). SPEC:
train_file, label_column, encoding, feature_config (gpseq's FeatureConfig dict: the gpseq model's
features; or "reference": `_common.reference_features`, the features CRFsuite users usually
configure, and no featurizer_dir is written), pos_column (reference features only: the POS column's
index in file order, or absent / null where the corpus has none), params (CRFsuite's training parameters,
python-crfsuite's Trainer: the library sklearn-crfsuite wraps, without sklearn's 1 s import),
model_path, featurizer_dir, dev_fraction and dev_seed (absent: no dev split, no T), result (where
to write {temperature, train_sentences, dev_sentences}).
"""

import json
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pycrfsuite

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import REFERENCE_FEATURES, crfsuite_features, fit_temperature, reference_features  # noqa: E402
from gpseq.corpora import read_conll, train_dev_split  # noqa: E402
from gpseq.features import FeatureConfig, Featurizer  # noqa: E402


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    train = read_conll(spec["train_file"], label_column=spec["label_column"], encoding=spec["encoding"])
    dev = None
    if spec.get("dev_fraction") is not None:
        train_idx, dev_idx = train_dev_split(len(train), spec["dev_fraction"], seed=spec["dev_seed"])
        dev, train = [train[i] for i in dev_idx], [train[i] for i in train_idx]
    featurizer = None
    if spec["feature_config"] == REFERENCE_FEATURES:
        featurise = partial(reference_features, pos_column=spec.get("pos_column"))
    else:
        featurizer = Featurizer(FeatureConfig.from_dict(spec["feature_config"])).fit(train)
        featurise = partial(crfsuite_features, featurizer)
    trainer = pycrfsuite.Trainer(verbose=False)
    for x, sentence in zip(featurise(train), train):
        trainer.append(x, list(sentence.labels))
    trainer.set_params(spec["params"])
    trainer.train(spec["model_path"])
    temperature = None
    if dev is not None:
        tagger = pycrfsuite.Tagger()
        tagger.open(spec["model_path"])
        labels = tagger.labels()
        index = {label: i for i, label in enumerate(labels)}
        probs = []
        for x in featurise(dev):
            tagger.set(x)
            probs.append([[tagger.marginal(label, t) for label in labels] for t in range(len(x))])
        gold = np.array([index.get(label, -1) for s in dev for label in s.labels], dtype=np.int64)
        temperature = fit_temperature(np.concatenate([np.asarray(p) for p in probs], axis=0), gold)
    if featurizer is not None:
        featurizer.save(spec["featurizer_dir"])
    Path(spec["result"]).write_text(json.dumps({"temperature": temperature, "train_sentences": len(train),
                                                "dev_sentences": len(dev or [])}))


if __name__ == "__main__":
    main(sys.argv[1])
