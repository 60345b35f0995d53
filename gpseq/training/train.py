"""The one training entry point: `train_tagger` turns sentences and a `TaggerConfig` into the parts a
tagger is made of (`TrainedParts`: the configuration it keeps, the featurizer, the label set, the
model, the scores), which `Tagger.train` builds its `Tagger` from. It knows nothing of the `Tagger`
class: a warm start's previous model comes in as its parts too.

The passes before the fit (dev split, featurizer, label set: `corpus_passes.prepare`), then one of
the two fits: the default MAP + Laplace fit of the weight-space linear chain (`prior_path.
train_laplace`, warm-started by `warm_start` when given a previous model), returning arrays; or SVI
(`svi.train_svi`), returning the live `StructuredGP`, early-stopped on the dev split through the
model's tagging (`gpseq.predict.tagging.TaggingModel`).

Of the tagger layer (docs/architecture.md), though it lives with the training: it chooses the
decoder (`gpseq.predict.decode`) and evaluates on dev through prediction, which sit above the
training layer; nothing of gpseq/training/ imports it, and it imports nothing of gpseq/tagger.py.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Iterable, NamedTuple, Sequence

import numpy as np

from gpseq.config import TaggerConfig
from gpseq.corpora.types import Sentence
from gpseq.errors import ConfigError
from gpseq.features import Featurizer
from gpseq.structured.likelihoods import likelihood_by_name
from gpseq.training import corpus_passes
from gpseq.training.batching import SentenceBlocks, SequenceData
from gpseq.training.config import Progress


class TrainedParts(NamedTuple):
    """What a tagger is made of: `Tagger(*parts)`. `model`: the model's arrays (`StructuredGP.get_state`
    names; the default training, no TensorFlow) or the `StructuredGP` itself (SVI)."""

    config: TaggerConfig
    featurizer: Featurizer
    labels: list[str]
    model: object
    scores: dict

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The model's arrays (`StructuredGP.get_state` names)."""
        return dict(self.model) if isinstance(self.model, dict) else self.model.get_state()


def decode_resolved(config: TaggerConfig, chosen: str | None) -> TaggerConfig:
    """The config a trained tagger keeps: decode "auto" replaced by the training's choice (viterbi
    without one)."""
    return dataclasses.replace(config, decode=chosen or "viterbi") if config.decode == "auto" else config


def train_tagger(
    train: Iterable[Sentence],
    config: TaggerConfig | None = None,
    *,
    dev: Sequence[Sentence] | None = None,
    callbacks: list[Callable[[Progress], None]] | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    resume: bool = False,
    init: TrainedParts | None = None,
) -> TrainedParts:
    """The parts of a tagger fitted on `train` (what `Tagger.train` documents: its arguments are
    these, but `init`, the previous model's `TrainedParts`)."""
    config = config or TaggerConfig()
    config.validate()
    likelihood_by_name(config.model.likelihood)  # the user's plug-in: its import fails here, before any work
    saved_config = config
    if init is not None and config.resolved_method() == "laplace":
        from gpseq.training.warm_start import warm_config

        config = warm_config(config, init)
    method = config.resolved_method()
    corpus = corpus_passes.prepare(train, config, dev, method)
    if method == "laplace":
        return _train_laplace(corpus, config, saved_config, callbacks, init)
    if init is not None:
        raise ConfigError("init (warm start) needs the default training (weight-space linear chain, "
                          f"method laplace); this configuration trains by {method}")
    return _train_svi(corpus, decode_resolved(config, None), callbacks, checkpoint_dir, resume)


def _train_laplace(corpus: corpus_passes.PreparedCorpus, config: TaggerConfig, saved_config: TaggerConfig,
                   callbacks, init: TrainedParts | None) -> TrainedParts:
    """The default training (`prior_path.train_laplace`); `config`: `saved_config`, the user's, or
    its warm-started round's (`warm_start.warm_config`)."""
    from gpseq.training.prior_path import train_laplace

    featurizer, labels, label_index, dev = corpus.featurizer, corpus.labels, corpus.label_index, corpus.dev
    # featurised a block at a time as the objective is built (the corpus matrix is never whole)
    data = SentenceBlocks(corpus.train, lambda block: SequenceData.featurised(featurizer, block, label_index))
    dev_data = SequenceData.featurised(featurizer, list(dev), label_index) if dev else None
    start = None
    if init is not None:
        from gpseq.training.warm_start import calibration_arrays, map_start

        start = map_start(init, featurizer, labels)
    choose = None
    if saved_config.decode == "auto":
        from gpseq.predict.decode import choose_decoder

        choose = lambda decodes: choose_decoder(decodes, labels, config.tag_scheme)  # noqa: E731
    arrays, scores = train_laplace(config, featurizer, len(labels), data, dev_data, callbacks, init=start,
                                   choose_decode=choose)
    scores.update(train_sentences=len(corpus.train), dev_sentences=len(dev or []))
    if corpus.counted.partial is not None:
        scores["unlabelled_tokens"] = corpus.counted.unlabelled_tokens
    if init is not None:
        arrays.update(calibration_arrays(init, config.dtype, arrays))
        scores.update(warm_start=True, calibration=init.scores.get("calibration"))
        scores.setdefault("decode", init.config.decoder)  # with its calibration, its decoder
    return TrainedParts(decode_resolved(saved_config, scores.get("decode")), featurizer, labels, arrays, scores)


def _train_svi(corpus: corpus_passes.PreparedCorpus, config: TaggerConfig, callbacks, checkpoint_dir,
               resume: bool) -> TrainedParts:
    """SVI (`svi.train_svi`), early-stopped on the dev sentences through the model's tagging."""
    from gpseq.training.svi import train_svi

    featurizer, labels = corpus.featurizer, corpus.labels
    train = list(corpus.train)
    data = SequenceData.featurised(featurizer, train, corpus.label_index)
    dev = list(corpus.dev or [])
    dev_metrics = _dev_metrics(config, featurizer, labels, dev) if dev else None
    model, scores = train_svi(config, featurizer, len(labels), data, dev_metrics=dev_metrics, callbacks=callbacks,
                              checkpoint_dir=checkpoint_dir, resume=resume)
    scores.update(train_sentences=len(train), dev_sentences=len(corpus.dev or []))
    return TrainedParts(config, featurizer, labels, model, scores)


def _dev_metrics(config: TaggerConfig, featurizer: Featurizer, labels: list[str], dev: list[Sentence]):
    """model → the function that evaluates it on `dev` with the deterministic predictive (the
    evaluation report of `TaggingModel.evaluate`, as a dict), its compiled prediction kept between
    calls."""
    from gpseq.predict.tagging import TaggingModel, model_predictor

    def for_model(model):
        tagging = TaggingModel(config, featurizer, labels, model_predictor(config, lambda: model))
        return lambda: tagging.evaluate(dev, mean=True).to_dict()

    return for_model
