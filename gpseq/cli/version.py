"""`gpseq version`."""

import typer

import gpseq
from gpseq.cli.common import app


@app.command()
def version() -> None:
    """Print the gpseq version."""
    typer.echo(gpseq.__version__)
