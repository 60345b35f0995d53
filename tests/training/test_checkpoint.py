"""Training checkpoints (gpseq/training/checkpoint.py): `--resume` from a checkpoint of another
configuration or of an older gpseq is one line naming the checkpoint (exit 4); `gpseq train` killed
with SIGKILL at random points leaves no model or a complete one, and `--resume` reaches the
uninterrupted result; a user's directory named `checkpoint` is never replaced.

The tiny model of `helpers.tiny_model` (and its checkpoint directory) is trained once for the module."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT
from helpers.cli import invoke, one_line
from helpers.files import snapshot
from helpers.tiny_model import KILL_OPTIONS, TINY, corpus, model, subprocess_env  # noqa: F401


def test_resume_with_another_learning_rate_is_refused(model, corpus, tmp_path):
    """The same model but another optimiser setting: the checkpoint's Adam state belongs to the old
    one, so --resume names the setting and both values instead of carrying on silently."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(model.with_name(model.name + ".ckpt"), ckpt)
    before = snapshot(tmp_path)
    result = invoke("train", corpus, "-o", tmp_path / "m2", *TINY, "--set", "training.learning_rate=0.5",
                    "--checkpoint-dir", ckpt, "--resume")
    assert result.exit_code == 4, result.stderr
    line = one_line(result)
    assert line.startswith(f"error: {ckpt}: the checkpoint was trained with other optimiser settings: "
                           "training.learning_rate "), line
    assert "0.5 now" in line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("recorded", [True, False], ids=["shapes-recorded", "old-checkpoint"])
def test_resume_from_a_checkpoint_of_another_configuration(model, corpus, tmp_path, recorded):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(model.with_name(model.name + ".ckpt"), ckpt)
    if not recorded:  # a checkpoint written before state.json recorded the variable shapes
        state = json.loads((ckpt / "checkpoint" / "state.json").read_text())
        del state["variables"]
        (ckpt / "checkpoint" / "state.json").write_text(json.dumps(state))
    before = snapshot(tmp_path)
    options = list(TINY)
    options[options.index("ner")] = "pos"  # other features: other feature columns
    result = invoke("train", corpus, "-o", tmp_path / "m2", *options, "--checkpoint-dir", ckpt, "--resume")
    assert result.exit_code == 4
    line = one_line(result)
    assert line.startswith(f"error: {ckpt}: the checkpoint "), line
    if recorded:  # names the variables whose shapes differ, with both shapes
        assert "linear/q_mu [" in line and "in the checkpoint" in line and "now" in line, line
    else:  # TensorFlow's own account of the mismatch, on the same line
        assert "incompatible tensor with shape" in line, line
    assert "--resume" in line, line
    assert snapshot(tmp_path) == before


# state.json of a checkpoint written by gpseq before the single Trainer (b379e36^, 2026-11-23), as
# written then for a tiny linear+rbf tagger: its variables are named as the old model named them
_FORMAT_1_STATE = {
    "step": 3, "best_score": None, "best_step": None, "evals_without_improvement": 0, "skipped_steps": 0,
    "stopped_early": False, "history": [], "best_values": None,
    "variables": {"label_bias": [9], "pairwise_mean": [9, 9], "temperature": [], "variance_scale": [],
                  "inducing/mixture_logits": [1], "inducing/q_mu": [1, 8, 9],
                  "inducing/q_sqrt/_pretransformed_input": [1, 9, 36],
                  "kernel/lengthscales/_pretransformed_input": [], "kernel/variance/_pretransformed_input": [],
                  "linear/q_mu": [2748, 9], "linear/prior_variance/_pretransformed_input": [],
                  "linear/q_variance/_pretransformed_input": [2748, 9],
                  "pairwise_variance/_pretransformed_input": [9, 9]},
}


def test_resume_from_a_checkpoint_written_before_the_single_trainer(model, corpus, tmp_path):
    """A checkpoint of the old trainer cannot be restored into the composed model: one line saying
    so and what to do (exit 4), nothing written."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(model.with_name(model.name + ".ckpt"), ckpt)
    assert json.loads((ckpt / "checkpoint" / "state.json").read_text())["checkpoint_format"] == 2
    (ckpt / "checkpoint" / "state.json").write_text(json.dumps(_FORMAT_1_STATE))
    before = snapshot(tmp_path)
    result = invoke("train", corpus, "-o", tmp_path / "m2", *TINY, "--checkpoint-dir", ckpt, "--resume")
    assert result.exit_code == 4
    line = one_line(result)
    assert line == (f"error: {ckpt}: the checkpoint was written by an older gpseq (checkpoint format 1, before "
                    "its single Trainer and composed model) and cannot be resumed by this one; train without "
                    "--resume to start afresh (or use another --checkpoint-dir)"), line
    assert snapshot(tmp_path) == before


# ---- kill -9 at random points, then --resume


KILL_TRIALS = 10


def _train_command(corpus: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "cli.py"), "train", str(corpus), "-o", str(out), *KILL_OPTIONS, *extra]


def _arrays(model_dir: Path) -> dict:
    import numpy as np

    with np.load(model_dir / "arrays.npz", allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def _assert_same_arrays(got: dict, want: dict, what: str) -> None:
    import numpy as np

    assert sorted(got) == sorted(want), what
    for name in want:
        assert np.allclose(got[name], want[name], rtol=1e-6, atol=1e-9), f"{what}: {name} differs"


@pytest.mark.slow
def test_kill_at_random_points_then_resume(corpus, tmp_path):
    """`gpseq train` (SVI, checkpoints) killed with SIGKILL at random times spread over an
    uninterrupted run's duration: every trial leaves either no model or a complete, loadable one
    equal to the uninterrupted result; `--resume` then reaches the uninterrupted result (the
    arrays), cleaning the killed run's temporaries and its stale lock."""
    from gpseq.tagger import Tagger

    reference = tmp_path / "reference" / "model"
    reference.parent.mkdir()
    started = time.monotonic()
    done = subprocess.run(_train_command(corpus, reference), capture_output=True, text=True, env=subprocess_env(),
                          timeout=600)
    duration = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    want = _arrays(reference)
    rng = random.Random(14)
    outcomes = []
    for trial in range(KILL_TRIALS):
        folder = tmp_path / f"trial{trial}"
        folder.mkdir()
        out = folder / "model"
        # trial 0 during start-up (imports, features); the others spread over the rest of the run and
        # a little past it (TensorFlow's start-up is about a third of a run of this size)
        if trial == 0:
            delay = rng.uniform(0.0, 0.3) * duration
        else:
            delay = (0.3 + 0.75 * (trial - 1 + rng.random()) / (KILL_TRIALS - 1)) * duration
        trial_started = time.monotonic()
        process = subprocess.Popen(_train_command(corpus, out), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, env=subprocess_env())
        state = out.with_name("model.ckpt") / "checkpoint" / "state.json"
        if trial % 2 == 1:
            # odd trials: killed once a given checkpoint exists (load on the machine cannot make every
            # time-based kill land before the first checkpoint); even trials: at a random time
            target = rng.choice([5, 10, 15, 20, 25, 30, 35])
            deadline = time.monotonic() + 600
            while process.poll() is None and time.monotonic() < deadline:
                try:
                    if json.loads(state.read_text())["step"] >= target:
                        break
                except (OSError, ValueError, KeyError):
                    pass
                time.sleep(0.02)
            delay = time.monotonic() - trial_started  # for the report only
        try:
            process.wait(timeout=0 if trial % 2 == 1 else delay)
            killed = False
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            process.wait()
            killed = True
        left = sorted(os.listdir(folder))
        unexpected = [name for name in left if name not in ("model", "model.ckpt", "model.lock")
                      and not name.startswith((".model.tmp-", ".model.old-"))]
        assert not unexpected, f"trial {trial} (killed after {delay:.1f} s): {unexpected}"
        if out.exists():  # a complete, loadable model: the uninterrupted one
            Tagger.load(out)
            _assert_same_arrays(_arrays(out), want, f"trial {trial}: the model left by the killed run")
        checkpoint = out.with_name("model.ckpt") / "checkpoint" / "state.json"
        step = json.loads(checkpoint.read_text())["step"] if checkpoint.exists() else None
        outcomes.append((round(delay, 1), killed, out.exists(), step))
        resumed = subprocess.run(_train_command(corpus, out, "--resume"), capture_output=True, text=True,
                                 env=subprocess_env(), timeout=600)
        assert resumed.returncode == 0, f"trial {trial}: {resumed.stderr}"
        Tagger.load(out)
        _assert_same_arrays(_arrays(out), want, f"trial {trial}: --resume after a kill at {delay:.1f} s")
        assert sorted(os.listdir(folder)) == ["model", "model.ckpt"], f"trial {trial}: {os.listdir(folder)}"
        assert os.listdir(out.with_name("model.ckpt")) == ["checkpoint"]
    print("kill trials (delay s, killed, model left, checkpoint step):", outcomes)
    assert any(killed for _, killed, _, _ in outcomes)
    assert any(step is not None and step < 40 for *_, step in outcomes), outcomes  # some resumed mid-training


def test_svi_checkpoints_never_replace_a_users_directory_named_checkpoint(corpus, tmp_path):
    checkpoints = tmp_path / "work"
    (checkpoints / "checkpoint").mkdir(parents=True)
    (checkpoints / "checkpoint" / "notes.txt").write_text("mine\n", encoding="utf-8")
    before = snapshot(tmp_path)
    result = invoke("train", corpus, "-o", tmp_path / "model", "--checkpoint-dir", checkpoints, *TINY,
                    "--set", "training.method=svi", "--set", "training.checkpoint_every=1")
    assert result.exit_code == 2
    line = one_line(result)
    assert line.startswith(f"error: {checkpoints / 'checkpoint'}: holds files gpseq did not write (notes.txt)"), line
    assert snapshot(tmp_path) == before
