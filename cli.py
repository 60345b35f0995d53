"""The typer app behind the `gpseq` command: train, tag, evaluate, info, corpus list|fetch.

Thin over the library: every command reads its inputs, calls `gpseq.tagger.Tagger`,
`gpseq.corpora` or `gpseq.evaluate`, and writes what they return. Run from a checkout as
`python cli.py --help`; installed, it is the `gpseq` console command (shipped as
`gpseq/_cli.py`, a symlink to this file, so no bare top-level `cli` module is installed).

User errors (`gpseq.errors`) print one line `error: <message>` on stderr and exit with the
error's code (see EXIT_CODES); `--verbose` adds the traceback.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import os
import shutil
import stat
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Iterable, Iterator, Optional

import typer

import gpseq
from gpseq.errors import ConfigError, GpseqError, InputFormatError, ModelFormatError, OutputError

EXIT_CODES = """[b]Exit codes[/b]

  0    success
  1    other gpseq error
  2    usage error; input file missing or malformed (names file:line);
       output not writable, an input, a directory gpseq did not write,
       or one another gpseq train is writing (MODEL_DIR.lock)
  3    model directory without tagger.json, corrupt, or newer format
  4    invalid configuration (unknown preset, config key or value; a
       --resume checkpoint of another configuration)
  5    numerical failure in training
  130  interrupted
"""

app = typer.Typer(
    name="gpseq",
    help="Sequence labelling with sparse structured Gaussian processes: calibrated per-token probabilities.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)
corpus_app = typer.Typer(
    help="The catalogue of public corpora: list them, fetch one (download or offline mirror).",
    epilog=EXIT_CODES,
    no_args_is_help=True,
    rich_markup_mode="rich",
)
app.add_typer(corpus_app, name="corpus")

Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Show tracebacks and info logging.")]
_state = {"verbose": False}


def _stderr():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def _stdout():
    from rich.console import Console

    return Console(highlight=False)


def _configure_logging(verbose: bool) -> None:
    from rich.logging import RichHandler

    logger = logging.getLogger("gpseq")
    if not any(isinstance(h, RichHandler) for h in logger.handlers):
        handler = RichHandler(console=_stderr(), show_time=False, show_path=False)
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.INFO if verbose else logging.WARNING)


def _tagger_module():
    """`gpseq.tagger`; TensorFlow, when a command comes to need it, is imported quietly unless
    --verbose (`gpseq._tensorflow`)."""
    from gpseq import _tensorflow

    _tensorflow.QUIET = not _state["verbose"]
    import gpseq.tagger

    return gpseq.tagger


def _command(function):
    """Run a command, turning gpseq errors into one stderr line and their exit code."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        verbose = bool(kwargs.get("verbose")) or _state["verbose"]
        _state["verbose"] = verbose
        _configure_logging(verbose)
        try:
            return function(*args, **kwargs)
        except typer.Exit:
            raise
        except GpseqError as error:
            failure, trace = error, traceback.format_exc()
        except FileNotFoundError as error:  # e.g. an output file in a directory that does not exist
            failure = InputFormatError(error.filename or "?", None, error.strerror or "no such file")
            trace = traceback.format_exc()
        except (PermissionError, IsADirectoryError, NotADirectoryError) as error:  # a path the user gave
            failure = OutputError(error.filename or "?", error.strerror or str(error))
            trace = traceback.format_exc()
        except OSError as error:  # e.g. a full disk: still one line naming the file
            failure = GpseqError(f"{error.filename or '?'}: {error.strerror or error}")
            trace = traceback.format_exc()
        except KeyboardInterrupt:
            typer.echo("error: interrupted", err=True)
            raise typer.Exit(130) from None
        if verbose:
            typer.echo(trace, err=True)
        typer.echo(f"error: {failure}", err=True)
        code = failure.exit_code
        raise typer.Exit(code)

    return wrapper


@app.callback()
def _root(verbose: Verbose = False) -> None:
    """Sequence labelling with sparse structured Gaussian processes: calibrated per-token probabilities."""
    _state["verbose"] = verbose


@app.command()
def version() -> None:
    """Print the gpseq version."""
    typer.echo(gpseq.__version__)


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


def _require_file(path: Path) -> Path:
    if str(path) != "-" and not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "no such file"
        raise InputFormatError(path, None, what)
    return path


def _require_model_dir(path: Path) -> Path:
    if not path.exists():
        raise InputFormatError(path, None, "no such model directory")
    return path


def _read_corpus(path: Path, token_column: int, label_column: int, encoding: str):
    from gpseq.corpora import read_conll

    _require_file(path)
    sentences = read_conll(path, token_column=token_column, label_column=label_column, encoding=encoding)
    if not sentences:
        raise InputFormatError(path, None, "no sentences in the file")
    return sentences


def _load_tagger(model_dir: Path):
    _require_model_dir(model_dir)
    return _tagger_module().Tagger.load(model_dir)


def _parse_value(text: str):
    """A --set value: JSON when it parses (2.0, true, null, [1,2], "x"), else the plain string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _apply_override(data: dict, assignment: str) -> None:
    """Set `section.key=value` in the nested config dict; unknown keys are a ConfigError."""
    key, sep, value = assignment.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set {assignment!r}: expected KEY.PATH=VALUE, e.g. model.prior_variance=2.0")
    parts = key.strip().split(".")
    node = data
    for depth, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            where = ".".join(parts[:depth]) or "the configuration"
            known = ", ".join(sorted(node)) if isinstance(node, dict) else "(not a section)"
            raise ConfigError(f"--set {key}: no key {part!r} in {where}; known: {known}")
        if depth == len(parts) - 1:
            node[part] = _parse_value(value)
        else:
            node = node[part]


def _build_config(config_file, features, likelihood, inducing, epochs, max_steps, seed, tag_scheme,
                  devices, strategy, overrides):
    """The TaggerConfig: library defaults ← --config JSON ← named options ← --set overrides."""
    from gpseq.features import FeatureConfig, get_preset, list_presets

    TaggerConfig = _tagger_module().TaggerConfig

    if config_file is not None:
        _require_file(config_file)
        try:
            data = json.loads(config_file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise InputFormatError(config_file, error.lineno, f"not valid JSON: {error.msg}") from None
        if not isinstance(data, dict):
            raise InputFormatError(config_file, 1, "the configuration must be a JSON object")
        data = TaggerConfig.from_dict(data).to_dict()
    else:
        data = TaggerConfig().to_dict()
    if features is not None:
        if features in list_presets():
            feature_config = get_preset(features)
        elif Path(features).is_file():
            feature_config = FeatureConfig.from_template_file(features)
        else:
            get_preset(features)  # raises ConfigError naming the presets
        data["features"] = feature_config.to_dict()
    named = {
        ("model", "likelihood"): likelihood,
        ("model", "num_inducing"): inducing,
        ("training", "epochs"): epochs,
        ("training", "max_steps"): max_steps,
        ("training", "seed"): seed,
        ("training", "devices"): devices,
        ("training", "strategy"): strategy,
    }
    for (section, key), value in named.items():
        if value is None:
            continue
        if key not in data[section]:
            raise ConfigError(
                f"--{key} is not supported by this gpseq's {section} configuration "
                f"(no {section}.{key}; the distributed trainer is not installed)"
            )
        data[section][key] = value
    if inducing is not None and data["model"]["kernel"] == "linear":
        data["model"]["kernel"] = "linear+rbf"  # inducing inputs ask for the sparse RBF part (SVI)
    if tag_scheme is not None:
        data["tag_scheme"] = tag_scheme
    for assignment in overrides or []:
        _apply_override(data, assignment)
    config = TaggerConfig.from_dict(data)
    config.validate()
    return config


# ---------------------------------------------------------------------------------------------
# Outputs: checked before any work; never an input, never a foreign file
# ---------------------------------------------------------------------------------------------


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name the same file: equal once resolved, or the same inode (hard links)."""
    try:
        if a.resolve() == b.resolve():
            return True
    except (OSError, RuntimeError):
        pass
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _writable_dir(path: Path, what: Path) -> None:
    """OutputError (naming `what`) unless `path`, or the nearest ancestor that exists, is a writable directory."""
    probe = path.absolute()
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise OutputError(what, f"cannot be created: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OutputError(what, f"cannot be written: directory {probe} is not writable (permission denied)")


def _check_train_outputs(output: Path, checkpoints: Path) -> None:
    """Before training: `-o` must be absent, empty, or a gpseq model directory holding only the
    files gpseq wrote, in a writable directory; the checkpoint directory must be writable."""
    if checkpoints.resolve() == output.resolve() or output.resolve() in checkpoints.resolve().parents:
        raise OutputError(checkpoints, f"the checkpoint directory must not be inside the model directory {output}")
    _tagger_module()._check_save_target(output)
    if os.path.lexists(checkpoints) and not checkpoints.is_dir():
        raise OutputError(checkpoints, "exists and is not a directory (needed for checkpoints)")
    _writable_dir(checkpoints, checkpoints)


def _check_tag_output(output: Optional[Path], files: list[Path], model_dir: Path) -> None:
    """Before tagging: `-o` must not be an input, the model, a directory or a read-only file, and its
    directory must exist and be writable."""
    if output is None:
        return
    if output.is_dir():
        raise OutputError(output, "is a directory; -o needs a file name")
    for path in files:
        if str(path) != "-" and _same_file(output, path):
            raise OutputError(output, f"is the same file as the input {path}; refusing to overwrite an input "
                                      "(choose another -o)")
    try:
        inside_model = model_dir.resolve() in output.resolve().parents
    except (OSError, RuntimeError):
        inside_model = False
    if inside_model:
        raise OutputError(output, f"is inside the model directory {model_dir}; refusing to write there")
    if os.path.lexists(output):
        try:
            mode = output.stat().st_mode
        except OSError as error:
            raise OutputError(output, f"cannot be written ({error.strerror or error})") from None
        if stat.S_ISREG(mode) and (not os.access(output, os.W_OK) or not mode & 0o222):
            raise OutputError(output, "is a read-only file; refusing to overwrite it")
    parent = Path(os.path.realpath(output)).parent  # where the temporary file goes (beside a symlink's target)
    if not parent.is_dir():
        raise OutputError(output, f"cannot be written: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(output, f"cannot be written: directory {parent} is not writable (permission denied)")


@contextlib.contextmanager
def _train_lock(output: Path):
    """Hold `OUTPUT.lock` (beside the model directory) for the whole training: a second training
    writing the same -o fails at start (OutputError naming the directory and the holder's PID).

    The lock is an flock on the file, which the kernel releases when its holder dies, so a lock
    left by a killed training is stale by construction and simply taken over; the file holds the
    holder's PID for the message and is removed at the end. (Without fcntl, i.e. not on a POSIX
    system, there is no lock.)"""
    try:
        import fcntl
    except ImportError:
        yield None
        return

    absolute = Path(os.path.abspath(output))
    lock = absolute.with_name(absolute.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)  # as the save would (checked writable before)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                holder = os.read(fd, 32).decode("ascii", "replace").strip() or "?"
            finally:
                os.close(fd)
            raise OutputError(output, f"another gpseq train (PID {holder}) is writing this model directory "
                                      f"(lock {lock}); wait for it to finish or choose another -o") from None
        try:  # the holder we waited for may have removed the file: lock the one at `lock`
            current = os.stat(lock)
            opened = os.fstat(fd)
            same = (current.st_dev, current.st_ino) == (opened.st_dev, opened.st_ino)
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        yield lock
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)  # while still holding it: a waiting opener then sees another inode and retries
        os.close(fd)


def _warn_dev_only_labels(sentences, dev_sentences, dev: Path) -> None:
    """One stderr line naming the labels of --dev that the training corpus never has."""
    seen = {label for sentence in sentences for label in (sentence.labels or ())}
    unseen = sorted({label for sentence in dev_sentences for label in (sentence.labels or ())} - seen)
    if unseen:
        shown = " ".join(unseen[:20]) + (f" … ({len(unseen)} in all)" if len(unseen) > 20 else "")
        typer.echo(f"warning: {dev}: label(s) not in the training corpus, which the model cannot predict "
                   f"(they count as errors on dev): {shown}", err=True)


@contextlib.contextmanager
def _output_file(output: Path):
    """The path to write `output` through: a temporary sibling renamed onto `output` at the end
    (an existing file keeps its permissions; a failure leaves it untouched). A device or FIFO
    (e.g. /dev/null) is written directly."""
    from gpseq.corpora._atomic import atomic_target

    target = Path(os.path.realpath(output)) if output.is_symlink() else output
    if os.path.exists(target) and not os.path.isfile(target):
        yield target
        return
    with atomic_target(target) as temp:
        if os.path.exists(target):
            shutil.copymode(target, temp)
        yield temp


# ---------------------------------------------------------------------------------------------
# train
# ---------------------------------------------------------------------------------------------

TRAIN_EXAMPLES = """[b]Examples[/b]

  gpseq train corpora/sample/train.conll -o runs/sample
  gpseq train train.txt --dev test.txt -o runs/chunk --features chunking \\
      --inducing 128 --epochs 5
  gpseq train train.data -o runs/crfpp --features template \\
      --likelihood pseudo --set training.batch_size=16
  gpseq train train.txt -o runs/chunk --resume   # continues from runs/chunk.ckpt

""" + EXIT_CODES


class _TrainProgress:
    """A rich progress bar fed by the trainer's Progress callbacks (ETA, running ELBO, dev score)."""

    def __init__(self, console):
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
            fields["elbo"] = f"ELBO/token {progress.elbo_per_token:.4f}"
        if progress.dev_score is not None and progress.event == "eval":
            self.dev = (progress.dev_metric, progress.dev_score)
            fields["dev"] = f"dev {progress.dev_metric} {progress.dev_score:.4f}"
        self.bar.update(self.task, total=progress.total_steps, completed=progress.step, **fields)


@app.command(epilog=TRAIN_EXAMPLES)
@_command
def train(
    train_corpus: Annotated[Path, typer.Argument(help="Labelled CoNLL-style column file (token first, label last by default).", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="Model directory to write.", show_default=False)],
    dev: Annotated[Optional[Path], typer.Option(help="Labelled dev corpus for early stopping (default: a held-out slice of train, training.dev_fraction).")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", help="TaggerConfig JSON (keys features, model, training, tag_scheme, …), e.g. a model's tagger.json 'config'.")] = None,
    features: Annotated[Optional[str], typer.Option(help="Feature preset (chunking, ner, pos, segmentation) or a CRF++ template file.")] = None,
    likelihood: Annotated[Optional[str], typer.Option(help="exact (linear chain) or pseudo (piecewise pseudo-likelihood).")] = None,
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
    tag_scheme: Annotated[Optional[str], typer.Option(help="Tag scheme of the labels: iob1, iob2 (bio), bioes (for spans and chunk F1).")] = None,
    devices: Annotated[Optional[int], typer.Option(help="Number of devices (replicas) to train on (training.devices).")] = None,
    strategy: Annotated[Optional[str], typer.Option(help="tf.distribute strategy: default, mirrored or multiworker (training.strategy).")] = None,
    verbose: Verbose = False,
) -> None:
    """Train a tagger on a labelled CoNLL-style corpus and save it to a model directory."""
    from rich.table import Table

    for path in (train_corpus, dev, config):
        if path is not None:
            _require_file(path)
    checkpoints = checkpoint_dir or output.with_name(output.name + ".ckpt")
    _check_train_outputs(output, checkpoints)
    chief = True  # multiworker: only the chief writes the model (and holds the lock)
    if os.environ.get("TF_CONFIG"):  # a cluster (imports TensorFlow, which the default training does without)
        from gpseq.training.distribute import is_chief_process

        chief = is_chief_process()
    with _train_lock(output) if chief else contextlib.nullcontext():
        if chief:  # again, now that no other training can be writing it
            _check_train_outputs(output, checkpoints)
        if tag_scheme is not None:
            from gpseq.corpora import normalise_scheme

            tag_scheme = normalise_scheme(tag_scheme)
        tagger_config = _build_config(config, features, likelihood, inducing, epochs, max_steps, seed, tag_scheme,
                                      devices, strategy, set_)
        sentences = _read_corpus(train_corpus, token_column, label_column, encoding)
        dev_sentences = _read_corpus(dev, token_column, label_column, encoding) if dev is not None else None
        if dev_sentences is not None:
            _warn_dev_only_labels(sentences, dev_sentences, dev)

        Tagger = _tagger_module().Tagger
        err = _stderr()
        started = time.perf_counter()
        with _TrainProgress(err) as bar:
            tagger = Tagger.train(sentences, tagger_config, dev=dev_sentences, callbacks=[bar],
                                  checkpoint_dir=checkpoints, resume=resume)
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
        ("train / dev sentences", f"{scores.get('train_sentences', len(sentences))} / {scores.get('dev_sentences', 0)}"),
        ("steps", f"{scores.get('steps')}" + (" (stopped early)" if scores.get("stopped_early") else "")),
        ("time", f"{elapsed:.1f} s"),
    ]
    calibration = scores.get("calibration")
    if calibration:
        rows.append(("calibration (dev)", f"T = {calibration['temperature']:.3f}, variance scale "
                     f"{calibration['variance_scale']:.3g}; dev token NLL {calibration['dev_token_nll']:.4f}"))
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
    _stdout().print(table)


# ---------------------------------------------------------------------------------------------
# tag
# ---------------------------------------------------------------------------------------------

TAG_EXAMPLES = """[b]Examples[/b]

  gpseq tag runs/sample corpora/sample/example.txt
  cat notes.txt | gpseq tag runs/sample - --format jsonl --mean
  gpseq tag runs/chunk test.conll --full-distribution -o tagged.conll
  gpseq tag runs/ner docs/*.txt --format spacy -o tagged.spacy

[b]Output formats[/b]

  conll  token, label, p(label) per line (tab-separated), a blank line
         between sentences; --full-distribution appends LABEL=p for
         every label.
  jsonl  one object per sentence: source, line, tokens, labels,
         confidences, distributions (per token: label -> p),
         sequence_log_prob = log p(label path | tokens), and for chunk
         labels spans \\[type, start, end_exclusive, probability], the
         probability being the product of the token marginals of the
         span's labels.
  spacy  a DocBin (-o required): doc.user_data["gpseq"] holds labels and
         confidences, chunk spans go to doc.spans["gpseq"] (scores in
         its attrs) and doc.ents, other labels to token.tag_.

""" + EXIT_CODES

_CONLL_SUFFIXES = {".conll", ".conllx", ".iob", ".iob2", ".bio", ".bioes", ".data", ".tsv", ".col"}


@dataclass
class _Item:
    """One input sentence on its way to the tagger: tokens, trailing spaces, where it came from."""

    sentence: object  # gpseq.corpora.Sentence
    spaces: list[bool] | None


# Raw text is cut so that neither spaCy nor the tagger ever sees an unbounded input: spaCy gets at most
# TEXT_MAX_CHARS characters per call (its own limit, nlp.max_length, is 1,000,000), lines longer than that
# are cut at whitespace; a sentence of more than --text-max-tokens tokens (raw text without sentence
# punctuation) is split into pieces of at most that many tokens, at whitespace between tokens.
TEXT_MAX_CHARS = 100_000
TEXT_MAX_TOKENS = 1_000


def _cut_at_whitespace(text: str, limit: int) -> Iterator[tuple[int, str]]:
    """(offset, piece) of `text` in pieces of at most `limit` characters, each cut at the last
    whitespace within the limit (a hard cut where `limit` characters hold no whitespace)."""
    start, n = 0, len(text)
    while n - start > limit:
        end = start + limit
        cut = max(text.rfind(c, start + 1, end + 1) for c in " \t\u3000\u00a0\f\v")
        if cut <= start:  # no whitespace in the window (e.g. unspaced scripts): a hard cut
            yield start, text[start:end]
            start = end
        else:  # text[cut] is whitespace: it ends this piece
            yield start, text[start:cut]
            start = cut + 1
    if start < n:
        yield start, text[start:]


def _split_tokens(n_tokens: int, spaces: list[bool], limit: int) -> list[tuple[int, int]]:
    """[start, end) pieces of a sentence of `n_tokens` tokens, each at most `limit` tokens, cut after a
    token followed by whitespace (the last such one within the limit; a cut between any two tokens
    when the last half of the window has none)."""
    pieces, start = [], 0
    while n_tokens - start > limit:
        end = start + limit
        cut = next((i for i in range(end, start + limit // 2, -1) if spaces[i - 1]), end)
        pieces.append((start, cut))
        start = cut
    pieces.append((start, n_tokens))
    return pieces


def _iter_text(source, name: str, encoding: str, nlp, max_block_chars: int = TEXT_MAX_CHARS,
               max_tokens: int = TEXT_MAX_TOKENS) -> Iterator[_Item]:
    """Sentences of raw text: blocks of non-blank lines (at most max_block_chars characters per spaCy
    call; a longer line is cut at whitespace), spaCy tokens and sentencizer; sentences longer than
    max_tokens tokens are split into pieces of at most max_tokens (at whitespace between tokens)."""
    from gpseq.corpora import Sentence
    from gpseq.corpora.conll import numbered_lines

    def split(block: list[str], first: int) -> Iterator[_Item]:
        text = "\n".join(block)
        doc = nlp(text)
        position, newlines = 0, 0  # newlines before `position` in text (sentences come in order)
        for sent in doc.sents:
            tokens = [t for t in sent if not t.is_space]
            if not tokens:
                continue
            spaces = []
            for token in tokens:
                following = doc[token.i + 1] if token.i + 1 < len(doc) else None
                spaces.append(bool(token.whitespace_) or (following is not None and following.is_space))
            for start, end in _split_tokens(len(tokens), spaces, max_tokens):
                piece = spaces[start:end]
                piece[-1] = False  # each sentence becomes its own Doc: no trailing space
                newlines += text.count("\n", position, tokens[start].idx)
                position = tokens[start].idx
                line = first + newlines
                yield _Item(Sentence([t.text for t in tokens[start:end]], source=name, line=line), piece)

    with numbered_lines(source, encoding, name) as (name, lines):
        block: list[str] = []
        first, size = 0, 0
        for number, line in lines:
            if not line.strip():
                if block:
                    yield from split(block, first)
                    block, size = [], 0
                continue
            if block and size + len(line) + 1 > max_block_chars:
                yield from split(block, first)
                block, size = [], 0
            if len(line) > max_block_chars:  # a long line (e.g. text without line breaks): cut at whitespace
                for _, piece in _cut_at_whitespace(line, max_block_chars):
                    yield from split([piece], number)
                continue
            if not block:
                first = number
            block.append(line)
            size += len(line) + 1
        if block:
            yield from split(block, first)


def _iter_inputs(files: list[Path], input_format: str, token_column: int, encoding: str, lang: str,
                 text_max_tokens: int = TEXT_MAX_TOKENS) -> Iterator[_Item]:
    from gpseq.corpora import iter_conll

    nlp = None
    for path in files:
        stdin = str(path) == "-"
        _require_file(path)
        source = sys.stdin.buffer if stdin else path
        name = "<stdin>" if stdin else str(path)
        if _input_format(path, input_format) == "conll":
            for sentence in iter_conll(source, token_column=token_column, label_column=None, encoding=encoding,
                                       name=name):
                yield _Item(sentence, None)
        else:
            if nlp is None:
                import spacy

                nlp = spacy.blank(lang)
                nlp.add_pipe("sentencizer")
            yield from _iter_text(source, name, encoding, nlp, max_tokens=text_max_tokens)


def _batches(items: Iterable[_Item], size: int) -> Iterator[list[_Item]]:
    batch: list[_Item] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _span_records(result, scheme: str | None) -> list[list]:
    """[type, start, end_exclusive, probability]: probability = product of the token marginals of the span's labels."""
    if scheme is None:
        return []
    from gpseq.corpora import spans

    confidences = result.confidences
    records = []
    for type_, start, end in spans(result.labels, scheme):
        probability = 1.0
        for t in range(start, end):
            probability *= confidences[t]
        records.append([type_, start, end, probability])
    return records


def _fmt(p: float) -> str:
    return f"{p:.6g}"


class _ConllWriter:
    def __init__(self, stream, full_distribution: bool):
        self.stream, self.full = stream, full_distribution

    def write(self, item: _Item, result, scheme) -> None:
        lines = []
        for t, (token, label, p) in enumerate(zip(result.tokens, result.labels, result.confidences)):
            fields = [token, label, _fmt(p)]
            if self.full:
                fields += [f"{name}={_fmt(q)}" for name, q in zip(result.label_set, result.probabilities[t])]
            lines.append("\t".join(fields))
        self.stream.write("\n".join(lines) + "\n\n")

    def close(self) -> None:
        self.stream.flush()


class _JsonlWriter:
    def __init__(self, stream, full_distribution: bool):
        self.stream = stream

    def write(self, item: _Item, result, scheme) -> None:
        record = {
            "source": item.sentence.source,
            "line": item.sentence.line,
            "tokens": result.tokens,
            "labels": result.labels,
            "confidences": [round(p, 6) for p in result.confidences],
            "distributions": [
                {name: round(float(q), 6) for name, q in zip(result.label_set, row)} for row in result.probabilities
            ],
            "spans": [[t, s, e, round(p, 6)] for t, s, e, p in _span_records(result, scheme)],
            "sequence_log_prob": result.sequence_log_prob,
        }
        self.stream.write(json.dumps(record, ensure_ascii=False) + "\n")

    def close(self) -> None:
        self.stream.flush()


class _DocBinWriter:
    """Tagged sentences as spaCy Docs in a DocBin (written to `path` at the end)."""

    def __init__(self, path: Path, lang: str, full_distribution: bool):
        import spacy
        from spacy.tokens import DocBin

        self.path, self.full = path, full_distribution
        self.vocab = spacy.blank(lang).vocab
        self.docbin = DocBin(store_user_data=True)

    def write(self, item: _Item, result, scheme) -> None:
        from spacy.tokens import Doc, Span

        spaces = item.spaces or [True] * (len(result.tokens) - 1) + [False]
        doc = Doc(self.vocab, words=result.tokens, spaces=spaces)
        data = {
            "labels": result.labels,
            "confidences": result.confidences,
            "sequence_log_prob": result.sequence_log_prob,
            "source": item.sentence.source,
            "line": item.sentence.line,
        }
        if self.full:
            data["label_set"] = list(result.label_set)
            data["probabilities"] = result.probabilities.tolist()
        doc.user_data["gpseq"] = data
        if scheme is not None:
            records = _span_records(result, scheme)
            group = [Span(doc, s, e, label=t or "CHUNK") for t, s, e, _ in records]
            doc.spans["gpseq"] = group
            doc.spans["gpseq"].attrs["scores"] = [p for *_, p in records]
            doc.ents = group
        else:
            for token, label in zip(doc, result.labels):
                token.tag_ = label
        self.docbin.add(doc)

    def close(self) -> None:
        self.docbin.to_disk(self.path)  # `gpseq tag` gives a temporary file, renamed into place after


def _input_format(path: Path, input_format: str) -> str:
    if input_format != "auto":
        return input_format
    return "conll" if (str(path) != "-" and path.suffix.lower() in _CONLL_SUFFIXES) else "text"


def _check_text_input(tagger, files: list[Path], input_format: str) -> None:
    """Raw text has only tokens: refuse it up front for a model whose features read other corpus columns."""
    features = tagger.featurizer.config
    columns = sorted(c for c in features.sources() if isinstance(c, int) and c > 0)
    text = [path for path in files if _input_format(path, input_format) == "text"]
    if columns and text:
        raise ConfigError(
            f"{text[0]}: raw text has only tokens, but this model's features "
            f"(preset {features.preset!r}) read corpus column(s) {columns}; tag a CoNLL "
            "file that has them (--input-format conll), or train with features that raw text can "
            "feed (e.g. --features ner or pos)"
        )


@app.command(epilog=TAG_EXAMPLES)
@_command
def tag(
    model_dir: Annotated[Path, typer.Argument(help="Model directory written by gpseq train.", show_default=False)],
    files: Annotated[list[Path], typer.Argument(help="Input files; - reads stdin.", show_default=False)],
    input_format: Annotated[str, typer.Option(help="text (spaCy tokenisation + sentencizer), conll (token column, blank line between sentences) or auto (conll for .conll/.iob/.data/.tsv…, text otherwise).")] = "auto",
    format_: Annotated[str, typer.Option("--format", help="Output: conll, jsonl or spacy (DocBin; needs -o).")] = "conll",
    full_distribution: Annotated[bool, typer.Option("--full-distribution", help="conll/spacy: add every label's probability per token.")] = False,
    samples: Annotated[Optional[int], typer.Option(help="Monte Carlo marginals over S draws of f (default: the model's predictive, deterministic unless it says mc).")] = None,
    mean: Annotated[bool, typer.Option("--mean", help="The deterministic calibrated marginals (probit-scaled potentials, one forward-backward), whatever the model's default.")] = False,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Output file (default: stdout).")] = None,
    batch_size: Annotated[int, typer.Option(help="Sentences read, tagged and written at a time (bounds memory).")] = 256,
    token_column: Annotated[int, typer.Option(help="conll input: the token column.")] = 0,
    encoding: Annotated[str, typer.Option(help="Encoding of the input files.")] = "utf-8",
    text_max_tokens: Annotated[int, typer.Option(help="text input: split a sentence longer than this many tokens (e.g. text without sentence punctuation) into pieces of at most this many, at whitespace.")] = TEXT_MAX_TOKENS,
    verbose: Verbose = False,
) -> None:
    """Tag raw text or CoNLL files: labels with per-token probabilities."""
    from gpseq.corpora import is_chunk_labelling

    if input_format not in ("auto", "text", "conll"):
        raise ConfigError(f"--input-format must be auto, text or conll; got {input_format!r}")
    if format_ not in ("conll", "jsonl", "spacy"):
        raise ConfigError(f"--format must be conll, jsonl or spacy; got {format_!r}")
    if format_ == "spacy" and output is None:
        raise ConfigError("--format spacy writes a binary DocBin: give -o FILE")
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1; got {batch_size}")
    if samples is not None and samples < 1:
        raise ConfigError(f"--samples must be >= 1; got {samples}")
    if text_max_tokens < 1:
        raise ConfigError(f"--text-max-tokens must be >= 1; got {text_max_tokens}")
    for path in files:
        _require_file(path)
    _check_tag_output(output, files, model_dir)
    tagger = _load_tagger(model_dir)
    lang = tagger.config.features.lang
    _check_text_input(tagger, files, input_format)
    scheme = tagger.config.tag_scheme if is_chunk_labelling(tagger.labels, tagger.config.tag_scheme) else None

    n_sentences = n_tokens = 0
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        target = None if output is None else stack.enter_context(_output_file(output))
        if format_ == "spacy":
            writer = _DocBinWriter(target, lang, full_distribution)
        else:
            if target is None:
                stream = sys.stdout
            else:
                stream = stack.enter_context(open(target, "w", encoding="utf-8", newline="\n"))
            writer = (_ConllWriter if format_ == "conll" else _JsonlWriter)(stream, full_distribution)
        for batch in _batches(_iter_inputs(files, input_format, token_column, encoding, lang,
                                             text_max_tokens), batch_size):
            results = tagger.tag([item.sentence for item in batch], samples=samples, mean=mean or None,
                                 batch_size=batch_size)
            for item, result in zip(batch, results):
                writer.write(item, result, scheme)
                n_tokens += len(result.tokens)
            n_sentences += len(batch)
        writer.close()
    if output is not None:
        elapsed = time.perf_counter() - started
        _stderr().print(f"tagged {n_sentences:,} sentences, {n_tokens:,} tokens in {elapsed:.1f} s → {output}")


# ---------------------------------------------------------------------------------------------
# evaluate
# ---------------------------------------------------------------------------------------------

EVALUATE_EXAMPLES = """[b]Examples[/b]

  gpseq evaluate runs/sample corpora/sample/test.conll
  gpseq evaluate runs/chunk test.txt --json --plot reliability.png
  gpseq evaluate runs/chunk test.txt --samples 32   # Monte Carlo marginals

""" + EXIT_CODES


def _metrics_tables(metrics: dict):
    """A table of the overall metrics and, when there are `metric[TYPE]` keys, one of the per-type scores."""
    from rich.table import Table

    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.4f}"
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{value:,}"
        return "-" if value is None else str(value)

    overall = Table(title="evaluation")
    overall.add_column("metric")
    overall.add_column("value", justify="right")
    per_type: dict[str, dict[str, object]] = {}
    for name, value in metrics.items():
        if name.endswith("]") and "[" in name:
            metric, _, kind = name[:-1].partition("[")
            per_type.setdefault(kind, {})[metric] = value
        else:
            overall.add_row(name, cell(value))
    tables = [overall]
    if per_type:
        columns = list(dict.fromkeys(metric for row in per_type.values() for metric in row))
        table = Table(title="per chunk type")
        table.add_column("type")
        for column in columns:
            table.add_column(column, justify="right")
        for kind, row in per_type.items():
            table.add_row(kind or "(untyped)", *(cell(row.get(column)) for column in columns))
        tables.append(table)
    return tables


@app.command(epilog=EVALUATE_EXAMPLES)
@_command
def evaluate(
    model_dir: Annotated[Path, typer.Argument(help="Model directory written by gpseq train.", show_default=False)],
    corpus: Annotated[Path, typer.Argument(help="Labelled CoNLL-style corpus.", show_default=False)],
    json_: Annotated[bool, typer.Option("--json", help="Print the metrics as JSON.")] = False,
    plot: Annotated[Optional[Path], typer.Option(help="Write the reliability diagram to this PNG.")] = None,
    samples: Annotated[Optional[int], typer.Option(help="Monte Carlo marginals over S draws of f (default: the model's predictive).")] = None,
    mean: Annotated[bool, typer.Option("--mean", help="The deterministic calibrated marginals, whatever the model's default.")] = False,
    bins: Annotated[int, typer.Option(help="Equal-width confidence bins for ECE and the reliability diagram.")] = 15,
    token_column: Annotated[int, typer.Option(help="Token column of the corpus.")] = 0,
    label_column: Annotated[int, typer.Option(help="Label column of the corpus (default: the last).")] = -1,
    encoding: Annotated[str, typer.Option(help="Encoding of the corpus.")] = "utf-8",
    verbose: Verbose = False,
) -> None:
    """Evaluate a model on a labelled corpus: token error, chunk P/R/F1, NLL, ECE, Brier; reliability diagram."""
    sentences = _read_corpus(corpus, token_column, label_column, encoding)
    tagger = _load_tagger(model_dir)
    report = tagger.evaluate(sentences, samples=samples, mean=mean or None, n_bins=bins)
    if plot is not None:
        _plot_reliability(report, plot, bins)
    metrics = report.to_dict()
    if json_:
        typer.echo(json.dumps(metrics, indent=2, default=_json_default))
        return
    console = _stdout()
    for table in _metrics_tables(metrics):
        console.print(table)
    if plot is not None:
        console.print(f"reliability diagram → {plot}")


def _plot_reliability(report, path: Path, bins: int) -> None:
    """`gpseq.evaluate.reliability_diagram` from the report's per-bin counts (Tagger.evaluate keeps no per-token arrays).

    Bin b's n_b tokens are given its mean confidence and round(n_b · accuracy_b) of them are
    marked correct: the same bins, bars, token counts and ECE as the per-token arrays give.
    """
    import numpy as np

    from gpseq.evaluate import reliability_diagram

    calibration = report.calibration
    if not calibration:
        raise GpseqError("no calibration bins in the evaluation report: nothing to plot")
    confidence, correct = [], []
    for count, mean_confidence, accuracy in zip(calibration["counts"], calibration["confidence"],
                                                calibration["accuracy"]):
        if not count:
            continue
        n_correct = int(round(count * accuracy))
        confidence.append(np.full(count, mean_confidence))
        correct.append(np.arange(count) < n_correct)
    reliability_diagram(np.concatenate(confidence), np.concatenate(correct), path, n_bins=bins)


def _json_default(value):
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


# ---------------------------------------------------------------------------------------------
# info
# ---------------------------------------------------------------------------------------------

INFO_EXAMPLES = """[b]Examples[/b]

  gpseq info runs/sample
  gpseq info runs/sample --json > model-info.json

""" + EXIT_CODES


def _model_info(model_dir: Path, tagger) -> dict:
    """What `gpseq info` shows: tagger.json's metadata, sizes of the arrays and of the files."""
    meta_path = model_dir / "tagger.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    arrays = meta.get("arrays", {})
    n_parameters = 0
    for shape in arrays.values():
        size = 1
        for dim in shape:
            size *= int(dim)
        n_parameters += size
    files = {str(p.relative_to(model_dir)): p.stat().st_size for p in sorted(model_dir.rglob("*")) if p.is_file()}
    scores = dict(meta.get("scores") or {})
    return {
        "model_dir": str(model_dir),
        "format": meta.get("format"),
        "format_version": meta.get("format_version"),
        "gpseq_version": meta.get("gpseq_version"),
        "labels": list(tagger.labels),
        "tag_scheme": tagger.config.tag_scheme,
        "n_features": int(tagger.featurizer.n_features),
        "features": tagger.config.features.to_dict(),
        "n_feature_templates": len(tagger.config.features.templates()),
        "model": tagger.config.model.to_dict(),
        "training": meta.get("config", {}).get("training", {}),
        "predict_samples": tagger.config.predict_samples,
        "decode": tagger.config.decode,
        "arrays": arrays,
        "n_parameters": n_parameters,
        "files": files,
        "bytes_on_disk": sum(files.values()),
        "scores": scores,
    }


@app.command(epilog=INFO_EXAMPLES)
@_command
def info(
    model_dir: Annotated[Path, typer.Argument(help="Model directory written by gpseq train.", show_default=False)],
    json_: Annotated[bool, typer.Option("--json", help="Print everything as JSON.")] = False,
    verbose: Verbose = False,
) -> None:
    """Describe a model: labels, features, sizes, training configuration, format version, scores."""
    from rich.table import Table

    tagger = _load_tagger(model_dir)
    data = _model_info(model_dir, tagger)
    if json_:
        typer.echo(json.dumps(data, indent=2, default=_json_default))
        return
    console = _stdout()
    summary = Table(title=f"gpseq model {model_dir}", show_header=False)
    summary.add_column("", style="bold")
    summary.add_column("")
    model = data["model"]
    scores = data["scores"]
    for name, value in [
        ("format", f"{data['format']} v{data['format_version']} (written by gpseq {data['gpseq_version']})"),
        ("labels", f"{len(data['labels'])}: {' '.join(data['labels'])}"),
        ("tag scheme", data["tag_scheme"]),
        ("features", f"{data['n_features']:,} columns, {data['n_feature_templates']} templates, "
                     f"preset {data['features'].get('preset')}"),
        ("model", f"kernel {model.get('kernel')}, {model.get('likelihood')} likelihood, "
                  f"M = {model.get('num_inducing')}, K = {model.get('num_components')}"),
        ("parameters", f"{data['n_parameters']:,} in {len(data['arrays'])} arrays"),
        ("on disk", f"{data['bytes_on_disk']:,} bytes in {len(data['files'])} files"),
        ("prediction", f"{data['predict_samples']} samples, decode {data['decode']}"),
    ]:
        summary.add_row(name, str(value))
    for key in ("steps", "best_dev_score", "best_step", "stopped_early", "train_sentences", "dev_sentences"):
        if key in scores:
            value = scores[key]
            summary.add_row(key.replace("_", " "), f"{value:.4f}" if isinstance(value, float) else str(value))
    console.print(summary)
    training = Table(title="training configuration", show_header=False)
    training.add_column("", style="bold")
    training.add_column("")
    for key, value in data["training"].items():
        training.add_row(key, str(value))
    console.print(training)
    arrays = Table(title="arrays")
    arrays.add_column("name")
    arrays.add_column("shape", justify="right")
    for name, shape in data["arrays"].items():
        arrays.add_row(name, " × ".join(str(d) for d in shape) or "scalar")
    console.print(arrays)


# ---------------------------------------------------------------------------------------------
# corpus list | fetch
# ---------------------------------------------------------------------------------------------

CORPUS_EXAMPLES = """[b]Examples[/b]

  gpseq corpus list
  gpseq corpus fetch conll2000 --dest ~/corpora
  gpseq corpus fetch conll2000 --mirror ../shared/corpora --dest /tmp/c

""" + EXIT_CODES


@corpus_app.command("list", epilog=CORPUS_EXAMPLES)
@_command
def corpus_list(
    json_: Annotated[bool, typer.Option("--json", help="Print the catalogue entries as JSON.")] = False,
    verbose: Verbose = False,
) -> None:
    """List the public corpora gpseq can fetch (columns, encoding, tag scheme, sizes)."""
    from rich.table import Table

    from gpseq.corpora import list_corpora

    entries = list_corpora()
    if json_:
        typer.echo(json.dumps(entries, indent=2))
        return
    table = Table(title="public corpora (gpseq corpus fetch NAME)")
    for column in ("name", "task", "lang", "columns", "encoding", "scheme", "splits (sentences/tokens)"):
        table.add_column(column)
    for entry in entries:
        counts = entry.get("counts") or {}
        splits = ", ".join(
            f"{split} {c[0]:,}/{c[1]:,}" if isinstance(c, list) and len(c) == 2 else split
            for split, c in ((s, counts.get(s)) for s in entry.get("files", {}))
        )
        table.add_row(entry["name"], str(entry.get("task", "")), str(entry.get("language", "")),
                      " ".join(map(str, entry.get("columns", []))), str(entry.get("encoding", "")),
                      str(entry.get("tag_scheme") or ""), splits)
    _stdout().print(table)


def _default_corpora_dir() -> Path:
    env = os.environ.get("GPSEQ_CORPORA")
    return Path(env) if env else Path.home() / ".cache" / "gpseq" / "corpora"


@corpus_app.command("fetch", epilog=CORPUS_EXAMPLES)
@_command
def corpus_fetch(
    name: Annotated[str, typer.Argument(help="Catalogue name (see gpseq corpus list).", show_default=False)],
    dest: Annotated[Optional[Path], typer.Option(help="Directory to put it under (default: $GPSEQ_CORPORA, else ~/.cache/gpseq/corpora).")] = None,
    mirror: Annotated[Optional[Path], typer.Option(help="Copy from this directory (laid out like the catalogue paths) instead of downloading.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace files already present.")] = False,
    verbose: Verbose = False,
) -> None:
    """Fetch a public corpus (sha256 checked where the catalogue knows it)."""
    from gpseq.corpora import fetch_corpus

    if mirror is not None and not mirror.is_dir():
        raise InputFormatError(mirror, None, "no such mirror directory")
    target = dest or _default_corpora_dir()
    folder = fetch_corpus(name, target, mirror=mirror, force=force)
    _stdout().print(f"{name} → {folder}")
    if dest is not None and os.environ.get("GPSEQ_CORPORA") != str(target):
        _stderr().print(f"(set GPSEQ_CORPORA={target} for the benchmarks and tests to find it)")


def main() -> None:
    """Entry point of the `gpseq` console script."""
    app()


if __name__ == "__main__":
    main()
