"""From a batch's predictive to what `Tagger.tag` returns: decoding, span probabilities, n-best,
abstention flags, as `TaggedSentence`s.

`tag_batch` takes one batch of `Tagger.predict_batches` (marginals `[B, T, V]`, Viterbi paths
`[B, T]`, path log-probabilities `[B]` and, when the options need it, the batch's
`ChainPosterior`) and the checked `TagOptions`; the maths is in `gpseq.structured.spans`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from gpseq.cancellation import check_cancelled
from gpseq.errors import ConfigError

__all__ = ["TaggedSentence", "TagOptions", "tag_batch", "given_span_probabilities", "DECODERS"]

DECODERS = ("viterbi", "max-marginal", "span-f1")
SPAN_F1_MIN_PROB = 1e-3  # span-F1 decoding considers the spans at least this probable


@dataclass
class TaggedSentence:
    """A tagged sentence: labels, per-token label distributions, sequence log-probability."""

    tokens: list[str]
    labels: list[str]
    probabilities: np.ndarray  # [T, V] per-token marginals p(y_t = v | X), rows sum to 1
    label_set: list[str]
    sequence_log_prob: float  # log p(predicted label path | X) under the predictive (see `Tagger.tag`)
    # chunks of `labels` (type, start, end exclusive, P(this exact span | X)); [] for non-chunk labels
    spans: list[tuple[str, int, int, float]] = field(default_factory=list)
    span_probability: str = "exact"  # how `spans` were scored: "exact" or "product" (of token marginals)
    nbest: list[tuple[list[str], float]] | None = None  # [(labels, P(labels | X))], most probable first
    abstain_below: float | None = None  # the threshold of `abstained` / `span_abstained` (None: no abstention)
    # (model name, labels) of each model before this one in a `gpseq.chain_models.ModelChain`; [] for one model
    chain: list[tuple[str, list[str]]] = field(default_factory=list)

    @property
    def confidences(self) -> list[float]:
        """p(y_t = predicted label) per token."""
        index = {label: i for i, label in enumerate(self.label_set)}
        return [float(self.probabilities[t, index[label]]) for t, label in enumerate(self.labels)]

    @property
    def abstained(self) -> list[bool]:
        """Per token: its confidence is below `abstain_below` (the label is kept; all False without a threshold)."""
        if self.abstain_below is None:
            return [False] * len(self.labels)
        return [p < self.abstain_below for p in self.confidences]

    @property
    def span_abstained(self) -> list[bool]:
        """Per span of `spans`: its probability is below `abstain_below`."""
        if self.abstain_below is None:
            return [False] * len(self.spans)
        return [p < self.abstain_below for *_, p in self.spans]

    def distribution(self, t: int) -> dict[str, float]:
        return {label: float(p) for label, p in zip(self.label_set, self.probabilities[t])}


def _padded(paths: Sequence[np.ndarray], T: int) -> np.ndarray:
    """Label-id paths of several lengths as one `[B, T]` array (padding 0)."""
    out = np.zeros((len(paths), T), dtype=np.int64)
    for row, path in enumerate(paths):
        out[row, :len(path)] = path
    return out




@dataclass(frozen=True)
class TagOptions:
    """The checked options of one `Tagger.tag` call, and the model's chunk scheme (None: not chunk labels)."""

    decode: str
    spans: str
    nbest: int
    abstain_below: float | None
    scheme: object

    @classmethod
    def checked(cls, decode: str, spans: str, nbest: int, abstain_below: float | None, scheme) -> "TagOptions":
        if decode not in DECODERS:
            raise ConfigError(f"decode must be one of {', '.join(DECODERS)}, got {decode!r}")
        if spans not in ("exact", "product"):
            raise ConfigError(f"spans must be exact or product, got {spans!r}")
        if nbest < 0:
            raise ConfigError(f"nbest must be >= 0, got {nbest}")
        if abstain_below is not None and not 0.0 <= abstain_below <= 1.0:
            raise ConfigError(f"abstain_below must be a probability in [0, 1], got {abstain_below}")
        if decode == "span-f1" and scheme is None:
            raise ConfigError("decode span-f1 needs chunk labels; this model's labels are not chunk labels")
        if decode == "span-f1" and "O" not in scheme.labels:
            # the chosen chunks need not cover every token, and such a token has no label to render it
            raise ConfigError("decode span-f1 needs an outside label O to leave tokens out of chunks; this "
                              "model has none (every token is in a chunk): use viterbi or max-marginal")
        return cls(decode, spans, nbest, abstain_below, scheme)

    @property
    def needs_chains(self) -> bool:
        """Whether the batch's `ChainPosterior` is needed (anything beyond marginals and the Viterbi path)."""
        return (self.nbest > 0 or self.decode != "viterbi"
                or (self.scheme is not None and self.spans == "exact"))


def tag_batch(sentences: Sequence, marg: np.ndarray, path: np.ndarray, logp: np.ndarray, posterior,
              labels: list[str], options: TagOptions) -> list[TaggedSentence]:
    """The `TaggedSentence` of each sentence of a predicted batch (`sentences[row]` is row `row`)."""
    scheme, decode = options.scheme, options.decode
    lengths = [len(sentence.tokens) for sentence in sentences]
    probs = [marg[row, :T].astype(np.float64) for row, T in enumerate(lengths)]
    for p in probs:
        p /= np.maximum(p.sum(-1, keepdims=True), 1e-300)
    if decode == "span-f1":
        found, best = span_f1_decode(scheme, {label: i for i, label in enumerate(labels)}, posterior, lengths)
    else:
        best = [p.argmax(-1) if decode == "max-marginal" else path[row, :T]
                for row, (p, T) in enumerate(zip(probs, lengths))]
        found = scheme.chunks(best) if scheme is not None else [[] for _ in best]
    if decode != "viterbi":  # the returned labels' probability (Monte Carlo: Jensen bias corrected)
        logp = posterior.path_log_probs(_padded(best, marg.shape[1]), bias_corrected=True)
    if decode != "span-f1" and scheme is not None:
        found = score_spans(scheme, posterior if options.spans == "exact" else None, found, probs, best)
    paths = log_probs = None
    if options.nbest:
        paths, log_probs = posterior.nbest(options.nbest)
    out = []
    for row, sentence in enumerate(sentences):
        T = lengths[row]
        out.append(TaggedSentence(
            tokens=list(sentence.tokens),
            labels=[labels[i] for i in best[row]],
            probabilities=probs[row],
            label_set=labels,
            sequence_log_prob=float(logp[row]),
            spans=found[row],
            span_probability=options.spans if posterior is not None or scheme is None else "product",
            nbest=None if paths is None else [
                ([labels[i] for i in paths[row, n, :T]], float(np.exp(log_probs[row, n])))
                for n in range(options.nbest) if np.isfinite(log_probs[row, n])],
            abstain_below=options.abstain_below,
        ))
    return out


def score_spans(scheme, posterior, found, probs, best) -> list[list[tuple[str, int, int, float]]]:
    """(type, start, end, P) for the chunks `found[row]` of a batch: exact from `posterior`, else the
    product of the tokens' marginals of their returned labels."""
    from gpseq.structured.spans import span_queries

    if posterior is None:
        out = []
        for p, b, chunks in zip(probs, best, found):
            confidence = p[np.arange(len(b)), b]
            out.append([(kind, start, end, float(np.prod(confidence[start:end]))) for kind, start, end in chunks])
        return out
    values = posterior.span_probs(scheme, span_queries(scheme, found))
    out, position = [], 0
    for chunks in found:
        out.append([(*chunk, float(p)) for chunk, p in zip(chunks, values[position:position + len(chunks)])])
        position += len(chunks)
    return out


def span_f1_decode(scheme, label_index: dict[str, int], posterior, lengths):
    """Chunks maximising the expected chunk F1 per sentence (`max_expected_f1_spans` over every
    span of probability ≥ SPAN_F1_MIN_PROB) and the label ids that render them."""
    from gpseq.corpora.schemes import spans_to_tags
    from gpseq.structured.spans import max_expected_f1_spans

    C = len(scheme.types)
    # every (sentence b, type c, start i), b then c then i ascending: (b, c) groups of L_b starts each
    group_b = np.repeat(np.arange(len(lengths), dtype=np.int64), C)
    group_size = np.asarray(lengths, dtype=np.int64)[group_b] if len(lengths) else np.zeros(0, np.int64)
    first = np.cumsum(group_size) - group_size
    starts = np.stack([np.repeat(group_b, group_size), np.repeat(np.tile(np.arange(C), len(lengths)), group_size),
                       np.arange(int(group_size.sum())) - np.repeat(first, group_size)], axis=1)
    queries, probs = posterior.spans_from(scheme, starts, min_prob=SPAN_F1_MIN_PROB)
    found, best = [], []
    for b, T in enumerate(lengths):
        check_cancelled()
        mine = queries[:, 0] == b
        candidates = list(zip(*queries[mine, 1:].T.tolist(), probs[mine].tolist()))  # (c, i, j, P)
        chosen = max_expected_f1_spans(candidates, expected_gold=float(probs[mine].sum()))
        lookup = {(c, i, j): p for c, i, j, p in candidates}
        chunks = [(scheme.types[c], i, j, lookup[(c, i, j)]) for c, i, j in chosen]
        tags = spans_to_tags(T, [chunk[:3] for chunk in chunks], scheme.scheme)
        found.append(chunks)
        best.append(np.array([label_index[label] for label in tags], dtype=np.int64))
    return found, best


def choose_decoder(decodes, labels: list[str], tag_scheme: str) -> tuple[str, dict]:
    """The decoder a trained model uses by default (`TaggerConfig.decode` "auto"): viterbi or
    max-marginal, whichever scores higher on held-out predictions — `decodes`, per part (gold label
    ids, each token's most probable label, the Viterbi path, offsets) as
    `training.calibration.held_out_decodes` gives them — by chunk F1 (conlleval) for chunk labels
    of `tag_scheme`, else by token accuracy; viterbi on a tie. A sentence with a token whose gold
    label is unknown (partial annotation) is left out. Returns (decoder, the two scores)."""
    from gpseq.corpora.schemes import is_chunk_labelling
    from gpseq.evaluation.metrics import chunk_scores

    chunked = is_chunk_labelling(labels, tag_scheme)
    gold, by = [], {"viterbi": [], "max-marginal": []}
    for gold_ids, best, path, offsets in decodes:
        for low, high in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
            if high > low and (gold_ids[low:high] >= 0).all():
                gold.append(gold_ids[low:high])
                by["viterbi"].append(path[low:high])
                by["max-marginal"].append(best[low:high])
    if not gold:
        return "viterbi", {}
    if chunked:
        names = lambda rows: [[labels[i] for i in row] for row in rows]  # noqa: E731
        score = {name: chunk_scores(names(gold), names(rows), tag_scheme).overall.f1 for name, rows in by.items()}
    else:
        flat = np.concatenate(gold)
        score = {name: float(np.mean(np.concatenate(rows) == flat)) for name, rows in by.items()}
    chosen = "max-marginal" if score["max-marginal"] > score["viterbi"] else "viterbi"
    return chosen, {"metric": "chunk_f1" if chunked else "token_accuracy", "sentences": len(gold), **score}


def given_span_probabilities(scheme, tag_scheme: str, sentences: Sequence, spans, posteriors) -> list[list[float]]:
    """P(span | X) of user-given spans (`Tagger.span_probabilities`): `spans[s]` = [(type, start, end
    exclusive)] of sentence s; `posteriors` yields (sentence ids, `ChainPosterior`) over batches."""
    from gpseq.structured.spans import span_queries

    if len(spans) != len(sentences):
        raise ConfigError(f"{len(spans)} span lists for {len(sentences)} sentences")
    if scheme is None:
        raise ConfigError(f"span probabilities need chunk labels; this model's labels are not "
                          f"{tag_scheme} chunk labels")
    for number, (sentence, found) in enumerate(zip(sentences, spans)):
        for kind, start, end in found:
            if not 0 <= start < end <= len(sentence.tokens):
                raise ConfigError(f"sentence {number}: span {(kind, start, end)} is empty or outside its "
                                  f"{len(sentence.tokens)} tokens")
    out: list[list[float]] = [[] for _ in sentences]
    for ids, posterior in posteriors:
        batch_spans = [list(spans[i]) for i in ids]
        probs = posterior.span_probs(scheme, span_queries(scheme, batch_spans))
        position = 0
        for row, i in enumerate(ids):
            out[i] = probs[position:position + len(batch_spans[row])].tolist()
            position += len(batch_spans[row])
    return out
