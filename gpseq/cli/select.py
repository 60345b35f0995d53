"""`gpseq select`: read an unlabelled pool (raw text or any corpus format), rank its sentences with
`Tagger.select` a chunk at a time, write the top N with their scores and the current predictions
for an annotation tool (`gpseq.active.annotation`)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpseq.cli.common import (CHAIN_HELP, EXIT_CODES, AllowPlugin, ModelDir, Verbose, app, command, load_chain,
                              require_file, split_models, stderr)
from gpseq.cli.outputs import check_tag_output, file_or_standard_output, output_format, standard_output
from gpseq.cli.tag import CONLL_SUFFIXES, INPUT_FORMATS, check_text_input, iter_inputs
from gpseq.corpora._atomic import replacing
from gpseq.corpora.text import TEXT_MAX_TOKENS
from gpseq.errors import ConfigError

SELECT_EXAMPLES = """[b]Examples[/b]

  gpseq select runs/chunk pool.txt -n 100 -o picked.conll
  gpseq select runs/chunk pool.txt -n 100 -o picked.jsonl   # JSON Lines (by the suffix)
  gpseq select runs/ner pool.txt -n 50 --format prodigy -o tasks.jsonl
  gpseq select runs/ner pool.txt -n 50 -o tasks.json       # Label Studio (by the suffix)
  gpseq select runs/chunk pool.conll -n 100 --strategy entropy --level sequence --normalise
  gpseq select models/en_pos_conll2000 runs/chunk pool.txt -n 100 -o picked.conll  # a chain

[b]The loop[/b]

  gpseq select runs/r0 pool.txt -n 100 -o round1.conll   # correct the labels
  cat train.conll round1.conll > train1.conll
  gpseq train train1.conll -o runs/r1 --init runs/r0

[b]Strategies[/b] (higher score = more worth annotating)

  entropy           entropy of the calibrated predictive's marginals (its
                    total uncertainty; --level sequence: of the label
                    sequence; default)
  bald              mutual information between the labels and f, from
                    posterior draws (the epistemic part alone)
  least-confidence  1 - P(most probable label sequence)
  margin            1 - (P(best) - P(second best sequence))
  random            a seeded random order

[b]Output formats[/b] (--format; without it, by the suffix of -o: .jsonl
jsonl, .json labelstudio, conll otherwise)

  conll        a -DOCSTART- line with rank, score, strategy and source, then
               the pool's columns with the predicted label appended (trains
               as it is once corrected; a chain: the earlier models' labels
               before it)
  jsonl        gpseq tag's JSONL record plus "select": {rank, score,
               strategy, index}
  prodigy      a Prodigy task stream: text, tokens, spans (with score =
               their probability), meta {score, strategy, rank, source}
  labelstudio  a Label Studio import file (JSON list) with predictions:
               spans pre-filled, each with its probability as "score"

""" + EXIT_CODES


OUTPUT_SUFFIXES = {"conll": CONLL_SUFFIXES, "jsonl": (".jsonl",), "prodigy": (".jsonl",), "labelstudio": (".json",)}


class SelectProgress:
    """A rich progress line fed by `select`'s progress(sentences, tokens) calls."""

    def __init__(self, console):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            TextColumn("[bold]scoring pool"), BarColumn(bar_width=24), TextColumn("{task.completed:,} sentences"),
            TextColumn("{task.fields[tokens]:,} tokens"), TimeElapsedColumn(), console=console, transient=False,
        )
        self.task = None

    def __enter__(self):
        self.bar.__enter__()
        self.task = self.bar.add_task("select", total=None, tokens=0)
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def __call__(self, sentences: int, tokens: int) -> None:
        self.bar.update(self.task, completed=sentences, tokens=tokens)


@app.command(epilog=SELECT_EXAMPLES)
@command
def select(
    model_dir: ModelDir,
    files: Annotated[list[Path], typer.Argument(help=f"{CHAIN_HELP} Then the unlabelled pool files (scored by the "
                                                     "last model); - reads stdin.", show_default=False)],
    n: Annotated[int, typer.Option("-n", "--n", help="How many sentences to pick.", show_default=False)],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Output file (default, or -: standard output).")] = None,
    strategy: Annotated[str, typer.Option(help="entropy, bald, least-confidence, margin or random.")] = "entropy",
    format_: Annotated[Optional[str], typer.Option("--format", help="conll, jsonl, prodigy or labelstudio. Default: by the suffix of -o (.jsonl jsonl, .json labelstudio, .conll/.iob/.tsv… conll), else conll; a --format another suffix names is an error (prodigy is written as .jsonl).", show_default=False)] = None,
    level: Annotated[str, typer.Option(help="bald/entropy over token marginals (token) or label sequences (sequence).")] = "token",
    normalise: Annotated[bool, typer.Option("--normalise", help="Divide scores by the sentence length (per-token geometric mean for path probabilities).")] = False,
    samples: Annotated[Optional[int], typer.Option(help="Posterior draws (bald: default 16; others: Monte Carlo predictive instead of the deterministic one).")] = None,
    max_similarity: Annotated[float, typer.Option(help="Skip a sentence whose token types overlap a picked one by more than this (Jaccard); 1 keeps near-duplicates (exact duplicates never).")] = 0.8,
    candidates: Annotated[int, typer.Option(help="Keep the N x this best-scored sentences to pick from, skipping near-duplicates (raise it when fewer than N are picked).")] = 4,
    seed: Annotated[int, typer.Option(help="Seed of the draws, the random strategy and ties.")] = 0,
    input_format: Annotated[str, typer.Option(help="text, conll, crfpp, conllu, jsonl, spacy or auto (as gpseq tag).")] = "auto",
    token_column: Annotated[int, typer.Option(help="conll input: the token column.")] = 0,
    encoding: Annotated[str, typer.Option(help="Encoding of the pool files.")] = "utf-8",
    text_max_tokens: Annotated[int, typer.Option(help="text input: split longer sentences into pieces of at most this many tokens.")] = TEXT_MAX_TOKENS,
    chunk_size: Annotated[int, typer.Option(help="Sentences read and scored at a time (bounds memory).")] = 2048,
    model_version: Annotated[str, typer.Option(help="labelstudio: the predictions' model_version (default: the model directory's name).")] = "",
    from_name: Annotated[str, typer.Option(help="labelstudio: the Labels control's name in the labeling config.")] = "label",
    to_name: Annotated[str, typer.Option(help="labelstudio: the Text object's name in the labeling config.")] = "text",
    allow_plugin: AllowPlugin = None,
    verbose: Verbose = False,
) -> None:
    """Pick the sentences of an unlabelled pool most worth annotating, with the current predictions."""
    from gpseq.active.annotation import FORMATS, write_selection
    from gpseq.active.selection import LEVELS, STRATEGIES
    from gpseq.corpora import is_chunk_labelling

    if n < 1:
        raise ConfigError(f"-n must be >= 1; got {n}")
    if strategy not in STRATEGIES:
        raise ConfigError(f"--strategy must be one of {', '.join(STRATEGIES)}; got {strategy!r}")
    if format_ is not None and format_ not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}; got {format_!r}")
    format_ = output_format(format_, output, OUTPUT_SUFFIXES, "conll")
    if level not in LEVELS:
        raise ConfigError(f"--level must be token or sequence; got {level!r}")
    if input_format not in INPUT_FORMATS:
        raise ConfigError(f"--input-format must be one of {', '.join(INPUT_FORMATS)}; got {input_format!r}")
    if not 0.0 < max_similarity <= 1.0:
        raise ConfigError(f"--max-similarity must be in (0, 1]; got {max_similarity}")
    if chunk_size < 1 or text_max_tokens < 1 or candidates < 1:
        raise ConfigError("--chunk-size, --text-max-tokens and --candidates must be >= 1")
    output = file_or_standard_output(output)
    model_dirs, files = split_models(model_dir, files)
    for path in files:
        require_file(path)
    for directory in model_dirs:
        check_tag_output(output, files, directory)
    chain = load_chain(model_dirs, allow_plugin)
    check_text_input(chain, files, input_format)
    scheme = chain.config.tag_scheme if is_chunk_labelling(chain.labels, chain.config.tag_scheme) else None
    pool = iter_inputs(files, input_format, token_column, encoding, chain.lang, text_max_tokens)
    started = time.perf_counter()
    err = stderr()
    with SelectProgress(err) as bar:
        picked = chain.select(pool, n, strategy, level=level, normalise=normalise, samples=samples,
                               max_similarity=max_similarity, candidates=candidates, seed=seed, chunk_size=chunk_size,
                               progress=bar)
    scanned = bar.bar.tasks[0].completed if bar.bar.tasks else 0
    with contextlib.ExitStack() as stack:
        if output is None:
            stream = standard_output()
        else:
            target = stack.enter_context(replacing(output))
            stream = stack.enter_context(open(target, "w", encoding="utf-8", newline="\n"))
        # resolved: `gpseq select . pool` names the directory, not "" (Path(".").name); a chain: its last model
        version = model_version or model_dirs[-1].resolve().name
        write_selection(stream, picked, format_, strategy, scheme, model_version=version, from_name=from_name,
                        to_name=to_name)
        stream.flush()
    if format_ == "conll":
        warn_token_column(picked, output)
    elapsed = time.perf_counter() - started
    err.print(f"picked {len(picked)} of {int(scanned):,} sentences by {strategy} in {elapsed:.1f} s"
              + (f" → {output}" if output is not None else ""))


def warn_token_column(picked, output: Optional[Path]) -> None:
    """One stderr line when the picked sentences' tokens are not the first column of the rows written
    (a CoNLL-U pool: column 0 is the word ID; a pool read with --token-column K): the file trains
    with --token-column K, not as it is."""
    for item in picked:
        first = item.sentence.columns[0] if item.sentence.columns else None
        if first and first[0] != item.sentence.tokens[0]:
            column = first.index(item.sentence.tokens[0]) if item.sentence.tokens[0] in first else "?"
            typer.echo(f"warning: {output or '<stdout>'}: the tokens are column {column} of these lines, not the "
                       f"first (e.g. CoNLL-U's FORM after its ID): train on it with --token-column {column}", err=True)
            return
