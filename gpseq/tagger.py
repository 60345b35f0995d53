"""The user-facing `Tagger`: train, tag, evaluate, save, load.

    tagger = Tagger.train(read_conll("train.conll"), TaggerConfig())
    for result in tagger.tag([["The", "cat", "sat", "."]]):
        print(result.labels, result.confidences)
    tagger.save("model/");  tagger = Tagger.load("model/")

A model directory is data: `tagger.json` (format version, gpseq version, labels, feature,
model and training configuration, scores, and "files": the size and sha256 of every other
file), `features/` (the featuriser's vocabulary and config), `arrays.npz` (variational
parameters, hyperparameters, inducing inputs). No pickle; the directory is written to a
temporary sibling and renamed into place, replacing only a directory that holds nothing but
what gpseq wrote.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable, Sequence

from gpseq.config import TaggerConfig
from gpseq.corpora.types import Sentence
from gpseq.features import Featurizer
from gpseq.predict.decode import TaggedSentence
from gpseq.predict.predictor import Predictor
from gpseq.predict.tagging import TaggingModel, model_predictor
from gpseq.saved.tagger import build_model, read_tagger, write_tagger
from gpseq.training.config import Progress
from gpseq.training.train import TrainedParts, train_tagger

__all__ = ["TaggedSentence", "Tagger", "TaggerConfig"]  # TaggedSentence lives in gpseq.predict.decode


class Tagger(TaggingModel):
    """A trained sparse structured GP tagger with its featuriser and label set: tagging, span and
    path probabilities, gold-path scores and evaluation (`TaggingModel`, `gpseq.predict.tagging`),
    training, selection for annotation and the model directory."""

    def __init__(self, config: TaggerConfig, featurizer: Featurizer, labels: list[str], model, scores=None,
                 likelihood=None):
        super().__init__(config, featurizer, labels)
        # `model`: a StructuredGP, or its arrays (`StructuredGP.get_state` names) from the default
        # training, which needs no TensorFlow: the model is then built on first use
        self._model, self._state = (None, dict(model)) if isinstance(model, dict) else (model, None)
        self.scores = dict(scores or {})
        self._likelihood = likelihood  # resolved at load (`saved_likelihood`); None: by name, the user's own

    @property
    def model(self):
        """The `StructuredGP` (built from the trained arrays on first use)."""
        if self._model is None:
            self._model = build_model(self.config, self.featurizer.n_features, len(self.labels), self._state,
                                      self._likelihood)
            self._state = None
        return self._model

    @property
    def arrays(self) -> dict:
        """The model's arrays (`StructuredGP.get_state` names): the trained or loaded ones as they are,
        without building TensorFlow, else the built model's."""
        return self._state if self._state is not None else self.model.get_state()

    @property
    def predictor(self) -> Predictor:
        """The model's batched, windowed prediction (`gpseq/predict/predictor.py`), compiled on first use;
        the default model's deterministic predictive in NumPy (`gpseq.predict.linear`) when the
        tagger holds its trained or loaded arrays (not a live TensorFlow model that SVI may still
        be changing): it never builds the TensorFlow model."""
        if self._predictor is None:
            self._predictor = model_predictor(self.config, lambda: self.model, self._state)
        return self._predictor

    # ---- training -----------------------------------------------------------------------------
    @classmethod
    def train(
        cls,
        train: Iterable[Sentence],
        config: TaggerConfig | None = None,
        *,
        dev: Sequence[Sentence] | None = None,
        callbacks: list[Callable[[Progress], None]] | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        resume: bool = False,
        init: "Tagger | None" = None,
    ) -> "Tagger":
        """Fit features and the posterior on `train`: MAP + Laplace with evidence-fitted priors and
        a dev-fitted calibration for the weight-space model (the default), SVI otherwise.

        `train`: sentences (a list, or any iterable), or a corpus read anew at each iteration
        (`gpseq.corpora.CorpusFile`): the default training then reads it in passes and never holds
        it (`gpseq.training.corpus_passes`), only its dev split.

        Tokens labelled `?` (`gpseq.corpora.UNLABELLED`) are marginalised: the default training
        maximises the partial-annotation likelihood p(observed labels | x) (constrained
        forward–backward, `gpseq.training.chain_objective`); calibration scores the labelled dev
        tokens only. SVI refuses them.

        `init`: a previous tagger to warm-start from (a round of active learning): one MAP fit on all
        of `train`, starting from its weights (mapped by feature name and label), with its prior
        (σ², l1) and its calibration, for a third of the iterations (`gpseq.training.warm_start`); default
        training only.

        The training is `gpseq.training.train.train_tagger`, which returns the parts the Tagger is
        built from (and takes `init`'s parts, not the tagger)."""
        previous = None
        if init is not None:  # its parts: the training does not call the tagger
            previous = TrainedParts(init.config, init.featurizer, init.labels,
                                    init._state if init._state is not None else init.model, init.scores)
        return cls(*train_tagger(train, config, dev=dev, callbacks=callbacks, checkpoint_dir=checkpoint_dir,
                                 resume=resume, init=previous))

    # ---- active learning ----------------------------------------------------------------------
    def select(self, sentences: Iterable, n: int, strategy: str = "entropy", **options) -> list:
        """The `n` sentences most worth annotating, best first, as `gpseq.active.selection.Selected`
        (pool index, sentence, score, current tagging): strategies entropy (default), bald,
        least-confidence, margin, random; options (level, normalise, samples, max_similarity, seed, …) in
        `gpseq.active.selection.select`."""
        from gpseq.active.selection import select

        return select(self, sentences, n, strategy, **options)

    # ---- persistence --------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike) -> Path:
        """Write the model directory atomically (temporary sibling, then rename).

        An existing `directory` is replaced only if it is a gpseq model directory holding nothing
        but the files gpseq wrote (`tagger.json`'s "files" manifest; for models written before
        the manifest, only tagger.json, arrays.npz and features/): checked before writing and
        again immediately before the replace, so files put there meanwhile are never deleted
        (`OutputError` instead). Temporaries of saves that were killed are removed; the
        directory and its files get the permissions of the umask."""
        return write_tagger(directory, self.config, self.featurizer, self.labels, self.arrays, self.scores)

    @classmethod
    def load(cls, directory: str | os.PathLike, likelihoods: dict[str, Callable] | None = None) -> "Tagger":
        """Load a model directory written by `save` (no training corpus needed).

        A model directory is data: loading imports no code the model names. A model trained with a
        plug-in likelihood loads when the plug-in's name is registered in this environment
        (entry-point group `gpseq_likelihoods`) or given in `likelihoods` ({name: function}, the
        function you trust for it); otherwise a one-line ModelFormatError names the plug-in.

        Everything is checked before the model is built: the files against tagger.json's
        manifest (size and sha256, when there is one), the arrays (a missing, empty, truncated
        or non-npz arrays.npz), and the metadata against the arrays and the featurizer (label
        count, num_features, shapes); any mismatch is a one-line ModelFormatError naming the file."""
        return cls(*read_tagger(directory, likelihoods))  # the model: built on first use
