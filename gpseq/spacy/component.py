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

Trained in spaCy (`model = null`): `labels` names the annotation to learn ("ents", "tag", "pos",
"spans:KEY"), `features`, `tag_scheme` and `overrides` configure the training, which `initialize`
runs (`spacy train`; `gpseq.spacy.training`). `score` gives spaCy's figures of that annotation
(`ents_f`, `tag_acc`, …) and gpseq's calibration figures (`ents_token_nll`, `ents_ece`,
`ents_entity_ece`, …; `gpseq.spacy.scoring`). The trained model is saved with the pipeline
(`to_disk`), so `model-best` loads as any spaCy pipeline.

Sequences: each sentence when the Doc has sentence boundaries (add a `sentencizer`), else the
whole Doc, tagged in bounded memory whatever its length (`gpseq.spacy.annotate`). The model is
loaded lazily (first use, `initialize`, or `to_disk`) from `model`, or by `from_disk` from the
pipeline directory, so `nlp.to_disk()` → `spacy.load()` does not need the original model directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

from spacy.language import Language
from spacy.tokens import Doc
from spacy.util import minibatch

from gpseq.errors import ConfigError, ModelFormatError
from gpseq.saved.meta import read_model_meta
from gpseq.spacy.annotate import annotate, doc_sequences
from gpseq.spacy.attributes import UPOS_FROM_PTB, annotations_read, upos_tags
from gpseq.spacy.extensions import register_extensions, token_distribution, token_probabilities
from gpseq.spacy.training import TASK_OF_LABELS, label_source, train_on_examples

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
        self.label_source = label_source(name, labels, task, spans_key)
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
            task = TASK_OF_LABELS[self.label_source[0]]
        if task == "auto":
            task = ("ents" if tagger.config.features.preset == "ner" else "spans") if chunks else "tag"
        elif task in ("spans", "ents") and not chunks:
            raise ConfigError(
                f"gpseq component {self.name!r}: task {task!r} needs chunk labels of scheme "
                f"{tagger.config.tag_scheme!r}, but the model's labels are e.g. {tagger.labels[:5]}"
            )
        self.annotations = annotations_read(tagger.featurizer.config, self.name)  # what earlier components set
        self.upos = upos_tags(tagger.labels) if task == "tag" and self.set_pos else None  # tag_ → pos_, or None
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

        Training: gpseq's default training on every example's reference Doc
        (`gpseq.spacy.training.train_on_examples`). The whole corpus is fitted here, once: `update`
        has nothing left to do. A given model is read on first use, so assembling a pipeline only copies
        model directories."""
        if self.model_path is not None:
            if self._tagger is None:
                _check_model_dir(self.model_path, self.name)
            return
        self._set_tagger(train_on_examples(self, get_examples, nlp))

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
                                   extension=self.extension, sequences=lambda doc: doc_sequences(self, [doc])[0]))
        return scores

    # ---- processing -----------------------------------------------------------------------------
    def __call__(self, doc: Doc) -> Doc:
        annotate(self, [doc])
        return doc

    def pipe(self, stream: Iterable[Doc], *, batch_size: int = 128) -> Iterator[Doc]:
        """Tag Docs `batch_size` at a time: one feature matrix and one batched prediction per group."""
        for docs in minibatch(stream, size=batch_size):
            annotate(self, docs)
            yield from docs

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
