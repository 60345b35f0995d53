"""What every `gpseq` command shares: the typer app, exit codes and error handling, consoles and
logging, option types, and reading a model or a corpus.

User errors (`gpseq.errors`) print one line `error: <message>` on stderr and exit with the
error's code (see EXIT_CODES); `--verbose` adds the traceback.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import traceback
from pathlib import Path
from typing import Annotated

import typer

from gpseq.errors import GpseqError, InputFormatError, OutputError

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
CorpusFormat = Annotated[str, typer.Option(
    "--format", help="Corpus format: conll (columns, -DOCSTART- separators), crfpp (columns), conllu "
                     "(UPOS labels), jsonl (tokens, labels), spacy (a DocBin; labels: --spacy-labels) or "
                     "auto (by suffix: .conllu, .jsonl, .spacy; conll otherwise).")]
SpacyLabels = Annotated[str, typer.Option(
    "--spacy-labels", metavar="tag|pos|ents|spans:KEY",
    help=".spacy corpora: the labels are token.tag_ (tag, the default: what spaCy's tagger trains on), "
         "token.pos_ (pos), doc.ents (ents) or the span group doc.spans[KEY] (spans:KEY), entities and "
         "spans as B-/I-/O labels of the tag scheme. A token without the annotation is unlabelled (?); a "
         "doc without it is an error.")]
ModelDir = Annotated[Path, typer.Argument(help="Model directory written by gpseq train.", show_default=False)]
# the positionals after MODEL_DIR of a command that takes a chain of models (`split_models`)
CHAIN_HELP = ("Model directories that follow MODEL_DIR (each holding tagger.json) chain after it: each model's "
              "labels become the next column of the tokens the later models read.")
AllowPlugin = Annotated[list[str], typer.Option(
    "--allow-plugin", metavar="NAME",
    help="Let a model trained with the plug-in likelihood NAME (package.module:function) load it: loading "
         "a model never imports code it names unless you allow it here or register it (entry-point group "
         "gpseq_likelihoods). Repeatable.")]
state = {"verbose": False}


@app.callback()
def _root(verbose: Verbose = False) -> None:
    """Sequence labelling with sparse structured Gaussian processes: calibrated per-token probabilities."""
    state["verbose"] = verbose


def stderr():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def stdout():
    from rich.console import Console

    return Console(highlight=False)


def configure_logging(verbose: bool) -> None:
    from rich.logging import RichHandler

    logger = logging.getLogger("gpseq")
    if not any(isinstance(h, RichHandler) for h in logger.handlers):
        handler = RichHandler(console=stderr(), show_time=False, show_path=False)
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.INFO if verbose else logging.WARNING)


def tagger_module():
    """`gpseq.tagger`; TensorFlow, when a command comes to need it, is imported quietly unless
    --verbose (`gpseq._tensorflow`)."""
    from gpseq import _tensorflow

    _tensorflow.QUIET = not state["verbose"]
    import gpseq.tagger

    return gpseq.tagger


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the command is so that it unwinds as on Ctrl-C: temporary
    files are removed and outputs left absent or complete."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def terminated_as_interrupt():
    """SIGTERM and SIGHUP raise `Terminated` while the command runs (the previous handlers are put
    back after); outside the main thread, where handlers cannot be set, nothing changes. `gpseq
    serve` installs its own handlers when it starts serving (a graceful shutdown)."""
    import signal

    def terminate(signum, frame):
        raise Terminated(signum)

    previous = {}
    try:
        for signum in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if signum is not None:
                previous[signum] = signal.signal(signum, terminate)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def command(function=None, *, signals: bool = True):
    """Run a command, turning gpseq errors into one stderr line and their exit code; SIGTERM and
    SIGHUP unwind it as Ctrl-C does (`terminated_as_interrupt`) unless `signals=False` (a command
    that handles them itself: `@command(signals=False)`)."""
    if function is None:
        return functools.partial(command, signals=signals)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        verbose = bool(kwargs.get("verbose")) or state["verbose"]
        state["verbose"] = verbose
        configure_logging(verbose)
        try:
            with terminated_as_interrupt() if signals else contextlib.nullcontext():
                return function(*args, **kwargs)
        except typer.Exit:
            raise
        except Terminated as signal_:
            typer.echo("error: terminated by a signal; outputs left as they were", err=True)
            raise typer.Exit(128 + signal_.signum) from None
        except GpseqError as error:
            failure, trace = error, traceback.format_exc()
        except FileNotFoundError as error:  # e.g. an output file in a directory that does not exist
            failure = InputFormatError(error.filename or "?", None, error.strerror or "no such file")
            trace = traceback.format_exc()
        except (PermissionError, IsADirectoryError, NotADirectoryError) as error:  # a path the user gave
            failure = OutputError(error.filename or "?", error.strerror or str(error))
            trace = traceback.format_exc()
        except BrokenPipeError:  # the reader of stdout went away (`gpseq tag … | head`): stop quietly, as
            _stdout_to_devnull()  # Unix tools killed by SIGPIPE do (and no second error at exit's flush)
            raise typer.Exit(141) from None
        except OSError as error:  # e.g. a full disk: still one line naming the file
            failure = GpseqError(f"{error.filename or '?'}: {error.strerror or error}")
            trace = traceback.format_exc()
        except KeyboardInterrupt:
            typer.echo("error: interrupted", err=True)
            raise typer.Exit(130) from None
        if verbose:
            typer.echo(trace, err=True)
        typer.echo(f"error: {failure}", err=True)
        raise typer.Exit(failure.exit_code)

    return wrapper


def _stdout_to_devnull() -> None:
    """Point file descriptor 1 at /dev/null: what is still buffered for a closed pipe goes nowhere."""
    import os
    import sys

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor behind stdout (captured): nothing to redirect
        pass


def require_file(path: Path) -> Path:
    """InputFormatError unless `path` is a file (or `-`, stdin), a named pipe or a device (a shell's
    `<(zcat corpus.gz)`, /dev/stdin: read as a file is, once); it names a directory, a symbolic
    link loop or a missing file as such."""
    from gpseq.corpora.lines import input_path_problem

    if str(path) != "-":
        problem = input_path_problem(path)
        if problem is not None:
            raise InputFormatError(path, None, problem)
    return path


def load_tagger(model_dir: Path, allow_plugins: list[str] | None = None):
    if not model_dir.exists():
        raise InputFormatError(model_dir, None, "no such model directory")
    from gpseq.structured.likelihoods import allowed_likelihoods

    return tagger_module().Tagger.load(model_dir, likelihoods=allowed_likelihoods(allow_plugins))


def split_models(model_dir: Path, paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """(model directories, inputs) of `MODEL_DIR [MODEL_DIR ...] INPUT ...`: the first positional is
    a model; each following one that is a model directory (holds tagger.json) is the next model of
    a chain, up to the first that is not, which starts the inputs. InputFormatError when no input
    follows the models."""
    from gpseq.chain_models import is_model_dir

    models, inputs = [model_dir], list(paths)
    while inputs and is_model_dir(inputs[0]):
        models.append(inputs.pop(0))
    if not inputs:
        raise InputFormatError(models[-1], None, "a model directory, and no input file after it: give the "
                                                 "files to read after the model directories")
    return models, inputs


def load_chain(model_dirs: list[Path], allow_plugins: list[str] | None = None):
    """The `ModelChain` of the model directories in order (one model: a chain of one), each loaded
    by `load_tagger`."""
    from gpseq.chain_models import ModelChain, model_name

    return ModelChain([load_tagger(path, allow_plugins) for path in model_dirs], [model_name(p) for p in model_dirs])


def read_labelled(path: Path, format: str, token_column: int, label_column: int, encoding: str,
                  spacy_labels: str = "tag", tag_scheme: str = "iob2"):
    """The sentences of a labelled corpus file (InputFormatError if it is missing or has none); a
    DocBin's labels are `spacy_labels`, its entities and spans chunk labels of `tag_scheme`."""
    from gpseq.corpora import read_corpus

    require_file(path)
    return read_corpus(path, format, token_column=token_column, label_column=label_column, encoding=encoding,
                       spacy_labels=spacy_labels, tag_scheme=tag_scheme)


def label_field(path: Path, format: str, label_column: int, sentence) -> int | None:
    """The index in `sentence.columns` rows of the field its labels were read from (None for JSON
    Lines, whose labels are not a column)."""
    from gpseq.corpora import detect_format

    resolved = detect_format(path, format, labelled=True)
    if resolved == "conllu":
        return 4 if label_column == 4 else 3
    if resolved in ("conll", "crfpp") and sentence.columns:
        width = len(sentence.columns[0])
        return label_column + width if label_column < 0 else label_column
    return None


def check_label_not_a_feature(features, path: Path, format: str, label_column: int, sentences) -> None:
    """InputFormatError when the corpus's label column is a column the model's features read (e.g.
    the `chunking` preset's POS column 1 in a two-column `token label` file): the features would be
    the gold labels themselves."""
    read = sorted(c for c in features.sources() if isinstance(c, int) and c > 0)
    if not read or not sentences:
        return
    label = label_field(path, format, label_column, sentences[0])
    if label in read:
        raise InputFormatError(
            path, sentences[0].line,
            f"the labels are column {label}, which this model's features (preset {features.preset!r}) read "
            f"as a corpus column (e.g. POS tags): they would see the gold labels; give a file with column(s) "
            f"{read} besides the label column, or features that read words only (--features pos or ner)")
