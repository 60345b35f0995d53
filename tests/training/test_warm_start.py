"""Warm starts (gpseq/training/warm_start.py): a previous tagger's weights mapped by feature name and
label, and `Tagger.train(init=...)` as the next round of active learning."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.active import trained  # noqa: F401


def test_warm_start_maps_weights_by_feature_name_and_label(trained):
    from gpseq.features import Featurizer, get_preset
    from gpseq.training.warm_start import map_start, previous_arrays

    tagger, train = trained
    featurizer = Featurizer(get_preset("chunking")).fit(train[60:200])  # other features, other column order
    labels = sorted({label for s in train[60:200] for label in s.labels}, reverse=True)  # other label order
    start = map_start(tagger, featurizer, labels)
    state = previous_arrays(tagger)
    old_column = {name: i for i, name in enumerate(tagger.featurizer.feature_names())}
    dense = start.dense(start.weights)
    checked = 0
    for j, name in enumerate(featurizer.feature_names()):
        for v, label in enumerate(labels):
            i, u = old_column.get(name), tagger.label_index.get(label)
            expected = 0.0 if i is None or u is None else state["var:linear/q_mu"][i, u]
            assert dense[j, v] == pytest.approx(expected)
            checked += expected != 0
    assert checked > 100
    for v, label in enumerate(labels):
        u = tagger.label_index.get(label)
        assert start.bias[v] == pytest.approx(0.0 if u is None else state["var:label_bias"][u])


def test_train_with_init_is_a_warm_started_round(trained):
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger, TaggerConfig

    tagger, train = trained
    config = TaggerConfig(features=get_preset("chunking"))
    warm = Tagger.train(train[:160], config, init=tagger)
    assert warm.scores["warm_start"] and warm.scores["train_sentences"] == 160
    assert len(warm.scores["lbfgs_iterations"]) == 1
    # the saved configuration is the user's, its decode "auto" resolved to the previous tagger's decoder
    # (kept with its calibration)
    assert {**warm.config.to_dict(), "decode": "auto"} == config.to_dict()
    assert warm.config.decode == tagger.config.decode == warm.scores["decode"] != "auto"
    from gpseq.training.warm_start import previous_arrays

    assert float(previous_arrays(warm)["var:temperature"]) == pytest.approx(
        float(previous_arrays(tagger)["var:temperature"]))
    # and its unseen features' scale: column 0's variance (σ² β / α, the same for every label) carried over
    name = "var:linear/q_variance/_pretransformed_input"
    np.testing.assert_allclose(previous_arrays(warm)[name][0], previous_arrays(tagger)[name][0, 0], rtol=1e-6)
    accuracy = np.mean([p == g for t, s in zip(warm.tag(train[160:200]), train[160:200])
                        for p, g in zip(t.labels, s.labels)])
    assert accuracy > 0.8
