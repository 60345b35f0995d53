"""The spaCy component's training in `spacy train` (a component with `model = null`).

`labels` names the annotation to learn, as `gpseq train --spacy-labels` does ("ents", "tag", "pos",
"spans:KEY"); `features` a preset or a CRF++ template file (as `--features`), `tag_scheme` the chunk
labels' scheme, `overrides` ["model.prior_variance=2.0", …] any key of the configuration (as
`--set`; the configuration is built by `gpseq.config.make_config`, as `gpseq train` builds it).
`initialize` (run by `spacy train`) fits the model on all the training examples with gpseq's
default training (`train_on_examples`); `update` has nothing to do. The examples' reference Docs
are read as `gpseq.corpora.docbin` reads a DocBin (`doc_sentences`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from gpseq.errors import ConfigError

if TYPE_CHECKING:
    from gpseq.tagger import Tagger

# the task that writes each kind of labels (`parse_label_source`)
TASK_OF_LABELS = {"tag": "tag", "pos": "tag", "ents": "ents", "spans": "spans"}


def label_source(name: str, labels: str | None, task: str, spans_key: str) -> tuple[str, str | None] | None:
    """(kind, span group key) of the `labels` setting (as `gpseq train --spacy-labels`), checked against
    the task and the span group the component writes; None when unset."""
    from gpseq.corpora.docbin import parse_label_source

    if labels is None:
        return None
    try:
        kind, key = parse_label_source(labels)
    except ConfigError as error:
        raise ConfigError(f"gpseq component {name!r}: labels: {error}") from None
    if task != "auto" and TASK_OF_LABELS[kind] != task:
        raise ConfigError(f"gpseq component {name!r}: labels {labels!r} are written by task "
                          f"{TASK_OF_LABELS[kind]!r}, not {task!r}")
    if kind == "spans" and key != spans_key:
        raise ConfigError(f"gpseq component {name!r}: labels {labels!r} train on span group {key!r} but the "
                          f"component writes doc.spans[{spans_key!r}]; set spans_key = {key!r}")
    return kind, key


def train_on_examples(component, get_examples, nlp) -> Tagger:
    """The `Tagger` of `component` (one with `model = null`) trained on spaCy's training examples:
    gpseq's default training (`Tagger.train`, as `gpseq train`) on every example's reference Doc, a
    sentence per `doc.sents` (the whole Doc without sentence boundaries), labels from the annotation
    `labels` names, the gold `tag_` as corpus column 1 (the `chunking` preset's POS column, which
    tagging reads from the `token.tag_` an earlier component set)."""
    name = component.name
    if component.label_source is None:
        raise ConfigError(f"gpseq component {name!r}: no model to load and nothing to train on: set "
                          'model = "<model dir>", or labels = "ents", "tag", "pos" or "spans:KEY" to '
                          "train it on the training examples (spacy train)")
    if get_examples is None:
        raise ConfigError(f"gpseq component {name!r}: training needs the training examples "
                          "(nlp.initialize(get_examples))")
    training = getattr(nlp, "config", {}).get("training", {})
    if training.get("max_epochs") == -1:
        # spaCy then initializes on the first 100 examples only: the model would see no more
        raise ConfigError(f"gpseq component {name!r}: [training] max_epochs = -1 (a streamed corpus) "
                          "gives initialize only the first 100 examples, and the gpseq model is trained "
                          "in initialize; set max_epochs = 1")
    from gpseq.tagger import Tagger

    config = training_config(name, component.training_settings)
    sentences = training_sentences(get_examples(), component.label_source, config.tag_scheme, name)
    return Tagger.train(sentences, config)


def training_config(name: str, settings: dict):
    """The TaggerConfig of `gpseq train --features F --tag-scheme S --set …` (`gpseq.config.make_config`)
    from the component's `features`, `tag_scheme` and `overrides`."""
    from gpseq.config import make_config
    from gpseq.corpora import normalise_scheme

    try:
        scheme = None if settings["tag_scheme"] is None else normalise_scheme(settings["tag_scheme"])
        return make_config(features=settings["features"], tag_scheme=scheme, overrides=list(settings["overrides"]))
    except ConfigError as error:
        raise ConfigError(f"gpseq component {name!r}: {error}") from None


def training_sentences(examples: Iterable, label_source: tuple[str, str | None], scheme: str, name: str) -> list:
    """gpseq `Sentence`s of the examples' reference Docs, as `gpseq.corpora.docbin` reads a DocBin."""
    from gpseq.corpora.docbin import doc_sentences

    kind, key = label_source
    where = f"training examples of gpseq component {name!r}"
    return [sentence for index, example in enumerate(examples)
            for sentence in doc_sentences(example.reference, index, kind, key, scheme, where)]
