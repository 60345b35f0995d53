"""Training from partial annotation (tokens labelled `?`): the constrained chain and the corpus
objective against brute-force enumeration of label paths, the readers, evaluation's skip-and-count,
the refusal of SVI, and the `gpseq` command line end to end."""

from __future__ import annotations

import itertools
import json
import sys

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import logsumexp

from helpers import ROOT, SAMPLE

from gpseq.corpora import UNLABELLED, Sentence, read_conll, read_corpus, write_conll
from gpseq.errors import ConfigError, GpseqError, InputFormatError
from gpseq.structured.numpy_chain import TimeMajor
from gpseq.training.batching import UNLABELLED_ID, SequenceData
from gpseq.training.chain_objective import CHUNK_TOKENS, MEMORY_TOKENS, NumpyChainObjective, chunk_bounds



def _paths(T: int, V: int) -> np.ndarray:
    return np.array(list(itertools.product(range(V), repeat=T)))  # [V^T, T]


def _scores(paths, unary, pairwise):
    """Σ_t u_t[y_t] + Σ_t P[y_t, y_{t+1}] of every path (brute force)."""
    T = unary.shape[0]
    return unary[np.arange(T), paths].sum(1) + pairwise[paths[:, :-1], paths[:, 1:]].sum(1)


def _consistent(paths, labels):
    """Which paths agree with `labels [T]` wherever a label is given (≥ 0)."""
    given = labels >= 0
    return np.all(~given | (paths == labels), axis=1)


@pytest.mark.parametrize("seed,scale", [(0, 2.0), (1, 2.0), (2, 2.0), (3, 30.0)])
def test_constrained_forward_backward_equals_enumeration_of_the_allowed_paths(seed, scale):
    rng = np.random.default_rng(seed)
    V = 3
    lengths = np.array([5, 3, 1, 4, 2])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    unary = rng.normal(size=(offsets[-1], V)) * scale
    pairwise = rng.normal(size=(V, V)) * scale / 2
    allowed = rng.random((offsets[-1], V)) < 0.6
    allowed[np.arange(len(allowed)), rng.integers(V, size=len(allowed))] = True  # ≥ 1 allowed label a token
    allowed[offsets[0]:offsets[1]] = True  # one sentence unconstrained: the plain chain
    layout = TimeMajor(offsets)
    marg, pair_sum, log_z = layout.constrained_forward_backward(unary[layout.order], pairwise, allowed[layout.order])
    expected_marg = np.zeros_like(unary)
    expected_pairs = np.zeros((V, V))
    expected_log_z = []
    for s, T in enumerate(lengths):
        u, mask = unary[offsets[s]:offsets[s + 1]], allowed[offsets[s]:offsets[s + 1]]
        paths = _paths(T, V)
        keep = mask[np.arange(T), paths].all(1)
        paths, scores = paths[keep], _scores(paths[keep], u, pairwise)
        expected_log_z.append(logsumexp(scores))
        probs = np.exp(scores - expected_log_z[-1])
        for t in range(T):
            expected_marg[offsets[s] + t] = np.bincount(paths[:, t], weights=probs, minlength=V)
        for t in range(T - 1):
            np.add.at(expected_pairs, (paths[:, t], paths[:, t + 1]), probs)
    mine = np.empty_like(marg)
    mine[layout.order] = marg  # back to corpus order
    np.testing.assert_allclose(mine, expected_marg, atol=1e-11)
    np.testing.assert_allclose(pair_sum, expected_pairs, atol=1e-11)
    np.testing.assert_allclose(log_z, np.array(expected_log_z)[layout.sentences], rtol=1e-12)
    assert np.all(mine[~allowed] == 0.0)


def test_constrained_chain_of_a_one_hot_mask_is_the_gold_path_and_a_token_needs_an_allowed_label():
    rng = np.random.default_rng(3)
    V, offsets = 4, np.array([0, 6, 9])
    unary, pairwise = rng.normal(size=(9, V)), rng.normal(size=(V, V))
    labels = rng.integers(V, size=9)
    layout = TimeMajor(offsets)
    one_hot = np.eye(V, dtype=bool)[labels]
    marg, _, log_z = layout.constrained_forward_backward(unary[layout.order], pairwise, one_hot[layout.order])
    for s in range(2):  # log Z over one path = that path's score
        y = labels[offsets[s]:offsets[s + 1]]
        score = unary[np.arange(offsets[s], offsets[s + 1]), y].sum() + pairwise[y[:-1], y[1:]].sum()
        assert log_z[list(layout.sentences).index(s)] == pytest.approx(score, rel=1e-12)
    np.testing.assert_allclose(marg, one_hot[layout.order], atol=1e-12)
    one_hot[4] = False
    with pytest.raises(ValueError, match="at least one allowed label"):
        layout.constrained_forward_backward(unary[layout.order], pairwise, one_hot[layout.order])


def _corpus(rng, lengths, V=3, D=9, hidden=0.5):
    """Sequences of binary feature rows (2-3 active features a token) and random labels, each
    hidden (`UNLABELLED_ID`) with probability `hidden`."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    rows = np.zeros((offsets[-1], D))
    for t in range(offsets[-1]):
        rows[t, rng.choice(np.arange(1, D), size=int(rng.integers(2, 4)), replace=False)] = 1.0
    labels = rng.integers(V, size=offsets[-1]).astype(np.int32)
    labels[rng.random(offsets[-1]) < hidden] = UNLABELLED_ID
    return SequenceData(sp.csr_matrix(rows), offsets, labels)


def _enumerated_objective(data, V, b, w_dense, p):
    """−Σ_n log p(observed labels_n | x_n) and its gradient (b, W [D, V], P) by enumerating every
    path of every sentence: E_p[φ] − E_{p|observed}[φ] of the sufficient statistics φ."""
    D = data.rows.shape[1]
    rows = data.rows.toarray()
    value, g_b, g_w, g_p = 0.0, np.zeros(V), np.zeros((D, V)), np.zeros((V, V))
    for s in range(len(data)):
        x, y = rows[data.offsets[s]:data.offsets[s + 1]], data.label_ids[data.offsets[s]:data.offsets[s + 1]]
        paths = _paths(len(y), V)
        scores = _scores(paths, b + x @ w_dense, p)
        keep = _consistent(paths, y)
        value += logsumexp(scores) - logsumexp(scores[keep])
        model = np.exp(scores - logsumexp(scores))  # p(path | x)
        observed = np.where(keep, np.exp(scores - logsumexp(scores[keep])), 0.0)  # p(path | x, observed labels)
        onehot = np.eye(V)[paths]  # [P, T, V]
        for weights in (model, -observed):
            g_b += np.einsum("p,ptv->v", weights, onehot)
            g_w += np.einsum("td,p,ptv->dv", x, weights, onehot)
            for t in range(len(y) - 1):
                np.add.at(g_p, (paths[:, t], paths[:, t + 1]), weights)
    return value, g_b, g_w, g_p


@pytest.mark.parametrize("seed,hidden,chunk_tokens,memory_tokens", [
    (0, 0.5, CHUNK_TOKENS, MEMORY_TOKENS), (1, 0.3, CHUNK_TOKENS, MEMORY_TOKENS), (2, 0.8, CHUNK_TOKENS, MEMORY_TOKENS),
    (0, 0.5, 7, MEMORY_TOKENS), (1, 0.3, 1, MEMORY_TOKENS), (2, 0.8, 7, 7), (0, 0.5, CHUNK_TOKENS, 0)])
def test_partial_annotation_objective_and_gradient_equal_enumeration_over_the_unlabelled_tokens(
        seed, hidden, chunk_tokens, memory_tokens, tmp_path):
    """Also summed over chunks of the corpus (`chunk_tokens` 7: runs of sentences; 1: a chunk per
    sentence, the longer ones over the budget), some or all of them written to disk and mapped back
    (`memory_tokens` 7: the first chunk in memory, the rest spilled; 0: every chunk spilled)."""
    rng = np.random.default_rng(seed)
    V = 3
    data = _corpus(rng, np.array([5, 3, 1, 4, 2, 5, 3]), V=V, hidden=hidden)
    data.label_ids[data.offsets[1]:data.offsets[2]] = UNLABELLED_ID  # a sentence without any label: term 0
    objective = NumpyChainObjective(data, V, dtype="float64", chunk_tokens=chunk_tokens, memory_tokens=memory_tokens,
                                    spill_dir=tmp_path)
    kept = data.subset(np.flatnonzero(np.add.reduceat((data.label_ids >= 0).astype(int), data.offsets[:-1]) > 0))
    assert len(objective.chunks) == len(chunk_bounds(kept.offsets, chunk_tokens)) > (chunk_tokens < 10)
    assert objective.spilled == {MEMORY_TOKENS: 0, 7: len(objective.chunks) - 1, 0: len(objective.chunks)}[memory_tokens]
    assert len(list(tmp_path.iterdir())) == (objective.spilled > 0)  # one directory of the objective's own
    support = objective.support
    b, p = rng.normal(size=V), rng.normal(size=(V, V))
    w_dense = np.zeros(data.rows.shape[1] * V)
    w_dense[support] = rng.normal(size=len(support))
    w_dense = w_dense.reshape(-1, V)
    value, g_b, g_w, g_p = objective.value_and_grad(b, w_dense.ravel()[support], p)
    expected = _enumerated_objective(data, V, b, w_dense, p)
    assert value == pytest.approx(expected[0], rel=1e-10)
    np.testing.assert_allclose(g_b, expected[1], atol=1e-9)
    np.testing.assert_allclose(g_w, expected[2].ravel()[support], atol=1e-9)
    np.testing.assert_allclose(g_p, expected[3], atol=1e-9)
    # the support: the (feature, label) pairs of the labelled tokens only
    rows, labels = data.rows.toarray(), data.label_ids
    seen = {(f, labels[t]) for t in range(len(labels)) if labels[t] >= 0 for f in np.flatnonzero(rows[t])}
    assert sorted(f * V + v for f, v in seen) == support.tolist()
    assert objective.n_tokens == int((labels >= 0).sum())
    assert objective.fisher(b, w_dense.ravel()[support], p)[0] == pytest.approx(
        NumpyChainObjective(data, V, dtype="float64").fisher(b, w_dense.ravel()[support], p)[0], rel=1e-12)
    objective.close()
    assert list(tmp_path.iterdir()) == []  # the spilled chunks deleted with the objective


def test_fully_labelled_corpus_gives_the_exact_chain_likelihood_and_unlabelled_sentences_add_nothing():
    rng = np.random.default_rng(4)
    V = 3
    full = _corpus(rng, np.array([5, 3, 1, 4]), V=V, hidden=0.0)
    objective = NumpyChainObjective(full, V, dtype="float64")
    assert len(objective.chunks) == 1 and objective.chunks[0].partial_layout is None and not objective.spilled
    support = objective.support
    b, p = rng.normal(size=V), rng.normal(size=(V, V))
    w = rng.normal(size=len(support))
    w_dense = np.zeros(full.rows.shape[1] * V)
    w_dense[support] = w
    value, g_b, g_w, g_p = objective.value_and_grad(b, w, p)
    expected = _enumerated_objective(full, V, b, w_dense.reshape(-1, V), p)  # −log p(y | x), exact
    assert value == pytest.approx(expected[0], rel=1e-12)
    np.testing.assert_allclose(g_w, expected[2].ravel()[support], atol=1e-10)
    # the formula of the fully labelled objective, term by term: log Z − gold score
    layout = objective.chunks[0].layout
    unary = full.rows[layout.order] @ w_dense.reshape(-1, V) + b  # X in the chunk's time-major order
    marg, pair_sum, log_z = layout.forward_backward(unary, p)
    labels = full.label_ids[layout.order]
    gold = unary[np.arange(len(labels)), labels].sum() + np.sum(layout.transition_counts(labels, V) * p)
    assert value == log_z.sum() - gold  # the same operations as before partial annotation: bit for bit
    # appending a sentence without any label changes neither value nor gradient
    extra = _corpus(rng, np.array([4]), V=V, hidden=1.0)
    both = SequenceData(sp.vstack([full.rows, extra.rows], format="csr"),
                        np.concatenate([full.offsets, full.offsets[-1] + extra.offsets[1:]]),
                        np.concatenate([full.label_ids, extra.label_ids]))
    again = NumpyChainObjective(both, V, dtype="float64").value_and_grad(b, w, p)
    assert again[0] == value
    for mine, reference in zip(again[1:], (g_b, g_w, g_p)):
        np.testing.assert_array_equal(mine, reference)


def test_objective_refuses_unknown_labels_and_a_corpus_without_labels():
    rng = np.random.default_rng(5)
    data = _corpus(rng, np.array([3, 2]), hidden=0.0)
    data.label_ids[1] = -1
    with pytest.raises(ValueError, match="known or marked unlabelled"):
        NumpyChainObjective(data, 3)
    data.label_ids[:] = UNLABELLED_ID
    with pytest.raises(ValueError, match="at least one labelled token"):
        NumpyChainObjective(data, 3)


# ---- input ----------------------------------------------------------------------------------
def test_conll_question_mark_and_jsonl_null_empty_missing_labels_read_as_unlabelled(tmp_path):
    conll = tmp_path / "partial.conll"
    conll.write_text("The DT B-NP\ncat NN ?\nsat VBD B-VP\n\nDogs NNS ?\n\n", encoding="utf-8")
    sentences = read_corpus(conll)
    assert sentences[0].labels == ["B-NP", UNLABELLED, "B-VP"] and not sentences[0].fully_labelled
    assert sentences[1].labels == [UNLABELLED]
    jsonl = tmp_path / "partial.jsonl"
    jsonl.write_text('{"tokens": ["The", "cat", "sat"], "labels": ["B-NP", null, ""], "confidences": [1, 1, 1]}\n'
                     '\n{"tokens": ["Dogs", "bark"]}\n'
                     '{"tokens": ["Birds"], "labels": ["?"]}\n'
                     '{"tokens": ["Yes"], "labels": ["O"], "columns": [["Yes", "UH"]]}\n', encoding="utf-8")
    sentences = read_corpus(jsonl)
    assert [s.labels for s in sentences] == [["B-NP", "?", "?"], ["?", "?"], ["?"], ["O"]]
    assert [s.line for s in sentences] == [1, 3, 4, 5] and sentences[3].fully_labelled
    assert sentences[0].columns == [["The"], ["cat"], ["sat"]] and sentences[3].columns == [["Yes", "UH"]]
    assert read_corpus(jsonl, labelled=False)[0].labels is None
    for text, problem in (('{"tokens": ["a", "b"], "labels": ["O"]}', "one label per token"),
                          ('{"tokens": []}', "non-empty list"),
                          ('["a"]', "JSON object"),
                          ('{"tokens": ["a"], "labels": ["B NP"]}', "without white space"),
                          ('{"tokens": ["a"]', "not JSON"),
                          ('{"tokens": ["a"], "columns": [["b", "NN"]]}', "the token first")):
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"tokens": ["ok"], "labels": ["O"]}\n' + text + "\n", encoding="utf-8")
        with pytest.raises(InputFormatError, match=rf"bad.jsonl:2: .*{problem}"):
            read_corpus(bad)


def test_evaluate_leaves_out_and_counts_sentences_with_unlabelled_gold_tokens():
    from gpseq.evaluation.evaluate import evaluate

    labels = ["B-NP", "I-NP", "O"]
    gold = [["B-NP", "I-NP", "O"], ["B-NP", "?"], ["O", "B-NP"]]
    predicted = [["B-NP", "O", "O"], ["B-NP", "I-NP"], ["O", "B-NP"]]
    rng = np.random.default_rng(0)
    probabilities = [rng.dirichlet(np.ones(3), size=len(s)) for s in gold]
    logp = [-1.0, -2.0, -0.5]
    report = evaluate(gold, predicted, labels=labels, probabilities=probabilities, sequence_log_probs=logp)
    keep = [0, 2]
    # independent reference: the same metrics by hand on the two fully labelled sentences
    flat_gold = [g for i in keep for g in gold[i]]
    flat_pred = [p for i in keep for p in predicted[i]]
    flat_p = np.concatenate([probabilities[i] for i in keep])
    assert report.n_sentences == 2 and report.n_tokens == 5
    assert report.n_skipped_sentences == 1 and report.n_skipped_tokens == 2
    assert report.token_accuracy == pytest.approx(np.mean([g == p for g, p in zip(flat_gold, flat_pred)]))
    nll = -np.mean(np.log([flat_p[t, labels.index(g)] for t, g in enumerate(flat_gold)]))
    assert report.token_nll == pytest.approx(nll)
    assert report.seq_nll == pytest.approx(0.75)
    assert report.chunk_f1 == pytest.approx(2 * 1 / (2 + 2))  # gold chunks 2, predicted 2, correct 1
    with pytest.raises(GpseqError, match="no sentence to evaluate on"):
        evaluate([gold[1]], [predicted[1]])


# ---- training -------------------------------------------------------------------------------
def _hide(sentences, share, seed):
    """The sentences with each token's label replaced by `?` with probability `share` (seeded)."""
    rng = np.random.default_rng(seed)
    out = []
    for sentence in sentences:
        labels = [UNLABELLED if rng.random() < share else label for label in sentence.labels]
        out.append(Sentence(sentence.tokens, labels, [[*row[:-1], label] for row, label in
                                                      zip(sentence.columns, labels)], sentence.source, sentence.line))
    return out


def test_svi_refuses_partial_labels_with_one_line_naming_the_file_and_line():
    from gpseq.tagger import Tagger, TaggerConfig

    train = _hide(read_conll(SAMPLE / "train.conll")[:20], 0.3, 0)
    config = TaggerConfig()
    config.training.method = "svi"
    with pytest.raises(ConfigError, match=r"train.conll:\d+: tokens labelled '\?' .*method laplace.*svi"):
        Tagger.train(train, config)
    everything_hidden = _hide(read_conll(SAMPLE / "train.conll")[:20], 1.0, 0)
    with pytest.raises(GpseqError, match="no labelled token"):
        Tagger.train(everything_hidden, TaggerConfig())


def test_half_the_labels_hidden_beats_the_fully_labelled_sentences_alone_on_the_sample_corpus():
    """Half of the training tokens' labels hidden: 30 % of the sentences keep every label, the others
    lose each label with probability 0.7 (hiding tokens uniformly at random would leave no fully
    labelled sentence at all on this corpus). The partial-annotation likelihood, which also learns
    from the labelled tokens of the partial sentences, tags the held-out test.conll more accurately
    than a model of the fully labelled sentences alone (measured: 0.977 vs 0.958; seeds 1 and 2:
    0.982 vs 0.966, 0.971 vs 0.961); accuracy by a hand count against the gold labels."""
    from gpseq.tagger import Tagger, TaggerConfig

    rng = np.random.default_rng(0)
    train = read_conll(SAMPLE / "train.conll")
    keep = rng.random(len(train)) < 0.3
    train = [s if kept else _hide([s], 0.7, seed)[0] for seed, (s, kept) in enumerate(zip(train, keep))]
    hidden = np.mean([label == UNLABELLED for s in train for label in s.labels])
    full_only = [s for s in train if s.fully_labelled]
    assert 0.45 < hidden < 0.55 and len(full_only) >= keep.sum()
    test = read_conll(SAMPLE / "test.conll")

    def accuracy(tagger):
        tagged = tagger.tag(test)
        return np.mean([g == p for s, t in zip(test, tagged) for g, p in zip(s.labels, t.labels)])

    partial = Tagger.train(train, TaggerConfig())
    assert UNLABELLED not in partial.labels
    assert accuracy(partial) > accuracy(Tagger.train(full_only, TaggerConfig())) + 0.005


def test_cli_trains_on_question_mark_labels_saves_tags_and_evaluates_skipping_them(tmp_path):
    from typer.testing import CliRunner

    sys.path.insert(0, str(ROOT))
    import cli

    train = _hide(read_conll(SAMPLE / "train.conll")[:120], 0.4, 2)
    write_conll(tmp_path / "train.conll", train)
    dev = _hide(read_conll(SAMPLE / "dev.conll")[:20], 0.2, 3)
    write_conll(tmp_path / "dev.conll", dev)
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(cli.app, [str(a) for a in args], catch_exceptions=False)

    result = invoke("train", tmp_path / "train.conll", "-o", tmp_path / "model")
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "model" / "tagger.json").read_text())
    hidden = sum(label == UNLABELLED for s in train for label in s.labels)
    assert meta["scores"]["unlabelled_tokens"] == hidden and f"{hidden:,} of" in result.stdout
    expected = sorted({label for s in train for label in s.labels} - {"?"})
    assert UNLABELLED not in meta["labels"] and set(meta["labels"]) <= set(expected)  # (the dev split keeps some)
    result = invoke("tag", tmp_path / "model", SAMPLE / "test.conll", "--input-format", "conll")
    assert result.exit_code == 0, result.output
    lines = [line.split("\t") for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == sum(len(s) for s in read_conll(SAMPLE / "test.conll"))
    assert {fields[1] for fields in lines} <= set(expected)
    result = invoke("evaluate", tmp_path / "model", tmp_path / "dev.conll", "--json")
    assert result.exit_code == 0, result.output
    partial = [s for s in dev if not s.fully_labelled]
    assert 0 < len(partial) < len(dev)
    assert f"{len(partial)} sentence(s)" in result.stderr and "left out" in result.stderr
    metrics = json.loads(result.stdout)
    assert metrics["n_skipped_sentences"] == len(partial)
    assert metrics["n_sentences"] == len(dev) - len(partial)
    # --dev with ? labels and a --set method that cannot take them
    result = invoke("train", tmp_path / "train.conll", "-o", tmp_path / "svi", "--set", "training.method=\"svi\"")
    assert result.exit_code != 0
    assert "partial annotation" in result.stderr and "train.conll:" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_chunk_bounds_cover_the_corpus_in_runs_within_the_budget():
    offsets = np.concatenate([[0], np.cumsum([5, 3, 1, 4, 2, 9, 3])])
    assert chunk_bounds(offsets, 7) == [(0, 1), (1, 3), (3, 5), (5, 6), (6, 7)]
    assert chunk_bounds(offsets, 9) == [(0, 3), (3, 5), (5, 6), (6, 7)]
    assert chunk_bounds(offsets, 100) == [(0, 7)]
    assert chunk_bounds(np.array([0]), 5) == []


def test_chunked_fisher_equals_the_whole_corpus_fisher():
    rng = np.random.default_rng(5)
    V = 3
    data = _corpus(rng, np.array([5, 3, 1, 4, 2, 5, 3]), V=V, hidden=0.3)
    whole = NumpyChainObjective(data, V, dtype="float64")
    chunked = NumpyChainObjective(data, V, dtype="float64", chunk_tokens=4)
    assert len(chunked.chunks) > 3 and np.array_equal(whole.support, chunked.support)
    b, p, w = rng.normal(size=V), rng.normal(size=(V, V)), rng.normal(size=len(whole.support))
    for mine, reference in zip(chunked.fisher(b, w, p), whole.fisher(b, w, p)):
        np.testing.assert_allclose(mine, reference, rtol=1e-12, atol=1e-12)


def test_an_extended_objective_equals_the_objective_of_the_concatenated_corpus(tmp_path):
    """`extended` (the refit on train + dev) shares the first objective's chunks, spilled or not."""
    rng = np.random.default_rng(6)
    V = 3
    first = _corpus(rng, np.array([5, 3, 1, 4, 2]), V=V, hidden=0.3)
    second = _corpus(rng, np.array([4, 6, 2]), V=V, hidden=0.0)
    both = SequenceData(sp.vstack([first.rows, second.rows], format="csr"),
                        np.concatenate([first.offsets, first.offsets[-1] + second.offsets[1:]]),
                        np.concatenate([first.label_ids, second.label_ids]))
    reference = NumpyChainObjective(both, V, dtype="float64")
    base = NumpyChainObjective(first, V, dtype="float64", chunk_tokens=6, memory_tokens=6, spill_dir=tmp_path)
    extended = base.extended(second)
    assert base.spilled > 0 and extended.spilled > base.spilled
    assert np.array_equal(extended.support, reference.support) and extended.n_tokens == reference.n_tokens
    b, p, w = rng.normal(size=V), rng.normal(size=(V, V)), rng.normal(size=len(reference.support))
    for mine, expected in zip(extended.value_and_grad(b, w, p) + extended.fisher(b, w, p),
                              reference.value_and_grad(b, w, p) + reference.fisher(b, w, p)):
        np.testing.assert_allclose(mine, expected, rtol=1e-12, atol=1e-12)
    assert np.isfinite(base.value_and_grad(b, np.zeros(len(base.support)), p)[0])  # still usable
    extended.close()
    assert list(tmp_path.iterdir()) == []


def test_a_carved_dev_split_that_would_take_every_labelled_sentence_is_not_carved():
    # 1 labelled sentence and 9 all-? ones, the labelled one where the default dev split falls:
    # training on the other 9 would have no labelled token, so there is no dev split
    from gpseq import Tagger
    from gpseq.config import TaggerConfig
    from gpseq.corpora import Sentence
    from gpseq.corpora.splits import train_dev_split
    from gpseq.features import get_preset

    config = TaggerConfig(features=get_preset("ner"))
    sentences = [Sentence([f"w{i}", f"x{i}"], ["?", "?"]) for i in range(10)]
    dev_ids = train_dev_split(len(sentences), config.training.dev_fraction, seed=config.training.seed,
                              max_dev=config.training.dev_max_sentences)[1]
    assert len(dev_ids) == 1
    sentences[int(dev_ids[0])] = Sentence(["the", "cat"], ["B-NP", "I-NP"])
    tagger = Tagger.train(sentences, config)
    assert tagger.labels == ["B-NP", "I-NP"]
    assert tagger.scores["dev_sentences"] == 0 and tagger.scores["train_sentences"] == 10
