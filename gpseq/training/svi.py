"""The training of every model but the default one: stochastic variational inference of a
`StructuredGP` (the ELBO by Adam, optionally natural gradients) with the `Trainer`, early stopping
on the dev split, checkpoints and `tf.distribute` — what the training (`gpseq.training.train`) runs
when `TaggerConfig.resolved_method()` is "svi" (the default model trains by `training.laplace`)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def train_svi(config, featurizer, num_labels: int, data, *, dev_metrics=None, callbacks=None,
              checkpoint_dir=None, resume: bool = False):
    """(model, scores): the `StructuredGP` of `config` over `num_labels` labels fitted by SVI on the
    featurised training sentences `data` (`SequenceData`), with K-means inducing inputs when the
    model has them, and its training state as `scores` (steps, best dev score and step, skipped
    steps, history). `dev_metrics(model)`: the function that evaluates the model on the dev
    sentences (the evaluation report's `to_dict`), for early stopping; None: no dev sentences."""
    from gpseq import _tensorflow

    tf = _tensorflow.load()

    from gpseq.gp.inducing import kmeans_inducing
    from gpseq.structured.model import build_structured_gp
    from gpseq.training.distribute import make_strategy
    from gpseq.training.trainer import Trainer

    tcfg = config.training
    dtype = tf.float32 if config.dtype == "float32" else tf.float64
    inducing = None
    if config.model.has_inducing:
        M = min(config.model.num_inducing, data.rows.shape[0])
        rows = data.rows if sp.issparse(data.rows) else data.rows.to_scipy()  # K-means runs on SciPy's CSR
        inducing = kmeans_inducing(rows, M, seed=tcfg.seed, snap=True)
        inducing = inducing[0] if isinstance(inducing, tuple) else inducing
        inducing = inducing.toarray() if sp.issparse(inducing) else np.asarray(inducing)
    # a sentence longer than a batch may hold is trained as consecutive pieces (memory bounded
    # by batch_tokens; the transitions across a cut are left out of the likelihood)
    data = data.cut_long(tcfg.batch_tokens)
    tf.random.set_seed(tcfg.seed)
    strategy = make_strategy(tcfg.strategy, tcfg.devices)  # variables are created in its scope
    with strategy.scope():
        model = build_structured_gp(config.model, featurizer.n_features, num_labels, inducing, dtype,
                                    num_data=len(data), num_samples=tcfg.num_samples)
    dev_evaluation = dev_metrics(model) if dev_metrics is not None else None

    def evaluate():  # (score to maximise, metrics) on dev, for early stopping
        metrics = dev_evaluation()
        if tcfg.early_stopping == "nll":
            return -metrics["token_nll"], metrics
        f1 = metrics.get("chunk_f1")
        return (f1 if f1 is not None else metrics["token_accuracy"]), metrics

    trainer = Trainer(model, tcfg, evaluate=evaluate if dev_evaluation is not None else None, callbacks=callbacks,
                      checkpoint_dir=checkpoint_dir, strategy=strategy)
    state = trainer.fit(data, resume=resume)
    scores = {
        "steps": state.step,
        "best_dev_score": state.best_score,
        "best_step": state.best_step,
        "skipped_steps": state.skipped_steps,
        "stopped_early": state.stopped_early,
        "history": state.history,
    }
    return model, scores
