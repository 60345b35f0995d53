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

import hashlib
import itertools
import json
import logging
import os
import secrets
import shutil
import tempfile
import zipfile
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import scipy.sparse as sp

from gpseq import __version__
from gpseq.corpora.types import Sentence
from gpseq.corpora._atomic import apply_umask, stale_temp_siblings, writable_dir
from gpseq.errors import ConfigError, GpseqError, ModelFormatError, OutputError
from gpseq.features import FeatureConfig, Featurizer, get_preset
from gpseq.model_meta import FORMAT, FORMAT_VERSION, META_FILE, json_default, read_model_meta
from gpseq.structured.config import ModelConfig
from gpseq.training.batching import SequenceData, batch_signature, make_batch, sequence_windows, token_batches
from gpseq.training.config import Progress, TrainingConfig

PREDICT_TOKENS = 8192  # padded tokens a prediction batch holds at most
log = logging.getLogger("gpseq")


@dataclass
class TaggerConfig:
    """Everything needed to rebuild a tagger: features, model, training, prediction."""

    features: FeatureConfig = field(default_factory=lambda: get_preset("chunking"))
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    tag_scheme: str = "iob2"
    predictive: str = "deterministic"  # marginals: "deterministic" (probit-scaled potentials, one
    # forward–backward) | "mc" (average over `predict_samples` draws of f); both calibrated by T, α
    predict_samples: int = 16  # S, Monte Carlo samples of f for the calibrated marginals
    decode: str = "viterbi"  # "viterbi" (on the posterior-mean potentials) | "max-marginal"
    dtype: str = "float32"
    # a sentence longer than predict_max_tokens is tagged in windows of that many tokens, each
    # token's results taken from a window where it has >= predict_overlap tokens of context on
    # either side (see `Tagger.tag`): memory bounded whatever the sentence length
    predict_max_tokens: int = 1000
    predict_overlap: int = 50

    def to_dict(self) -> dict:
        return {
            "features": self.features.to_dict(),
            "model": self.model.to_dict(),
            "training": asdict(self.training),
            "tag_scheme": self.tag_scheme,
            "predictive": self.predictive,
            "predict_samples": self.predict_samples,
            "decode": self.decode,
            "dtype": self.dtype,
            "predict_max_tokens": self.predict_max_tokens,
            "predict_overlap": self.predict_overlap,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "TaggerConfig":
        data = dict(data)
        try:
            features = data.pop("features", None)
            model = data.pop("model", None) or {}
            training = data.pop("training", None) or {}
            return cls(
                features=FeatureConfig.from_dict(features) if features else get_preset("chunking"),
                model=ModelConfig(**model),
                training=TrainingConfig(**training),
                **data,
            )
        except TypeError as error:
            raise ConfigError(f"invalid tagger configuration: {error}") from None

    def resolved_method(self) -> str:
        """The training method: `training.method`, with "auto" = laplace for the weight-space
        linear model with the exact chain likelihood, svi otherwise."""
        if self.training.method != "auto":
            return self.training.method
        m = self.model
        laplace_ok = m.kernel == "linear" and m.unary == "shallow" and m.likelihood == "exact"
        return "laplace" if laplace_ok and self.training.strategy == "default" else "svi"

    def validate(self) -> None:
        self.model.validate()
        if self.training.method == "laplace" and (self.model.kernel != "linear" or self.model.unary != "shallow"):
            raise ConfigError('training.method "laplace" needs model.kernel "linear" with shallow unaries; '
                              'use training.method "svi" for other models')
        self.training.validate()
        if self.decode not in ("viterbi", "max-marginal"):
            raise ConfigError(f"decode must be viterbi or max-marginal, got {self.decode!r}")
        if self.dtype not in ("float32", "float64"):
            raise ConfigError(f"dtype must be float32 or float64, got {self.dtype!r}")
        if self.predictive not in ("deterministic", "mc"):
            raise ConfigError(f"predictive must be deterministic or mc, got {self.predictive!r}")
        if self.predict_samples < 1:
            raise ConfigError(f"predict_samples must be >= 1, got {self.predict_samples}")
        _check_window(self.predict_max_tokens, self.predict_overlap)


@dataclass
class TaggedSentence:
    """A tagged sentence: labels, per-token label distributions, sequence log-probability."""

    tokens: list[str]
    labels: list[str]
    probabilities: np.ndarray  # [T, V] per-token marginals p(y_t = v | X), rows sum to 1
    label_set: list[str]
    sequence_log_prob: float  # log p(predicted label path | X)

    @property
    def confidences(self) -> list[float]:
        """p(y_t = predicted label) per token."""
        index = {label: i for i, label in enumerate(self.label_set)}
        return [float(self.probabilities[t, index[label]]) for t, label in enumerate(self.labels)]

    def distribution(self, t: int) -> dict[str, float]:
        return {label: float(p) for label, p in zip(self.label_set, self.probabilities[t])}


def _check_window(max_tokens, overlap) -> None:
    """ConfigError unless sentences can be windowed: 1 <= overlap, 2·overlap < max_tokens."""
    for name, value in (("predict_max_tokens", max_tokens), ("predict_overlap", overlap)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
    if overlap < 1:
        raise ConfigError(f"predict_overlap must be >= 1, got {overlap}")
    if max_tokens <= 2 * overlap:
        raise ConfigError(f"predict_max_tokens must be > 2 * predict_overlap ({2 * overlap}), got {max_tokens}")


def _as_sentences(sentences: Iterable) -> list[Sentence]:
    out = []
    for sentence in sentences:
        if isinstance(sentence, Sentence):
            out.append(sentence)
        elif isinstance(sentence, str):
            raise GpseqError("tag() takes tokenised sentences (lists of tokens), not strings")
        else:
            out.append(Sentence(tokens=list(sentence)))
    return out


class Tagger:
    """A trained sparse structured GP tagger with its featuriser and label set."""

    def __init__(self, config: TaggerConfig, featurizer: Featurizer, labels: list[str], model, scores=None):
        self.config = config
        self.featurizer = featurizer
        self.labels = list(labels)
        self.label_index = {label: i for i, label in enumerate(self.labels)}
        # `model`: a StructuredGP, or its arrays (`StructuredGP.get_state` names) from the default
        # training, which needs no TensorFlow: the model is then built on first use
        self._model, self._state = (None, dict(model)) if isinstance(model, dict) else (model, None)
        self.scores = dict(scores or {})
        self._predict_fn = None
        self._mean_fn = None
        self._gold_fn = None

    @property
    def model(self):
        """The `StructuredGP` (built from the trained arrays on first use)."""
        if self._model is None:
            self._model = _build_model(self.config, self.featurizer.n_features, len(self.labels), self._state)
            self._state = None
        return self._model

    # ---- training -----------------------------------------------------------------------------
    @classmethod
    def train(
        cls,
        train: Sequence[Sentence],
        config: TaggerConfig | None = None,
        *,
        dev: Sequence[Sentence] | None = None,
        callbacks: list[Callable[[Progress], None]] | None = None,
        checkpoint_dir: str | os.PathLike | None = None,
        resume: bool = False,
    ) -> "Tagger":
        """Fit features and the posterior on `train`: MAP + Laplace with evidence-fitted priors and
        a dev-fitted calibration for the weight-space model (the default), SVI otherwise."""
        config = config or TaggerConfig()
        config.validate()
        train = list(train)
        unlabelled = [s for s in train if s.labels is None]
        if unlabelled or not train:
            where = unlabelled[0] if unlabelled else None
            raise GpseqError(
                f"{where.source}:{where.line}: training sentence without labels" if where else "empty training corpus"
            )
        tcfg = config.training
        method = config.resolved_method()
        wants_dev = tcfg.calibrate if method == "laplace" else tcfg.early_stopping != "none"
        if dev is None and tcfg.dev_fraction > 0 and wants_dev and len(train) >= 10:
            from gpseq.corpora.splits import train_dev_split

            train_ids, dev_ids = train_dev_split(len(train), tcfg.dev_fraction, seed=tcfg.seed)
            dev = [train[i] for i in dev_ids]
            train = [train[i] for i in train_ids]
        labels = sorted({label for s in train for label in s.labels})
        featurizer = Featurizer(config.features).fit(train)
        label_index = {l: i for i, l in enumerate(labels)}
        data = cls._sequence_data(featurizer, train, label_index)
        if method == "laplace":
            from gpseq.training.laplace import train_laplace

            dev_data = cls._sequence_data(featurizer, list(dev), label_index) if dev else None
            arrays, scores = train_laplace(config, featurizer, len(labels), data, dev_data, callbacks)
            scores.update(train_sentences=len(train), dev_sentences=len(dev or []))
            return cls(config, featurizer, labels, arrays, scores)
        from gpseq import _tensorflow

        tf = _tensorflow.load()

        from gpseq.gp.inducing import kmeans_inducing
        from gpseq.structured.model import build_structured_gp

        dtype = tf.float32 if config.dtype == "float32" else tf.float64
        inducing = None
        if config.model.has_inducing:
            M = min(config.model.num_inducing, data.rows.shape[0])
            inducing = kmeans_inducing(data.rows, M, seed=tcfg.seed, snap=True)
            inducing = inducing[0] if isinstance(inducing, tuple) else inducing
            inducing = inducing.toarray() if sp.issparse(inducing) else np.asarray(inducing)
        # a sentence longer than a batch may hold is trained as consecutive pieces (memory bounded
        # by batch_tokens; the transitions across a cut are left out of the likelihood)
        data = data.cut_long(tcfg.batch_tokens)
        tf.random.set_seed(tcfg.seed)
        from gpseq.training.distribute import make_strategy

        strategy = make_strategy(tcfg.strategy, tcfg.devices)  # variables are created in its scope
        with strategy.scope():
            model = build_structured_gp(config.model, featurizer.n_features, len(labels), inducing, dtype,
                                        num_data=len(data), num_samples=tcfg.num_samples)
        tagger = cls(config, featurizer, labels, model)
        evaluate = None
        if dev:
            dev = list(dev)

            def evaluate():
                report = tagger.evaluate(dev, mean=True)
                metrics = report.to_dict()
                if tcfg.early_stopping == "nll":
                    return -metrics["token_nll"], metrics
                f1 = metrics.get("chunk_f1")
                return (f1 if f1 is not None else metrics["token_accuracy"]), metrics

        from gpseq.training.trainer import Trainer

        trainer = Trainer(model, tcfg, evaluate=evaluate, callbacks=callbacks, checkpoint_dir=checkpoint_dir,
                          strategy=strategy)
        state = trainer.fit(data, resume=resume)
        tagger.scores = {
            "steps": state.step,
            "best_dev_score": state.best_score,
            "best_step": state.best_step,
            "skipped_steps": state.skipped_steps,
            "stopped_early": state.stopped_early,
            "history": state.history,
            "train_sentences": len(train),
            "dev_sentences": len(dev or []),
        }
        return tagger

    @staticmethod
    def _sequence_data(featurizer: Featurizer, sentences: list[Sentence], label_index: dict | None) -> SequenceData:
        matrix = featurizer.transform(sentences)
        label_ids = None
        if label_index is not None:
            flat = [label for s in sentences for label in (s.labels or [])]
            label_ids = np.fromiter((label_index.get(l, -1) for l in flat), dtype=np.int32, count=len(flat))
        return SequenceData(sp.csr_matrix(matrix.rows), np.asarray(matrix.offsets, dtype=np.int64), label_ids)

    # ---- prediction ---------------------------------------------------------------------------
    def _deterministic(self, mean: bool | None, samples: int | None) -> bool:
        """Whether a prediction uses the deterministic calibrated predictive (`mean=True`) or
        Monte Carlo over q(f): explicit `mean` wins, then explicit `samples`, then the config."""
        if mean is not None:
            return bool(mean)
        return samples is None and self.config.predictive == "deterministic"

    def _compiled(self, mean: bool):
        import tensorflow as tf

        from gpseq.structured import predict

        model = self.model
        if mean and self._mean_fn is None:
            self._mean_fn = tf.function(lambda batch: predict.predict_deterministic(model, batch),
                                        input_signature=[batch_signature(model.dtype)])
        if not mean and self._predict_fn is None:
            self._predict_fn = tf.function(
                lambda batch, num_samples, seed: predict.predict_monte_carlo(model, batch, num_samples, seed),
                input_signature=[batch_signature(model.dtype), tf.TensorSpec([], tf.int32), tf.TensorSpec([2], tf.int32)],
            )
        return self._mean_fn if mean else self._predict_fn

    def predict_batches(self, sentences: list[Sentence], *, samples: int | None = None, mean: bool | None = None,
                        batch_size: int = 256, seed: int = 0, max_tokens: int | None = None):
        """Yields (sentence index array, marginals [B, T, V], paths [B, T], log-probs [B])."""
        yield from self.predict_features(self.featurizer.transform(sentences), samples=samples, mean=mean,
                                         batch_size=batch_size, seed=seed, max_tokens=max_tokens)

    def predict_features(self, matrix, *, samples: int | None = None, mean: bool | None = None,
                         batch_size: int = 256, seed: int = 0, max_tokens: int | None = None):
        """`predict_batches` for a FeatureMatrix (e.g. `featurizer.transform_docs(docs)`, rows `[N, D]`):
        yields (sentence index array, marginals [B, T, V], paths [B, T], log-probs [B]).

        Batches hold at most `batch_size` sentences and PREDICT_TOKENS padded tokens (S× that
        under Monte Carlo). A sentence longer than `max_tokens` (default: the config's
        `predict_max_tokens`) is tagged in overlapping windows of that many tokens and yielded
        alone, stitched (see `tag`)."""
        data = SequenceData(sp.csr_matrix(matrix.rows), np.asarray(matrix.offsets, dtype=np.int64), None)
        mean = self._deterministic(mean, samples)
        samples = samples or self.config.predict_samples
        max_tokens = max_tokens or self.config.predict_max_tokens
        overlap = self.config.predict_overlap
        _check_window(max_tokens, overlap)
        numbers = itertools.count()  # one seed per compiled call
        short = np.flatnonzero(data.lengths <= max_tokens)
        for ids in token_batches(data.lengths[short], PREDICT_TOKENS, batch_size):
            marg, path, logp = self._predict_batch(data, short[ids], mean, samples, [seed, next(numbers)])
            yield short[ids], marg, path, logp
        for index in np.flatnonzero(data.lengths > max_tokens):
            start, stop = data.offsets[index], data.offsets[index + 1]
            windows = sequence_windows(int(stop - start), max_tokens, overlap)  # [W, 4]
            pieces = data.slices(start + windows[:, 0], start + windows[:, 1])
            marg = path = None
            for ids in token_batches(pieces.lengths, PREDICT_TOKENS, batch_size):
                window_marg, window_path, _ = self._predict_batch(pieces, ids, mean, samples, [seed, next(numbers)])
                if marg is None:
                    marg = np.empty((stop - start, window_marg.shape[-1]), dtype=window_marg.dtype)  # [T, V]
                    path = np.empty(stop - start, dtype=window_path.dtype)  # [T]
                for row, w in enumerate(ids):
                    first, _, keep_start, keep_stop = windows[w]
                    marg[keep_start:keep_stop] = window_marg[row, keep_start - first:keep_stop - first]
                    path[keep_start:keep_stop] = window_path[row, keep_start - first:keep_stop - first]
            labelled = SequenceData(data.rows[start:stop], np.array([0, stop - start], dtype=np.int64),
                                    path.astype(np.int32))
            logp = self._chain_log_probs(labelled, mean, samples, batch_size, [seed, next(numbers)], max_tokens)
            yield np.array([index]), marg[None], path[None], logp

    def _predict_batch(self, data: SequenceData, ids: np.ndarray, mean: bool, samples: int, seed: list[int]):
        """(marginals [B, T, V], Viterbi paths [B, T], log p(path | X) [B]) of the sentences `ids` of `data`."""
        import tensorflow as tf

        dtype = np.float32 if self.config.dtype == "float32" else np.float64
        fn = self._compiled(mean)
        batch = {k: tf.convert_to_tensor(v) for k, v in make_batch(data, ids, dtype=dtype).items()}
        if mean:
            marg, path, logp = fn(batch)
        else:
            marg, path, logp = fn(batch, tf.constant(samples, tf.int32), tf.constant(seed, tf.int32))
        return marg.numpy(), path.numpy(), logp.numpy()

    def tag(self, sentences: Iterable, *, samples: int | None = None, mean: bool | None = None,
            decode: str | None = None, batch_size: int = 256, max_tokens: int | None = None) -> list[TaggedSentence]:
        """Label tokenised sentences: labels, per-token marginals and the path's log-probability.

        Marginals are the model's calibrated predictive (deterministic by default, `mean=True`
        forces it; `samples=S` averages S Monte Carlo draws of f); labels are the Viterbi path of
        the posterior-mean potentials (`decode="max-marginal"`: each token's most probable label).

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
        distributions were the whole sentence's)."""
        sentences = _as_sentences(sentences)
        decode = decode or self.config.decode
        results: list[TaggedSentence | None] = [None] * len(sentences)
        for ids, marg, path, logp in self.predict_batches(sentences, samples=samples, mean=mean,
                                                          batch_size=batch_size, max_tokens=max_tokens):
            for row, index in enumerate(ids):
                T = len(sentences[index].tokens)
                probs = marg[row, :T].astype(np.float64)
                probs /= np.maximum(probs.sum(-1, keepdims=True), 1e-300)
                best = probs.argmax(-1) if decode == "max-marginal" else path[row, :T]
                results[index] = TaggedSentence(
                    tokens=list(sentences[index].tokens),
                    labels=[self.labels[i] for i in best],
                    probabilities=probs,
                    label_set=self.labels,
                    sequence_log_prob=float(logp[row]),
                )
        return results  # type: ignore[return-value]

    def evaluate(self, corpus: Sequence[Sentence], *, samples: int | None = None, mean: bool | None = None,
                 n_bins: int = 15):
        """Metrics of `gpseq.evaluate` on a labelled corpus (gold labels unseen in training count as errors)."""
        from gpseq.evaluate import evaluate

        corpus = list(corpus)
        tagged = self.tag(corpus, samples=samples, mean=mean)
        gold_logp = self.gold_log_probs(corpus, samples=samples, mean=mean)
        return evaluate(
            [list(s.labels) for s in corpus],
            [t.labels for t in tagged],
            labels=self.labels,
            probabilities=[t.probabilities for t in tagged],
            sequence_log_probs=list(gold_logp),
            scheme=self.config.tag_scheme,
            n_bins=n_bins,
        )

    def _compiled_gold(self):
        import tensorflow as tf

        from gpseq.structured import predict

        if getattr(self, "_gold_fn", None) is None:
            model = self.model
            signature = [batch_signature(model.dtype), tf.TensorSpec([], tf.int32), tf.TensorSpec([2], tf.int32),
                         tf.TensorSpec([], tf.bool)]
            self._gold_fn = tf.function(lambda batch, num_samples, seed, mean: predict.gold_log_prob(
                model, batch, num_samples, seed, mean), input_signature=signature)
        return self._gold_fn

    def gold_log_probs(self, corpus: Sequence[Sentence], *, samples: int | None = None, mean: bool | None = None,
                       batch_size: int = 256, seed: int = 1, max_tokens: int | None = None) -> np.ndarray:
        """log p(gold path | X) per sentence: log E_q[p(y | f)] by Monte Carlo (log-mean-exp over
        `samples` draws), or p(y | E f) with `mean`; −inf when a gold label was never seen in training.
        A sentence longer than `max_tokens` (default `predict_max_tokens`) is scored in windows (`tag`)."""
        corpus = list(corpus)
        mean = self._deterministic(mean, samples)
        data = self._sequence_data(self.featurizer, corpus, self.label_index)
        max_tokens = max_tokens or self.config.predict_max_tokens
        _check_window(max_tokens, self.config.predict_overlap)
        return self._chain_log_probs(data, mean, samples or self.config.predict_samples, batch_size, [seed, 0],
                                     max_tokens)

    def _chain_log_probs(self, data: SequenceData, mean: bool, samples: int, batch_size: int, seed: list[int],
                         max_tokens: int) -> np.ndarray:
        """log p(labels | X) `[B]` of every labelled sequence of `data` (−inf where a label id is −1).

        A sequence longer than `max_tokens` is scored as a junction tree of its windows
        (`sequence_windows`): Σ_w log p_w(y_w) − Σ_w log p(y of w ∩ w+1), every term the model's
        chain on that stretch alone. Scores of the parts add up to the whole path's score exactly;
        the windows' log-partitions stand in for the sentence's."""
        import tensorflow as tf

        lengths = data.lengths
        token_owner = np.repeat(np.arange(len(data)), lengths)
        unseen = np.bincount(token_owner, weights=data.label_ids < 0, minlength=len(data)) > 0
        if (lengths > max_tokens).any():
            owner, sign, starts, stops = [], [], [], []
            for index, length in enumerate(lengths):
                windows = sequence_windows(int(length), max_tokens, self.config.predict_overlap)
                shared = np.stack([windows[1:, 0], windows[:-1, 1]], axis=1)  # [W − 1, 2] w ∩ w+1
                parts = np.concatenate([windows[:, :2], shared]) + data.offsets[index]
                owner += [index] * len(parts)
                sign += [1.0] * len(windows) + [-1.0] * len(shared)
                starts.append(parts[:, 0])
                stops.append(parts[:, 1])
            owner, sign = np.array(owner), np.array(sign)
            pieces = data.slices(np.concatenate(starts), np.concatenate(stops))
        else:
            owner, sign, pieces = np.arange(len(data)), np.ones(len(data)), data
        out = np.zeros(len(data))
        dtype = np.float32 if self.config.dtype == "float32" else np.float64
        samples = tf.constant(samples, tf.int32)
        fn = self._compiled_gold()
        for number, ids in enumerate(token_batches(pieces.lengths, PREDICT_TOKENS, batch_size)):
            raw = make_batch(pieces, ids, dtype=dtype)
            raw["labels"] = np.maximum(raw["labels"], 0)  # unseen labels: −inf below, whatever this scores
            batch = {k: tf.convert_to_tensor(v) for k, v in raw.items()}
            logp = fn(batch, samples, tf.constant([seed[0], seed[1] + number], tf.int32), tf.constant(mean)).numpy()
            np.add.at(out, owner[ids], sign[ids] * logp)
        out = np.minimum(out, 0.0)  # log-probabilities; the windows' sum can round (or approximate) above 0
        out[unseen] = -np.inf
        return out

    # ---- persistence --------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike) -> Path:
        """Write the model directory atomically (temporary sibling, then rename).

        An existing `directory` is replaced only if it is a gpseq model directory holding nothing
        but the files gpseq wrote (`tagger.json`'s "files" manifest; for models written before
        the manifest, only tagger.json, arrays.npz and features/): checked before writing and
        again immediately before the replace, so files put there meanwhile are never deleted
        (`OutputError` instead). Temporaries of saves that were killed are removed; the
        directory and its files get the permissions of the umask."""
        directory = Path(directory)
        _check_save_target(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(directory)
        pid = os.getpid()
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-{pid}-", dir=directory.parent))
        try:
            self.featurizer.save(tmp / "features")
            arrays = self._state if self._state is not None else self.model.get_state()
            np.savez_compressed(tmp / "arrays.npz", **arrays)
            meta = {
                "format": FORMAT,
                "format_version": FORMAT_VERSION,
                "gpseq_version": __version__,
                "labels": self.labels,
                "num_features": int(self.featurizer.n_features),
                "config": self.config.to_dict(),
                "scores": self.scores,
                "arrays": {name: list(value.shape) for name, value in arrays.items()},
                "files": _file_manifest(tmp),
            }
            with open(tmp / "tagger.json", "w", encoding="utf-8") as handle:
                json.dump(meta, handle, indent=2, default=json_default)
            apply_umask(tmp)
            replace_model_dir(tmp, directory)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Tagger":
        """Load a model directory written by `save` (no training corpus needed).

        Everything is checked before the model is built: the files against tagger.json's
        manifest (size and sha256, when there is one), the arrays (a missing, empty, truncated
        or non-npz arrays.npz), and the metadata against the arrays and the featurizer (label
        count, num_features, shapes); any mismatch is a one-line ModelFormatError naming the file."""
        directory = Path(directory)
        meta_path = directory / META_FILE
        meta = read_model_meta(directory)
        if "files" in meta:
            _verify_manifest(directory, meta_path, meta["files"])
        try:
            config = TaggerConfig.from_dict(meta["config"])
            config.validate()
        except KeyError:
            raise ModelFormatError(f"{meta_path}: no model configuration (key 'config')") from None
        except (ConfigError, TypeError, AttributeError, ValueError) as error:
            raise ModelFormatError(f"{meta_path}: invalid model configuration ({error})") from None
        _check_labels_against_shapes(meta_path, meta, config)
        featurizer = Featurizer.load(directory / "features")
        arrays = _read_arrays(directory / "arrays.npz")
        _check_arrays(meta_path, directory / "arrays.npz", meta, arrays, featurizer, config)
        model = _build_model(config, meta["num_features"], len(meta["labels"]), arrays)
        return cls(config, featurizer, meta["labels"], model, meta.get("scores"))


def _build_model(config: TaggerConfig, num_features: int, num_labels: int, arrays: dict):
    """The `StructuredGP` of `config` holding `arrays` (`StructuredGP.get_state` names)."""
    from gpseq import _tensorflow

    tf = _tensorflow.load()

    from gpseq.structured.model import StructuredGP, build_structured_gp

    dtype = tf.float32 if config.dtype == "float32" else tf.float64
    model = build_structured_gp(config.model, num_features, num_labels, StructuredGP.inducing_from_state(arrays),
                                dtype)
    model.set_state(arrays)
    return model


# ---- model directories: what gpseq wrote, what it may replace ------------------------------------

# What `Tagger.save` writes: the only entries an old model directory (no manifest) may hold.
_LEGACY_MODEL_FILES = frozenset({"tagger.json", "arrays.npz", "features/featurizer.json", "features/vocabulary.npz"})
_LEGACY_MODEL_DIRS = frozenset({"features"})


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _file_manifest(root: Path) -> dict:
    """{relative path: {"sha256", "size"}} of every file under `root` but tagger.json."""
    manifest = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        name = path.relative_to(root).as_posix()
        if name != "tagger.json":
            manifest[name] = {"sha256": _sha256(path), "size": path.stat().st_size}
    return manifest


def _entries(root: Path) -> tuple[set[str], set[str], list[str]]:
    """(regular files, directories, anything else such as symlinks) under `root`, relative POSIX paths."""
    files, dirs, other = set(), set(), []
    stack = [root]
    while stack:
        folder = stack.pop()
        with os.scandir(folder) as scan:
            for entry in scan:
                name = Path(entry.path).relative_to(root).as_posix()
                if entry.is_symlink():
                    other.append(name)
                elif entry.is_dir():
                    dirs.add(name)
                    stack.append(Path(entry.path))
                elif entry.is_file():
                    files.add(name)
                else:
                    other.append(name)
    return files, dirs, sorted(other)


def _foreign_content(directory: Path) -> str | None:
    """Why `directory` may not be replaced by a model (None: it is an empty directory, or a gpseq
    model directory holding only what gpseq wrote, unchanged)."""
    try:
        files, dirs, other = _entries(directory)
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    if not files and not dirs and not other:
        return None
    meta_path = directory / "tagger.json"
    if "tagger.json" not in files:
        return "exists and is not a gpseq model directory (no tagger.json)"
    try:
        meta = json.loads(meta_path.read_bytes().decode("utf-8"))
    except (OSError, ValueError):
        return "is not a gpseq model directory (its tagger.json is not gpseq's)"
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        return "is not a gpseq model directory (its tagger.json has no gpseq-tagger format marker)"
    manifest = meta.get("files")
    if manifest is None:  # written before the manifest: only the files gpseq writes
        allowed_files, allowed_dirs = _LEGACY_MODEL_FILES, _LEGACY_MODEL_DIRS
    else:
        if not isinstance(manifest, dict) or not all(
                isinstance(k, str) and isinstance(v, dict) for k, v in manifest.items()):
            return "is not a gpseq model directory (tagger.json has a malformed file manifest)"
        allowed_files = set(manifest) | {"tagger.json"}
        allowed_dirs = {parent.as_posix() for name in allowed_files for parent in Path(name).parents
                        if parent != Path(".")}
    foreign = sorted(other) + sorted((files - set(allowed_files)) | (dirs - set(allowed_dirs)))
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        return f"holds {foreign[0]}{more}, which gpseq did not write"
    if manifest is not None:
        for name, record in sorted(manifest.items()):
            path = directory / name
            if name not in files:
                continue  # a missing file loses nothing
            try:
                changed = path.stat().st_size != record.get("size") or _sha256(path) != record.get("sha256")
            except OSError:
                changed = True
            if changed:
                return f"holds {name}, changed since gpseq wrote it (size or sha256 differ from tagger.json)"
    return None


def _check_save_target(directory: str | os.PathLike) -> None:
    """OutputError unless `Tagger.save(directory)` may write there: the parent can be written, and
    `directory` is absent, empty, or a gpseq model directory holding only the files gpseq wrote."""
    directory = Path(directory)
    if os.path.lexists(directory):
        if directory.is_symlink():
            raise OutputError(directory, "is a symbolic link; give the model directory itself")
        if not directory.is_dir():
            raise OutputError(directory, "exists and is not a directory; refusing to replace it")
        problem = _foreign_content(directory)
        if problem is not None:
            raise OutputError(directory, f"{problem}; refusing to replace it")
    writable_dir(directory.absolute().parent, directory)


def model_dir_temp(directory: str | os.PathLike) -> Path:
    """A new empty temporary sibling of `directory` to write a model directory into
    (`.NAME.tmp-PID-…`: removed by a later save if this process dies); after checking that
    `directory` may be replaced (`OutputError` otherwise) and removing dead saves' temporaries."""
    directory = Path(directory)
    _check_save_target(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(directory)
    return Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-{os.getpid()}-", dir=directory.parent))


def copy_model_files(source: Path, destination: Path) -> None:
    """Copy what gpseq wrote in the model directory `source` (tagger.json and the files of its
    manifest, checked against it; for a model without a manifest, the files `save` writes) into
    the existing directory `destination`; anything else in `source` is left behind."""
    meta_path = source / META_FILE
    meta = read_model_meta(source)
    manifest = meta.get("files")
    if manifest is not None:
        _verify_manifest(source, meta_path, manifest)
        names = sorted(manifest)
    else:
        names = sorted(name for name in _LEGACY_MODEL_FILES - {"tagger.json"} if (source / name).is_file())
    for name in ["tagger.json", *names]:
        (destination / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / name, destination / name)


def replace_model_dir(written: Path, directory: Path) -> None:
    """Rename the complete model directory `written` (a sibling of `directory`) onto `directory`.

    `directory` is replaced only if it is absent, empty, or a gpseq model directory holding only
    what gpseq wrote: checked now and once more after moving it aside (nothing can be added to it
    then), so files put there at any time before are never deleted (`OutputError`, `directory`
    left as it was)."""
    directory = Path(directory)
    _check_save_target(directory)  # again: files may have been put there since the first check
    old = None
    if os.path.lexists(directory):
        old = directory.with_name(f".{directory.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
        os.replace(directory, old)
        problem = _foreign_content(old)
        if problem is not None:
            os.replace(old, directory)
            raise OutputError(directory, f"{problem}; refusing to replace it")
    os.replace(written, directory)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _remove_stale_temps(directory: Path) -> None:
    """Delete `.NAME.tmp-PID-*` / `.NAME.old-PID-*` siblings left by saves whose process is dead."""
    prefixes = (f".{directory.name}.tmp-", f".{directory.name}.old-")
    for path in stale_temp_siblings(directory.parent, prefixes):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)


def _verify_manifest(directory: Path, meta_path: Path, manifest) -> None:
    """ModelFormatError naming the first file that is missing or differs from tagger.json's manifest."""
    if not isinstance(manifest, dict):
        raise ModelFormatError(f"{meta_path}: malformed file manifest ('files')")
    for name, record in sorted(manifest.items()):
        path = directory / name
        if not isinstance(record, dict) or ".." in Path(name).parts or Path(name).is_absolute():
            raise ModelFormatError(f"{meta_path}: malformed file manifest entry {name!r}")
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise ModelFormatError(f"{path}: missing (listed in {meta_path.name})") from None
        except OSError as error:
            raise ModelFormatError(f"{path}: unreadable ({error.strerror or error})") from None
        if size != record.get("size"):
            what = "empty file" if size == 0 else f"{size:,} bytes"
            raise ModelFormatError(f"{path}: {what}, {meta_path.name} records {record.get('size'):,} bytes "
                                   "(truncated or changed since gpseq wrote it)"
                                   if isinstance(record.get("size"), int) else
                                   f"{path}: {what}; {meta_path.name} records no valid size")
        if _sha256(path) != record.get("sha256"):
            raise ModelFormatError(f"{path}: sha256 does not match {meta_path.name} (changed since gpseq wrote it)")


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of arrays.npz; a missing, empty, truncated or non-npz file is a ModelFormatError."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ModelFormatError(f"{path}: missing; the model directory is incomplete") from None
    except OSError as error:
        raise ModelFormatError(f"{path}: unreadable ({error.strerror or error})") from None
    if size == 0:
        raise ModelFormatError(f"{path}: empty file (0 bytes); the model directory is damaged")
    try:
        handle = np.load(path, allow_pickle=False)
        if not isinstance(handle, np.lib.npyio.NpzFile):
            raise ModelFormatError(f"{path}: not an .npz archive of arrays")
        with handle:
            return {name: handle[name] for name in handle.files}
    except ModelFormatError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as error:
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ModelFormatError(f"{path}: unreadable arrays, truncated or corrupt ({detail})") from None


def _shape(value) -> list[int] | None:
    if isinstance(value, (list, tuple)) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                for d in value):
        return list(value)
    return None


def _check_labels_against_shapes(meta_path: Path, meta: dict, config: TaggerConfig) -> None:
    """The label list against the array shapes tagger.json records, before anything is read or
    allocated (a tagger.json with extra labels must not build a [V, V] model first)."""
    labels = meta.get("labels")
    if not isinstance(labels, list) or not labels or not all(isinstance(l, str) for l in labels):
        raise ModelFormatError(f"{meta_path}: 'labels' must be a non-empty list of strings")
    if len(set(labels)) != len(labels):
        raise ModelFormatError(f"{meta_path}: 'labels' has duplicates")
    num_features = meta.get("num_features")
    if not isinstance(num_features, int) or isinstance(num_features, bool) or num_features < 1:
        raise ModelFormatError(f"{meta_path}: 'num_features' must be a positive integer, got {num_features!r}")
    recorded = meta.get("arrays")
    if not isinstance(recorded, dict) or not recorded:
        raise ModelFormatError(f"{meta_path}: no array shapes ('arrays')")
    shapes = {}
    for name, shape in recorded.items():
        shapes[name] = _shape(shape)
        if shapes[name] is None:
            raise ModelFormatError(f"{meta_path}: array {name!r} has an invalid shape {shape!r}")
    V, D = len(labels), num_features
    expected = {"var:label_bias": [V], "var:pairwise_mean": [V, V]}
    if config.model.has_weight_space:
        expected["var:linear/q_mu"] = [D, V]
    for name, shape in expected.items():
        if shapes.get(name) != shape:
            raise ModelFormatError(
                f"{meta_path}: {V:,} labels and {D:,} features, but the array {name} has shape "
                f"{shapes.get(name)} (expected {shape}): labels or num_features do not match the arrays"
            )
    if config.model.has_inducing:
        if shapes.get("inducing_inputs/shape") != [2] or shapes.get("inducing_inputs/indptr") is None:
            raise ModelFormatError(f"{meta_path}: the model's inducing inputs are missing from 'arrays'")
        M = shapes["inducing_inputs/indptr"][0] - 1
        if M < 1:
            raise ModelFormatError(f"{meta_path}: no inducing inputs (indptr of shape {[M + 1]})")
        if config.model.unary != "deep":
            K = config.model.num_components
            for name, shape in {"var:inducing/mixture_logits": [K], "var:inducing/q_mu": [K, M, V]}.items():
                if name in shapes and shapes[name] != shape:
                    raise ModelFormatError(
                        f"{meta_path}: {V:,} labels, {K} components and {M} inducing inputs, but the array "
                        f"{name} has shape {shapes[name]} (expected {shape})")
        elif "var:deep/mean_weights" in shapes and shapes["var:deep/mean_weights"] != [D, config.model.hidden_dims]:
            raise ModelFormatError(
                f"{meta_path}: {D:,} features and hidden_dims {config.model.hidden_dims}, but the array "
                f"var:deep/mean_weights has shape {shapes['var:deep/mean_weights']}")


def _check_arrays(meta_path: Path, npz_path: Path, meta: dict, arrays: dict, featurizer: Featurizer,
                  config: TaggerConfig) -> None:
    """The arrays read from arrays.npz against tagger.json's shapes, and num_features against the featurizer."""
    if meta["num_features"] != featurizer.n_features:
        raise ModelFormatError(
            f"{meta_path}: num_features {meta['num_features']:,} does not match the featurizer's "
            f"{featurizer.n_features:,} (features/featurizer.json)")
    recorded = {name: list(shape) for name, shape in meta["arrays"].items()}
    actual = {name: list(value.shape) for name, value in arrays.items()}
    missing = sorted(set(recorded) - set(actual))
    extra = sorted(set(actual) - set(recorded))
    if missing:
        raise ModelFormatError(f"{npz_path}: lacks the array {missing[0]!r} listed in {meta_path.name}")
    if extra:
        raise ModelFormatError(f"{npz_path}: holds an array {extra[0]!r} not listed in {meta_path.name}")
    for name, shape in recorded.items():
        if actual[name] != shape:
            raise ModelFormatError(f"{npz_path}: array {name!r} has shape {actual[name]}, "
                                   f"{meta_path.name} records {shape}")
    if config.model.has_inducing:
        shape = arrays["inducing_inputs/shape"]
        M = arrays["inducing_inputs/indptr"].shape[0] - 1
        if shape.dtype.kind not in "iu" or [int(d) for d in shape] != [M, featurizer.n_features]:
            raise ModelFormatError(f"{npz_path}: inducing inputs of shape {shape.tolist()}, expected "
                                   f"[{M}, {featurizer.n_features}] (inducing points × features)")
