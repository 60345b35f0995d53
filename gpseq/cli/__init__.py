"""The `gpseq` command: a typer app with one module per command, each thin over the library.

    gpseq train | tag | evaluate | serve | info | corpus list | corpus fetch | version

`common` holds the app, exit codes, error handling and option types; `outputs` the checks and
atomic writes of what commands write; `config` the TaggerConfig a training asks for. A new
command is one module here that decorates a function with `@app.command()` (or
`@corpus_app.command()`), imported below. Installed, `gpseq` is `gpseq.cli:main`; from a checkout
`python -m gpseq` or `python cli.py`.
"""

from gpseq.cli import version, train, tag, evaluate, serve, info, corpus  # noqa: F401  (registration order = help order)
from gpseq.cli.common import EXIT_CODES, app, corpus_app

__all__ = ["EXIT_CODES", "app", "corpus_app", "main"]


def main() -> None:
    """Entry point of the `gpseq` console script."""
    app()
