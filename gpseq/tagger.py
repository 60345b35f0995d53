"""The user-facing `Tagger`: train, tag, evaluate, save, load.

    tagger = Tagger.train(read_conll("train.conll"), TaggerConfig())
    for result in tagger.tag([["The", "cat", "sat", "."]]):
        print(result.labels, result.confidences)
    tagger.save("model/");  tagger = Tagger.load("model/")

A model directory is data: `tagger.json` (format version, gpseq version, labels, feature,
model and training configuration, scores), `features/` (the featuriser's vocabulary and
config), `arrays.npz` (variational parameters, hyperparameters, inducing inputs). No pickle;
the directory is written to a temporary sibling and renamed into place.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import scipy.sparse as sp

from gpseq import __version__
from gpseq.corpora.types import Sentence
from gpseq.errors import ConfigError, GpseqError, ModelFormatError
from gpseq.features import FeatureConfig, Featurizer, get_preset
from gpseq.structured.model import ModelConfig
from gpseq.training.batching import SequenceData, batch_signature, bucketed_batches, make_batch
from gpseq.training.trainer import Progress, Trainer, TrainingConfig

FORMAT_VERSION = 1
log = logging.getLogger("gpseq")


@dataclass
class TaggerConfig:
    """Everything needed to rebuild a tagger: features, model, training, prediction."""

    features: FeatureConfig = field(default_factory=lambda: get_preset("chunking"))
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    tag_scheme: str = "iob2"
    predict_samples: int = 16  # S, Monte Carlo samples of f for the calibrated marginals
    decode: str = "viterbi"  # "viterbi" (on the posterior-mean potentials) | "max-marginal"
    dtype: str = "float32"

    def to_dict(self) -> dict:
        return {
            "features": self.features.to_dict(),
            "model": self.model.to_dict(),
            "training": asdict(self.training),
            "tag_scheme": self.tag_scheme,
            "predict_samples": self.predict_samples,
            "decode": self.decode,
            "dtype": self.dtype,
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

    def validate(self) -> None:
        self.model.validate()
        self.training.validate()
        if self.decode not in ("viterbi", "max-marginal"):
            raise ConfigError(f"decode must be viterbi or max-marginal, got {self.decode!r}")
        if self.dtype not in ("float32", "float64"):
            raise ConfigError(f"dtype must be float32 or float64, got {self.dtype!r}")
        if self.predict_samples < 1:
            raise ConfigError(f"predict_samples must be >= 1, got {self.predict_samples}")


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
        self.model = model
        self.scores = dict(scores or {})
        self._predict_fn = None
        self._mean_fn = None
        self._gold_fn = None

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
        """Fit features, inducing inputs and the variational posterior by SVI on `train`."""
        import tensorflow as tf

        from gpseq.gp.inducing import kmeans_inducing
        from gpseq.structured.model import StructuredGP

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
        if dev is None and tcfg.dev_fraction > 0 and tcfg.early_stopping != "none" and len(train) >= 10:
            rng = np.random.default_rng([tcfg.seed, 7])
            order = rng.permutation(len(train))
            n_dev = max(1, int(round(tcfg.dev_fraction * len(train))))
            dev = [train[i] for i in sorted(order[:n_dev])]
            train = [train[i] for i in sorted(order[n_dev:])]
        labels = sorted({label for s in train for label in s.labels})
        featurizer = Featurizer(config.features).fit(train)
        data = cls._sequence_data(featurizer, train, {l: i for i, l in enumerate(labels)})
        dtype = tf.float32 if config.dtype == "float32" else tf.float64
        inducing = None
        if config.model.has_inducing:
            M = min(config.model.num_inducing, data.rows.shape[0])
            inducing = kmeans_inducing(data.rows, M, seed=tcfg.seed, snap=True)
            inducing = inducing[0] if isinstance(inducing, tuple) else inducing
            inducing = inducing.toarray() if sp.issparse(inducing) else np.asarray(inducing)
        tf.random.set_seed(tcfg.seed)
        from gpseq.training.distribute import make_strategy

        strategy = make_strategy(tcfg.strategy, tcfg.devices)  # variables are created in its scope
        with strategy.scope():
            model = StructuredGP(config.model, featurizer.n_features, len(labels), inducing, dtype=dtype)
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

        def loss(batch, seed):
            elbo = model.elbo(batch, len(data), tcfg.num_samples, seed)
            return -elbo, {}

        model.loss = loss
        model.natgrad_elbo = lambda batch, seed, q_mu, q_sqrt: model.elbo(
            batch, len(data), tcfg.num_samples, seed, q_mu=q_mu, q_sqrt=q_sqrt)
        trainer = Trainer(model, tcfg, evaluate=evaluate, callbacks=callbacks, checkpoint_dir=checkpoint_dir,
                          strategy=strategy)
        state = trainer.fit(data, resume=resume)
        del model.loss, model.natgrad_elbo
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
    def _compiled(self, mean: bool):
        import tensorflow as tf

        from gpseq.structured import chain

        model = self.model
        if mean and self._mean_fn is None:

            def mean_fn(batch):
                unary, pairwise = model.mean_potentials(batch)
                marg = chain.unary_marginals(unary, pairwise, batch["lengths"])
                path, _ = chain.viterbi(unary, pairwise, batch["lengths"])
                logp = tf.minimum(chain.log_likelihood(path, unary, pairwise, batch["lengths"]), 0.0)
                return marg, path, logp

            self._mean_fn = tf.function(mean_fn, input_signature=[batch_signature(model.dtype)])
        if not mean and self._predict_fn is None:

            def predict_fn(batch, num_samples, seed):
                marg, unary, pairwise, log_z = model.predict_marginals(batch, num_samples, seed)
                mean_unary, mean_pairwise = model.mean_potentials(batch)
                path, _ = chain.viterbi(mean_unary, mean_pairwise, batch["lengths"])
                logp = _mc_log_prob(model, path, unary, pairwise, batch["lengths"], log_z)
                return marg, path, logp

            self._predict_fn = tf.function(
                predict_fn,
                input_signature=[batch_signature(model.dtype), tf.TensorSpec([], tf.int32), tf.TensorSpec([2], tf.int32)],
            )
        return self._mean_fn if mean else self._predict_fn

    def predict_batches(self, sentences: list[Sentence], *, samples: int | None = None, mean: bool = False,
                        batch_size: int = 256, seed: int = 0):
        """Yields (sentence index array, marginals [B, T, V], paths [B, T], log-probs [B])."""
        yield from self.predict_features(self.featurizer.transform(sentences), samples=samples, mean=mean,
                                         batch_size=batch_size, seed=seed)

    def predict_features(self, matrix, *, samples: int | None = None, mean: bool = False,
                         batch_size: int = 256, seed: int = 0):
        """`predict_batches` for a FeatureMatrix (e.g. `featurizer.transform_docs(docs)`, rows `[N, D]`):
        yields (sentence index array, marginals [B, T, V], paths [B, T], log-probs [B])."""
        import tensorflow as tf

        data = SequenceData(sp.csr_matrix(matrix.rows), np.asarray(matrix.offsets, dtype=np.int64), None)
        samples = samples or self.config.predict_samples
        fn = self._compiled(mean)
        dtype = np.float32 if self.config.dtype == "float32" else np.float64
        for number, ids in enumerate(bucketed_batches(data.lengths, batch_size, None)):
            batch = {k: tf.convert_to_tensor(v) for k, v in make_batch(data, ids, dtype=dtype).items()}
            if mean:
                marg, path, logp = fn(batch)
            else:
                marg, path, logp = fn(batch, tf.constant(samples, tf.int32), tf.constant([seed, number], tf.int32))
            yield ids, marg.numpy(), path.numpy(), logp.numpy()

    def tag(self, sentences: Iterable, *, samples: int | None = None, mean: bool = False,
            decode: str | None = None, batch_size: int = 256) -> list[TaggedSentence]:
        """Label tokenised sentences; per-token distributions are Monte Carlo averages over q(f)
        (`samples` draws; `mean=True` uses the posterior-mean potentials instead)."""
        sentences = _as_sentences(sentences)
        decode = decode or self.config.decode
        results: list[TaggedSentence | None] = [None] * len(sentences)
        for ids, marg, path, logp in self.predict_batches(sentences, samples=samples, mean=mean,
                                                          batch_size=batch_size):
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

    def evaluate(self, corpus: Sequence[Sentence], *, samples: int | None = None, mean: bool = False,
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
        from gpseq._tfp import tfp

        from gpseq.structured import chain

        if getattr(self, "_gold_fn", None) is None:
            model = self.model
            signature = [batch_signature(model.dtype), tf.TensorSpec([], tf.int32), tf.TensorSpec([2], tf.int32),
                         tf.TensorSpec([], tf.bool)]

            def gold_fn(batch, num_samples, seed, mean):
                def mean_mode():
                    unary, pairwise = model.mean_potentials(batch)
                    ll = chain.log_likelihood(batch["labels"], unary, pairwise, batch["lengths"])
                    return tf.minimum(ll, 0.0)  # float32 rounding can put a near-certain path above 0

                def mc_mode():
                    seeds = tfp.random.split_seed(seed, 2)
                    unary = model.sample_unary(batch, num_samples, seeds[0])  # [K, S, B, T, V]
                    pairwise = model.sample_pairwise(num_samples, seeds[1])[:, None]  # [S, 1, V, V]
                    return _mc_log_prob(model, batch["labels"], unary, pairwise, batch["lengths"])

                return tf.cond(mean, mean_mode, mc_mode)

            self._gold_fn = tf.function(gold_fn, input_signature=signature)
        return self._gold_fn

    def gold_log_probs(self, corpus: Sequence[Sentence], *, samples: int | None = None, mean: bool = False,
                       batch_size: int = 256, seed: int = 1) -> np.ndarray:
        """log p(gold path | X) per sentence: log E_q[p(y | f)] by Monte Carlo (log-mean-exp over
        `samples` draws), or p(y | E f) with `mean`; −inf when a gold label was never seen in training."""
        import tensorflow as tf

        corpus = list(corpus)
        data = self._sequence_data(self.featurizer, corpus, self.label_index)
        out = np.full(len(corpus), -np.inf)
        dtype = np.float32 if self.config.dtype == "float32" else np.float64
        samples = tf.constant(samples or self.config.predict_samples, tf.int32)
        fn = self._compiled_gold()
        for number, ids in enumerate(bucketed_batches(data.lengths, batch_size, None)):
            raw = make_batch(data, ids, dtype=dtype)
            unseen = (raw["labels"] < 0).any(axis=1)
            raw["labels"] = np.maximum(raw["labels"], 0)
            batch = {k: tf.convert_to_tensor(v) for k, v in raw.items()}
            logp = fn(batch, samples, tf.constant([seed, number], tf.int32), tf.constant(mean)).numpy()
            out[ids] = np.where(unseen, -np.inf, logp)
        return out

    # ---- persistence --------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike) -> Path:
        """Write the model directory atomically (temporary sibling, then rename)."""
        directory = Path(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
        try:
            self.featurizer.save(tmp / "features")
            arrays = self.model.get_state()
            np.savez_compressed(tmp / "arrays.npz", **arrays)
            meta = {
                "format": "gpseq-tagger",
                "format_version": FORMAT_VERSION,
                "gpseq_version": __version__,
                "labels": self.labels,
                "num_features": int(self.featurizer.n_features),
                "config": self.config.to_dict(),
                "scores": self.scores,
                "arrays": {name: list(value.shape) for name, value in arrays.items()},
            }
            with open(tmp / "tagger.json", "w", encoding="utf-8") as handle:
                json.dump(meta, handle, indent=2, default=_json_default)
            old = directory.with_name(f".{directory.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            if directory.exists():
                os.replace(directory, old)
            os.replace(tmp, directory)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Tagger":
        """Load a model directory written by `save` (no training corpus needed)."""
        import tensorflow as tf

        from gpseq.structured.model import StructuredGP

        directory = Path(directory)
        meta_path = directory / "tagger.json"
        if not meta_path.is_file():
            raise ModelFormatError(f"{directory}: not a gpseq model directory (no tagger.json)")
        try:
            with open(meta_path, encoding="utf-8") as handle:
                meta = json.load(handle)
        except (OSError, json.JSONDecodeError) as error:
            raise ModelFormatError(f"{meta_path}: unreadable model metadata ({error})") from None
        if meta.get("format") != "gpseq-tagger":
            raise ModelFormatError(f"{meta_path}: not a gpseq tagger model")
        version = meta.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise ModelFormatError(
                f"{meta_path}: model format version {version} is newer than this gpseq "
                f"({__version__}) reads (<= {FORMAT_VERSION}); upgrade gpseq"
            )
        config = TaggerConfig.from_dict(meta["config"])
        featurizer = Featurizer.load(directory / "features")
        try:
            with np.load(directory / "arrays.npz", allow_pickle=False) as handle:
                arrays = {name: handle[name] for name in handle.files}
        except (OSError, ValueError) as error:
            raise ModelFormatError(f"{directory / 'arrays.npz'}: unreadable arrays ({error})") from None
        dtype = tf.float32 if config.dtype == "float32" else tf.float64
        model = StructuredGP(config.model, meta["num_features"], len(meta["labels"]),
                             StructuredGP.inducing_from_state(arrays), dtype=dtype)
        model.set_state(arrays)
        return cls(config, featurizer, meta["labels"], model, meta.get("scores"))


def _mc_log_prob(model, labels, unary, pairwise, lengths, log_z=None):
    """log E_q[p(y | f)] per sequence from samples `[K, S, B, T, V]` (log-mean-exp over S, mixture over K).

    Always the exact linear-chain p(y | f) (a pseudo-likelihood is a training objective, not a
    distribution over paths); `log_z [K, S, B]` reuses the partition functions already computed."""
    import tensorflow as tf

    from gpseq.structured import chain

    if log_z is None:
        ll = chain.log_likelihood(labels, unary, pairwise, lengths)  # [K, S, B]
    else:
        ll = chain.sequence_score(labels, unary, pairwise, lengths) - log_z
    # log p(y | f) ≤ 0; in float32 score − log Z of a long, near-certain path can round to +1e-5
    ll = tf.minimum(ll, 0.0)
    S = tf.cast(tf.shape(ll)[1], ll.dtype)
    per_component = tf.reduce_logsumexp(ll, axis=1) - tf.math.log(S)  # [K, B]
    log_weights = tf.math.log(model._mixture_weights())[:, None]
    return tf.reduce_logsumexp(per_component + log_weights, axis=0)


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
