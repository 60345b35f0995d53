"""The configuration of a command (gpseq/cli/config.py): `--set KEY.PATH=VALUE`, the precedence of
defaults, a --config file, options and --set, and a --config file that is not valid JSON, not UTF-8
or nested too deeply (one line naming the file and line)."""

from __future__ import annotations

import json

import pytest

from helpers.cli import invoke, one_line

from gpseq.cli.config import ConfigOptions, apply_override, build_config


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
