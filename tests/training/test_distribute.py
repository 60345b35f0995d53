"""tf.distribute training: per-replica sub-batches, MirroredStrategy on two logical CPUs against
one device (ELBO, gradients, trained parameters, resume on another replica count), and
MultiWorkerMirroredStrategy with two worker processes on 127.0.0.1 against a single process.

Logical devices and multi-worker clusters must be set up before TensorFlow starts, so those
checks run tests/training/distribute_worker.py in subprocesses (bounded in time, killed on failure).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gpseq.errors import ConfigError
from gpseq.training.batching import make_batch
from gpseq.training.distribute import batch_plan, split_batch
from gpseq.training.trainer import TrainingConfig

HERE = Path(__file__).resolve().parent
WORKER = HERE / "distribute_worker.py"
TIMEOUT = 240  # s per subprocess run: a hang bound (about 40 s of CPU each; the shared machine may be loaded)
sys.path.insert(0, str(HERE))
from distribute_worker import run_training, synthetic_data  # noqa: E402


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", **extra)
    return env


def _run(processes: list[subprocess.Popen], timeout: float) -> None:
    """Waits for all processes to succeed within `timeout` s in total; kills any still running."""
    deadline = time.monotonic() + timeout
    try:
        for process in processes:
            _, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
            assert process.returncode == 0, err.decode(errors="replace")[-3000:]
    finally:
        _kill(processes)


def _kill(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def _free_ports(count: int) -> list[int]:
    sockets = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


# ---- in process: batches and configuration ------------------------------------------------------
@pytest.mark.parametrize("parts", [1, 2, 3, 8])
def test_sub_batches_partition_the_global_batch_with_its_features(parts):
    data = synthetic_data()
    ids = np.array([3, 17, 4, 9, 11, 0, 22])
    batch = make_batch(data, ids)
    pieces = split_batch(batch, parts)
    assert len(pieces) == parts
    assert sum(len(p["lengths"]) for p in pieces) == len(ids)
    assert max(len(p["lengths"]) for p in pieces) - min(len(p["lengths"]) for p in pieces) <= 1
    dense = data.rows.toarray()
    row = 0
    for piece in pieces:
        for b, length in enumerate(piece["lengths"]):
            sentence = ids[row]
            start = data.offsets[sentence]
            assert length == data.lengths[sentence]
            # rebuild each token's dense feature row from the piece's global ids and values
            rebuilt = np.zeros((length, dense.shape[1]))
            global_ids = piece["feature_ids"][piece["indices"][b, :length]]
            np.add.at(rebuilt, (np.arange(length)[:, None], global_ids), piece["values"][b, :length])
            np.testing.assert_allclose(rebuilt, dense[start:start + length], rtol=1e-6)
            np.testing.assert_array_equal(piece["labels"][b, :length], data.label_ids[start:start + length])
            row += 1


def test_batch_plan_covers_each_epoch_once_and_resumes_mid_epoch():
    lengths = synthetic_data().lengths
    full = [ids.tolist() for ids in batch_plan(lengths, 5, seed=2, start_step=0, total_steps=15)]
    assert len(full) == 15  # 3 epochs of ceil(23 / 5) = 5 batches
    for epoch in range(3):
        seen = sorted(i for ids in full[5 * epoch: 5 * epoch + 5] for i in ids)
        assert seen == list(range(len(lengths)))
    assert full[:5] != full[5:10]  # epochs are reshuffled
    assert [ids.tolist() for ids in batch_plan(lengths, 5, seed=2, start_step=7, total_steps=15)] == full[7:]


def test_strategy_configuration_errors(monkeypatch):
    from gpseq.training.distribute import make_strategy

    with pytest.raises(ConfigError, match="strategy must be one of"):
        TrainingConfig(strategy="ring").validate()
    with pytest.raises(ConfigError, match="devices"):
        TrainingConfig(devices=0).validate()
    with pytest.raises(ConfigError, match="strategy must be one of"):
        make_strategy("ring")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="TF_CONFIG"):
        make_strategy("multiworker")
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ConfigError, match="TF_CONFIG"):
        make_strategy("multiworker")


def test_chief_process_from_tf_config():
    from gpseq.training.distribute import is_chief_process

    workers = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    assert is_chief_process("")
    assert is_chief_process(json.dumps({"cluster": workers, "task": {"type": "worker", "index": 0}}))
    assert not is_chief_process(json.dumps({"cluster": workers, "task": {"type": "worker", "index": 1}}))
    with_chief = {"chief": ["127.0.0.1:3"], **workers}
    assert not is_chief_process(json.dumps({"cluster": with_chief, "task": {"type": "worker", "index": 0}}))
    assert is_chief_process(json.dumps({"cluster": with_chief, "task": {"type": "chief", "index": 0}}))


# ---- subprocesses: two logical CPUs; two workers --------------------------------------------------
def _mirrored(mode: str, tmp_path: Path) -> dict:
    out = tmp_path / f"{mode}.json"
    process = subprocess.Popen([sys.executable, str(WORKER), mode, str(out)], env=_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _run([process], timeout=TIMEOUT)
    return json.loads(out.read_text())


def test_mirrored_two_logical_cpus_give_the_one_device_elbo(tmp_path):
    report = _mirrored("mirrored-elbo", tmp_path)
    assert report["replicas"] == 2 and len(set(report["devices"])) == 2
    for case in ("linear_seven", "linear_one"):  # "one": a single sentence, so one replica is empty
        result = report[case]
        assert result["applied"]
        assert result["mirrored"] == pytest.approx(result["one_device"], rel=1e-12)
        assert result["gradient_max_abs_diff"] <= 1e-12 * max(1.0, result["gradient_max_abs"])
    rbf = report["rbf"]  # the KL enters once: by hand N/B Σ_r ELL_r − KL
    assert rbf["sub_batch_sizes"] == [4, 3]
    assert rbf["mirrored"] == pytest.approx(rbf["by_hand"], rel=1e-12)


def test_mirrored_two_logical_cpus_train_like_one_device(tmp_path):
    report = _mirrored("mirrored-training", tmp_path)
    assert report["replicas"] == 2
    training = report["training"]
    assert training["replicas_agree"] and training["steps"] == 4
    assert training["moved_max_abs"] > 0.05  # training did change the parameters
    assert training["two_vs_one_max_abs_diff"] < 1e-9
    assert training["resumed_vs_one_max_abs_diff"] < 1e-9
    for case in ("svgp", "svgp_natgrad"):  # a tf.data dataset of global batches, split per replica
        svgp = report[case]  # (svgp_natgrad: natural-gradient steps on q(u) from all-reduced gradients)
        assert svgp["steps"] == 10 and svgp["moved_max_abs"] > 0.05
        assert svgp["loss_max_rel_diff"] < 1e-12
        assert svgp["param_max_abs_diff"] < 1e-9


def test_multiworker_two_processes_train_like_one(tmp_path):
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    processes = []
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        processes.append(subprocess.Popen(
            [sys.executable, str(WORKER), "train", str(tmp_path / f"worker{index}.npz"), str(tmp_path / f"ckpt{index}")],
            env=_env(TF_CONFIG=tf_config), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    try:  # the single-process reference runs here meanwhile
        run_training(str(tmp_path / "single.npz"), str(tmp_path / "ckpt_single"))
    except BaseException:
        _kill(processes)
        raise
    _run(processes, timeout=TIMEOUT)
    results = [np.load(tmp_path / f"{name}.npz") for name in ("worker0", "worker1", "single")]
    assert [int(r["replicas"]) for r in results] == [2, 2, 1]
    assert [bool(r["chief"]) for r in results] == [True, False, True]
    assert int(results[0]["steps"]) == int(results[2]["steps"]) == 8
    arrays = [name for name in results[2].files if name.startswith("arr_")]
    for name in arrays:
        np.testing.assert_array_equal(results[0][name], results[1][name])  # workers hold one model
        np.testing.assert_allclose(results[0][name], results[2][name], rtol=1e-9, atol=1e-11)
    assert float(results[2]["moved"]) > 0.05  # training did change the parameters
    # checkpoints: the chief's directory has one; the other worker wrote none
    assert (tmp_path / "ckpt0" / "checkpoint" / "state.json").is_file()
    assert not (tmp_path / "ckpt1").exists()
