"""Subprocess side of tests/training/test_distribute.py (TensorFlow's devices must be set up before it starts).

    python tests/training/distribute_worker.py mirrored-elbo OUT.json      # 2 logical CPUs: ELBOs and gradients
    python tests/training/distribute_worker.py mirrored-training OUT.json  # 2 logical CPUs: training, resume, SVGP
    python tests/training/distribute_worker.py train OUT.npz CKPT    # train the small model; TF_CONFIG set → multiworker

Prints nothing the test reads; results go to OUT (JSON or .npz).
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

NUM_FEATURES, NUM_LABELS, NUM_SEQUENCES = 40, 3, 23


def synthetic_data():
    """23 sequences of 1–7 tokens, 3 distinct active features per token, labels a function of them."""
    from gpseq.training.batching import SequenceData

    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 8, NUM_SEQUENCES)
    tokens = int(lengths.sum())
    cols = np.stack([rng.choice(np.arange(1, NUM_FEATURES), 3, replace=False) for _ in range(tokens)])
    values = rng.uniform(0.5, 1.5, (tokens, 3))
    rows = sp.csr_matrix((values.ravel(), cols.ravel(), np.arange(0, 3 * tokens + 1, 3)), shape=(tokens, NUM_FEATURES))
    rows.sort_indices()
    labels = (cols[:, 0] % NUM_LABELS).astype(np.int32)
    return SequenceData(rows, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), labels)


def build_model(kernel: str, data, num_samples: int = 2):
    """A float64 StructuredGP whose `loss(batch, seed)` is the one Tagger.train trains."""
    import tensorflow as tf

    from gpseq.structured.model import ModelConfig, build_structured_gp

    inducing = data.rows[:6].toarray() if kernel != "linear" else None
    config = ModelConfig(kernel=kernel, num_inducing=6, initial_weight_variance=0.05)
    return build_structured_gp(config, NUM_FEATURES, NUM_LABELS, inducing, tf.float64, num_data=len(data),
                               num_samples=num_samples)


def training_config(**overrides):
    from gpseq.training.trainer import TrainingConfig

    params = dict(batch_size=7, epochs=1, learning_rate=0.05, num_samples=2, seed=3, early_stopping="none",
                  dev_fraction=0.0, checkpoint_every=0)
    params.update(overrides)
    return TrainingConfig(**params)


def values(model) -> list[np.ndarray]:
    return [v.numpy() for v in model.trainable_variables]


def gradient_probe(strategy, model):
    """A function (data, sentence ids, seed) → (global loss, applied, gradient) of one step under
    `strategy`: SGD with rate 1 from the model's current point, which is then restored."""
    import tensorflow as tf

    from gpseq.training.distribute import build_svi_step, distributed_batches

    variables = model.trainable_variables
    with strategy.scope():
        optimizer = tf.keras.optimizers.SGD(learning_rate=1.0)
        optimizer.build(variables)
    step = build_svi_step(strategy, model.loss, variables, optimizer)

    def probe(data, sentence_ids, seed):
        before = values(model)
        batch = next(iter(distributed_batches(strategy, data, [sentence_ids], tf.float64)))
        loss, applied = step(batch, tf.constant(seed, tf.int32))
        gradient = [b - v.numpy() for b, v in zip(before, variables)]
        for variable, value in zip(variables, before):
            variable.assign(value)
        return float(loss), bool(applied), gradient

    return probe


def one_device_loss_and_gradient(model, batch, seed):
    import tensorflow as tf

    with tf.GradientTape() as tape:
        loss = model.loss(batch, tf.constant(seed, tf.int32))
    return float(loss), [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, model.trainable_variables)]


def run_mirrored_elbo(out_path: str) -> None:
    import tensorflow as tf

    from gpseq.training.distribute import make_strategy
    from gpseq.training.batching import make_batch
    from gpseq.training.distribute import split_batch
    from gpseq.training.trainer import Trainer

    strategy = make_strategy("mirrored", 2)
    data = synthetic_data()
    order = np.argsort(data.lengths, kind="stable")
    report = {"replicas": strategy.num_replicas_in_sync, "devices": list(strategy.extended.worker_devices)}

    # 1. linear kernel: the distributed ELBO and gradient equal the one-device ones of the global batch
    reference = build_model("linear", data)
    for variable in reference.trainable_variables:  # a point away from the initial one
        variable.assign(variable + 0.1 * np.random.default_rng(1).standard_normal(variable.shape))
    with strategy.scope():
        mirrored = build_model("linear", data)
    for target, value in zip(mirrored.trainable_variables, values(reference)):
        target.assign(value)
    probe = gradient_probe(strategy, mirrored)
    for name, ids in {"seven": order[8:15], "one": order[20:21]}.items():
        batch = {k: tf.constant(v) for k, v in make_batch(data, ids, dtype=np.float64).items()}
        loss_1, grad_1 = one_device_loss_and_gradient(reference, batch, [3, 11])
        loss_2, applied, grad_2 = probe(data, ids, [3, 11])
        report[f"linear_{name}"] = {
            "one_device": loss_1, "mirrored": loss_2, "applied": applied,
            "gradient_max_abs_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(grad_1, grad_2)),
            "gradient_max_abs": max(float(np.max(np.abs(a))) for a in grad_1),
        }

    # 2. linear+rbf: the distributed loss is −(N/B Σ_r ELL(sub-batch r) − KL), the KL once
    ids = order[8:15]
    with strategy.scope():
        mirrored = build_model("linear+rbf", data)
    seed = tf.constant([3, 11], tf.int32)
    parts = split_batch(make_batch(data, ids, dtype=np.float64), 2)
    ell = sum(float(mirrored.expected_log_likelihood({k: tf.constant(v) for k, v in p.items()}, 2, seed))
              for p in parts)
    by_hand = -(len(data) / len(ids) * ell - float(mirrored.prior_kl()))
    loss_2, applied, _ = gradient_probe(strategy, mirrored)(data, ids, [3, 11])
    report["rbf"] = {"by_hand": by_hand, "mirrored": loss_2, "kl": float(mirrored.prior_kl()),
                     "sub_batch_sizes": [len(p["lengths"]) for p in parts]}

    with open(out_path, "w") as handle:
        json.dump(report, handle)


def run_mirrored_training(out_path: str) -> None:
    from gpseq.training.distribute import make_strategy
    from gpseq.training.trainer import Trainer

    strategy = make_strategy("mirrored", 2)
    data = synthetic_data()
    report = {"replicas": strategy.num_replicas_in_sync}

    # 3. training: 2 replicas vs 1 device for 2 steps, then the 2-replica checkpoint resumed on 1 device
    single, at_two = build_model("linear", data), []
    Trainer(single, training_config(), callbacks=[
        lambda p: at_two.append(values(single)) if p.event == "step" and p.step == 2 else None]).fit(data)
    ckpt = out_path + ".ckpt"
    with strategy.scope():
        two = build_model("linear", data)
    Trainer(two, training_config(max_steps=2, checkpoint_every=2), strategy=strategy, checkpoint_dir=ckpt).fit(data)
    resumed = build_model("linear", data)
    state = Trainer(resumed, training_config(), checkpoint_dir=ckpt).fit(data, resume=True)
    report["training"] = {
        "steps": state.step,
        "two_vs_one_max_abs_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(values(two), at_two[0])),
        "resumed_vs_one_max_abs_diff": max(float(np.max(np.abs(a - b)))
                                           for a, b in zip(values(resumed), values(single))),
        "moved_max_abs": max(float(np.max(np.abs(a - b))) for a, b in zip(values(single), values(build_model("linear", data)))),
        "replicas_agree": all(np.array_equal(*[c.numpy() for c in v.values]) for v in two.trainable_variables),
    }
    report["svgp"] = svgp_mirrored_vs_one(strategy)
    report["svgp_natgrad"] = svgp_mirrored_vs_one(strategy, natgrad_gamma=0.5)
    with open(out_path, "w") as handle:
        json.dump(report, handle)


def svgp_mirrored_vs_one(strategy, natgrad_gamma=None) -> dict:
    """The trainer on an SVGP (Gaussian likelihood, closed-form ELBO): 2 replicas vs 1 device on the
    same global batches of 50, 50, 50, 50, 10 points (the last split 5 + 5); with `natgrad_gamma`,
    q(u) stepped by natural gradients from the all-reduced gradients."""
    import tensorflow as tf

    from gpseq.gp import RBF, SVGP, Gaussian
    from gpseq.training.trainer import Trainer

    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (210, 1))
    Y = np.sin(2 * X) + 0.1 * rng.standard_normal(X.shape)
    batches = tf.data.Dataset.from_tensor_slices((X, Y)).batch(50)

    def build():
        return SVGP(RBF(1.0, 1.5), Gaussian(0.5), np.linspace(-3, 3, 8)[:, None], num_data=210,
                    train_inducing=True)

    def losses(model, strategy=None):
        out = []
        Trainer(model, learning_rate=0.05, natgrad_gamma=natgrad_gamma, strategy=strategy,
                callbacks=[lambda p: out.append(p.loss) if p.event == "step" else None]).fit(batches, max_steps=10)
        return out

    single = build()
    single_losses = losses(single)
    with strategy.scope():
        mirrored = build()
    mirrored_losses = losses(mirrored, strategy)
    return {
        "loss_max_rel_diff": max(abs(a - b) / abs(a) for a, b in zip(single_losses, mirrored_losses)),
        "param_max_abs_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(values(single), values(mirrored))),
        "moved_max_abs": max(float(np.max(np.abs(a - b))) for a, b in zip(values(single), values(build()))),
        "steps": len(mirrored_losses),
    }


def run_training(out_path: str, checkpoint_dir: str) -> None:
    """Trains the small linear-kernel model for 2 epochs (8 steps); multiworker when TF_CONFIG is set."""
    from gpseq.training.distribute import make_strategy
    from gpseq.training.trainer import Trainer

    strategy = make_strategy("multiworker" if os.environ.get("TF_CONFIG") else "default")
    data = synthetic_data()
    with strategy.scope():
        model = build_model("linear", data)
    initial = values(model)
    trainer = Trainer(model, training_config(epochs=2, checkpoint_every=2), strategy=strategy,
                      checkpoint_dir=checkpoint_dir)
    state = trainer.fit(data)
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(values(model), initial))
    np.savez(out_path, *values(model), replicas=strategy.num_replicas_in_sync, steps=state.step,
             chief=trainer.is_chief, moved=moved)


if __name__ == "__main__":
    if sys.argv[1] == "mirrored-elbo":
        run_mirrored_elbo(sys.argv[2])
    elif sys.argv[1] == "mirrored-training":
        run_mirrored_training(sys.argv[2])
    else:
        run_training(sys.argv[2], sys.argv[3])
