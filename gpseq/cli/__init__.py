"""The `gpseq` command: a typer app with one module per command, each thin over the library.

    gpseq train | tag | evaluate | serve | info | corpus list | corpus fetch | version

`common` holds the app, exit codes, error handling and option types; `outputs` the checks and
atomic writes of what commands write; `config` the TaggerConfig a training asks for. A new
command is one module here that decorates a function with `@app.command()` (or
`@corpus_app.command()`): every module of the package is imported below, so it registers itself.
Installed, `gpseq` is `gpseq.cli:main`; from a checkout `python -m gpseq` or `python cli.py`.
"""

import importlib
import pkgutil

from gpseq.cli.common import EXIT_CODES, app, corpus_app

# registration order = the order of --help: these first, any other command after them
_HELP_ORDER = ("version", "train", "tag", "evaluate", "serve", "info", "corpus")
for _name in sorted((module.name for module in pkgutil.iter_modules(__path__)),
                    key=lambda name: (_HELP_ORDER.index(name) if name in _HELP_ORDER else len(_HELP_ORDER), name)):
    importlib.import_module(f"{__name__}.{_name}")

__all__ = ["EXIT_CODES", "app", "corpus_app", "main"]


def main() -> None:
    """Entry point of the `gpseq` console script."""
    app()
