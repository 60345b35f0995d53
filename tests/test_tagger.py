"""The structured GP tagger (gpseq/tagger.py) end to end: learning on the bundled sample, persistence,
resume, one-token sentences, natural-gradient steps in training, strings refused in place of
tokenised sentences, and a process forked after TensorFlow started."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from helpers.tiny_design import tiny_batch, tiny_data, tiny_model

from gpseq.features import get_preset
from gpseq.structured.model import ModelConfig
from gpseq.tagger import Tagger, TaggerConfig
from gpseq.training.trainer import TrainingConfig


def _sample(split, sample_dir):
    from gpseq.corpora import read_conll

    return read_conll(sample_dir / f"{split}.conll")


def _quick_config(dtype="float32", **training):
    params = dict(epochs=3, batch_size=16, learning_rate=0.05, checkpoint_every=5, seed=1, early_stopping="none")
    params.update(training)
    return TaggerConfig(
        features=get_preset("chunking"),
        model=ModelConfig(kernel="linear+rbf", num_inducing=8),
        training=TrainingConfig(**params),
        predict_samples=4,
        dtype=dtype,
    )


@pytest.fixture(scope="module")
def trained(sample_dir, tmp_path_factory):
    train = _sample("train", sample_dir)
    return Tagger.train(train, _quick_config()), train


def test_tagger_learns_the_sample_better_than_chance(trained, sample_dir):
    tagger, train = trained
    test = _sample("test", sample_dir)
    report = tagger.evaluate(test).to_dict()
    majority = max(
        sum(label == candidate for s in train for label in s.labels) for candidate in tagger.labels
    ) / sum(len(s) for s in train)
    assert report["token_accuracy"] > majority + 0.2
    tagged = tagger.tag(test[:3])
    for result in tagged:
        np.testing.assert_allclose(result.probabilities.sum(-1), 1.0, atol=1e-5)


def test_save_load_gives_identical_predictions(trained, sample_dir, tmp_path):
    tagger, _ = trained
    test = _sample("test", sample_dir)[:20]
    tagger.save(tmp_path / "model")
    meta = json.loads((tmp_path / "model" / "tagger.json").read_text())
    assert meta["format_version"] == 1 and meta["labels"] == tagger.labels
    loaded = Tagger.load(tmp_path / "model")
    for a, b in zip(tagger.tag(test), loaded.tag(test)):
        assert a.labels == b.labels
        # float32 model: equal to float32 round-off (reduction order may differ between graphs)
        np.testing.assert_allclose(a.probabilities, b.probabilities, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(a.sequence_log_prob, b.sequence_log_prob, rtol=1e-4, atol=1e-4)


def test_resume_continues_from_the_checkpoint(sample_dir, tmp_path):
    train = _sample("train", sample_dir)[:60]
    config = _quick_config("float64", max_steps=8, epochs=10)
    straight = Tagger.train(train, config)
    interrupted = _quick_config("float64", max_steps=5, epochs=10)
    Tagger.train(train, interrupted, checkpoint_dir=tmp_path / "ckpt")
    resumed = Tagger.train(train, config, checkpoint_dir=tmp_path / "ckpt", resume=True)
    assert resumed.scores["steps"] == 8
    for a, b in zip(straight.model.trainable_variables, resumed.model.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-9, atol=1e-12)


def test_one_token_sentences_tag_and_train():
    # a batch whose longest sentence has one token (the chain pads the time axis internally)
    from gpseq.corpora.types import Sentence

    data, _ = tiny_data(n_seq=3, max_len=1, n_features=6, n_labels=2)
    model, _ = tiny_model(n_features=6, n_labels=2)
    batch = tiny_batch(data)
    assert batch["values"].shape[1] == 1 and int(tf.reduce_max(batch["lengths"])) == 1
    from gpseq.structured.predict import monte_carlo_marginals

    marg, _, _, log_z = monte_carlo_marginals(model, batch, 4, tf.constant([0, 1]))
    assert marg.shape == (3, 1, 2)
    np.testing.assert_allclose(tf.reduce_sum(marg[:, 0], -1).numpy(), 1.0, atol=1e-9)
    with tf.GradientTape() as tape:
        elbo = model.elbo(batch, 3, 2, tf.constant([0, 1]))
    assert all(np.all(np.isfinite(tf.convert_to_tensor(g).numpy()))
               for g in tape.gradient(elbo, model.trainable_variables) if g is not None)
    # through the public API, in both prediction modes
    train = [Sentence(["a", "b"], ["X", "Y"]), Sentence(["b"], ["Y"]), Sentence(["a"], ["X"])] * 4
    from gpseq.features import get_preset

    config = TaggerConfig(features=get_preset("pos"), model=ModelConfig(kernel="linear+rbf", num_inducing=2),
                          training=TrainingConfig(epochs=1, batch_size=4, dev_fraction=0.0, seed=0))
    tagger = Tagger.train(train, config)
    for mean in (False, True):
        result = tagger.tag([["b"]], mean=mean)[0]
        assert result.probabilities.shape == (1, 2) and abs(result.probabilities.sum() - 1.0) < 1e-6


def test_natural_gradient_step_on_q_u_increases_the_elbo_and_trains_the_tagger(sample_dir):
    from gpseq.gp.natgrad import NaturalGradient

    data, _ = tiny_data(n_seq=4, max_len=4, n_features=8, n_labels=3)
    model, _ = tiny_model(n_features=8, n_labels=3)
    batch = tiny_batch(data)
    seed = tf.constant([5, 6])  # common random numbers: the ELBO is a deterministic function of q(u)

    before = float(model.elbo(batch, 4, 8, seed))
    # a small step along the natural gradient ascends
    NaturalGradient(0.02).minimize(lambda: -model.elbo(batch, 4, 8, seed), model.variational_parameters())
    after = float(model.elbo(batch, 4, 8, seed))
    assert after > before

    # wired into training: q(u) moves only by natural-gradient steps, the rest by Adam
    train = _sample("train", sample_dir)[:60]
    config = TaggerConfig(features=get_preset("pos"), model=ModelConfig(kernel="linear+rbf", num_inducing=4),
                          training=TrainingConfig(epochs=2, batch_size=20, dev_fraction=0.0, seed=0,
                                                  natgrad_gamma=0.01))
    tagger = Tagger.train(train, config)
    assert tagger.scores["skipped_steps"] == 0
    # Adam does not touch q(u) here: it moved from its zero initial mean by natural-gradient steps
    assert np.abs(tagger.model.unaries.sparse.q.q_mu.numpy()).max() > 1e-3
    accuracy = tagger.evaluate(train).to_dict()["token_accuracy"]
    majority = max(np.unique(np.concatenate([s.labels for s in train]), return_counts=True)[1]) / sum(
        len(s) for s in train)
    assert accuracy > majority


def test_strings_instead_of_tokenised_sentences_are_refused_by_name():
    """One string for the whole input (tag, select) is refused as such, not read as its characters;
    a string among the sentences is named. Neither message names another function (select's used
    to say "tag() takes ...")."""
    from gpseq.active.selection import select
    from gpseq.corpora.types import as_sentences
    from gpseq.errors import GpseqError

    with pytest.raises(GpseqError, match=r"got one string \('The cat sat \.'\)") as raised:
        as_sentences("The cat sat .")
    assert "tag()" not in str(raised.value)
    with pytest.raises(GpseqError, match=r"got a string \('Dogs bark'\)"):
        as_sentences([["The", "cat"], "Dogs bark"])
    with pytest.raises(GpseqError, match="one string"):
        select(None, "The cat sat on the mat .", 2, "random")
    assert [s.tokens for s in as_sentences([["The", "cat"], ("Dogs", "bark")])] == [["The", "cat"], ["Dogs", "bark"]]


def test_a_process_forked_after_tensorflow_started_refuses_to_run_it_instead_of_hanging():
    """TensorFlow does not survive a fork: a child forked after the parent's Monte Carlo prediction
    hung at its first TensorFlow operation. Any prediction that needs TensorFlow now raises the
    reason there (Tagger.tag with samples, select's draws); the linear model's deterministic
    predictive (plain NumPy) still runs. In subprocesses, bounded in time."""
    import subprocess
    import sys
    from pathlib import Path

    model = Path(__file__).resolve().parents[1] / "models" / "en_pos_conll2000"
    code = (
        "import os, sys\n"
        "from gpseq.tagger import Tagger\n"
        f"tagger = Tagger.load({str(model)!r})\n"
        "sentence = [['The', 'cat', 'sat', '.']]\n"
        "tagger.tag(sentence, samples=2)\n"  # TensorFlow starts here, in the parent
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    print('deterministic', tagger.tag(sentence)[0].labels, flush=True)\n"
        "    for what, call in (('tag', lambda: tagger.tag(sentence, samples=2)),\n"
        "                       ('select', lambda: tagger.select(sentence, 1, 'bald', tag=False))):\n"
        "        try:\n"
        "            call()\n"
        "            print(what, 'ran', flush=True)\n"
        "        except Exception as error:\n"
        "            print(what, 'refused:', error, flush=True)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("deterministic [")
    assert [line.split(":")[0] for line in lines[1:]] == ["tag refused", "select refused"]
    assert all("TensorFlow cannot run after a fork" in line for line in lines[1:])
