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

import itertools
import os
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import scipy.sparse as sp

from gpseq.cancellation import check_cancelled, stopping_when
from gpseq.config import TaggerConfig, check_window
from gpseq.corpora.types import UNLABELLED, Sentence, as_sentences
from gpseq.errors import ConfigError, GpseqError
from gpseq.features import Featurizer
from gpseq.predict.decode import TaggedSentence, TagOptions, given_span_probabilities, tag_batch
from gpseq.predict.predictor import Predictor
from gpseq.saved.tagger import build_model, read_tagger, write_tagger
from gpseq.structured.likelihoods import likelihood_by_name
from gpseq.training.batching import UNKNOWN_LABEL_ID, UNLABELLED_ID, SequenceData
from gpseq.training.config import Progress

__all__ = ["TaggedSentence", "Tagger", "TaggerConfig"]  # TaggedSentence lives in gpseq.predict.decode


def _decode_resolved(config: TaggerConfig, chosen: str | None) -> TaggerConfig:
    """The config a trained tagger keeps: decode "auto" replaced by the training's choice (viterbi
    without one)."""
    import dataclasses

    return dataclasses.replace(config, decode=chosen or "viterbi") if config.decode == "auto" else config


class Tagger:
    """A trained sparse structured GP tagger with its featuriser and label set."""

    def __init__(self, config: TaggerConfig, featurizer: Featurizer, labels: list[str], model, scores=None,
                 likelihood=None):
        self.config = config
        self.featurizer = featurizer
        self.labels = list(labels)
        self.label_index = {label: i for i, label in enumerate(self.labels)}
        # `model`: a StructuredGP, or its arrays (`StructuredGP.get_state` names) from the default
        # training, which needs no TensorFlow: the model is then built on first use
        self._model, self._state = (None, dict(model)) if isinstance(model, dict) else (model, None)
        self.scores = dict(scores or {})
        self._likelihood = likelihood  # resolved at load (`saved_likelihood`); None: by name, the user's own
        self._predictor = None

    @property
    def model(self):
        """The `StructuredGP` (built from the trained arrays on first use)."""
        if self._model is None:
            self._model = build_model(self.config, self.featurizer.n_features, len(self.labels), self._state,
                                      self._likelihood)
            self._state = None
        return self._model

    @property
    def predictor(self) -> Predictor:
        """The model's batched, windowed prediction (`gpseq/predict/predictor.py`), compiled on first use;
        the default model's deterministic predictive in NumPy (`gpseq.predict.linear`) when the
        tagger holds its trained or loaded arrays (not a live TensorFlow model that SVI may still
        be changing): it never builds the TensorFlow model."""
        if self._predictor is None:
            from gpseq.predict.linear import LinearPredictive

            dtype = np.float32 if self.config.dtype == "float32" else np.float64
            linear = None if self._state is None else LinearPredictive.from_state(self.config.model, self._state, dtype)
            self._predictor = Predictor(lambda: self.model, self.config.predict_overlap, dtype, linear)
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
        training only."""
        config = config or TaggerConfig()
        config.validate()
        likelihood_by_name(config.model.likelihood)  # the user's plug-in: its import fails here, before any work
        saved_config = config
        if init is not None and config.resolved_method() == "laplace":
            from gpseq.training.warm_start import warm_config

            config = warm_config(config, init)
        from gpseq.training import corpus_passes

        if isinstance(train, Iterator):  # read once: kept
            train = list(train)
        counted = corpus_passes.scan(train)  # a list, or a corpus read in passes (`CorpusFile`)
        tcfg = config.training
        method = config.resolved_method()
        partial = counted.partial
        if partial is not None and method != "laplace":
            raise ConfigError(f"{partial.source}:{partial.line}: tokens labelled {UNLABELLED!r} (partial annotation) "
                              f"need the default training (method laplace); this configuration trains by {method}")
        wants_dev = tcfg.calibrate if method == "laplace" else tcfg.early_stopping != "none"
        dev_ids = None
        if dev is None and tcfg.dev_fraction > 0 and wants_dev and counted.sentences >= 10:
            from gpseq.corpora.splits import train_dev_split

            dev_ids = train_dev_split(counted.sentences, tcfg.dev_fraction, seed=tcfg.seed,
                                      max_dev=tcfg.dev_max_sentences)[1]
        corpus = train
        train, held_out = corpus_passes.split(corpus, counted, dev_ids)
        if dev_ids is not None and partial is not None and not any(
                label != UNLABELLED for sentence in train for label in sentence.labels):
            # a partially annotated corpus whose labelled sentences the dev split took, all of them:
            # nothing would be left to train on, so no dev split
            dev_ids = None
            train, held_out = corpus_passes.split(corpus, counted, None)
        dev = held_out if dev_ids is not None else dev
        seen: set = set()
        # the vocabulary and the label set: of the training corpus, the dev split carved from it
        # included when the final weights train on it too (the default training refits on train +
        # dev, and cross-fits over both): a label or a feature of the user's training file is not
        # lost because the random dev split took the one sentence that has it. A --dev file of the
        # user's adds none (`cli.train.warn_dev_only_labels`).
        vocabulary = corpus_passes.labelled(train, seen)
        if method == "laplace" and dev_ids is not None:
            from gpseq.training.prior_path import final_fit_sees_dev

            if final_fit_sees_dev(tcfg, counted.tokens):
                vocabulary = itertools.chain(vocabulary, corpus_passes.labelled(dev, seen))
        featurizer = Featurizer(config.features).fit(vocabulary)
        labels = sorted(seen - {UNLABELLED})
        if not labels:
            raise GpseqError(f"{partial.source}: no labelled token in the training corpus (every label is "
                             f"{UNLABELLED!r})")
        label_index = {l: i for i, l in enumerate(labels)}
        if method == "laplace":
            from gpseq.training.batching import SentenceBlocks
            from gpseq.training.prior_path import train_laplace

            # featurised a block at a time as the objective is built (the corpus matrix is never whole)
            data = SentenceBlocks(train, lambda block: cls._sequence_data(featurizer, block, label_index))
            dev_data = cls._sequence_data(featurizer, list(dev), label_index) if dev else None
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
            scores.update(train_sentences=len(train), dev_sentences=len(dev or []))
            if partial is not None:
                scores["unlabelled_tokens"] = counted.unlabelled_tokens
            if init is not None:
                arrays.update(calibration_arrays(init, config.dtype, arrays))
                scores.update(warm_start=True, calibration=init.scores.get("calibration"))
                scores.setdefault("decode", init.config.decoder)  # with its calibration, its decoder
            return cls(_decode_resolved(saved_config, scores.get("decode")), featurizer, labels, arrays, scores)
        if init is not None:
            raise ConfigError("init (warm start) needs the default training (weight-space linear chain, "
                              f"method laplace); this configuration trains by {method}")
        from gpseq.training.svi import train_svi

        train = list(train)
        data = cls._sequence_data(featurizer, train, label_index)
        tagger = train_svi(cls, _decode_resolved(config, None), featurizer, labels, data, dev, callbacks=callbacks,
                           checkpoint_dir=checkpoint_dir, resume=resume)
        tagger.scores.update(train_sentences=len(train), dev_sentences=len(dev or []))
        return tagger

    @staticmethod
    def _sequence_data(featurizer: Featurizer, sentences: list[Sentence], label_index: dict | None) -> SequenceData:
        matrix = featurizer.transform(sentences)
        label_ids = None
        if label_index is not None:
            index = {**label_index, UNLABELLED: UNLABELLED_ID}
            flat = [label for s in sentences for label in (s.labels or [])]
            label_ids = np.fromiter((index.get(l, UNKNOWN_LABEL_ID) for l in flat), dtype=np.int32, count=len(flat))
        return SequenceData(sp.csr_matrix(matrix.rows), np.asarray(matrix.offsets, dtype=np.int64), label_ids)

    # ---- prediction ---------------------------------------------------------------------------
    def _deterministic(self, mean: bool | None, samples: int | None) -> bool:
        """Whether a prediction uses the deterministic calibrated predictive (`mean=True`) or
        Monte Carlo over q(f): explicit `mean` wins, then explicit `samples`, then the config."""
        if mean is not None:
            return bool(mean)
        return samples is None and self.config.predictive == "deterministic"

    def predict_batches(self, sentences: list[Sentence], *, samples: int | None = None, mean: bool | None = None,
                        batch_size: int = 256, seed: int = 0, max_tokens: int | None = None, chains: bool = False):
        """Yields (sentence index array, marginals [B, T, V], paths [B, T], log-probs [B]) and, with
        `chains`, the batch's `ChainPosterior` (`gpseq.structured.spans`)."""
        yield from self.predict_features(self.featurizer.transform(sentences), samples=samples, mean=mean,
                                         batch_size=batch_size, seed=seed, max_tokens=max_tokens, chains=chains)

    def predict_features(self, matrix, *, samples: int | None = None, mean: bool | None = None,
                         batch_size: int = 256, seed: int = 0, max_tokens: int | None = None, chains: bool = False):
        """`predict_batches` for a FeatureMatrix (e.g. `featurizer.transform_docs(docs)`, rows `[N, D]`):
        yields (sentence index array, marginals [B, T, V], paths [B, T], log-probs [B]) and, with
        `chains`, the batch's `ChainPosterior`.

        Batches hold at most `batch_size` sentences and `predict.predictor.PREDICT_TOKENS` padded tokens
        (under Monte Carlo at most `predict.predictor.PREDICT_TOKEN_DRAWS` tokens × draws, or one
        sentence). A sentence longer than `max_tokens` (default: the config's
        `predict_max_tokens`) is tagged in overlapping windows of that many tokens and yielded
        alone, stitched (see `tag`)."""
        data = SequenceData(sp.csr_matrix(matrix.rows), np.asarray(matrix.offsets, dtype=np.int64), None)
        max_tokens = max_tokens or self.config.predict_max_tokens
        check_window(max_tokens, self.config.predict_overlap)
        yield from self.predictor.predict(data, mean=self._deterministic(mean, samples),
                                          samples=samples or self.config.predict_samples, batch_size=batch_size,
                                          seed=seed, max_tokens=max_tokens, chains=chains)

    @property
    def span_scheme(self):
        """The chunk boundaries of the model's labels (`SpanScheme`), None when they are not chunk
        labels of its tag scheme (POS tags)."""
        if not hasattr(self, "_span_scheme"):
            from gpseq.corpora.schemes import is_chunk_labelling
            from gpseq.structured.spans import SpanScheme

            chunks = is_chunk_labelling(self.labels, self.config.tag_scheme)
            self._span_scheme = SpanScheme.build(self.labels, self.config.tag_scheme) if chunks else None
        return self._span_scheme

    def posteriors(self, sentences: Iterable, *, samples: int | None = None, mean: bool | None = None,
                   batch_size: int = 256, seed: int = 0, max_tokens: int | None = None):
        """Yields (sentence index array, `ChainPosterior`) over batches: the predictive's chains (one
        probit-scaled chain, or S calibrated draws with `samples=S`) for any span, path or n-best query."""
        for ids, _, _, _, posterior in self.predict_batches(as_sentences(sentences), samples=samples, mean=mean,
                                                            batch_size=batch_size, seed=seed,
                                                            max_tokens=max_tokens, chains=True):
            yield ids, posterior

    def select(self, sentences: Iterable, n: int, strategy: str = "bald", **options) -> list:
        """The `n` sentences most worth annotating, best first, as `gpseq.active.selection.Selected`
        (pool index, sentence, score, current tagging): strategies bald, entropy, least-confidence,
        margin, random; options (level, normalise, samples, max_similarity, seed, …) in
        `gpseq.active.selection.select`."""
        from gpseq.active.selection import select

        return select(self, sentences, n, strategy, **options)

    def span_probabilities(self, sentences: Iterable, spans: Sequence[Sequence[tuple[str, int, int]]], *,
                           samples: int | None = None, mean: bool | None = None) -> list[list[float]]:
        """P(span | X) of user-given spans: `spans[s]` = [(type, start, end exclusive)] of sentence s,
        each the probability that exactly this chunk (conlleval boundaries of the tag scheme) is in
        the label path, whatever the rest of the sentence."""
        sentences = as_sentences(sentences)
        return given_span_probabilities(self.span_scheme, self.config.tag_scheme, sentences, spans,
                                        self.posteriors(sentences, samples=samples, mean=mean))

    def tag(self, sentences: Iterable, *, samples: int | None = None, mean: bool | None = None,
            decode: str | None = None, batch_size: int = 256, max_tokens: int | None = None,
            spans: str = "exact", nbest: int = 0, abstain_below: float | None = None,
            should_stop: Callable[[], bool] | None = None) -> list[TaggedSentence]:
        """Label tokenised sentences: labels, per-token marginals and the path's log-probability.

        Marginals are the model's calibrated predictive (deterministic by default, `mean=True`
        forces it; `samples=S` averages S Monte Carlo draws of f); labels are the Viterbi path of
        the posterior-mean potentials (`decode="max-marginal"`: each token's most probable label;
        `decode="span-f1"`: the non-overlapping chunks maximising the expected chunk F1 from the
        exact span probabilities, a minimum-risk decoding).

        Probabilities that say what they are (`gpseq.structured.spans`), all under the predictive
        the marginals come from — exact for the deterministic one; for `samples=S` the average over
        the S draws' chains:
        - `spans`: each chunk of the returned labels with P(this exact span | X), by constrained
          forward–backward (`spans="product"`: the product of its tokens' marginals, an
          approximation ignoring label correlation, kept for comparison);
        - `sequence_log_prob`: log p(returned labels | X); under Monte Carlo the log of the S-draw
          average with its Jensen bias corrected to first order (delta method);
        - `nbest`: the K most probable label sequences of the predictive's mean potentials (for
          the deterministic predictive, exactly the K most probable paths) by k-best Viterbi, with
          their probabilities;
        - `abstain_below=P`: `TaggedSentence.abstained` / `span_abstained` flag tokens and spans
          whose probability is below P; labels are never changed.

        Long sentences: one longer than `max_tokens` (default: the config's `predict_max_tokens`,
        1000) is tagged in windows of `max_tokens` tokens, consecutive windows sharing at least
        2·`predict_overlap` (2·50) tokens; each token's marginals and Viterbi label come from the
        window where it is most central (at least `predict_overlap` tokens of context on either
        side), so memory is bounded whatever the length. The features are those of the whole
        sentence (unary potentials are exact); only the chain is cut, and the influence of a label
        on the marginals decays geometrically along a linear chain, so stitched marginals match the
        whole-sentence ones closely (not exactly) and the stitched path may differ from the whole
        sentence's Viterbi path near a cut. Its `sequence_log_prob` is Σ_windows log p(path part)
        − Σ_shared parts log p(path part), each computed on that stretch alone: the path's score is
        exact and log Z is approximated by the windows' (exact for the chain if the windows'
        distributions were the whole sentence's).

        `should_stop`: a function the prediction calls between batches and every few hundred chain
        steps (`gpseq.cancellation`); once it returns True, `tag` raises `Cancelled` at that check
        (the service stops the call of requests that timed out)."""
        sentences = as_sentences(sentences)
        options = TagOptions.checked(decode or self.config.decoder, spans, nbest, abstain_below, self.span_scheme)
        results: list[TaggedSentence | None] = [None] * len(sentences)
        with stopping_when(should_stop):
            check_cancelled()
            for ids, marg, path, logp, *rest in self.predict_batches(sentences, samples=samples, mean=mean,
                                                                     batch_size=batch_size, max_tokens=max_tokens,
                                                                     chains=options.needs_chains):
                batch = [sentences[index] for index in ids]
                tagged = tag_batch(batch, marg, path, logp, rest[0] if rest else None, self.labels, options)
                for index, result in zip(ids, tagged):
                    results[index] = result
        return results  # type: ignore[return-value]

    def evaluate(self, corpus: Sequence[Sentence], *, samples: int | None = None, mean: bool | None = None,
                 n_bins: int = 15, decode: str | None = None, target_error: float | None = None):
        """Metrics of `gpseq.evaluation.evaluate` on a labelled corpus (gold labels unseen in training
        count as errors; sentences with tokens labelled `?` are left out and counted, `n_skipped_sentences`),
        with entity-level calibration of the exact span probabilities for chunk labels and, with
        `target_error`, the abstention threshold reaching it (`gpseq.evaluation.trust`)."""
        from gpseq.evaluation.evaluate import evaluate

        corpus = list(corpus)
        tagged = self.tag(corpus, samples=samples, mean=mean, decode=decode)
        gold_logp = self.gold_log_probs(corpus, samples=samples, mean=mean)
        return evaluate(
            [list(s.labels) for s in corpus],
            [t.labels for t in tagged],
            labels=self.labels,
            probabilities=[t.probabilities for t in tagged],
            sequence_log_probs=list(gold_logp),
            scheme=self.config.tag_scheme,
            n_bins=n_bins,
            spans=[t.spans for t in tagged] if self.span_scheme is not None else None,
            target_error=target_error,
        )

    def gold_log_probs(self, corpus: Sequence[Sentence], *, samples: int | None = None, mean: bool | None = None,
                       batch_size: int = 256, seed: int = 1, max_tokens: int | None = None) -> np.ndarray:
        """log p(gold path | X) per sentence: log E_q[p(y | f)] by Monte Carlo (log-mean-exp over
        `samples` draws), or p(y | E f) with `mean`; −inf when a gold label was never seen in training
        or is `?` (no gold path).
        A sentence longer than `max_tokens` (default `predict_max_tokens`) is scored in windows (`tag`)."""
        corpus = list(corpus)
        mean = self._deterministic(mean, samples)
        data = self._sequence_data(self.featurizer, corpus, self.label_index)
        max_tokens = max_tokens or self.config.predict_max_tokens
        check_window(max_tokens, self.config.predict_overlap)
        return self.predictor.log_probs(data, mean=mean, samples=samples or self.config.predict_samples,
                                        batch_size=batch_size, seed=[seed, 0], max_tokens=max_tokens)

    # ---- persistence --------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike) -> Path:
        """Write the model directory atomically (temporary sibling, then rename).

        An existing `directory` is replaced only if it is a gpseq model directory holding nothing
        but the files gpseq wrote (`tagger.json`'s "files" manifest; for models written before
        the manifest, only tagger.json, arrays.npz and features/): checked before writing and
        again immediately before the replace, so files put there meanwhile are never deleted
        (`OutputError` instead). Temporaries of saves that were killed are removed; the
        directory and its files get the permissions of the umask."""
        arrays = self._state if self._state is not None else self.model.get_state()
        return write_tagger(directory, self.config, self.featurizer, self.labels, arrays, self.scores)

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
