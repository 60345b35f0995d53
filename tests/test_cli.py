"""The `gpseq` command line, in-process (typer's CliRunner) and as a subprocess.

One tiny model is trained once per module on the bundled sample corpus and reused. Outputs are
checked against independent computations: the library's `Tagger` called directly, seqeval's
span extraction, a hand count of token accuracy, file sizes read from disk, spaCy's DocBin reader.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import cli  # noqa: E402  (the top-level typer app, as `python cli.py` runs it)
from gpseq.cli.config import ConfigOptions, apply_override, build_config  # noqa: E402

SAMPLE = ROOT / "corpora" / "sample"
# A tiny, fast configuration: lexical features only (raw text has no POS column), few steps.
TRAIN_OPTIONS = [
    "--features", "ner", "--inducing", "8", "--max-steps", "8", "--seed", "3",
    "--set", "training.batch_size=32", "--set", "predict_samples=4", "--set", "training.eval_every=8",
]
TEXT = "The committee approved the new budget on Tuesday. It will fund three small projects.\n\nA second paragraph follows here."

runner = CliRunner()


def invoke(*args, input=None):
    return runner.invoke(cli.app, [str(a) for a in args], input=input, catch_exceptions=False)


def parse_conll_output(text: str) -> list[list[list[str]]]:
    """Sentences of rows of tab-separated fields."""
    sentences, current = [], []
    for line in text.splitlines():
        if line.strip():
            current.append(line.split("\t"))
        elif current:
            sentences.append(current)
            current = []
    if current:
        sentences.append(current)
    return sentences


def read_first_columns(path: Path) -> list[list[str]]:
    """Token column of a CoNLL file, read by hand (independent of gpseq.corpora)."""
    sentences, current = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            if current:
                sentences.append(current)
            current = []
        else:
            current.append(fields)
    if current:
        sentences.append(current)
    return sentences


@pytest.fixture(scope="module")
def sample() -> Path:
    if not (SAMPLE / "train.conll").is_file():
        pytest.skip("the bundled sample corpus (corpora/sample/train.conll) is not there yet")
    return SAMPLE


@pytest.fixture(scope="module")
def trained(sample, tmp_path_factory):
    """(model_dir, train CLI result): trained once for the whole module."""
    base = tmp_path_factory.mktemp("cli")
    model_dir = base / "model"
    result = invoke("train", sample / "train.conll", "-o", model_dir, "--dev", sample / "dev.conll", *TRAIN_OPTIONS)
    assert result.exit_code == 0, result.output + result.stderr
    return model_dir, result


@pytest.fixture(scope="module")
def library_tagger(trained):
    from gpseq.tagger import Tagger

    return Tagger.load(trained[0])


@pytest.fixture()
def text_file(tmp_path) -> Path:
    path = tmp_path / "input.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def spacy_sentences(text: str) -> list[list[str]]:
    import spacy

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    out = []
    for paragraph in text.split("\n\n"):
        for sent in nlp(paragraph).sents:
            tokens = [t.text for t in sent if not t.is_space]
            if tokens:
                out.append(tokens)
    return out


# ---------------------------------------------------------------------------------------------
# train
# ---------------------------------------------------------------------------------------------


def test_train_writes_model_with_the_requested_configuration(trained):
    model_dir, result = trained
    meta = json.loads((model_dir / "tagger.json").read_text())
    config = meta["config"]
    assert config["features"]["preset"] == "ner"
    assert config["model"]["num_inducing"] == 8
    assert config["training"]["max_steps"] == 8
    assert config["training"]["seed"] == 3
    assert config["training"]["batch_size"] == 32  # from --set
    assert config["predict_samples"] == 4  # from --set, a top-level key
    assert meta["scores"]["steps"] == 8
    assert (model_dir.with_name(model_dir.name + ".ckpt") / "checkpoint").is_dir()
    assert re.search(r"\bsteps\s+│\s+8\b", result.output), result.output  # the summary table
    gold = {row[-1] for sentence in read_first_columns(SAMPLE / "train.conll") for row in sentence}
    assert set(meta["labels"]) <= gold


@pytest.mark.slow
def test_train_resume_repeats_the_uninterrupted_run(sample, tmp_path):
    """4 steps, then --resume to 8, gives the parameters of 8 uninterrupted steps (no dev set, so
    no best-so-far restore can differ between the two)."""

    def train(model_dir, steps, *extra):
        options = list(TRAIN_OPTIONS)
        options[options.index("--max-steps") + 1] = str(steps)
        result = invoke("train", sample / "train.conll", "-o", model_dir, *options,
                        "--set", "training.dev_fraction=0", *extra)
        assert result.exit_code == 0, result.stderr
        return result

    ckpt = tmp_path / "ckpt"
    train(tmp_path / "resumed", 4, "--checkpoint-dir", ckpt)
    assert json.loads((ckpt / "checkpoint" / "state.json").read_text())["step"] == 4
    second = train(tmp_path / "resumed", 8, "--checkpoint-dir", ckpt, "--resume")
    assert re.search(r"\b8/8\b", second.stderr)  # the progress bar ends at 8 of 8 steps
    train(tmp_path / "straight", 8)
    assert json.loads((tmp_path / "resumed" / "tagger.json").read_text())["scores"]["steps"] == 8
    with np.load(tmp_path / "resumed" / "arrays.npz") as a, np.load(tmp_path / "straight" / "arrays.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for name in a.files:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-4, atol=1e-5, err_msg=name)  # float32 sums


def test_set_parses_json_values_and_rejects_unknown_keys():
    data = {"model": {"prior_variance": 1.0, "kernel": "linear"}, "training": {"max_steps": None}}
    apply_override(data, "model.prior_variance=2.5")
    apply_override(data, "model.kernel=linear+rbf")
    apply_override(data, "training.max_steps=null")
    assert data == {"model": {"prior_variance": 2.5, "kernel": "linear+rbf"}, "training": {"max_steps": None}}
    from gpseq.errors import ConfigError

    with pytest.raises(ConfigError, match="no key 'prior_varianc'"):
        apply_override(data, "model.prior_varianc=2")
    with pytest.raises(ConfigError, match="KEY.PATH=VALUE"):
        apply_override(data, "model.prior_variance")


def test_config_precedence_defaults_file_options_set(tmp_path):
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps({"model": {"num_inducing": 5, "likelihood": "exact"},
                                       "training": {"epochs": 2, "seed": 11}}))
    config = build_config(ConfigOptions(config_file=config_file, features="pos", tag_scheme="bioes",
                                        named={"--likelihood": "pseudo", "--max-steps": 7},
                                        overrides=["training.epochs=3", "model.prior_variance=2.5"]))
    assert config.model.num_inducing == 5  # file
    assert config.training.seed == 11  # file
    assert config.model.likelihood == "pseudo"  # option over file
    assert config.features.preset == "pos"
    assert config.training.max_steps == 7
    assert config.tag_scheme == "bioes"
    assert config.training.epochs == 3  # --set over file
    assert config.model.prior_variance == 2.5
    from gpseq.tagger import TaggerConfig

    assert config.training.batch_size == TaggerConfig().training.batch_size  # untouched default


def test_inducing_points_bring_the_rbf_gp_in_the_library_as_with_inducing():
    """The model rule lives in ModelConfig, not in the command: inducing points asked for with the
    default kernel are the linear + sparse RBF GP (trained by SVI), from Python as from --inducing;
    a kernel given explicitly is kept, and a saved configuration reads back as it was."""
    from gpseq.config import TaggerConfig, make_config
    from gpseq.structured.config import ModelConfig

    assert (ModelConfig().kernel, ModelConfig().num_inducing) == ("linear", 64)
    model = ModelConfig(num_inducing=128)
    assert (model.kernel, model.num_inducing, model.has_inducing) == ("linear+rbf", 128, True)
    assert TaggerConfig(model=model).resolved_method() == "svi"
    assert TaggerConfig.from_dict({"model": {"num_inducing": 128}}).model.kernel == "linear+rbf"
    assert ModelConfig(kernel="linear", num_inducing=128).kernel == "linear"  # the user's kernel
    assert ModelConfig(kernel="paper-rbf").num_inducing == 64
    assert ModelConfig(kernel="linear").with_inducing(8) == ModelConfig(kernel="linear+rbf", num_inducing=8)
    assert ModelConfig(kernel="paper-rbf").with_inducing(8).kernel == "paper-rbf"
    saved = TaggerConfig().to_dict()  # a saved model's: kernel "linear" and num_inducing 64, both given
    assert TaggerConfig.from_dict(saved).model == ModelConfig()
    assert build_config(ConfigOptions(named={"--inducing": 16})).model == ModelConfig(num_inducing=16)
    assert make_config(settings={"model.num_inducing": 16}).model == ModelConfig(num_inducing=16)
    explicit = build_config(ConfigOptions(named={"--inducing": 16}, overrides=["model.kernel=linear"]))
    assert explicit.model.kernel == "linear"  # --set after --inducing
    assert build_config(ConfigOptions(overrides=["model.num_inducing=16"])).model.kernel == "linear"  # --set: as given


def test_invalid_config_json_names_file_and_line(tmp_path):
    train = tmp_path / "t.conll"
    train.write_text("The DT B-NP\n\n", encoding="utf-8")
    config_file = tmp_path / "config.json"
    config_file.write_text('{\n  "model": {"num_inducing": 5,}\n}\n')
    result = invoke("train", train, "-o", tmp_path / "m", "--config", config_file)
    assert result.exit_code == 2
    assert f"{config_file}:2:" in one_line(result)


# ---------------------------------------------------------------------------------------------
# tag
# ---------------------------------------------------------------------------------------------


def test_tag_raw_text_conll_matches_the_library(trained, library_tagger, text_file):
    model_dir, _ = trained
    result = invoke("tag", model_dir, text_file, "--mean")
    assert result.exit_code == 0, result.stderr
    sentences = parse_conll_output(result.stdout)
    expected_tokens = spacy_sentences(TEXT)
    assert [[row[0] for row in s] for s in sentences] == expected_tokens
    direct = library_tagger.tag(expected_tokens, mean=True)
    for rows, tagged in zip(sentences, direct):
        assert [row[1] for row in rows] == tagged.labels
        np.testing.assert_allclose([float(row[2]) for row in rows], tagged.confidences, rtol=1e-5, atol=1e-6)


def test_tag_full_distribution_rows_sum_to_one(trained, library_tagger, text_file):
    model_dir, _ = trained
    result = invoke("tag", model_dir, text_file, "--mean", "--full-distribution")
    assert result.exit_code == 0, result.stderr
    labels = library_tagger.labels
    for sentence in parse_conll_output(result.stdout):
        for row in sentence:
            assert len(row) == 3 + len(labels)
            distribution = dict(field.rsplit("=", 1) for field in row[3:])
            assert list(distribution) == labels
            probabilities = {k: float(v) for k, v in distribution.items()}
            assert math.isclose(sum(probabilities.values()), 1.0, abs_tol=1e-4)
            assert math.isclose(probabilities[row[1]], float(row[2]), rel_tol=1e-5)


def test_tag_conll_input_jsonl_spans_agree_with_seqeval(trained, library_tagger, sample):
    from seqeval.metrics.sequence_labeling import get_entities

    model_dir, _ = trained
    result = invoke("tag", model_dir, sample / "test.conll", "--input-format", "conll", "--format", "jsonl", "--mean")
    assert result.exit_code == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    gold = read_first_columns(sample / "test.conll")
    assert [r["tokens"] for r in records] == [[row[0] for row in s] for s in gold]
    chunky = all(label == "O" or label[:2] in ("B-", "I-") for label in library_tagger.labels)
    # the library on the same sentences, with their extra columns (features may read them)
    from gpseq.corpora.types import Sentence

    direct = library_tagger.tag([Sentence([row[0] for row in s], columns=s) for s in gold], mean=True)
    for record, tagged, rows in zip(records, direct, gold):
        assert record["labels"] == tagged.labels
        assert record["source"] == str(sample / "test.conll")
        assert record["sequence_log_prob"] == pytest.approx(tagged.sequence_log_prob, rel=1e-5, abs=1e-5)
        assert record["sequence_log_prob"] <= 1e-6
        for t, distribution in enumerate(record["distributions"]):
            assert sum(distribution.values()) == pytest.approx(1.0, abs=1e-4)
            assert distribution[record["labels"][t]] == pytest.approx(record["confidences"][t], abs=2e-6)
        if chunky:
            expected = [(kind, start, end + 1) for kind, start, end in get_entities(record["labels"])]
            assert [(k, s, e) for k, s, e, _ in record["spans"]] == expected
            assert [p for *_, p in record["spans"]] == pytest.approx([p for *_, p in tagged.spans], abs=2e-6)
            assert record["span_probability"] == "exact" or not record["spans"]
    if chunky:
        assert any(r["spans"] for r in records)
        product = invoke("tag", model_dir, sample / "test.conll", "--input-format", "conll", "--format", "jsonl",
                         "--mean", "--span-probs", "product")
        for line in product.stdout.splitlines():
            record = json.loads(line)
            for _, start, end, probability in record["spans"]:
                assert probability == pytest.approx(np.prod(record["confidences"][start:end]), rel=1e-4, abs=1e-6)


def test_tag_stdin_and_batch_size_do_not_change_the_output(trained, text_file):
    model_dir, _ = trained
    from_file = invoke("tag", model_dir, text_file, "--mean", "--format", "jsonl", "--batch-size", "256")
    from_stdin = invoke("tag", model_dir, "-", "--mean", "--format", "jsonl", "--batch-size", "1", input=TEXT)
    assert from_file.exit_code == 0 and from_stdin.exit_code == 0, from_stdin.stderr
    strip = lambda out: [{k: v for k, v in json.loads(l).items() if k != "source"} for l in out.splitlines()]  # noqa: E731
    a, b = strip(from_file.stdout), strip(from_stdin.stdout)
    assert len(a) == len(spacy_sentences(TEXT))
    assert [r["labels"] for r in a] == [r["labels"] for r in b]
    assert [r["line"] for r in a] == [1, 1, 3]
    for x, y in zip(a, b):
        np.testing.assert_allclose(x["confidences"], y["confidences"], rtol=1e-5, atol=1e-6)


def test_tag_sampled_marginals_are_distributions(trained, text_file):
    model_dir, _ = trained
    result = invoke("tag", model_dir, text_file, "--samples", "3", "--format", "jsonl")
    assert result.exit_code == 0, result.stderr
    for line in result.stdout.splitlines():
        record = json.loads(line)
        for distribution in record["distributions"]:
            assert sum(distribution.values()) == pytest.approx(1.0, abs=1e-4)
            assert all(0.0 <= p <= 1.0 for p in distribution.values())


def test_tag_spacy_docbin(trained, library_tagger, text_file, tmp_path):
    import spacy
    from spacy.tokens import DocBin

    model_dir, _ = trained
    out = tmp_path / "tagged.spacy"
    result = invoke("tag", model_dir, text_file, "--mean", "--format", "spacy", "-o", out)
    assert result.exit_code == 0, result.stderr
    docs = list(DocBin().from_disk(out).get_docs(spacy.blank("en").vocab))
    expected = spacy_sentences(TEXT)
    assert [[t.text for t in doc] for doc in docs] == expected
    assert docs[0].text == "The committee approved the new budget on Tuesday."
    direct = library_tagger.tag(expected, mean=True)
    for doc, tagged in zip(docs, direct):
        assert list(doc.user_data["gpseq"]["labels"]) == tagged.labels
        if "gpseq" in doc.spans:
            from seqeval.metrics.sequence_labeling import get_entities

            got = [(span.label_ if span.label_ != "CHUNK" else "", span.start, span.end) for span in doc.spans["gpseq"]]
            assert got == [(k, s, e + 1) for k, s, e in get_entities(tagged.labels)]
            assert len(doc.spans["gpseq"].attrs["scores"]) == len(got)
        else:
            assert [t.tag_ for t in doc] == tagged.labels


def test_tag_abstain_below_flags_in_every_format_and_never_changes_a_label(trained, sample, tmp_path):
    """--abstain-below P: ABSTAIN exactly where p(label) < P (spans: P(span) < P), labels as without it."""
    import spacy
    from spacy.tokens import DocBin

    model_dir, _ = trained
    test = sample / "test.conll"
    plain = parse_conll_output(invoke("tag", model_dir, test, "--input-format", "conll").stdout)
    conll = invoke("tag", model_dir, test, "--input-format", "conll", "--abstain-below", "0.97")
    assert conll.exit_code == 0, conll.stderr
    flagged = parse_conll_output(conll.stdout)
    assert [[row[:3] for row in s] for s in flagged] == plain
    rows = [row for s in flagged for row in s]
    assert {row[3] for row in rows} <= {"ABSTAIN", "-"}
    assert all((row[3] == "ABSTAIN") == (float(row[2]) < 0.97) for row in rows)
    assert any(row[3] == "ABSTAIN" for row in rows) and any(row[3] == "-" for row in rows)
    jsonl = invoke("tag", model_dir, test, "--input-format", "conll", "--format", "jsonl", "--abstain-below", "0.97")
    records = [json.loads(line) for line in jsonl.stdout.splitlines()]
    assert [r["labels"] for r in records] == [[row[1] for row in s] for s in plain]
    for record in records:
        assert record["abstain"] == [p < 0.97 for p in record["confidences"]]
        assert record["span_abstain"] == [p < 0.97 for *_, p in record["spans"]]
    out = tmp_path / "flagged.spacy"
    assert invoke("tag", model_dir, test, "--input-format", "conll", "--format", "spacy", "-o", out,
                  "--abstain-below", "0.97").exit_code == 0
    for doc, record in zip(DocBin().from_disk(out).get_docs(spacy.blank("en").vocab), records):
        assert list(doc.user_data["gpseq"]["labels"]) == record["labels"]
        assert list(doc.user_data["gpseq"]["abstain"]) == record["abstain"]
        if "gpseq" in doc.spans:
            assert list(doc.spans["gpseq"].attrs["abstain"]) == record["span_abstain"]
    bad = invoke("tag", model_dir, test, "--abstain-below", "1.5")
    assert bad.exit_code == 4 and "--abstain-below must be a probability" in bad.stderr


def test_tag_nbest_lists_the_most_probable_paths_first(trained, sample):
    model_dir, _ = trained
    result = invoke("tag", model_dir, sample / "test.conll", "--input-format", "conll", "--format", "jsonl",
                    "--nbest", "3")
    assert result.exit_code == 0, result.stderr
    for line in result.stdout.splitlines():
        record = json.loads(line)
        probabilities = [entry["probability"] for entry in record["nbest"]]
        assert probabilities == sorted(probabilities, reverse=True) and sum(probabilities) <= 1 + 1e-6
        assert len({tuple(entry["labels"]) for entry in record["nbest"]}) == len(record["nbest"])
        assert all(len(entry["labels"]) == len(record["tokens"]) for entry in record["nbest"])
    conll = invoke("tag", model_dir, sample / "test.conll", "--input-format", "conll", "--nbest", "2")
    assert conll.stdout.startswith("# nbest\t1\t")


def test_evaluate_target_error_and_entity_plots(trained, sample, tmp_path):
    model_dir, _ = trained
    png = tmp_path / "reliability.png"
    result = invoke("evaluate", model_dir, sample / "test.conll", "--json", "--plot", png, "--target-error", "0.01")
    assert result.exit_code == 0, result.stderr
    metrics = json.loads(result.stdout)
    for key in ("entity_ece", "entity_brier", "entity_ece_product", "entity_aurc", "entity_error_at_90",
                "error_at_80", "error_at_95", "abstain_threshold", "abstain_coverage"):
        assert key in metrics
    if metrics["abstain_threshold"] is not None:
        assert metrics["abstain_error"] <= 0.01
    for path in (png, tmp_path / "reliability-entities.png", tmp_path / "reliability-risk-coverage.png"):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the text report's threshold is the measured one to the last bit: passed to --abstain-below it
    # keeps exactly the tokens that were measured (a rounded one can keep others)
    text = invoke("evaluate", model_dir, sample / "test.conll", "--target-error", "0.05")
    assert text.exit_code == 0, text.stderr
    as_json = json.loads(invoke("evaluate", model_dir, sample / "test.conll", "--json", "--target-error", "0.05").stdout)
    printed = re.findall(r"--abstain-below (\S+) keeps", " ".join(text.stdout.split()))
    expected = [as_json[key] for key in ("abstain_threshold", "entity_abstain_threshold")
                if as_json.get(key) is not None]
    assert expected and [float(p) for p in printed] == expected


def test_tag_spacy_needs_output(trained, text_file):
    result = invoke("tag", trained[0], text_file, "--format", "spacy")
    assert result.exit_code == 4
    assert result.stderr.strip() == "error: --format spacy writes a binary DocBin: give -o FILE"


# ---------------------------------------------------------------------------------------------
# evaluate, info
# ---------------------------------------------------------------------------------------------


def test_evaluate_json_and_reliability_png(trained, sample, tmp_path):
    model_dir, _ = trained
    png = tmp_path / "reliability.png"
    result = invoke("evaluate", model_dir, sample / "test.conll", "--json", "--mean", "--plot", png)
    assert result.exit_code == 0, result.stderr
    metrics = json.loads(result.stdout)
    tagged = invoke("tag", model_dir, sample / "test.conll", "--input-format", "conll", "--mean")
    predicted = [row[1] for s in parse_conll_output(tagged.stdout) for row in s]
    gold = [row[-1] for s in read_first_columns(sample / "test.conll") for row in s]
    assert metrics["n_tokens"] == len(gold)
    assert metrics["token_accuracy"] == pytest.approx(np.mean([g == p for g, p in zip(gold, predicted)]), abs=1e-12)
    assert 0.0 <= metrics["ece"] <= 1.0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = invoke("evaluate", model_dir, sample / "test.conll", "--mean")
    assert table.exit_code == 0 and "token_accuracy" in table.stdout


def test_evaluate_and_tag_read_conllu(trained, sample, tmp_path):
    """The same sentences as CoNLL-U (FORM and UPOS fields holding the token and the label) give the
    same metrics as the CoNLL file, by suffix or by --format; tag reads it too (--input-format auto)."""
    model_dir, _ = trained
    conllu = tmp_path / "test.conllu"
    lines = []
    for sentence in read_first_columns(sample / "test.conll"):
        lines += [f"{i}\t{row[0]}\t_\t{row[-1]}\t_\t_\t_\t_\t_\t_" for i, row in enumerate(sentence, 1)] + [""]
    conllu.write_text("\n".join(lines) + "\n", encoding="utf-8")
    unsuffixed = tmp_path / "test.ud"
    unsuffixed.write_bytes(conllu.read_bytes())
    want = json.loads(invoke("evaluate", model_dir, sample / "test.conll", "--json", "--mean").stdout)
    for args in ([conllu], [unsuffixed, "--format", "conllu"]):
        result = invoke("evaluate", model_dir, *args, "--json", "--mean")
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout) == want
    tagged = invoke("tag", model_dir, conllu, "--mean")
    assert [[row[0] for row in s] for s in parse_conll_output(tagged.stdout)] == [
        [row[0] for row in s] for s in read_first_columns(sample / "test.conll")]


def test_info_json_reports_sizes_from_disk(trained, library_tagger):
    model_dir, _ = trained
    result = invoke("info", model_dir, "--json")
    assert result.exit_code == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["labels"] == library_tagger.labels
    assert info["n_features"] == library_tagger.featurizer.n_features
    on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(model_dir) for f in files)
    assert info["bytes_on_disk"] == on_disk
    with np.load(model_dir / "arrays.npz") as arrays:
        assert info["n_parameters"] == sum(arrays[name].size for name in arrays.files)
    assert info["format_version"] == json.loads((model_dir / "tagger.json").read_text())["format_version"]
    assert info["training"]["max_steps"] == 8
    table = invoke("info", model_dir)
    assert table.exit_code == 0 and "arrays" in table.stdout


# ---------------------------------------------------------------------------------------------
# corpus list | fetch
# ---------------------------------------------------------------------------------------------


def test_corpus_list_json_and_table():
    result = invoke("corpus", "list", "--json")
    assert result.exit_code == 0
    names = [entry["name"] for entry in json.loads(result.stdout)]
    assert "conll2000" in names
    table = invoke("corpus", "list")
    assert "conll2000" in table.stdout


def test_corpus_fetch_from_mirror_checks_sha256(corpora_dir, tmp_path):
    import hashlib

    from gpseq.corpora import get_corpus

    result = invoke("corpus", "fetch", "crfpp-basenp", "--mirror", corpora_dir, "--dest", tmp_path)
    assert result.exit_code == 0, result.stderr
    for spec in get_corpus("crfpp-basenp")["files"].values():
        copied = tmp_path / spec["path"]
        assert copied.read_bytes() == (corpora_dir / spec["path"]).read_bytes()
        if spec["sha256"]:
            assert hashlib.sha256(copied.read_bytes()).hexdigest() == spec["sha256"]
    unknown = invoke("corpus", "fetch", "no-such-corpus", "--mirror", corpora_dir, "--dest", tmp_path)
    assert unknown.exit_code == 4 and "unknown corpus" in unknown.stderr


# ---------------------------------------------------------------------------------------------
# user errors: one line on stderr, documented exit codes
# ---------------------------------------------------------------------------------------------


def one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_missing_training_file_is_exit_2_naming_the_path(tmp_path):
    missing = tmp_path / "nope.conll"
    result = invoke("train", missing, "-o", tmp_path / "m")
    assert result.exit_code == 2
    assert str(missing) in one_line(result)


def test_missing_model_directory_is_exit_2(tmp_path, text_file):
    result = invoke("tag", tmp_path / "no-model", text_file)
    assert result.exit_code == 2
    assert "no-model" in one_line(result)


def test_malformed_corpus_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.conll"
    bad.write_text("The DT B-NP\ncat NN I-NP\nsat VBD\n\n", encoding="utf-8")
    result = invoke("train", bad, "-o", tmp_path / "m", "--features", "ner")
    assert result.exit_code == 2
    assert f"{bad}:3:" in one_line(result)


def test_bad_encoding_names_file_and_line(tmp_path):
    bad = tmp_path / "latin.conll"
    bad.write_bytes("a DT B-NP\n\nb NN B-NP\ncaf\xe9 NN I-NP\n".encode("latin-1"))
    result = invoke("train", bad, "-o", tmp_path / "m", "--features", "ner")
    assert result.exit_code == 2
    assert f"{bad}:4:" in one_line(result)


def test_newer_model_format_is_exit_3(trained, tmp_path, text_file):
    copy = tmp_path / "future-model"
    shutil.copytree(trained[0], copy)
    meta = json.loads((copy / "tagger.json").read_text())
    meta["format_version"] = meta["format_version"] + 1
    (copy / "tagger.json").write_text(json.dumps(meta))
    result = invoke("tag", copy, text_file)
    assert result.exit_code == 3
    assert "newer" in one_line(result)
    assert invoke("info", copy).exit_code == 3


def test_directory_without_tagger_json_is_exit_3(tmp_path, text_file):
    (tmp_path / "empty").mkdir()
    result = invoke("tag", tmp_path / "empty", text_file)
    assert result.exit_code == 3
    assert "tagger.json" in one_line(result)


def test_unknown_preset_and_config_key_are_exit_4(tmp_path):
    train = tmp_path / "t.conll"
    train.write_text("The DT B-NP\ncat NN I-NP\n\n", encoding="utf-8")
    result = invoke("train", train, "-o", tmp_path / "m", "--features", "no-such-preset")
    assert result.exit_code == 4
    assert "no-such-preset" in one_line(result)
    result = invoke("train", train, "-o", tmp_path / "m", "--set", "model.no_such_key=1")
    assert result.exit_code == 4
    assert "no_such_key" in one_line(result)
    result = invoke("train", train, "-o", tmp_path / "m", "--likelihood", "bogus")
    assert result.exit_code == 4
    assert "likelihood" in one_line(result)


def test_verbose_shows_the_traceback(tmp_path):
    result = invoke("train", tmp_path / "nope.conll", "-o", tmp_path / "m", "--verbose")
    assert result.exit_code == 2
    assert "Traceback" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")


@pytest.mark.slow
def test_model_reading_the_pos_column_tags_conll_and_refuses_raw_text(sample, tmp_path, text_file):
    """The chunking preset reads column 1 (POS): CoNLL input with that column works, raw text is exit 4."""
    model_dir = tmp_path / "chunking"
    result = invoke("train", sample / "train.conll", "-o", model_dir, "--features", "chunking", "--inducing", "4",
                    "--max-steps", "2", "--set", "training.dev_fraction=0", "--set", "predict_samples=2")
    assert result.exit_code == 0, result.stderr
    tagged = invoke("tag", model_dir, sample / "test.conll", "--mean")
    assert tagged.exit_code == 0, tagged.stderr
    gold = read_first_columns(sample / "test.conll")
    assert [[row[0] for row in s] for s in parse_conll_output(tagged.stdout)] == [[r[0] for r in s] for s in gold]
    refused = invoke("tag", model_dir, text_file)
    assert refused.exit_code == 4
    assert "column(s) [1]" in one_line(refused)


# ---------------------------------------------------------------------------------------------
# subprocess: `python cli.py` from the checkout and the installed `gpseq` console script
# ---------------------------------------------------------------------------------------------


def run(*args, input=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([str(a) for a in args], input=input, capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)


def test_python_cli_py_help_from_checkout():
    result = run(sys.executable, "cli.py", "--help")
    assert result.returncode == 0, result.stderr
    for command in ("train", "tag", "evaluate", "info", "corpus"):
        assert command in result.stdout
    assert "Exit codes" in result.stdout


def test_console_script_tags_like_the_in_process_app(trained, text_file):
    script = Path(sys.executable).with_name("gpseq")
    if not script.exists():
        pytest.skip("no gpseq console script beside this Python")
    model_dir, _ = trained
    result = run(script, "tag", model_dir, text_file, "--mean", "--format", "jsonl")
    assert result.returncode == 0, result.stderr
    in_process = invoke("tag", model_dir, text_file, "--mean", "--format", "jsonl")
    a = [json.loads(line) for line in result.stdout.splitlines()]
    b = [json.loads(line) for line in in_process.stdout.splitlines()]
    assert [r["labels"] for r in a] == [r["labels"] for r in b]
    missing = run(script, "tag", model_dir, text_file.with_name("missing.txt"))
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [f"error: {text_file.with_name('missing.txt')}: no such file"]


def test_config_json_not_utf8_or_nested_too_deeply_is_one_line_exit_2(tmp_path):
    """--config with an invalid UTF-8 byte or absurd nesting: one line naming the file (a
    UnicodeDecodeError / RecursionError traceback before)."""
    train = tmp_path / "t.conll"
    train.write_text("The DT B-NP\n\n", encoding="utf-8")
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes('{\n  "tag_scheme": "iob2",\n  "note": "café"\n}\n'.encode("latin-1"))
    result = invoke("train", train, "-o", tmp_path / "m", "--config", latin1)
    assert result.exit_code == 2
    assert f"{latin1}:3:" in one_line(result)
    assert "UTF-8" in one_line(result)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    result = invoke("train", train, "-o", tmp_path / "m", "--config", deep)
    assert result.exit_code == 2
    assert str(deep) in one_line(result)
    assert not (tmp_path / "m").exists()


def test_evaluate_refuses_a_label_column_the_features_read(sample, tmp_path):
    """A `token label` file evaluated with a model whose features read column 1 (the chunking
    preset's POS column): column 1 is the gold label, so the features would see the answer (scores
    came out near perfect). Exit 2 naming the file; a file with the POS column evaluates."""
    small = tmp_path / "small.conll"
    blocks = (sample / "train.conll").read_text(encoding="utf-8").split("\n\n")[:40]
    small.write_text("\n\n".join(blocks) + "\n\n", encoding="utf-8")
    model_dir = tmp_path / "chunking"
    result = invoke("train", small, "-o", model_dir, "--features", "chunking", "--max-steps", "5")
    assert result.exit_code == 0, result.stderr
    two_columns = tmp_path / "two.conll"
    two_columns.write_text("".join(
        "\n".join(f"{line.split()[0]} {line.split()[-1]}" for line in block.splitlines()) + "\n\n"
        for block in (sample / "test.conll").read_text(encoding="utf-8").split("\n\n") if block.strip()))
    refused = invoke("evaluate", model_dir, two_columns, "--json")
    assert refused.exit_code == 2
    assert f"{two_columns}:1:" in one_line(refused) and "column 1" in one_line(refused)
    assert refused.stdout == ""
    accepted = invoke("evaluate", model_dir, sample / "test.conll", "--json")
    assert accepted.exit_code == 0, accepted.stderr


def test_train_refuses_a_label_column_the_features_read(sample, tmp_path):
    """`gpseq train` on a `token label` file with the chunking preset (which reads column 1 as POS)
    would train on the gold labels as features (dev NLL near 0, a useless model): exit 2 naming the
    file and nothing written; the same for a --dev file; with word-only features it trains."""
    blocks = [b for b in (sample / "train.conll").read_text(encoding="utf-8").split("\n\n") if b.strip()][:40]
    two_columns = tmp_path / "two.conll"
    two_columns.write_text("".join("\n".join(f"{line.split()[0]} {line.split()[-1]}" for line in block.splitlines())
                                   + "\n\n" for block in blocks), encoding="utf-8")
    refused = invoke("train", two_columns, "-o", tmp_path / "m", "--features", "chunking")
    assert refused.exit_code == 2
    assert f"{two_columns}:1:" in one_line(refused) and "column 1" in one_line(refused)
    assert not (tmp_path / "m").exists()
    dev_refused = invoke("train", sample / "train.conll", "--dev", two_columns, "-o", tmp_path / "m2",
                         "--features", "chunking")
    assert dev_refused.exit_code == 2 and f"{two_columns}:1:" in one_line(dev_refused)
    words_only = invoke("train", two_columns, "-o", tmp_path / "m3", "--features", "pos")
    assert words_only.exit_code == 0, words_only.stderr


def test_tag_reads_a_named_pipe(trained, library_tagger, tmp_path):
    """`gpseq tag MODEL <(zcat notes.txt.gz)`: the shell passes a named pipe (/dev/fd/N), which is read
    as a file is (it was refused as 'no such file'); a directory or a missing path still are."""
    model_dir, _ = trained
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)

    def feed():
        with open(fifo, "w", encoding="utf-8") as handle:
            handle.write(TEXT)

    import threading

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    result = invoke("tag", model_dir, fifo, "--mean", "--input-format", "text")
    writer.join(10)
    assert result.exit_code == 0, result.stderr
    sentences = parse_conll_output(result.stdout)
    assert [[row[0] for row in s] for s in sentences] == spacy_sentences(TEXT)
    assert [[row[1] for row in s] for s in sentences] == [t.labels for t in library_tagger.tag(
        spacy_sentences(TEXT), mean=True)]
    refused = invoke("tag", model_dir, tmp_path)
    assert refused.exit_code == 2 and "is a directory" in one_line(refused)
    refused = invoke("tag", model_dir, tmp_path / "absent.txt")
    assert refused.exit_code == 2 and "no such file" in one_line(refused)


def test_tag_conll_output_refuses_a_token_with_a_tab_or_line_break(trained, tmp_path):
    """JSON Lines input may hold a token with a tab or a newline; written into the conll output it
    shifted the fields or split the line (silently). Exit 2 naming the input line, nothing written;
    jsonl output carries such tokens."""
    model_dir, _ = trained
    path = tmp_path / "odd.jsonl"
    path.write_text('{"tokens": ["The", "cat"]}\n{"tokens": ["New York", "a\\tb", "c\\nd"]}\n', encoding="utf-8")
    out = tmp_path / "out.conll"
    out.write_text("kept\n", encoding="utf-8")
    refused = invoke("tag", model_dir, path, "--mean", "-o", out)
    assert refused.exit_code == 2
    assert f"{path}:2: token 2 ('a\\tb') holds a tab or a line break" in one_line(refused)
    assert out.read_text(encoding="utf-8") == "kept\n"
    for token in ("x\ry", "x\u2028y"):
        path.write_text(json.dumps({"tokens": ["ok", token]}) + "\n", encoding="utf-8")
        assert invoke("tag", model_dir, path, "--mean").exit_code == 2
    path.write_text('{"tokens": ["New York", "a\\tb", "c\\nd"]}\n', encoding="utf-8")
    jsonl = invoke("tag", model_dir, path, "--mean", "--format", "jsonl")
    assert jsonl.exit_code == 0, jsonl.stderr
    assert json.loads(jsonl.stdout)["tokens"] == ["New York", "a\tb", "c\nd"]
    path.write_text('{"tokens": ["New York", "city"]}\n', encoding="utf-8")  # a space: the fields are tab-separated
    conll = invoke("tag", model_dir, path, "--mean")
    assert conll.exit_code == 0 and [row[0] for row in parse_conll_output(conll.stdout)[0]] == ["New York", "city"]


def test_tag_into_a_closed_pipe_stops_quietly(trained, tmp_path):
    """`gpseq tag MODEL text | head -1`: when the reader closes the pipe, gpseq stops with exit 141
    and no message (it printed 'error: ?: Broken pipe' and exited 1)."""
    model_dir, _ = trained
    text = tmp_path / "long.txt"
    text.write_text(("The committee approved the new budget on Tuesday. " * 2000) + "\n", encoding="utf-8")
    process = subprocess.Popen([sys.executable, "-m", "gpseq", "tag", str(model_dir), str(text)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = process.stdout.readline()  # 16,000 tokens of output: far more than a pipe holds
    process.stdout.close()
    stderr = process.stderr.read().decode()
    code = process.wait(timeout=120)
    assert first.strip()
    assert code == 141, stderr
    assert not re.search(r"^error:|Broken pipe|Traceback", stderr, re.MULTILINE), stderr


def test_default_training_reports_its_objective_by_name(tmp_path):
    """The default fit maximises a log posterior by L-BFGS: its progress and summary say so, not
    "ELBO" and "steps" (which name SVI's objective and Adam steps)."""
    corpus = tmp_path / "train.conll"
    corpus.write_text("".join(f"the\tD\n{w}\tN\nsat\tV\n\n" for w in ["cat", "dog", "yak", "zebu"] * 8))
    result = invoke("train", corpus, "-o", tmp_path / "m", "--features", "ner")
    assert result.exit_code == 0, result.stderr
    progress, summary = " ".join(result.stderr.split()), " ".join(result.stdout.split())
    assert "log posterior/token" in progress and "L-BFGS iterations" in summary
    assert "ELBO" not in progress + summary
