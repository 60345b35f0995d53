"""`gpseq info`: what a model directory holds (tagger.json's metadata, array shapes, file sizes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from gpseq.cli.common import EXIT_CODES, AllowPlugin, ModelDir, Verbose, app, command, load_tagger, stdout
from gpseq.saved.meta import json_default, n_parameters, read_model_meta


INFO_EXAMPLES = """[b]Examples[/b]

  gpseq info runs/sample
  gpseq info runs/sample --json > model-info.json

""" + EXIT_CODES


def model_info(model_dir: Path, tagger) -> dict:
    """What `gpseq info` shows: tagger.json's metadata, sizes of the arrays and of the files."""
    meta = read_model_meta(model_dir)
    arrays = meta.get("arrays", {})
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
        "decode": tagger.config.decoder,
        "arrays": arrays,
        "n_parameters": n_parameters(meta),
        "files": files,
        "bytes_on_disk": sum(files.values()),
        "scores": scores,
    }


@app.command(epilog=INFO_EXAMPLES)
@command
def info(
    model_dir: ModelDir,
    json_: Annotated[bool, typer.Option("--json", help="Print everything as JSON.")] = False,
    allow_plugin: AllowPlugin = None,
    verbose: Verbose = False,
) -> None:
    """Describe a model: labels, features, sizes, training configuration, format version, scores."""
    from rich.table import Table

    from gpseq.cli.outputs import standard_output

    standard_output("the report is written there")  # a closed stdout is an error before any work
    tagger = load_tagger(model_dir, allow_plugin)
    data = model_info(model_dir, tagger)
    if json_:
        typer.echo(json.dumps(data, indent=2, default=json_default))
        return
    console = stdout()
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
    calibration = scores.get("calibration")
    if isinstance(calibration, dict) and "variance_scale" in calibration:
        alpha = float(calibration["variance_scale"])
        beta = calibration.get("unseen_scale")
        floor = lambda scale: " (at its floor)" if scale <= 1.5e-5 else ""  # noqa: E731
        unseen = "" if beta is None else f", unseen-feature scale β = {float(beta):.3g}{floor(float(beta))}"
        summary.add_row("calibration", f"variance scale α = {alpha:.3g}{floor(alpha)}{unseen}, temperature T = "
                                       f"{float(calibration.get('temperature', 1.0)):.3f}")
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
