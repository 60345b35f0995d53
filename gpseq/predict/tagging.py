"""What a trained model does with sentences: `TaggingModel` tags them (labels, calibrated marginals,
span and path probabilities, n-best, abstention), scores gold paths and evaluates, through the
model's batched `Predictor`. `Tagger` is one (`gpseq.tagger`, which adds training, selection and
the model directory); so is the model SVI trains while it early-stops on the dev split
(`gpseq.training.train`), which is not a Tagger yet."""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np

from gpseq.cancellation import check_cancelled, stopping_when
from gpseq.config import TaggerConfig, check_window
from gpseq.corpora.types import Sentence, as_sentences
from gpseq.predict.decode import TaggedSentence, TagOptions, given_span_probabilities, tag_batch
from gpseq.predict.predictor import Predictor
from gpseq.training.batching import SequenceData


def model_predictor(config: TaggerConfig, model, state: dict | None = None) -> Predictor:
    """The `Predictor` of a tagger's model: `model` the `StructuredGP` or a function that builds it,
    `state` its trained or loaded arrays (`StructuredGP.get_state` names) when it has them, with
    which the default model's deterministic predictive runs in NumPy (`gpseq.predict.linear`) and
    never builds the TensorFlow model; None for a live model that SVI may still be changing."""
    from gpseq.predict.linear import LinearPredictive

    dtype = np.float32 if config.dtype == "float32" else np.float64
    linear = None if state is None else LinearPredictive.from_state(config.model, state, dtype)
    return Predictor(model, config.predict_overlap, dtype, linear)


class TaggingModel:
    """A trained model's tagging: its configuration, featurizer and label set, and its `predictor`
    (`model_predictor`; a subclass may build it on first use, as `Tagger` does)."""

    def __init__(self, config: TaggerConfig, featurizer, labels: list[str], predictor: Predictor | None = None):
        self.config = config
        self.featurizer = featurizer
        self.labels = list(labels)
        self.label_index = {label: i for i, label in enumerate(self.labels)}
        self._predictor = predictor

    @property
    def predictor(self) -> Predictor:
        """The model's batched, windowed prediction (`gpseq/predict/predictor.py`)."""
        return self._predictor

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
        data = SequenceData(matrix.csr, np.asarray(matrix.offsets, dtype=np.int64), None)
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
        data = SequenceData.featurised(self.featurizer, corpus, self.label_index)
        max_tokens = max_tokens or self.config.predict_max_tokens
        check_window(max_tokens, self.config.predict_overlap)
        return self.predictor.log_probs(data, mean=mean, samples=samples or self.config.predict_samples,
                                        batch_size=batch_size, seed=[seed, 0], max_tokens=max_tokens)

