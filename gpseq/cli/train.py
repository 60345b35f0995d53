"""`gpseq train`: read the corpora, build the TaggerConfig, `Tagger.train`, save, print a summary."""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpseq.cli.common import (EXIT_CODES, CorpusFormat, SpacyLabels, Verbose, app, check_label_not_a_feature,
                              command, read_labelled, require_file, stderr, stdout, tagger_module)
from gpseq.cli.config import ConfigOptions, build_config
from gpseq.corpora.types import UNLABELLED
from gpseq.errors import InputFormatError
from gpseq.cli.outputs import check_train_outputs, train_lock


# a training file larger than this is read in passes (`gpseq.corpora.CorpusFile`): memory bounded
# whatever its size; a smaller one is read once into memory (each pass re-parses the file)
STREAM_BYTES = 8 << 20

TRAIN_EXAMPLES = """[b]Examples[/b]

  gpseq train corpora/sample/train.conll -o runs/sample
  gpseq train train.txt --dev test.txt -o runs/chunk --features chunking \\
      --inducing 128 --epochs 5
  gpseq train train.data -o runs/crfpp --features template \\
      --likelihood pseudo --set training.batch_size=16
  gpseq train train.txt -o runs/chunk --resume   # continues from runs/chunk.ckpt
  gpseq train train1.conll -o runs/r1 --init runs/r0   # warm start (active learning)
  gpseq train partial.conll -o runs/p   # tokens labelled ? are marginalised
  gpseq train train.spacy --dev dev.spacy -o runs/ner --spacy-labels ents
  gpseq train train.conll -o runs/plug --likelihood mypkg.chain:log_likelihood \
      --set model.estimator=score   # a NumPy likelihood (docs/likelihoods.md)

""" + EXIT_CODES


class TrainProgress:
    """A rich progress bar fed by the trainer's Progress callbacks (ETA, the running objective per
    token, dev score). `objective` names what the training maximises: the ELBO for SVI, the log
    posterior (log likelihood + log prior) of the default MAP + Laplace fit."""

    def __init__(self, console, objective: str = "ELBO"):
        self.objective = objective
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        self.bar = Progress(
            TextColumn("[bold]training"), BarColumn(bar_width=24), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(compact=True),
            TextColumn("{task.fields[elbo]}"), TextColumn("{task.fields[dev]}"),
            console=console, transient=False,
        )
        self.task = None
        self.last = None
        self.dev = None

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def __call__(self, progress) -> None:
        if self.task is None:
            self.task = self.bar.add_task("train", total=progress.total_steps, completed=0, elbo="", dev="")
        fields = {}
        if progress.event in ("step", "eval") and progress.elbo_per_token == progress.elbo_per_token:
            self.last = progress
            fields["elbo"] = f"{self.objective}/token {progress.elbo_per_token:.4f}"
        if progress.dev_score is not None and progress.event == "eval":
            self.dev = (progress.dev_metric, progress.dev_score)
            fields["dev"] = f"dev {progress.dev_metric} {progress.dev_score:.4f}"
        self.bar.update(self.task, total=progress.total_steps, completed=progress.step, **fields)


@app.command(epilog=TRAIN_EXAMPLES)
@command
def train(
    train_corpus: Annotated[Path, typer.Argument(help="Labelled corpus: a CoNLL-style column file (token first, label last by default), CoNLL-U, JSON Lines or a spaCy DocBin (.spacy; --spacy-labels); a token labelled ? is unlabelled (partial annotation, marginalised).", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="Model directory to write.", show_default=False)],
    dev: Annotated[Optional[Path], typer.Option(help="Labelled dev corpus for early stopping (default: a held-out slice of train, training.dev_fraction).")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="TaggerConfig JSON (keys features, model, training, tag_scheme, …), e.g. a model's tagger.json 'config'.")] = None,
    features: Annotated[Optional[str], typer.Option(help="Feature preset (chunking, ner, pos, segmentation) or a CRF++ template file.")] = None,
    likelihood: Annotated[Optional[str], typer.Option(help="exact (linear chain), pseudo (piecewise pseudo-likelihood), or a plug-in: a NumPy function package.module:function or a name registered under the entry-point group gpseq_likelihoods (needs --set model.estimator=score; saved with the model by name).")] = None,
    inducing: Annotated[Optional[int], typer.Option(help="Add the sparse RBF GP with M inducing inputs (kernel linear+rbf, trained by SVI).")] = None,
    epochs: Annotated[Optional[int], typer.Option(help="Passes over the training corpus.")] = None,
    max_steps: Annotated[Optional[int], typer.Option(help="Stop after this many steps (caps --epochs).")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Random seed (batch order, Monte Carlo noise, K-means).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the last checkpoint in the checkpoint directory.")] = False,
    checkpoint_dir: Annotated[Optional[Path], typer.Option(help="Where checkpoints go (default: MODEL_DIR.ckpt beside the model).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a config key: --set model.prior_variance=2.0 (value parsed as JSON when it can be). Repeatable.")] = None,
    token_column: Annotated[int, typer.Option(help="Token column of the corpora (0-based; negative counts from the end).")] = 0,
    label_column: Annotated[int, typer.Option(help="Label column of the corpora (default: the last).")] = -1,
    encoding: Annotated[str, typer.Option(help="Encoding of the corpora (e.g. euc-jp).")] = "utf-8",
    format_: CorpusFormat = "auto",
    spacy_labels: SpacyLabels = "tag",
    tag_scheme: Annotated[Optional[str], typer.Option(help="Tag scheme of the labels: iob1, iob2 (bio), bioes (for spans and chunk F1); .spacy entities and spans are read as labels of it.")] = None,
    devices: Annotated[Optional[int], typer.Option(help="Number of devices (replicas) to train on (training.devices).")] = None,
    strategy: Annotated[Optional[str], typer.Option(help="tf.distribute strategy: default, mirrored or multiworker (training.strategy).")] = None,
    init: Annotated[Optional[Path], typer.Option("--init", help="Warm-start from this model directory (a round of active learning: its weights, prior and calibration, a third of the iterations; default training only).")] = None,
    verbose: Verbose = False,
) -> None:
    """Train a tagger on a labelled corpus and save it to a model directory."""
    from rich.table import Table

    from gpseq.corpora.docbin import parse_label_source
    from gpseq.training.allocator import one_arena

    one_arena()  # before the progress display's thread: every thread of the training on one heap
    parse_label_source(spacy_labels)  # a ConfigError before any work
    for path in (train_corpus, dev, config):
        if path is not None and str(path) == "-":
            raise InputFormatError(path, None, "training needs a file, not - (standard input): a corpus is read "
                                               "more than once")
        if path is not None:
            require_file(path)
    checkpoints = checkpoint_dir or output.with_name(output.name + ".ckpt")
    check_train_outputs(output, checkpoints)
    chief = True  # multiworker: only the chief writes the model (and holds the lock)
    if os.environ.get("TF_CONFIG"):  # a cluster (imports TensorFlow, which the default training does without)
        from gpseq.training.distribute import is_chief_process

        chief = is_chief_process()
    with train_lock(output) if chief else contextlib.nullcontext():
        if chief:  # again, now that no other training can be writing it
            check_train_outputs(output, checkpoints)
        if tag_scheme is not None:
            from gpseq.corpora import normalise_scheme

            tag_scheme = normalise_scheme(tag_scheme)
        tagger_config = build_config(ConfigOptions(
            config_file=config, features=features, tag_scheme=tag_scheme, overrides=set_ or [],
            named={"--likelihood": likelihood, "--inducing": inducing, "--epochs": epochs, "--max-steps": max_steps,
                   "--seed": seed, "--devices": devices, "--strategy": strategy}))
        if train_corpus.stat().st_size > STREAM_BYTES:  # read in passes, never held (the default training)
            from gpseq.corpora import CorpusFile

            sentences = CorpusFile(train_corpus, format_, token_column=token_column, label_column=label_column,
                                   encoding=encoding, spacy_labels=spacy_labels,
                                   tag_scheme=tagger_config.tag_scheme)
        else:
            sentences = read_labelled(train_corpus, format_, token_column, label_column, encoding, spacy_labels,
                                      tagger_config.tag_scheme)
        dev_sentences = (read_labelled(dev, format_, token_column, label_column, encoding, spacy_labels,
                                       tagger_config.tag_scheme)
                         if dev is not None else None)
        # a label column the features read as a corpus column (a two-column `token label` file with the
        # chunking preset's POS column 1) would train on the gold labels: refused, as evaluate does
        first = sentences[:1] if isinstance(sentences, list) else list(itertools.islice(iter(sentences), 1))
        check_label_not_a_feature(tagger_config.features, train_corpus, format_, label_column, first)
        if dev_sentences is not None:
            check_label_not_a_feature(tagger_config.features, dev, format_, label_column, dev_sentences[:1])
            warn_dev_only_labels(sentences, dev_sentences, dev)

        Tagger = tagger_module().Tagger
        previous = None
        if init is not None:
            from gpseq.cli.common import load_tagger

            previous = load_tagger(init)
        err = stderr()
        started = time.perf_counter()
        objective = "log posterior" if tagger_config.resolved_method() == "laplace" else "ELBO"
        with TrainProgress(err, objective) as bar:
            tagger = Tagger.train(sentences, tagger_config, dev=dev_sentences, callbacks=[bar],
                                  checkpoint_dir=checkpoints, resume=resume, init=previous)
        elapsed = time.perf_counter() - started
        if not chief:
            err.print(f"worker done in {elapsed:.0f} s; the chief saves the model")
            return
        tagger.save(output)  # checks `output` again: files put there during training are never replaced

    scores = tagger.scores
    table = Table(title=f"gpseq model saved to {output}", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    rows = [
        ("labels", f"{len(tagger.labels)}: {' '.join(tagger.labels[:12])}{' …' if len(tagger.labels) > 12 else ''}"),
        ("features", f"{tagger.featurizer.n_features:,} ({tagger_config.features.preset})"),
        ("model", f"{tagger_config.model.kernel}, {tagger_config.model.likelihood} likelihood"
                  + (f", M = {tagger_config.model.num_inducing}" if tagger_config.model.has_inducing else "")
                  + f", trained by {scores.get('method', 'svi')}"),
        ("train / dev sentences", f"{scores['train_sentences']} / {scores.get('dev_sentences', 0)}"),
        *([("unlabelled tokens (?)", f"{scores['unlabelled_tokens']:,} of {sum(len(s) for s in sentences):,}, "
            "marginalised")] if scores.get("unlabelled_tokens") else []),
        ("L-BFGS iterations" if scores.get("method") == "laplace" else "steps",
         f"{scores.get('steps')}" + (" (stopped early)" if scores.get("stopped_early") else "")),
        ("time", f"{elapsed:.1f} s"),
    ]
    calibration = scores.get("calibration")
    if calibration:
        unseen = calibration.get("unseen_scale")
        rows.append(("calibration (dev)", f"T = {calibration['temperature']:.3f}, variance scale "
                     f"{calibration['variance_scale']:.3g}"
                     + ("" if unseen is None else f", unseen-feature scale {unseen:.3g}")
                     + f"; dev token NLL {calibration['dev_token_nll']:.4f}"))
    held_out = scores.get("decode_scores")
    if held_out:  # the decoder the training kept (`TaggerConfig.decode` "auto") and the other one
        kept = tagger.config.decode
        other = "max-marginal" if kept == "viterbi" else "viterbi"
        metric = {"chunk_f1": "chunk F1", "token_accuracy": "accuracy"}[held_out["metric"]]
        rows.append(("decoder (dev)", f"{kept} ({metric} {held_out[kept]:.4f}; {other} {held_out[other]:.4f})"))
    if bar.last is not None and scores.get("method") != "laplace":
        rows.append(("last ELBO / token", f"{bar.last.elbo_per_token:.4f}"))
    if scores.get("best_dev_score") is not None:
        rows.append((f"best dev score ({tagger_config.training.early_stopping})",
                     f"{scores['best_dev_score']:.4f} at step {scores.get('best_step')}"))
    if scores.get("skipped_steps"):
        rows.append(("skipped steps (non-finite)", str(scores["skipped_steps"])))
    if scores.get("method") != "laplace":  # the L-BFGS fit takes no checkpoints
        rows.append(("checkpoints", str(checkpoints)))
    for name, value in rows:
        table.add_row(name, value)
    stdout().print(table)


def warn_dev_only_labels(sentences, dev_sentences, dev: Path) -> None:
    """One stderr line naming the labels of --dev that the training corpus never has."""
    seen = {label for sentence in sentences for label in (sentence.labels or ())}
    unseen = sorted({label for sentence in dev_sentences for label in (sentence.labels or ())} - seen - {UNLABELLED})
    if unseen:
        shown = " ".join(unseen[:20]) + (f" … ({len(unseen)} in all)" if len(unseen) > 20 else "")
        typer.echo(f"warning: {dev}: label(s) not in the training corpus, which the model cannot predict "
                   f"(they count as errors on dev): {shown}", err=True)
