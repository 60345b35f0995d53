"""`gpseq corpus list | fetch`: the catalogue of public corpora (`gpseq.corpora.catalogue`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpseq.cli.common import EXIT_CODES, Verbose, command, corpus_app, stderr, stdout
from gpseq.errors import InputFormatError


CORPUS_EXAMPLES = """[b]Examples[/b]

  gpseq corpus list
  gpseq corpus fetch conll2000 --dest ~/corpora
  gpseq corpus fetch conll2000 --mirror ../shared/corpora --dest /tmp/c

""" + EXIT_CODES


@corpus_app.command("list", epilog=CORPUS_EXAMPLES)
@command
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
    stdout().print(table)


def default_corpora_dir() -> Path:
    env = os.environ.get("GPSEQ_CORPORA")
    return Path(env) if env else Path.home() / ".cache" / "gpseq" / "corpora"


@corpus_app.command("fetch", epilog=CORPUS_EXAMPLES)
@command
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
    target = dest or default_corpora_dir()
    folder = fetch_corpus(name, target, mirror=mirror, force=force)
    stdout().print(f"{name} → {folder}")
    if dest is not None and os.environ.get("GPSEQ_CORPORA") != str(target):
        stderr().print(f"(set GPSEQ_CORPORA={target} for the benchmarks and tests to find it)")
