"""`gpseq tag`: read inputs in any corpus format (raw text by default), `Tagger.tag` a batch at a
time, write CoNLL, JSONL or a spaCy DocBin (`gpseq.predict.writers`)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Annotated, Iterable, Iterator, Optional

import typer

from gpseq.cli.common import (CHAIN_HELP, EXIT_CODES, AllowPlugin, ModelDir, Verbose, app, command, load_chain,
                              require_file, split_models, stderr)
from gpseq.cli.outputs import check_tag_output, file_or_standard_output, output_format, standard_output
from gpseq.corpora import ReadOptions, Sentence, detect_format, iter_corpus
from gpseq.corpora._atomic import replacing
from gpseq.corpora.formats import FORMATS, SUFFIXES
from gpseq.corpora.text import TEXT_MAX_TOKENS
from gpseq.errors import ConfigError
from gpseq.predict.writers import WRITERS


TAG_EXAMPLES = """[b]Examples[/b]

  gpseq tag runs/sample corpora/sample/example.txt
  gpseq tag models/en_pos_conll2000 models/en_chunk_conll2000 notes.txt
  cat notes.txt | gpseq tag runs/sample - --format jsonl --mean
  gpseq tag runs/chunk test.conll --full-distribution -o tagged.conll
  gpseq tag runs/ner docs/*.txt -o tagged.spacy              # a DocBin (by the suffix)
  gpseq tag runs/ner test.spacy -o tagged.jsonl             # DocBin in, JSON Lines out
  gpseq tag runs/chunk test.conll --abstain-below 0.9       # flag what is below 0.9
  gpseq tag runs/chunk test.conll --format jsonl --nbest 5  # the 5 most probable label paths

[b]Chains[/b] (gpseq tag MODEL_DIR MODEL_DIR ... FILE...)

Each model's labels become the next column of the tokens the later models
read (after the input's own columns; on raw text the first model's labels
are column 1), so a chunker whose features read a POS column tags raw text
after a POS tagger. The options apply to the last model, whose labels and
probabilities are written; the earlier models' labels come along (conll:
columns before the label; jsonl and spacy: "chain").

[b]Output formats[/b] (--format; without it, by the suffix of -o: .jsonl
jsonl, .spacy spacy, conll otherwise)

  conll  token, label, p(label) per line (tab-separated), a blank line
         between sentences (a chain: token, the earlier models' labels,
         label, p(label)); --abstain-below adds ABSTAIN or - as the
         field after p(label); --full-distribution appends LABEL=p for
         every label; --nbest K puts "# nbest RANK P LABELS" lines before
         each sentence.
  jsonl  one object per sentence: source, line, tokens, labels,
         confidences, distributions (per token: label -> p),
         sequence_log_prob = log p(label path | tokens), and for chunk
         labels spans \\[type, start, end_exclusive, probability], the
         probability that exactly this span is a chunk of that type
         (constrained forward-backward; --span-probs product: the
         product of its token marginals, an approximation);
         --abstain-below adds abstain (per token) and span_abstain (per
         span); --nbest K adds nbest \\[{labels, probability}]; a chain
         adds chain \\[{model, labels}] of the models before the last.
  spacy  a DocBin (-o required): doc.user_data["gpseq"] holds labels and
         confidences (and abstain flags, nbest), chunk spans go to
         doc.spans["gpseq"] (probabilities in attrs["scores"], flags in
         attrs["abstain"]) and doc.ents, other labels to token.tag_;
         for a chunk model that reads a POS column (column 1),
         token.tag_ holds it (the input's; in a chain on raw text, the
         first model's labels), so gpseq evaluate MODEL out.spacy
         --spacy-labels ents reads the file back as tagged.

--abstain-below P never changes a label: it marks the tokens whose
p(label) and the spans whose probability is below P. Pick P for a target
error rate on a dev set with gpseq evaluate --target-error.

""" + EXIT_CODES

INPUT_FORMATS = ("auto", *FORMATS)  # every format of the corpus registry
CONLL_SUFFIXES = tuple(suffix for suffix, format in SUFFIXES.items() if format == "conll")
OUTPUT_SUFFIXES = {"conll": CONLL_SUFFIXES, "jsonl": (".jsonl",), "spacy": (".spacy",)}


def iter_inputs(files: list[Path], input_format: str, token_column: int, encoding: str, lang: str,
                text_max_tokens: int = TEXT_MAX_TOKENS) -> Iterator[Sentence]:
    """The unlabelled sentences of every input file in turn (`-`: stdin); one spaCy pipeline for all raw text."""
    options = ReadOptions(token_column=token_column, labelled=False, encoding=encoding, lang=lang,
                          text_max_tokens=text_max_tokens)
    for path in files:
        require_file(path)
        yield from iter_corpus(path, input_format, options=options)


def batches(sentences: Iterable[Sentence], size: int) -> Iterator[list[Sentence]]:
    batch: list[Sentence] = []
    for sentence in sentences:
        batch.append(sentence)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def check_text_input(chain, files: list[Path], input_format: str) -> None:
    """Raw text has only tokens: refuse it up front for a model (of a `ModelChain`) whose features
    read corpus columns that neither the text nor the models before it give."""
    problem = chain.text_problem()
    text = [path for path in files if detect_format(path, input_format, labelled=False) == "text"]
    if problem and text:
        raise ConfigError(f"{text[0]}: {problem}")


@app.command(epilog=TAG_EXAMPLES)
@command
def tag(
    model_dir: ModelDir,
    files: Annotated[list[Path], typer.Argument(help=f"{CHAIN_HELP} Then the input files (the last model's labels are written); - reads stdin.", show_default=False)],
    input_format: Annotated[str, typer.Option(help="text (spaCy tokenisation + sentencizer), conll (token column, blank line between sentences), crfpp (columns, no -DOCSTART-), conllu, jsonl, spacy (a DocBin), or auto (conllu for .conllu, jsonl for .jsonl, spacy for .spacy, conll for .conll/.iob/.data/.tsv…, text otherwise).")] = "auto",
    format_: Annotated[Optional[str], typer.Option("--format", help="Output: conll, jsonl or spacy (DocBin; needs -o). Default: by the suffix of -o (.jsonl, .spacy; .conll/.iob/.tsv… conll), else conll; a --format another suffix names is an error.", show_default=False)] = None,
    full_distribution: Annotated[bool, typer.Option("--full-distribution", help="conll/spacy: add every label's probability per token.")] = False,
    samples: Annotated[Optional[int], typer.Option(help="Monte Carlo marginals over S draws of f (default: the model's predictive, deterministic unless it says mc).")] = None,
    mean: Annotated[bool, typer.Option("--mean", help="The deterministic calibrated marginals (probit-scaled potentials, one forward-backward), whatever the model's default.")] = False,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Output file (default, or -: standard output).")] = None,
    batch_size: Annotated[int, typer.Option(help="Sentences read, tagged and written at a time (bounds memory).")] = 256,
    token_column: Annotated[int, typer.Option(help="conll input: the token column.")] = 0,
    encoding: Annotated[str, typer.Option(help="Encoding of the input files.")] = "utf-8",
    text_max_tokens: Annotated[int, typer.Option(help="text input: split a sentence longer than this many tokens (e.g. text without sentence punctuation) into pieces of at most this many, at whitespace.")] = TEXT_MAX_TOKENS,
    abstain_below: Annotated[Optional[float], typer.Option(help="Mark (ABSTAIN) tokens and spans whose probability is below P; labels are never changed.", metavar="P")] = None,
    nbest: Annotated[int, typer.Option(help="Also write the K most probable label sequences with their probabilities.", metavar="K")] = 0,
    span_probs: Annotated[str, typer.Option(help="Span probabilities: exact (P(this exact span), constrained forward-backward) or product (of the token marginals; an approximation).")] = "exact",
    decode: Annotated[Optional[str], typer.Option(help="viterbi, max-marginal or span-f1 (the chunks maximising the expected chunk F1 from the span probabilities); default: the model's.")] = None,
    allow_plugin: AllowPlugin = None,
    verbose: Verbose = False,
) -> None:
    """Tag raw text or corpus files (CoNLL, CoNLL-U, JSON Lines, spaCy DocBin): labels with per-token probabilities."""
    from gpseq.corpora import is_chunk_labelling

    if input_format not in INPUT_FORMATS:
        raise ConfigError(f"--input-format must be {', '.join(INPUT_FORMATS[:-1])} or {INPUT_FORMATS[-1]}; "
                          f"got {input_format!r}")
    if format_ is not None and format_ not in WRITERS:
        raise ConfigError(f"--format must be conll, jsonl or spacy; got {format_!r}")
    format_ = output_format(format_, output, OUTPUT_SUFFIXES, "conll")
    if format_ == "spacy" and output is not None and str(output) == "-":
        raise ConfigError("--format spacy writes a binary DocBin, not to standard output: give -o FILE, not -")
    if format_ == "spacy" and output is None:
        raise ConfigError("--format spacy writes a binary DocBin: give -o FILE")
    output = file_or_standard_output(output)
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1; got {batch_size}")
    from gpseq.config import MAX_NBEST, MAX_SAMPLES

    if samples is not None and not 1 <= samples <= MAX_SAMPLES:
        raise ConfigError(f"--samples must be in [1, {MAX_SAMPLES:,}] (Monte Carlo draws; memory grows with "
                          f"them); got {samples:,}")
    if text_max_tokens < 1:
        raise ConfigError(f"--text-max-tokens must be >= 1; got {text_max_tokens}")
    if abstain_below is not None and not 0.0 <= abstain_below <= 1.0:
        raise ConfigError(f"--abstain-below must be a probability in [0, 1]; got {abstain_below}")
    if not 0 <= nbest <= MAX_NBEST:
        raise ConfigError(f"--nbest must be in [0, {MAX_NBEST}] (label sequences per sentence); got {nbest:,}")
    if span_probs not in ("exact", "product"):
        raise ConfigError(f"--span-probs must be exact or product; got {span_probs!r}")
    if decode is not None and decode not in ("viterbi", "max-marginal", "span-f1"):
        raise ConfigError(f"--decode must be viterbi, max-marginal or span-f1; got {decode!r}")
    model_dirs, files = split_models(model_dir, files)
    for path in files:
        require_file(path)
    for directory in model_dirs:
        check_tag_output(output, files, directory)
    chain = load_chain(model_dirs, allow_plugin)
    lang = chain.lang
    check_text_input(chain, files, input_format)
    scheme = chain.config.tag_scheme if is_chunk_labelling(chain.labels, chain.config.tag_scheme) else None

    n_sentences = n_tokens = 0
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        target = None if output is None else stack.enter_context(replacing(output))
        if format_ == "spacy":
            # column 1 (POS) back into token.tag_ where the model read it: the DocBin is then its input again
            writer = WRITERS[format_](target, lang, full_distribution, tag_column=1 if 1 in chain.reads[-1] else None)
        else:
            if target is None:
                stream = standard_output()
            else:
                stream = stack.enter_context(open(target, "w", encoding="utf-8", newline="\n"))
            writer = WRITERS[format_](stream, full_distribution)
        sentences = iter_inputs(files, input_format, token_column, encoding, lang, text_max_tokens)
        for batch in batches(sentences, batch_size):
            results = chain.tag(batch, samples=samples, mean=mean or None, batch_size=batch_size,
                                 spans=span_probs, nbest=nbest, abstain_below=abstain_below, decode=decode)
            for sentence, result in zip(batch, results):
                writer.write(sentence, result, scheme)
                n_tokens += len(result.tokens)
            n_sentences += len(batch)
        writer.close()
    if output is not None:
        elapsed = time.perf_counter() - started
        stderr().print(f"tagged {n_sentences:,} sentences, {n_tokens:,} tokens in {elapsed:.1f} s → {output}")
