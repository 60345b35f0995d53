"""The spaCy factory `gpseq`: a trained gpseq model as a pipeline component.

    nlp = spacy.blank("en"); nlp.add_pipe("sentencizer")
    nlp.add_pipe("gpseq", name="pos", config={"model": "models/en_pos_conll2000", "extension": "pos_probs"})
    nlp.add_pipe("gpseq", name="chunker", config={"model": "models/en_chunk_conll2000"})
    doc = nlp("The committee approved the budget.")
    [t.tag_ for t in doc], doc.spans["gpseq"], doc[0]._.gpseq_probs, doc.spans["gpseq"][0]._.gpseq_prob

The factory is registered through the `spacy_factories` entry point, so `add_pipe("gpseq")`
works without importing gpseq first. What the component writes depends on the model's labels
(`task="auto"`):
- chunk labels of the model's tag scheme (B-NP, I-PER, …) → `doc.spans[spans_key]` (with
  `attrs["scores"]`), or `doc.ents` when the model's features are the `ner` preset (entities an
  earlier component set, e.g. an `entity_ruler`, are kept; predicted ones overlapping them are dropped);
- other labels (POS tags) → `token.tag_`, and `token.pos_` when every label is a Universal POS
  tag or a Penn Treebank tag (mapped by `gpseq.spacy.attributes.UPOS_FROM_PTB`).
Every tagged token gets `token._.<extension>` (each gpseq component of a pipeline its own name):
{label: p(y_t = label | X)}, the model's calibrated marginals (the model's predictive: deterministic by default; `samples=S` for Monte Carlo over q(f)); every
predicted span gets `span._.<span_extension>` = P(this exact span | X), the probability that the
label path has exactly this chunk (constrained forward–backward, as `gpseq tag`'s spans; also in
`doc.spans[spans_key].attrs["scores"]`). Features that read token attributes (e.g. the `chunking` preset's POS column, mapped to
`tag_`) read them from what earlier components wrote.

Trained in spaCy (`model = null`): `labels` names the annotation to learn, as `gpseq train
--spacy-labels` does ("ents", "tag", "pos", "spans:KEY"), `features` a preset or a CRF++ template
file (as `--features`), `tag_scheme` the chunk labels' scheme, `overrides` ["model.prior_variance=2.0",
…] any key of the configuration (as `--set`). `initialize` (run by `spacy train`) fits the model on
all the training examples with gpseq's default training; `update` has nothing to do. `score` gives
spaCy's figures of that annotation (`ents_f`, `tag_acc`, …) and gpseq's calibration figures
(`ents_token_nll`, `ents_ece`, `ents_entity_ece`, …; `gpseq.spacy.scoring`). The trained model is
saved with the pipeline (`to_disk`), so `model-best` loads as any spaCy pipeline.

Sequences: each sentence when the Doc has sentence boundaries (add a `sentencizer`), else the
whole Doc; whitespace tokens are left out of the sequence and left untagged (as `gpseq tag`
does). A sequence longer than `max_tokens` (default null: the model's `predict_max_tokens`,
1000) is tagged in overlapping windows and stitched, as `Tagger.tag` documents, so a Doc of
any length is tagged in bounded memory. The model is loaded lazily (first use, `initialize`,
or `to_disk`) from `model`, or by `from_disk` from the pipeline directory, so `nlp.to_disk()`
→ `spacy.load()` does not need the original model directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
from spacy.language import Language
from spacy.tokens import Doc, Span, Token
from spacy.util import minibatch

from gpseq.errors import ConfigError, ModelFormatError
from gpseq.predict.writers import doc_spans, set_tags, span_records
from gpseq.saved.meta import read_model_meta
from gpseq.spacy.attributes import UPOS_FROM_PTB, annotations_read, upos_tags
from gpseq.spacy.extensions import register_extensions, store_probabilities, token_distribution, token_probabilities

__all__ = ["TASKS", "GpseqComponent", "make_gpseq", "UPOS_FROM_PTB", "token_distribution", "token_probabilities"]

TASKS = ("auto", "tag", "spans", "ents")
_MODEL_SUBDIR = "model"
_MAX_PAYLOAD_FILES = 64  # a model directory holds four files; `from_bytes` refuses a payload of more


@Language.factory(
    "gpseq",
    default_config={
        "model": None,
        "task": "auto",
        "spans_key": "gpseq",
        "extension": "gpseq_probs",
        "span_extension": "gpseq_prob",
        "set_pos": True,
        "samples": None,
        "mean": False,
        "decode": None,
        "batch_size": 256,
        "seed": 0,
        "max_tokens": None,
        "labels": None,
        "features": None,
        "tag_scheme": None,
        "overrides": [],
    },
)
def make_gpseq(
    nlp: Language,
    name: str,
    model: str | None,
    task: str,
    spans_key: str,
    extension: str,
    span_extension: str,
    set_pos: bool,
    samples: int | None,
    mean: bool,
    decode: str | None,
    batch_size: int,
    seed: int,
    max_tokens: int | None,
    labels: str | None,
    features: str | None,
    tag_scheme: str | None,
    overrides: list[str],
) -> "GpseqComponent":
    """Build the `gpseq` component (see the module docstring for what each setting does)."""
    return GpseqComponent(nlp, name, model=model, task=task, spans_key=spans_key, extension=extension,
                          span_extension=span_extension, set_pos=set_pos, samples=samples, mean=mean,
                          decode=decode, batch_size=batch_size, seed=seed, max_tokens=max_tokens, labels=labels,
                          features=features, tag_scheme=tag_scheme, overrides=overrides)


class GpseqComponent:
    """A gpseq `Tagger` applied to spaCy Docs: tags, entities or chunk spans, with probabilities."""

    def __init__(self, nlp: Language, name: str = "gpseq", *, model: str | os.PathLike | None = None,
                 task: str = "auto", spans_key: str = "gpseq", extension: str = "gpseq_probs",
                 span_extension: str = "gpseq_prob", set_pos: bool = True, samples: int | None = None,
                 mean: bool = False, decode: str | None = None, batch_size: int = 256, seed: int = 0,
                 max_tokens: int | None = None, labels: str | None = None, features: str | None = None,
                 tag_scheme: str | None = None, overrides: Iterable[str] = ()):
        if task not in TASKS:
            raise ConfigError(f"gpseq component {name!r}: task must be one of {TASKS}, got {task!r}")
        if decode not in (None, "viterbi", "max-marginal", "span-f1"):
            raise ConfigError(f"gpseq component {name!r}: decode must be viterbi, max-marginal or span-f1, "
                              f"got {decode!r}")
        if samples is not None and (not isinstance(samples, int) or isinstance(samples, bool) or samples < 1):
            raise ConfigError(f"gpseq component {name!r}: samples must be an integer >= 1 or null, got {samples!r}")
        if not isinstance(seed, int) or isinstance(seed, bool) or not -2**31 <= seed < 2**31:
            # the draws' seed is an int32: a larger one would wrap onto another (2**32 draws as 0 does)
            raise ConfigError(f"gpseq component {name!r}: seed must be an integer in [-2**31, 2**31), got {seed!r}")
        if batch_size < 1:
            raise ConfigError(f"gpseq component {name!r}: batch_size must be >= 1, got {batch_size}")
        if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                       or max_tokens < 1):
            raise ConfigError(f"gpseq component {name!r}: max_tokens must be a positive integer or null, "
                              f"got {max_tokens!r}")
        if not extension or not span_extension:
            raise ConfigError(f"gpseq component {name!r}: extension names must not be empty")
        for other_name, other in getattr(nlp, "components", ()):
            # both would store their marginals under one key: the later would silently replace the earlier's
            if isinstance(other, GpseqComponent) and other_name != name and other.extension == extension:
                raise ConfigError(f"gpseq component {name!r}: extension {extension!r} is already the one of "
                                  f"gpseq component {other_name!r}; give each its own 'extension'")
        self.label_source = _label_source(name, labels, task, spans_key)
        overrides = list(overrides or ())
        if model is not None and (features is not None or tag_scheme is not None or overrides):
            raise ConfigError(f"gpseq component {name!r}: features, tag_scheme and overrides configure the "
                              "training of a component without a model; this one loads model "
                              f"{str(model)!r} (set model = null to train it with spacy train)")
        if not all(isinstance(assignment, str) for assignment in overrides):
            raise ConfigError(f"gpseq component {name!r}: overrides must be strings KEY.PATH=VALUE, "
                              f"got {overrides!r}")
        self.training_settings = {"features": features, "tag_scheme": tag_scheme, "overrides": overrides}
        self.nlp, self.name = nlp, name
        self.model_path = None if model is None else str(model)
        self.task_setting = task
        self.spans_key, self.extension, self.span_extension = spans_key, extension, span_extension
        self.set_pos, self.samples, self.mean, self.decode = set_pos, samples, mean, decode
        self.batch_size, self.seed, self.max_tokens = batch_size, seed, max_tokens
        self._tagger = None
        register_extensions(extension, span_extension)

    # ---- the model ------------------------------------------------------------------------------
    @property
    def tagger(self):
        """The gpseq `Tagger` (loaded from `model` on first use)."""
        if self._tagger is None:
            from gpseq.tagger import Tagger

            _check_model_dir(self.model_path, self.name)

            self._set_tagger(Tagger.load(self.model_path))
        return self._tagger

    def _set_tagger(self, tagger) -> None:
        from gpseq.corpora import is_chunk_labelling

        overlap = tagger.config.predict_overlap
        if self.max_tokens is not None and self.max_tokens <= 2 * overlap:
            raise ConfigError(f"gpseq component {self.name!r}: max_tokens must be > 2 × the model's "
                              f"predict_overlap ({2 * overlap}), got {self.max_tokens}")

        chunks = is_chunk_labelling(tagger.labels, tagger.config.tag_scheme)
        task = self.task_setting
        if task == "auto" and self.label_source is not None:
            task = _TASK_OF_LABELS[self.label_source[0]]
        if task == "auto":
            task = ("ents" if tagger.config.features.preset == "ner" else "spans") if chunks else "tag"
        elif task in ("spans", "ents") and not chunks:
            raise ConfigError(
                f"gpseq component {self.name!r}: task {task!r} needs chunk labels of scheme "
                f"{tagger.config.tag_scheme!r}, but the model's labels are e.g. {tagger.labels[:5]}"
            )
        self._annotations = annotations_read(tagger.featurizer.config, self.name)
        self._upos = upos_tags(tagger.labels) if task == "tag" and self.set_pos else None
        self.task = task
        self._tagger = tagger

    @property
    def labels(self) -> tuple[str, ...]:
        """The model's labels; read from `tagger.json` when the model is not loaded (spaCy's meta
        asks for them before `from_disk`), empty when there is no readable model there."""
        if self._tagger is not None:
            return tuple(self._tagger.labels)
        try:
            return tuple(read_model_meta(_check_model_dir(self.model_path, self.name))["labels"])
        except (ConfigError, ModelFormatError, KeyError, TypeError):
            return ()

    def initialize(self, get_examples=None, *, nlp: Language | None = None) -> None:
        """Train the model on spaCy's training examples when the component has none (`model = null`),
        else check the model directory (spaCy calls this from `nlp.initialize()`: `spacy train`,
        `spacy assemble`).

        Training: gpseq's default training (`Tagger.train`, as `gpseq train`) on every example's
        reference Doc, read as `gpseq.corpora.docbin` reads a DocBin: a sentence per `doc.sents` (the
        whole Doc without sentence boundaries), labels from the annotation `labels` names, the gold
        `tag_` as corpus column 1 (the `chunking` preset's POS column, which tagging reads from the
        `token.tag_` an earlier component set). The whole corpus is fitted here, once: `update` has
        nothing left to do. A given model is read on first use, so assembling a pipeline only copies
        model directories."""
        if self.model_path is not None:
            if self._tagger is None:
                _check_model_dir(self.model_path, self.name)
            return
        if self.label_source is None:
            raise ConfigError(f"gpseq component {self.name!r}: no model to load and nothing to train on: set "
                              'model = "<model dir>", or labels = "ents", "tag", "pos" or "spans:KEY" to '
                              "train it on the training examples (spacy train)")
        if get_examples is None:
            raise ConfigError(f"gpseq component {self.name!r}: training needs the training examples "
                              "(nlp.initialize(get_examples))")
        training = getattr(nlp, "config", {}).get("training", {})
        if training.get("max_epochs") == -1:
            # spaCy then initializes on the first 100 examples only: the model would see no more
            raise ConfigError(f"gpseq component {self.name!r}: [training] max_epochs = -1 (a streamed corpus) "
                              "gives initialize only the first 100 examples, and the gpseq model is trained "
                              "in initialize; set max_epochs = 1")
        from gpseq.tagger import Tagger

        config = self._training_config()
        sentences = _training_sentences(get_examples(), self.label_source, config.tag_scheme, self.name)
        self._set_tagger(Tagger.train(sentences, config))

    def _training_config(self):
        """The TaggerConfig of `gpseq train --features F --tag-scheme S --set …` (`gpseq.cli.config`)."""
        from gpseq.cli.config import ConfigOptions, build_config
        from gpseq.corpora import normalise_scheme

        settings = self.training_settings
        try:
            scheme = None if settings["tag_scheme"] is None else normalise_scheme(settings["tag_scheme"])
            return build_config(ConfigOptions(features=settings["features"], tag_scheme=scheme,
                                              overrides=list(settings["overrides"])))
        except ConfigError as error:
            raise ConfigError(f"gpseq component {self.name!r}: {error}") from None

    def update(self, examples: Iterable, *, drop: float = 0.0, sgd=None, losses: dict | None = None) -> dict:
        """Nothing: `initialize` fits the model on the whole training corpus. Returns `losses` with
        {name: 0.0}, so spaCy's training loop runs on (set its max_steps small)."""
        losses = {} if losses is None else losses
        losses.setdefault(self.name, 0.0)
        return losses

    def score(self, examples: Iterable, **cfg) -> dict:
        """spaCy's figures for the annotation the component writes (`ents_f`, `tag_acc`, …) and gpseq's
        calibration figures under the same prefix (`ents_token_nll`, `ents_ece`, `ents_entity_ece`, …;
        `gpseq.spacy.scoring`), which spaCy's `Scorer` reports in `nlp.evaluate` and `spacy evaluate`."""
        from gpseq.spacy.scoring import gpseq_scores, spacy_scores

        examples = list(examples)
        tagger = self.tagger
        # a given model's task says which annotation it writes: tags, entities or its span group
        kind, key = self.label_source or (self.task, self.spans_key if self.task == "spans" else None)
        scores = spacy_scores(examples, kind, key, **cfg)
        scores.update(gpseq_scores(examples, kind=kind, key=key, scheme=tagger.config.tag_scheme,
                                   extension=self.extension, sequences=lambda doc: self._sequences([doc])[0]))
        return scores

    # ---- processing -----------------------------------------------------------------------------
    def __call__(self, doc: Doc) -> Doc:
        self._process([doc])
        return doc

    def pipe(self, stream: Iterable[Doc], *, batch_size: int = 128) -> Iterator[Doc]:
        """Tag Docs `batch_size` at a time: one feature matrix and one batched prediction per group."""
        for docs in minibatch(stream, size=batch_size):
            self._process(docs)
            yield from docs

    def _sequences(self, docs: list[Doc]) -> tuple[list[list[Token]], list[int]]:
        """The token lists to tag (sentences without whitespace tokens) and the Doc each belongs to."""
        sequences, owners = [], []
        for number, doc in enumerate(docs):
            # A Doc of whitespace only has nothing to tag, here or in an earlier gpseq component (which
            # then set no annotation): not a missing component.
            has_words = any(not token.is_space for token in doc)
            missing = [name for name in self._annotations if has_words and not doc.has_annotation(name)]
            if missing:
                raise ConfigError(
                    f"gpseq component {self.name!r}: the model's features read token annotation {missing} "
                    "that no earlier component set; add a component that sets it before this one "
                    "(e.g. a gpseq POS tagger before a chunker)"
                )
            parts = doc.sents if doc.has_annotation("SENT_START") else [doc[:]]
            for part in parts:
                tokens = [token for token in part if not token.is_space]
                if tokens:
                    sequences.append(tokens)
                    owners.append(number)
        return sequences, owners

    def _process(self, docs: list[Doc]) -> None:
        tagger = self.tagger
        sequences, owners = self._sequences(docs)
        V = len(tagger.labels)
        probs = [np.full((len(doc), V), np.nan) for doc in docs]  # [N_doc, V] per Doc; NaN = untagged
        returned = [np.full(len(doc), -1, dtype=np.int64) for doc in docs]  # [N_doc] returned label ids
        spans: list[list[Span]] = [[] for _ in docs]
        span_scores: list[list[float]] = [[] for _ in docs]
        chunks: list[list[tuple]] = [[] for _ in docs]  # (type, start_char, end_char, P) per Doc
        if sequences:
            # transform_docs reads len() and the tokens of each item, so token lists stand in for Docs.
            matrix = tagger.featurizer.transform_docs(sequences)
            decode = self.decode or tagger.config.decoder  # the model's own may be span-f1
            span_f1 = decode == "span-f1"
            if span_f1:
                from gpseq.predict.decode import TagOptions

                try:
                    TagOptions.checked(decode, "exact", 0, None, tagger.span_scheme)
                except ConfigError as error:
                    raise ConfigError(f"gpseq component {self.name!r}: {error}") from None
            for ids, marginals, paths, _, *rest in tagger.predict_features(
                matrix, samples=self.samples, mean=self.mean or None, batch_size=self.batch_size, seed=self.seed,
                max_tokens=self.max_tokens, chains=self.task != "tag" or span_f1,
            ):
                if span_f1:  # the chunks maximising the expected chunk F1, as Tagger.tag chooses them
                    chosen, exact = self._span_f1(rest[0], [len(sequences[index]) for index in ids])
                else:
                    exact = self._span_probabilities(rest[0], ids, sequences, marginals, paths, decode) \
                        if rest else None
                for row, index in enumerate(ids):
                    tokens = sequences[index]
                    T = len(tokens)
                    p = marginals[row, :T].astype(np.float64)  # [T, V]
                    p /= np.maximum(p.sum(-1, keepdims=True), 1e-300)
                    if span_f1:
                        best = chosen[row]
                    else:
                        best = p.argmax(-1) if decode == "max-marginal" else paths[row, :T]
                    number = owners[index]
                    positions = [token.i for token in tokens]
                    probs[number][positions] = p
                    returned[number][positions] = best
                    records = self._write(tokens, p, best, None if exact is None else exact[row])
                    spans[number].extend(doc_spans(docs[number], records, positions))
                    span_scores[number].extend(float(probability) for *_, probability in records)
                    chunks[number].extend((kind, tokens[start].idx, tokens[end - 1].idx + len(tokens[end - 1]),
                                           float(probability)) for kind, start, end, probability in records)
        for doc, p, ids, found, scores, own in zip(docs, probs, returned, spans, span_scores, chunks):
            order = sorted(range(len(found)), key=lambda k: (found[k].start, found[k].end))
            found, scores = [found[k] for k in order], [scores[k] for k in order]
            store_probabilities(doc, self.extension, tagger.labels, p, ids, own)
            if self.task == "spans":
                doc.spans[self.spans_key] = found
                doc.spans[self.spans_key].attrs["scores"] = scores
            elif self.task == "ents":
                # Entities set by an earlier component (an entity_ruler) are kept and predictions that
                # overlap one are dropped, as spaCy's own ner respects them.
                taken = np.zeros(len(doc), dtype=bool)
                for entity in doc.ents:
                    taken[entity.start:entity.end] = True
                kept = [k for k, span in enumerate(found) if not taken[span.start:span.end].any()]
                found, scores = [found[k] for k in kept], [scores[k] for k in kept]
                doc.ents = sorted([*doc.ents, *found], key=lambda span: span.start)
            for span, score in zip(found, scores):
                span._.set(self.span_extension, score)

    def _span_f1(self, posterior, lengths: list[int]) -> tuple[list[np.ndarray], list[list[float]]]:
        """Span-F1 decoding of a batch (`gpseq.predict.decode.span_f1_decode`): the label ids `[T]` that render
        each sequence's chosen chunks and their P(exact span | X), in the order of their starts."""
        from gpseq.predict.decode import span_f1_decode

        tagger = self._tagger
        found, best = span_f1_decode(tagger.span_scheme, {label: i for i, label in enumerate(tagger.labels)},
                                     posterior, lengths)
        return best, [[p for *_, p in sorted(chunks, key=lambda chunk: chunk[1])] for chunks in found]

    def _span_probabilities(self, posterior, ids, sequences, marginals, paths, decode) -> list[list[float]]:
        """P(exact span | X) of the chunks of each returned label sequence of a batch `[B][chunks]`."""
        from gpseq.corpora.schemes import spans as chunks_of
        from gpseq.structured.spans import span_queries

        tagger = self._tagger
        found = []
        for row, index in enumerate(ids):
            T = len(sequences[index])
            best = marginals[row, :T].argmax(-1) if decode == "max-marginal" else paths[row, :T]
            found.append(chunks_of([tagger.labels[i] for i in best], tagger.config.tag_scheme))
        probs = posterior.span_probs(tagger.span_scheme, span_queries(tagger.span_scheme, found))
        out, position = [], 0
        for chunks in found:
            out.append(probs[position:position + len(chunks)].tolist())
            position += len(chunks)
        return out

    def _write(self, tokens: list[Token], p: np.ndarray, best: np.ndarray,
               exact: list[float] | None = None) -> list[list]:
        """Labels of one sequence: set as tags, or returned as its chunks [type, start, end, P] over the
        sequence (`exact`: P(exact span) per chunk; None: the product of the token marginals)."""
        labels = [self._tagger.labels[i] for i in best]
        if self.task == "tag":
            set_tags(tokens, labels, self._upos)
            return []
        confidence = p[np.arange(len(tokens)), best].tolist()  # [T] p(y_t = predicted label_t)
        records = span_records(labels, confidence, self._tagger.config.tag_scheme)
        if exact is not None:
            records = [[*record[:3], probability] for record, probability in zip(records, exact)]
        return records

    # ---- serialisation --------------------------------------------------------------------------
    def to_disk(self, path: str | os.PathLike, *, exclude: Iterable[str] = ()) -> None:
        """Write the model into the pipeline directory (`<path>/model`, a gpseq model directory);
        a model not yet loaded is copied (only what gpseq wrote there, checked against its manifest).

        As `Tagger.save`: written to a temporary sibling and renamed into place; an existing
        `<path>/model` is replaced only if it is a gpseq model directory holding nothing but what
        gpseq wrote (checked before writing and again at the replace), else `OutputError` and
        nothing is changed. The rest of `<path>` is not touched."""
        from gpseq.saved.directory import copy_model_files, writing_model_dir

        path = Path(path)
        target = path / _MODEL_SUBDIR
        if self._tagger is not None:
            self._tagger.save(target)
            return
        source = _check_model_dir(self.model_path, self.name)
        with writing_model_dir(target) as tmp:
            copy_model_files(source, tmp)

    def from_disk(self, path: str | os.PathLike, *, exclude: Iterable[str] = ()) -> "GpseqComponent":
        """Load the model that `to_disk` wrote (the `model` setting is not read)."""
        from gpseq.tagger import Tagger

        self._set_tagger(Tagger.load(Path(path) / _MODEL_SUBDIR))
        return self

    def to_bytes(self, *, exclude: Iterable[str] = ()) -> bytes:
        """The model directory's files as one msgpack blob (for `nlp.to_bytes()`)."""
        import srsly

        with tempfile.TemporaryDirectory(prefix="gpseq-") as tmp:
            self.tagger.save(Path(tmp) / _MODEL_SUBDIR)
            root = Path(tmp) / _MODEL_SUBDIR
            files = {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}
        return srsly.msgpack_dumps({"format": "gpseq-component", "files": files})

    def from_bytes(self, data: bytes, *, exclude: Iterable[str] = ()) -> "GpseqComponent":
        import srsly

        from gpseq.tagger import Tagger

        not_ours = ModelFormatError(f"gpseq component {self.name!r}: bytes are not a serialised gpseq component")
        try:
            payload = srsly.msgpack_loads(data)
        except Exception:  # msgpack's errors on arbitrary bytes are of many kinds (ValueError, ExtraData, …)
            raise not_ours from None
        files = payload.get("files") if isinstance(payload, dict) else None
        if not isinstance(payload, dict) or payload.get("format") != "gpseq-component" or not isinstance(files, dict) \
                or len(files) > _MAX_PAYLOAD_FILES or not all(isinstance(name, str) and isinstance(content, bytes)
                                                              for name, content in files.items()):
            raise not_ours
        tmp = tempfile.mkdtemp(prefix="gpseq-")
        try:
            root = Path(tmp) / _MODEL_SUBDIR
            for name, content in files.items():
                target = (root / name).resolve()
                if root.resolve() not in target.parents:
                    raise ModelFormatError(f"gpseq component {self.name!r}: bad file name {name!r} in bytes")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content)
            self._set_tagger(Tagger.load(root))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return self


def _check_model_dir(model_path: str | None, name: str) -> Path:
    """The model directory, after a cheap check of its `tagger.json` (no TensorFlow)."""
    if model_path is None:
        raise ConfigError(f"gpseq component {name!r}: no model (set config model = \"<model dir>\", or "
                          "labels = … and train it: spacy train, nlp.initialize)")
    read_model_meta(model_path)
    return Path(model_path)


_TASK_OF_LABELS = {"tag": "tag", "pos": "tag", "ents": "ents", "spans": "spans"}


def _label_source(name: str, labels: str | None, task: str, spans_key: str) -> tuple[str, str | None] | None:
    """(kind, span group key) of the `labels` setting (as `gpseq train --spacy-labels`), checked against
    the task and the span group the component writes; None when unset."""
    from gpseq.corpora.docbin import parse_label_source

    if labels is None:
        return None
    try:
        kind, key = parse_label_source(labels)
    except ConfigError as error:
        raise ConfigError(f"gpseq component {name!r}: labels: {error}") from None
    if task != "auto" and _TASK_OF_LABELS[kind] != task:
        raise ConfigError(f"gpseq component {name!r}: labels {labels!r} are written by task "
                          f"{_TASK_OF_LABELS[kind]!r}, not {task!r}")
    if kind == "spans" and key != spans_key:
        raise ConfigError(f"gpseq component {name!r}: labels {labels!r} train on span group {key!r} but the "
                          f"component writes doc.spans[{spans_key!r}]; set spans_key = {key!r}")
    return kind, key


def _training_sentences(examples: Iterable, label_source: tuple[str, str | None], scheme: str, name: str) -> list:
    """gpseq `Sentence`s of the examples' reference Docs, as `gpseq.corpora.docbin` reads a DocBin."""
    from gpseq.corpora.docbin import _doc_sentences

    kind, key = label_source
    where = f"training examples of gpseq component {name!r}"
    return [sentence for index, example in enumerate(examples)
            for sentence in _doc_sentences(example.reference, index, kind, key, scheme, where)]
