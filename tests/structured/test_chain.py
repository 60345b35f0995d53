"""Linear-chain algorithms against brute-force enumeration of every label path (float64)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf
from scipy.special import logsumexp

from gpseq.errors import ConfigError
from gpseq.structured import chain

METHODS = ["scan", "parallel"]
TOL = 1e-9


# ---- brute force over all |V|^L paths of one sequence -----------------------------------------
def _paths(unary, pairwise, length):
    """All paths of one sequence and their scores (unary [T, V], pairwise [V, V])."""
    num_labels = unary.shape[-1]
    paths = list(itertools.product(range(num_labels), repeat=length))
    scores = np.array([
        sum(unary[t, p[t]] for t in range(length)) + sum(pairwise[p[t], p[t + 1]] for t in range(length - 1))
        for p in paths
    ])
    return paths, scores


def brute(unary, pairwise, length):
    """log Z, unary marginals [T, V], pair marginals [T-1, V, V], best path, best score."""
    T, V = unary.shape
    paths, scores = _paths(unary, pairwise, length)
    log_z = logsumexp(scores)
    probs = np.exp(scores - log_z)
    unary_marg = np.zeros((T, V))
    pair_marg = np.zeros((max(T - 1, 0), V, V))
    for path, p in zip(paths, probs):
        for t in range(length):
            unary_marg[t, path[t]] += p
        for t in range(length - 1):
            pair_marg[t, path[t], path[t + 1]] += p
    best = int(np.argmax(scores))
    best_path = np.zeros(T, np.int32)
    best_path[:length] = paths[best]
    return log_z, unary_marg, pair_marg, best_path, scores[best]


def brute_score(labels, unary, pairwise, length):
    return sum(unary[t, labels[t]] for t in range(length)) + sum(
        pairwise[labels[t], labels[t + 1]] for t in range(length - 1)
    )


def brute_pseudo(labels, unary, pairwise, length, form):
    """The pseudo-likelihoods from their definitions, one factor at a time."""
    total = 0.0
    for t in range(length):  # unary pieces: local softmax
        total += unary[t, labels[t]] - logsumexp(unary[t])
    for t in range(length - 1):
        i, j = labels[t], labels[t + 1]
        if form == "pwpl":  # each variable of the edge factor conditioned on the other
            total += pairwise[i, j] - logsumexp(pairwise[:, j])
            total += pairwise[i, j] - logsumexp(pairwise[i, :])
        else:  # the edge factor normalised over both of its variables
            total += pairwise[i, j] - logsumexp(pairwise)
    return total


def make_case(seed, batch=4, steps=5, labels=3, scale=1.0, lengths=None):
    rng = np.random.default_rng(seed)
    unary = rng.uniform(-scale, scale, size=(batch, steps, labels))
    pairwise = rng.uniform(-scale, scale, size=(labels, labels))
    if lengths is None:
        lengths = np.array([steps, 3, 1, 0][:batch], np.int32)
    gold = rng.integers(0, labels, size=(batch, steps)).astype(np.int32)
    gold[np.arange(steps)[None, :] >= lengths[:, None]] = -1  # padding must be ignored
    return unary, pairwise, lengths, gold


CASES = [
    dict(seed=0, steps=5, labels=3, scale=1.0),
    dict(seed=1, steps=4, labels=4, scale=5.0),
    dict(seed=2, steps=6, labels=3, scale=1e3),
    dict(seed=3, steps=4, labels=4, scale=1e3),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"T{c['steps']}V{c['labels']}s{c['scale']:g}")
@pytest.mark.parametrize("method", METHODS)
def test_against_enumeration(case, method):
    unary, pairwise, lengths, gold = make_case(**case)
    log_z = chain.log_partition(unary, pairwise, lengths, method=method).numpy()
    ll = chain.log_likelihood(gold, unary, pairwise, lengths, method=method).numpy()
    score = chain.sequence_score(gold, unary, pairwise, lengths).numpy()
    marg, pair = (m.numpy() for m in chain.marginals(unary, pairwise, lengths, method=method))
    only_unary = chain.unary_marginals(unary, pairwise, lengths, method=method).numpy()
    path, best = (v.numpy() for v in chain.viterbi(unary, pairwise, lengths))
    assert path.dtype == np.int32 and pair.shape == (len(lengths), case["steps"] - 1) + pairwise.shape
    for b, length in enumerate(lengths):
        ref_z, ref_marg, ref_pair, ref_path, ref_best = brute(unary[b], pairwise, length)
        ref_score = brute_score(gold[b], unary[b], pairwise, length)
        assert log_z[b] == pytest.approx(ref_z, abs=TOL, rel=TOL)
        assert score[b] == pytest.approx(ref_score, abs=TOL, rel=TOL)
        assert ll[b] == pytest.approx(ref_score - ref_z, abs=TOL, rel=TOL)
        np.testing.assert_allclose(marg[b], ref_marg, atol=TOL)
        np.testing.assert_allclose(only_unary[b], ref_marg, atol=TOL)
        np.testing.assert_allclose(pair[b], ref_pair, atol=TOL)
        np.testing.assert_array_equal(path[b], ref_path)
        assert best[b] == pytest.approx(ref_best, abs=TOL, rel=TOL)
        for form in chain.PSEUDO_FORMS:
            pseudo = chain.pseudo_log_likelihood(gold, unary, pairwise, lengths, form=form).numpy()
            ref = brute_pseudo(gold[b], unary[b], pairwise, length, form)
            assert pseudo[b] == pytest.approx(ref, abs=TOL, rel=TOL)


def test_length_zero_and_one():
    unary, pairwise, _, _ = make_case(4, batch=2, steps=3, labels=4, scale=3.0)
    lengths = np.array([0, 1], np.int32)
    labels = np.array([[-1, -1, -1], [2, -1, -1]], np.int32)
    assert chain.log_partition(unary, pairwise, lengths).numpy()[0] == 0.0
    assert chain.log_partition(unary, pairwise, lengths).numpy()[1] == pytest.approx(logsumexp(unary[1, 0]))
    for form in chain.PSEUDO_FORMS:  # one token: the local softmax, whatever the pairwise
        pseudo = chain.pseudo_log_likelihood(labels, unary, pairwise, lengths, form=form).numpy()
        assert pseudo[0] == 0.0
        assert pseudo[1] == pytest.approx(unary[1, 0, 2] - logsumexp(unary[1, 0]), abs=TOL)
    marg = chain.unary_marginals(unary, pairwise, lengths).numpy()
    np.testing.assert_allclose(marg[1, 0], np.exp(unary[1, 0] - logsumexp(unary[1, 0])), atol=TOL)
    assert not marg[0].any() and not marg[1, 1:].any()
    path, best = chain.viterbi(unary, pairwise, lengths)
    np.testing.assert_array_equal(path.numpy(), [[0, 0, 0], [np.argmax(unary[1, 0]), 0, 0]])
    assert best.numpy()[0] == 0.0


def test_single_step_batch():
    unary, pairwise, _, _ = make_case(5, batch=3, steps=1, labels=3)
    lengths = np.array([1, 0, 1], np.int32)
    for method in METHODS:
        log_z = chain.log_partition(unary, pairwise, lengths, method=method).numpy()
        np.testing.assert_allclose(log_z, [logsumexp(unary[0, 0]), 0.0, logsumexp(unary[2, 0])], atol=TOL)
    _, pair = chain.marginals(unary, pairwise, lengths)
    assert pair.shape == (3, 0, 3, 3)


@pytest.mark.parametrize("method", METHODS)
def test_padded_batch_equals_each_sequence_alone(method):
    unary, pairwise, lengths, gold = make_case(6, batch=4, steps=6, labels=4, scale=4.0)
    rng = np.random.default_rng(0)
    # garbage (huge, NaN) in the padding must not matter
    padded = unary.copy()
    pad = np.arange(6)[None, :] >= lengths[:, None]
    padded[pad] = rng.choice([1e30, -1e30, np.nan], size=(pad.sum(), 4))
    batch_z = chain.log_partition(padded, pairwise, lengths, method=method).numpy()
    batch_ll = chain.log_likelihood(gold, padded, pairwise, lengths, method=method).numpy()
    batch_marg, batch_pair = chain.marginals(padded, pairwise, lengths, method=method)
    batch_path, _ = chain.viterbi(padded, pairwise, lengths)
    for b, length in enumerate(lengths):
        alone = unary[b : b + 1, :length]
        one = np.array([length], np.int32)
        assert batch_z[b] == pytest.approx(chain.log_partition(alone, pairwise, one, method=method).numpy()[0], abs=TOL)
        assert batch_ll[b] == pytest.approx(
            chain.log_likelihood(gold[b : b + 1, :length], alone, pairwise, one, method=method).numpy()[0], abs=TOL
        )
        marg, pair = chain.marginals(alone, pairwise, one, method=method)
        np.testing.assert_allclose(batch_marg.numpy()[b, :length], marg.numpy()[0], atol=TOL)
        np.testing.assert_allclose(batch_pair.numpy()[b, : max(length - 1, 0)], pair.numpy()[0], atol=TOL)
        np.testing.assert_array_equal(batch_path.numpy()[b, :length], chain.viterbi(alone, pairwise, one)[0].numpy()[0])


@pytest.mark.parametrize("method", METHODS)
def test_gradients_match_enumerated_marginals_and_padding_gets_zero(method):
    unary, pairwise, lengths, gold = make_case(7, batch=4, steps=5, labels=3, scale=1e3)
    u, w = tf.constant(unary), tf.constant(pairwise)
    with tf.GradientTape() as tape:
        tape.watch([u, w])
        total = tf.reduce_sum(chain.log_partition(u, w, lengths, method=method))
    grad_u, grad_w = tape.gradient(total, [u, w])
    ref_u, ref_w = np.zeros_like(unary), np.zeros_like(pairwise)
    for b, length in enumerate(lengths):
        _, marg, pair, _, _ = brute(unary[b], pairwise, length)
        ref_u[b], ref_w = marg, ref_w + pair.sum(0)
    np.testing.assert_allclose(grad_u.numpy(), ref_u, atol=TOL)
    np.testing.assert_allclose(grad_w.numpy(), ref_w, atol=TOL)
    pad = np.arange(5)[None, :] >= lengths[:, None]
    assert np.all(grad_u.numpy()[pad] == 0.0)
    for fn in (
        lambda: chain.log_likelihood(gold, u, w, lengths, method=method),
        lambda: chain.pseudo_log_likelihood(gold, u, w, lengths),
    ):
        with tf.GradientTape() as tape:
            tape.watch([u, w])
            total = tf.reduce_sum(fn())
        g_u, g_w = tape.gradient(total, [u, w])
        assert np.all(g_u.numpy()[pad] == 0.0)
        assert np.isfinite(g_u.numpy()).all() and np.isfinite(g_w.numpy()).all()


@pytest.mark.parametrize("method", METHODS)
def test_gradients_match_finite_differences(method):
    unary, _, lengths, gold = make_case(8, batch=3, steps=4, labels=3, scale=2.0, lengths=np.array([4, 2, 1], np.int32))
    pairwise = np.random.default_rng(9).normal(size=(3, 3, 3))  # one matrix per sequence

    @tf.function
    def objective(u, w):
        return tf.reduce_sum(
            chain.log_likelihood(gold, u, w, lengths, method=method) * tf.constant([1.0, -0.7, 0.4], tf.float64)
        ) + tf.reduce_sum(chain.pseudo_log_likelihood(gold, u, w, lengths))

    theoretical, numerical = tf.test.compute_gradient(objective, [tf.constant(unary), tf.constant(pairwise)], delta=1e-5)
    for t, n in zip(theoretical, numerical):
        np.testing.assert_allclose(t, n, atol=1e-7)


@pytest.mark.parametrize("method", METHODS)
def test_sample_dimensions_and_pairwise_broadcasting(method):
    rng = np.random.default_rng(10)
    S, B, T, V = 2, 3, 4, 3
    unary = rng.normal(size=(S, B, T, V)) * 2
    lengths = np.array([4, 2, 0], np.int32)
    gold = rng.integers(0, V, size=(B, T)).astype(np.int32)
    per_sample = rng.normal(size=(S, 1, V, V))
    per_sequence = rng.normal(size=(B, V, V))
    per_both = rng.normal(size=(S, B, V, V))
    shared = rng.normal(size=(V, V))
    for pairwise, pick in [
        (shared, lambda s, b: shared),
        (per_sample, lambda s, b: per_sample[s, 0]),
        (per_sequence, lambda s, b: per_sequence[b]),
        (per_both, lambda s, b: per_both[s, b]),
    ]:
        log_z = chain.log_partition(unary, pairwise, lengths, method=method).numpy()
        ll = chain.log_likelihood(gold, unary, pairwise, lengths, method=method).numpy()
        marg, pair = (m.numpy() for m in chain.marginals(unary, pairwise, lengths, method=method))
        path, best = (v.numpy() for v in chain.viterbi(unary, pairwise, lengths))
        pseudo = chain.pseudo_log_likelihood(gold, unary, pairwise, lengths).numpy()
        assert log_z.shape == (S, B) and marg.shape == (S, B, T, V) and path.shape == (S, B, T)
        for s in range(S):
            for b in range(B):
                w = pick(s, b)
                ref_z, ref_marg, ref_pair, ref_path, ref_best = brute(unary[s, b], w, lengths[b])
                assert log_z[s, b] == pytest.approx(ref_z, abs=TOL)
                assert ll[s, b] == pytest.approx(brute_score(gold[b], unary[s, b], w, lengths[b]) - ref_z, abs=TOL)
                np.testing.assert_allclose(marg[s, b], ref_marg, atol=TOL)
                np.testing.assert_allclose(pair[s, b], ref_pair, atol=TOL)
                np.testing.assert_array_equal(path[s, b], ref_path)
                assert best[s, b] == pytest.approx(ref_best, abs=TOL)
                assert pseudo[s, b] == pytest.approx(brute_pseudo(gold[b], unary[s, b], w, lengths[b], "pwpl"), abs=TOL)
    # a leading dimension carried only by pairwise broadcasts the unaries
    log_z = chain.log_partition(unary[0], per_sample, lengths, method=method).numpy()
    assert log_z.shape == (S, B)
    assert log_z[1, 0] == pytest.approx(brute(unary[0, 0], per_sample[1, 0], 4)[0], abs=TOL)


@pytest.mark.parametrize("method", METHODS)
def test_xla_compiled_agrees(method):
    unary, pairwise, lengths, gold = make_case(11, batch=4, steps=6, labels=4, scale=1e3)
    per_sample = np.stack([pairwise, -pairwise])[:, None]  # [S, 1, V, V]
    unary = np.stack([unary, unary[::-1]])  # [S, B, T, V]

    def everything(u, w):
        with tf.GradientTape() as tape:
            tape.watch([u, w])
            ll = chain.log_likelihood(gold, u, w, lengths, method=method)
            total = tf.reduce_sum(ll)
        grads = tape.gradient(total, [u, w])
        marg, pair = chain.marginals(u, w, lengths, method=method)
        path, best = chain.viterbi(u, w, lengths) if method == "scan" else (None, None)
        outputs = [ll, *grads, marg, pair]
        if method == "scan":  # the method-independent ones once (XLA compilation dominates)
            outputs += [path, best, chain.pseudo_log_likelihood(gold, u, w, lengths)]
        return outputs

    args = [tf.constant(unary), tf.constant(per_sample)]
    eager = everything(*args)
    compiled = tf.function(everything, jit_compile=True)(*args)
    for e, c in zip(eager, compiled):
        np.testing.assert_allclose(c.numpy(), e.numpy(), atol=TOL, rtol=TOL)


def test_scan_and_parallel_agree_on_longer_sequences():
    rng = np.random.default_rng(12)
    B, T, V = 5, 37, 6
    unary = rng.normal(size=(B, T, V)) * 3
    pairwise = rng.normal(size=(V, V)) * 3
    lengths = np.array([37, 20, 1, 0, 33], np.int32)
    z_scan = chain.log_partition(unary, pairwise, lengths, method="scan").numpy()
    z_par = chain.log_partition(unary, pairwise, lengths, method="parallel").numpy()
    np.testing.assert_allclose(z_scan, z_par, rtol=1e-12)
    m_scan = chain.unary_marginals(unary, pairwise, lengths, method="scan").numpy()
    m_par = chain.unary_marginals(unary, pairwise, lengths, method="parallel").numpy()
    np.testing.assert_allclose(m_scan, m_par, atol=1e-10)
    np.testing.assert_allclose(m_scan.sum(-1), (np.arange(T)[None] < lengths[:, None]).astype(float), atol=1e-10)


def test_float32_follows_inputs_and_stays_finite_for_large_potentials():
    unary, pairwise, lengths, gold = make_case(13, batch=4, steps=6, labels=4, scale=1e3)
    u, w = tf.constant(unary, tf.float32), tf.constant(pairwise, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch([u, w])
        ll = chain.log_likelihood(gold, u, w, lengths)
        total = tf.reduce_sum(ll)
    grads = tape.gradient(total, [u, w])
    assert ll.dtype == tf.float32
    ref = chain.log_likelihood(gold, unary, pairwise, lengths).numpy()
    np.testing.assert_allclose(ll.numpy(), ref, rtol=1e-5, atol=1e-2)
    assert all(np.isfinite(g.numpy()).all() for g in grads)


def test_bad_arguments_raise_config_errors():
    unary, pairwise, lengths, _ = make_case(14)
    with pytest.raises(ConfigError):
        chain.log_partition(unary, pairwise, lengths, method="nope")
    with pytest.raises(ConfigError):
        chain.log_partition(unary, np.zeros((2, 2)), lengths)
    with pytest.raises(ConfigError):
        chain.pseudo_log_likelihood(np.zeros((4, 5), np.int32), unary, pairwise, lengths, form="nope")


def test_one_step_sequences_inside_a_compiled_function_with_dynamic_shapes():
    # T = 1 with a dynamic time axis: the scans over steps 1..T-1 must not be empty at run time
    rng = np.random.default_rng(3)
    unary = rng.standard_normal((3, 1, 4))
    pairwise = rng.standard_normal((4, 4))
    lengths = np.ones(3, np.int32)
    sig = [tf.TensorSpec([None, None, 4], tf.float64), tf.TensorSpec([4, 4], tf.float64),
           tf.TensorSpec([None], tf.int32)]
    marg = tf.function(lambda u, w, n: chain.unary_marginals(u, w, n), input_signature=sig)(unary, pairwise, lengths)
    path = tf.function(lambda u, w, n: chain.viterbi(u, w, n)[0], input_signature=sig)(unary, pairwise, lengths)
    log_z = tf.function(lambda u, w, n: chain.log_partition(u, w, n), input_signature=sig)(unary, pairwise, lengths)
    # one step: p(y) = softmax(u), log Z = logsumexp(u), Viterbi = argmax(u)
    expected = np.exp(unary - unary.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(marg.numpy(), expected, atol=1e-12)
    np.testing.assert_array_equal(path.numpy(), unary.argmax(-1))
    np.testing.assert_allclose(log_z.numpy(), np.log(np.exp(unary[:, 0]).sum(-1)), atol=1e-12)
