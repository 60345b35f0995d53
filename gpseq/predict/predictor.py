"""Batched prediction of a `StructuredGP` over sparse features, memory bounded whatever the input.

`Predictor` cuts a corpus (`SequenceData`) into batches of at most PREDICT_TOKENS padded tokens,
tags a sentence longer than `max_tokens` in overlapping windows and stitches them, and scores
label paths (`log_probs`), a long one as a junction tree of its windows. The compiled model
functions are those of `structured/predict.py`; `Tagger` and the spaCy component use this
through `Tagger.predict_features` / `Tagger.gold_log_probs`.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from gpseq._tensorflow import check_not_forked
from gpseq.cancellation import check_cancelled
from gpseq.training.batching import SequenceData, batch_signature, make_batch, sequence_windows, token_batches

PREDICT_TOKENS = 8192  # padded tokens a prediction batch holds at most
# padded tokens × posterior draws a Monte Carlo batch holds at most: its arrays are S per token (the
# chains' [S, B, T, V] and more), so a batch of PREDICT_TOKENS tokens at S = 100 would take gigabytes;
# a sentence or window (≤ max_tokens tokens) longer than the share is a batch of its own
PREDICT_TOKEN_DRAWS = 65_536


def batch_tokens(mean: bool, samples: int) -> int:
    """The padded tokens a prediction batch holds at most: PREDICT_TOKENS, and under Monte Carlo
    (not `mean`) at most PREDICT_TOKEN_DRAWS / `samples`."""
    return PREDICT_TOKENS if mean else max(1, min(PREDICT_TOKENS, PREDICT_TOKEN_DRAWS // max(1, int(samples))))


class Predictor:
    """The compiled prediction and scoring functions of one `StructuredGP`, over token-capped batches.

    `model`: the `StructuredGP`, or a function that builds it (called on first use: a model whose
    deterministic predictive `linear` serves never builds it). `linear`: the model's
    `LinearPredictive` (NumPy, the default model's deterministic predictive), or None.
    `overlap`: context tokens a window keeps on either side of the tokens it is used for
    (`sequence_windows`); `dtype`: the NumPy float type of the model's batches."""

    def __init__(self, model, overlap: int, dtype=np.float32, linear=None):
        self._model = model
        self.overlap, self.dtype, self.linear = overlap, dtype, linear
        self._mean_fn = self._sample_fn = self._gold_fn = None
        self._chain_fns: dict[bool, object] = {}

    @property
    def model(self):
        if callable(self._model) and not hasattr(self._model, "unaries"):
            self._model = self._model()
        return self._model

    def predict(self, data: SequenceData, *, mean: bool, samples: int, batch_size: int, seed: int,
                max_tokens: int, chains: bool = False) -> Iterator[tuple]:
        """Yields (sentence index array, marginals [B, T, V], paths [B, T], log p(path | X) [B]), and with
        `chains` a fifth item, the batch's `ChainPosterior` (exact span, path and n-best probabilities).

        Batches hold at most `batch_size` sentences and `batch_tokens` padded tokens (under Monte
        Carlo at most PREDICT_TOKEN_DRAWS token × draw pairs, or one sentence or window). A
        sentence longer than `max_tokens` is tagged in overlapping windows of that many tokens,
        each token's results taken from the window where it is most central, and yielded alone
        (see `Tagger.tag`)."""
        draws = [seed, 0]  # one seed for every batch: the same draws of the model's global quantities
        # (`gpseq.structured.unaries`), so a sentence's results do not depend on its batch
        budget = batch_tokens(mean, samples)
        short = np.flatnonzero(data.lengths <= max_tokens)
        for ids in token_batches(data.lengths[short], budget, batch_size):
            check_cancelled()
            marg, path, logp, posterior = self._batch(data, short[ids], mean, samples, draws, chains)
            yield (short[ids], marg, path, logp, posterior) if chains else (short[ids], marg, path, logp)
        for index in np.flatnonzero(data.lengths > max_tokens):
            start, stop = data.offsets[index], data.offsets[index + 1]
            windows = sequence_windows(int(stop - start), max_tokens, self.overlap)  # [W, 4]
            pieces = data.slices(start + windows[:, 0], start + windows[:, 1])
            marg = path = unary = pairwise = weights = None
            for ids in token_batches(pieces.lengths, budget, batch_size):
                check_cancelled()
                window_marg, window_path, _, window = self._batch(pieces, ids, mean, samples, draws,
                                                                  chains)
                if marg is None:
                    marg = np.empty((stop - start, window_marg.shape[-1]), dtype=window_marg.dtype)  # [T, V]
                    path = np.empty(stop - start, dtype=window_path.dtype)  # [T]
                if chains and unary is None:
                    pairwise, weights = window.pairwise, window.weights
                    unary = np.empty((window.unary.shape[0], stop - start, window.unary.shape[-1]))  # [R, T, V]
                for row, w in enumerate(ids):
                    first, _, keep_start, keep_stop = windows[w]
                    marg[keep_start:keep_stop] = window_marg[row, keep_start - first:keep_stop - first]
                    path[keep_start:keep_stop] = window_path[row, keep_start - first:keep_stop - first]
                    if chains:
                        unary[:, keep_start:keep_stop] = window.unary[:, row, keep_start - first:keep_stop - first]
            labelled = SequenceData(data.rows[start:stop], np.array([0, stop - start], dtype=np.int64),
                                    path.astype(np.int32))
            logp = self.log_probs(labelled, mean=mean, samples=samples, batch_size=batch_size,
                                  seed=draws, max_tokens=max_tokens)
            if chains:
                # one chain over the whole sentence: its unaries are exact in any window (deterministic);
                # Monte Carlo draws are stitched from the windows' and the first window's pairwise is used
                from gpseq.structured.spans import ChainPosterior

                yield np.array([index]), marg[None], path[None], logp, ChainPosterior(
                    unary[:, None], pairwise, [stop - start], weights)
            else:
                yield np.array([index]), marg[None], path[None], logp

    def log_probs(self, data: SequenceData, *, mean: bool, samples: int, batch_size: int, seed: list[int],
                  max_tokens: int) -> np.ndarray:
        """log p(labels | X) `[B]` of every labelled sequence of `data` (−inf where a label id is −1):
        log E_q[p(y | f)] by Monte Carlo over `samples` draws, or p(y | E f) with `mean`.

        A sequence longer than `max_tokens` is scored as a junction tree of its windows
        (`sequence_windows`): Σ_w log p_w(y_w) − Σ_w log p(y of w ∩ w+1), every term the model's
        chain on that stretch alone. Scores of the parts add up to the whole path's score exactly;
        the windows' log-partitions stand in for the sentence's."""
        lengths = data.lengths
        token_owner = np.repeat(np.arange(len(data)), lengths)
        unseen = np.bincount(token_owner, weights=data.label_ids < 0, minlength=len(data)) > 0
        if (lengths > max_tokens).any():
            owner, sign, starts, stops = [], [], [], []
            for index, length in enumerate(lengths):
                windows = sequence_windows(int(length), max_tokens, self.overlap)
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
        clipped = SequenceData(pieces.rows, pieces.offsets, np.maximum(pieces.label_ids, 0))  # unseen: −inf below
        for ids in token_batches(pieces.lengths, batch_tokens(mean, samples), batch_size):
            check_cancelled()
            if mean and self.linear is not None:
                logp = self.linear.log_probs(clipped, ids)
            else:
                logp = self._gold_batch(clipped, ids, mean, samples, seed)
            np.add.at(out, owner[ids], sign[ids] * logp)
        out = np.minimum(out, 0.0)  # log-probabilities; the windows' sum can round (or approximate) above 0
        out[unseen] = -np.inf
        return out

    def _gold_batch(self, data: SequenceData, ids: np.ndarray, mean: bool, samples: int, seed: list[int]):
        """log p(labels | X) `[B]` of the labelled sentences `ids` of `data` by the compiled model."""
        check_not_forked()
        import tensorflow as tf

        batch = {k: tf.convert_to_tensor(v) for k, v in make_batch(data, ids, dtype=self.dtype).items()}
        return self._compiled_gold()(batch, tf.constant(samples, tf.int32), tf.constant(seed, tf.int32),
                                     tf.constant(mean)).numpy()

    def _batch(self, data: SequenceData, ids: np.ndarray, mean: bool, samples: int, seed: list[int],
               chains: bool = False):
        """(marginals [B, T, V], Viterbi paths [B, T], log p(path | X) [B], the predictive's chains as a
        `ChainPosterior` (`predict.predict_with_chains`) with `chains`, else None) of the sentences
        `ids` of `data`: by the NumPy predictive `linear` when it serves, else the compiled model."""
        if mean and self.linear is not None:
            return self.linear.batch(data, ids, chains)
        check_not_forked()
        import tensorflow as tf

        batch = {k: tf.convert_to_tensor(v) for k, v in make_batch(data, ids, dtype=self.dtype).items()}
        if chains:
            from gpseq.structured.spans import ChainPosterior

            marg, path, logp, unary, pairwise, weights = self._compiled_chains(mean)(
                batch, tf.constant(samples, tf.int32), tf.constant(seed, tf.int32))
            return marg.numpy(), path.numpy(), logp.numpy(), ChainPosterior(unary.numpy(), pairwise.numpy(),
                                                                            data.lengths[ids], weights.numpy())
        fn = self._compiled(mean)
        if mean:
            marg, path, logp = fn(batch)
        else:
            marg, path, logp = fn(batch, tf.constant(samples, tf.int32), tf.constant(seed, tf.int32))
        return marg.numpy(), path.numpy(), logp.numpy(), None

    def _compiled_chains(self, mean: bool):
        import tensorflow as tf

        from gpseq.structured import predict

        if mean not in self._chain_fns:
            model = self.model
            self._chain_fns[mean] = tf.function(
                lambda batch, num_samples, seed: predict.predict_with_chains(model, batch, num_samples, seed, mean),
                input_signature=[batch_signature(model.dtype), tf.TensorSpec([], tf.int32), tf.TensorSpec([2], tf.int32)],
            )
        return self._chain_fns[mean]

    def _compiled(self, mean: bool):
        import tensorflow as tf

        from gpseq.structured import predict

        model = self.model
        if mean and self._mean_fn is None:
            self._mean_fn = tf.function(lambda batch: predict.predict_deterministic(model, batch),
                                        input_signature=[batch_signature(model.dtype)])
        if not mean and self._sample_fn is None:
            self._sample_fn = tf.function(
                lambda batch, num_samples, seed: predict.predict_monte_carlo(model, batch, num_samples, seed),
                input_signature=[batch_signature(model.dtype), tf.TensorSpec([], tf.int32), tf.TensorSpec([2], tf.int32)],
            )
        return self._mean_fn if mean else self._sample_fn

    def _compiled_gold(self):
        import tensorflow as tf

        from gpseq.structured import predict

        if self._gold_fn is None:
            model = self.model
            signature = [batch_signature(model.dtype), tf.TensorSpec([], tf.int32), tf.TensorSpec([2], tf.int32),
                         tf.TensorSpec([], tf.bool)]
            self._gold_fn = tf.function(lambda batch, num_samples, seed, mean: predict.gold_log_prob(
                model, batch, num_samples, seed, mean), input_signature=signature)
        return self._gold_fn
