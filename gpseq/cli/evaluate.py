"""`gpseq evaluate`: `Tagger.evaluate` on a labelled corpus, the metrics as tables or JSON, the
reliability diagrams (tokens, entities) and the risk–coverage plot, the abstention threshold for a
target error."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpseq.cli.common import (EXIT_CODES, AllowPlugin, CorpusFormat, ModelDir, SpacyLabels, Verbose, app,
                              check_label_not_a_feature, command, load_tagger, read_labelled, require_file, stdout)
from gpseq.cli.outputs import check_plot_outputs
from gpseq.saved.meta import json_default


EVALUATE_EXAMPLES = """[b]Examples[/b]

  gpseq evaluate runs/sample corpora/sample/test.conll
  gpseq evaluate runs/chunk test.txt --json --plot reliability.png
  gpseq evaluate runs/chunk test.txt --samples 32   # Monte Carlo marginals
  gpseq evaluate runs/chunk dev.txt --target-error 0.01   # the P for tag --abstain-below
  gpseq evaluate runs/ner test.spacy --spacy-labels ents

--plot FILE.png writes the token reliability diagram there and, for chunk
labels, FILE-entities.png (predicted spans: P(exact span) against how often
it matches a gold span) and FILE-risk-coverage.png (error rate of what is
kept against the fraction kept, tokens and spans).

""" + EXIT_CODES


def metrics_tables(metrics: dict):
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


def _check_plot_target(path: Path) -> None:
    """OutputError when a `--plot` path names (itself or through a symlink) a device or a pipe: the
    plots are PNG files (`gpseq.corpora._atomic.replacing` would write into it directly)."""
    from gpseq.errors import OutputError

    if os.path.exists(path) and not os.path.isfile(path):  # both follow a symlink
        raise OutputError(path, "is not a regular file (a device or a pipe); --plot writes a PNG file there")


@app.command(epilog=EVALUATE_EXAMPLES)
@command
def evaluate(
    model_dir: ModelDir,
    corpus: Annotated[Path, typer.Argument(help="Labelled corpus (any --format: CoNLL columns, CoNLL-U, JSON Lines, a spaCy DocBin).", show_default=False)],
    json_: Annotated[bool, typer.Option("--json", help="Print the metrics as JSON.")] = False,
    plot: Annotated[Optional[Path], typer.Option(help="Write the reliability diagram to this PNG.")] = None,
    samples: Annotated[Optional[int], typer.Option(help="Monte Carlo marginals over S draws of f (default: the model's predictive).")] = None,
    mean: Annotated[bool, typer.Option("--mean", help="The deterministic calibrated marginals, whatever the model's default.")] = False,
    bins: Annotated[int, typer.Option(help="Equal-width confidence bins for ECE and the reliability diagram.")] = 15,
    token_column: Annotated[int, typer.Option(help="Token column of the corpus.")] = 0,
    label_column: Annotated[int, typer.Option(help="Label column of the corpus (default: the last).")] = -1,
    encoding: Annotated[str, typer.Option(help="Encoding of the corpus.")] = "utf-8",
    format_: CorpusFormat = "auto",
    spacy_labels: SpacyLabels = "tag",
    target_error: Annotated[Optional[float], typer.Option(help="Report the abstention threshold P (for gpseq tag --abstain-below P) with the largest coverage whose kept tokens, and separately spans, err at most this often on this corpus (use a dev set).", metavar="E")] = None,
    decode: Annotated[Optional[str], typer.Option(help="viterbi, max-marginal or span-f1 (default: the model's).")] = None,
    allow_plugin: AllowPlugin = None,
    verbose: Verbose = False,
) -> None:
    """Evaluate a model on a labelled corpus: token error, chunk P/R/F1, NLL, ECE, Brier, entity-level
    calibration, risk-coverage; reliability diagrams. Sentences with tokens labelled ? (unlabelled)
    are left out and counted."""
    from gpseq.errors import ConfigError, InputFormatError

    from gpseq.config import MAX_SAMPLES
    from gpseq.corpora import detect_format
    from gpseq.corpora.docbin import parse_label_source

    parse_label_source(spacy_labels)
    if not 1 <= bins <= 10_000:
        raise ConfigError(f"--bins must be in [1, 10,000]; got {bins:,}")
    if samples is not None and not 1 <= samples <= MAX_SAMPLES:
        raise ConfigError(f"--samples must be in [1, {MAX_SAMPLES:,}] (Monte Carlo draws; memory grows with "
                          f"them); got {samples:,}")
    if target_error is not None and not 0.0 <= target_error < 1.0:
        raise ConfigError(f"--target-error must be in [0, 1); got {target_error}")
    if decode is not None and decode not in ("viterbi", "max-marginal", "span-f1"):
        raise ConfigError(f"--decode must be viterbi, max-marginal or span-f1; got {decode!r}")
    plot_paths = [] if plot is None else [plot, *(plot.with_name(f"{plot.stem}-{what}{plot.suffix or '.png'}")
                                                 for what in ("entities", "risk-coverage"))]
    check_plot_outputs(plot_paths, [corpus], model_dir)
    for path in plot_paths:
        _check_plot_target(path)
    from gpseq.cli.outputs import standard_output

    standard_output("the report is written there")  # a closed stdout is an error before any work
    require_file(corpus)
    tagger = None
    if detect_format(corpus, format_) == "spacy":  # its entities and spans become labels of the model's scheme
        tagger = load_tagger(model_dir, allow_plugin)
    sentences = read_labelled(corpus, format_, token_column, label_column, encoding, spacy_labels,
                              tagger.config.tag_scheme if tagger is not None else "iob2")
    if not any(sentence.fully_labelled for sentence in sentences):
        raise InputFormatError(corpus, None, "every sentence has tokens labelled ? (unlabelled): no gold path to "
                                             "evaluate against")
    tagger = tagger or load_tagger(model_dir, allow_plugin)
    check_label_not_a_feature(tagger.featurizer.config, corpus, format_, label_column, sentences)
    report = tagger.evaluate(sentences, samples=samples, mean=mean or None, n_bins=bins, decode=decode,
                             target_error=target_error)
    plots = []
    if plot is not None:
        plots.append(("reliability diagram", report.reliability_diagram(plot, bins)))
        if report.entity_calibration:
            plots.append(("entity reliability diagram", report.entity_reliability_diagram(plot_paths[1], bins)))
        if report.curves:
            plots.append(("risk-coverage plot", report.risk_coverage_plot(plot_paths[2])))
    metrics = report.to_dict()
    if report.n_skipped_sentences:
        typer.echo(f"note: {corpus}: {report.n_skipped_sentences} sentence(s) ({report.n_skipped_tokens} tokens) "
                   "with tokens labelled ? (unlabelled) left out of the evaluation", err=True)
    if json_:
        typer.echo(json.dumps(metrics, indent=2, default=json_default))
        return
    console = stdout()
    for table in metrics_tables(metrics):
        console.print(table)
    for what, path in plots:
        console.print(f"{what} → {path}")
    if target_error is not None:
        for unit, prefix in (("tokens", "abstain_"), ("spans", "entity_abstain_")):
            threshold = metrics.get(f"{prefix}threshold")
            if f"{prefix}coverage" not in metrics:
                continue
            if threshold is None:
                console.print(f"target error {target_error}: no threshold reaches it for {unit}")
            else:
                # the threshold to the last bit (repr): passed back, it keeps exactly the tokens measured
                console.print(f"target error {target_error}: --abstain-below {float(threshold)!r} keeps "
                              f"{100 * metrics[f'{prefix}coverage']:.1f} % of the {unit} at error "
                              f"{metrics[f'{prefix}error']:.4f} on this corpus")
