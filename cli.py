"""The typer app behind the `gpseq` command (thin over the library: every command maps to library calls).

Run from a checkout as `python cli.py --help`; installed, it is the `gpseq` console command
(shipped as `gpseq/_cli.py`, a symlink to this file).
"""

from __future__ import annotations

import typer

import gpseq

app = typer.Typer(
    name="gpseq",
    help="Sequence labelling with sparse structured Gaussian processes.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def version() -> None:
    """Print the gpseq version."""
    typer.echo(gpseq.__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
