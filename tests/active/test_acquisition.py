"""Active learning (`gpseq.active.selection`): every score against its definition by brute-force enumeration
of the label paths of tiny chains, the ranking's determinism, and the annotation-tool outputs
against the fields Prodigy and Label Studio document."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from gpseq.active.acquisition import (chain_entropies, chain_scores, chain_token_marginals, combine,
                                      mixture_path_log_probs, sample_paths)
from gpseq.structured.spans import ChainPosterior


def random_chains(R=4, B=3, T=4, V=3, seed=0, lengths=None, spread=1.5):
    rng = np.random.default_rng(seed)
    base_u, base_w = rng.normal(size=(B, T, V)), rng.normal(size=(V, V))
    unary = base_u[None] + spread * rng.normal(size=(R, B, T, V))
    pairwise = base_w[None] + spread * rng.normal(size=(R, V, V))
    weights = rng.dirichlet(np.ones(R)) if R > 1 else None
    lengths = np.array(lengths if lengths is not None else [T, T - 1, 1][:B])
    return ChainPosterior(unary, pairwise, lengths, weights), unary, pairwise, lengths


def enumerate_chain(unary, pairwise, L):
    """{path: p(path)} of one chain over its first L tokens, by enumeration."""
    V = unary.shape[-1]
    paths = list(itertools.product(range(V), repeat=L))
    scores = np.array([sum(unary[t, y[t]] for t in range(L)) + sum(pairwise[y[t], y[t + 1]] for t in range(L - 1))
                       for y in paths])
    probs = np.exp(scores - scores.max())
    return dict(zip(paths, probs / probs.sum()))


def entropy(p):
    p = np.asarray(p, dtype=np.float64)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def brute_force(posterior, unary, pairwise, lengths):
    """Per sentence: (per-chain path distributions, the mixture's path distribution, per-chain
    token marginals [R, L, V], mixture token marginals [L, V])."""
    R, B, T, V = unary.shape
    out = []
    for b in range(B):
        L = lengths[b]
        chains = [enumerate_chain(unary[r, b], pairwise[r], L) for r in range(R)]
        mixture = {y: sum(posterior.weights[r] * chains[r][y] for r in range(R)) for y in chains[0]}
        marg = np.zeros((R, L, V))
        for r in range(R):
            for y, p in chains[r].items():
                marg[r, np.arange(L), list(y)] += p
        out.append((chains, mixture, marg, np.einsum("r,rtv->tv", posterior.weights, marg)))
    return out


def test_token_marginals_and_chain_entropies_match_enumeration():
    posterior, unary, pairwise, lengths = random_chains()
    marg = chain_token_marginals(posterior)
    entropies = chain_entropies(posterior)
    for b, (chains, _, brute_marg, _) in enumerate(brute_force(posterior, unary, pairwise, lengths)):
        L = lengths[b]
        np.testing.assert_allclose(marg[:, b, :L], brute_marg, atol=1e-12)
        assert np.all(marg[:, b, L:] == 0)
        np.testing.assert_allclose(entropies[:, b], [entropy(list(c.values())) for c in chains], atol=1e-10)


def test_token_bald_and_entropy_are_their_definitions():
    posterior, unary, pairwise, lengths = random_chains(seed=1)
    bald = chain_scores(posterior, "bald", level="token")["sum"]
    token_entropy = chain_scores(posterior, "entropy", level="token")["sum"]
    for b, (_, _, marg, mean) in enumerate(brute_force(posterior, unary, pairwise, lengths)):
        expected_entropy = sum(entropy(mean[t]) for t in range(lengths[b]))
        expected_bald = expected_entropy - sum(posterior.weights[r] * entropy(marg[r, t])
                                               for r in range(len(marg)) for t in range(lengths[b]))
        assert token_entropy[b] == pytest.approx(expected_entropy, abs=1e-10)
        assert bald[b] == pytest.approx(expected_bald, abs=1e-10)
        assert bald[b] >= -1e-12


def test_sequence_bald_estimates_the_mutual_information_by_enumeration():
    """I(y; f) = H[p̄] − Σ_r w_r H[p_r] over all V^T label paths, against the path-sampling estimate."""
    posterior, unary, pairwise, lengths = random_chains(seed=2)
    estimate = chain_scores(posterior, "bald", level="sequence", paths=4000, rng=np.random.default_rng(0))["sum"]
    entropy_estimate = chain_scores(posterior, "entropy", level="sequence", paths=4000,
                                    rng=np.random.default_rng(1))["sum"]
    for b, (chains, mixture, _, _) in enumerate(brute_force(posterior, unary, pairwise, lengths)):
        mixture_entropy = entropy(list(mixture.values()))
        exact = mixture_entropy - sum(w * entropy(list(c.values())) for w, c in zip(posterior.weights, chains))
        assert exact > 0.05  # the draws disagree: a real test
        assert estimate[b] == pytest.approx(exact, abs=0.03 * max(1.0, exact))
        assert entropy_estimate[b] == pytest.approx(mixture_entropy, abs=0.03 * max(1.0, mixture_entropy))


def test_sequence_entropy_of_one_chain_is_exact():
    posterior, unary, pairwise, lengths = random_chains(R=1, seed=3)
    found = chain_scores(posterior, "entropy", level="sequence")["sum"]
    for b in range(len(lengths)):
        exact = entropy(list(enumerate_chain(unary[0, b], pairwise[0], lengths[b]).values()))
        assert found[b] == pytest.approx(exact, abs=1e-10)


@pytest.mark.parametrize("keyed", [False, True])
def test_sampled_paths_follow_the_chain(keyed):
    """Forward filtering, backward sampling against enumeration, with the Gumbel noise from a
    generator or keyed by the sentence (`sentence_keys`: the hash-based noise must be Gumbel too)."""
    posterior, unary, pairwise, lengths = random_chains(R=2, B=1, T=3, seed=4, lengths=[3])
    keys = np.array([12345], dtype=np.uint32) if keyed else None
    paths = sample_paths(posterior, 20000, np.random.default_rng(5), keys)  # [R, n, B, T]
    for r in range(2):
        exact = enumerate_chain(unary[r, 0], pairwise[r], 3)
        counts = {}
        for y in map(tuple, paths[r, :, 0]):
            counts[y] = counts.get(y, 0) + 1
        for y, p in exact.items():
            assert counts.get(y, 0) / 20000 == pytest.approx(p, abs=0.015)
    log_p = mixture_path_log_probs(posterior, paths[:, :5])  # [Q, R, 5, B]
    for q in range(2):
        exact = enumerate_chain(unary[q, 0], pairwise[q], 3)
        for r in range(2):
            for n in range(5):
                assert np.exp(log_p[q, r, n, 0]) == pytest.approx(exact[tuple(paths[r, n, 0])], rel=1e-9)


def test_least_confidence_and_margin_against_enumeration():
    posterior, unary, pairwise, lengths = random_chains(R=1, seed=6)
    lc = chain_scores(posterior, "least-confidence")
    margin = chain_scores(posterior, "margin")
    owners = np.arange(len(lengths))
    lc_score = combine(lc, owners, lengths, "least-confidence", normalise=False)
    margin_score = combine(margin, owners, lengths, "margin", normalise=False)
    lc_normalised = combine(lc, owners, lengths, "least-confidence", normalise=True)
    for b in range(len(lengths)):
        probs = sorted(enumerate_chain(unary[0, b], pairwise[0], lengths[b]).values(), reverse=True)
        assert lc_score[b] == pytest.approx(1 - probs[0], abs=1e-10)
        assert margin_score[b] == pytest.approx(1 - (probs[0] - probs[1]), abs=1e-10)
        assert lc_normalised[b] == pytest.approx(1 - probs[0] ** (1 / lengths[b]), abs=1e-10)


def test_margin_of_a_mixture_of_chains_is_between_its_two_paths_under_the_mixture():
    # the two paths come from the mean potentials; under the mixture (Monte Carlo draws) the
    # second can be the more probable: the margin is their probability gap, never above 1
    posterior, unary, pairwise, lengths = random_chains(R=3, seed=0)
    paths, _ = posterior.nbest(2)
    margin = combine(chain_scores(posterior, "margin"), np.arange(len(lengths)), lengths, "margin", normalise=False)
    swapped = 0
    for b, (_, mixture, _, _) in enumerate(brute_force(posterior, unary, pairwise, lengths)):
        first, second = (mixture[tuple(paths[b, k, : lengths[b]])] for k in range(2))
        swapped += second > first
        assert margin[b] == pytest.approx(1 - abs(first - second), abs=1e-10)
        assert margin[b] <= 1
    assert swapped  # the case this pins happens here


def test_pieces_combine_as_documented():
    parts = {"sum": np.array([1.0, 2.0, 4.0])}
    assert combine(parts, np.array([0, 0, 1]), np.array([10, 4]), "bald", False).tolist() == [3.0, 4.0]
    assert combine(parts, np.array([0, 0, 1]), np.array([10, 4]), "bald", True).tolist() == [0.3, 1.0]
    # two pieces: P1 multiplies; the second best path is the best with one piece's second best
    logs = {"log_p1": np.log([0.5, 0.8]), "log_p2": np.log([0.2, 0.1])}
    score = combine(logs, np.array([0, 0]), np.array([6]), "margin", False)[0]
    assert score == pytest.approx(1 - (0.4 - 0.16))


# ---- with a trained tagger ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(sample_dir):
    from gpseq.corpora import read_conll
    from gpseq.features import get_preset
    from gpseq.tagger import Tagger, TaggerConfig

    train = read_conll(sample_dir / "train.conll")
    return Tagger.train(train[:120], TaggerConfig(features=get_preset("chunking"))), train


def test_select_is_deterministic_under_a_seed_and_scores_are_the_strategy(trained):
    from gpseq.active.selection import score_sentences

    tagger, train = trained
    pool = [s for s in train[120:220]]
    first = tagger.select(pool, 10, "bald", seed=3)
    again = tagger.select(pool, 10, "bald", seed=3, chunk_size=2048)
    assert [(s.index, s.score) for s in first] == [(s.index, s.score) for s in again]
    assert [s.score for s in first] == sorted((s.score for s in first), reverse=True)
    # entropy under the deterministic predictive: the token entropies of Tagger.tag's marginals
    picked = tagger.select(pool, 5, "entropy", max_similarity=1.0)
    for item in picked:
        p = item.tagged.probabilities
        assert item.score == pytest.approx(float(-(p * np.log(np.maximum(p, 1e-300))).sum()), rel=1e-4, abs=1e-6)
        assert pool[item.index] is item.sentence
    # least-confidence: 1 − P(Viterbi path) of the deterministic predictive, as Tagger.tag scores the path
    scores = score_sentences(tagger, pool[:20], "least-confidence")
    tagged = tagger.tag(pool[:20], decode="viterbi")  # the best path, whichever decoder the model keeps
    np.testing.assert_allclose(scores, [1 - np.exp(t.sequence_log_prob) for t in tagged], atol=2e-3)
    # random: a permutation that depends on the seed only
    a, b = (tagger.select(pool, 100, "random", seed=s, max_similarity=1.0, tag=False) for s in (1, 2))
    assert sorted(x.index for x in a) == sorted(x.index for x in b) == list(range(100))
    assert [x.index for x in a] != [x.index for x in b]


def test_select_skips_duplicates_and_near_duplicates(trained):
    from gpseq.corpora.types import Sentence

    tagger, train = trained
    base = train[130]
    near = Sentence(tokens=list(base.tokens[:-1]) + ["zzz"], columns=[list(c) for c in base.columns[:-1]]
                    + [["zzz", "NN"]])
    pool = [base, Sentence(tokens=list(base.tokens), columns=[list(c) for c in base.columns]), near, train[140]]
    jaccard = len(set(t.lower() for t in base.tokens) & set(t.lower() for t in near.tokens)) / len(
        set(t.lower() for t in base.tokens) | set(t.lower() for t in near.tokens))
    other = len(set(t.lower() for t in base.tokens) & set(t.lower() for t in train[140].tokens)) / len(
        set(t.lower() for t in base.tokens) | set(t.lower() for t in train[140].tokens))
    assert other < jaccard - 0.01
    picked = tagger.select(pool, 4, "least-confidence", max_similarity=jaccard - 0.01, tag=False)
    tokens = [tuple(p.sentence.tokens) for p in picked]
    assert len(set(tokens)) == len(tokens) == 2  # never the same sentence twice, nor base with near
    assert tuple(train[140].tokens) in tokens
    assert len(tagger.select(pool, 4, "least-confidence", max_similarity=1.0, tag=False)) == 3


def test_select_rejects_bad_options(trained):
    from gpseq.errors import ConfigError

    tagger, train = trained
    for options in ({"strategy": "nope"}, {"level": "word"}, {"samples": 1}, {"max_similarity": 0.0},
                    {"variance_scale": -1.0}):
        with pytest.raises(ConfigError):
            tagger.select(train[:5], 2, **options)


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


# ---- the command and the annotation-tool formats ------------------------------------------------
POOL_TEXT = ("The committee approved the new budget on Tuesday. Mills reported a loss in London.\n\n"
             "Harlow Mills said the plant in Essex would close. The budget was approved on Tuesday.\n\n"
             "Shares of Acme Corp rose sharply after the report. A second paragraph follows here.\n")


@pytest.fixture(scope="module")
def cli_model(sample_dir, tmp_path_factory):
    from typer.testing import CliRunner

    from gpseq.cli import app

    base = tmp_path_factory.mktemp("select")
    model = base / "model"
    result = CliRunner().invoke(app, ["train", str(sample_dir / "train.conll"), "-o", str(model), "--features", "ner"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    pool = base / "pool.txt"
    pool.write_text(POOL_TEXT, encoding="utf-8")
    return model, pool, base


def run_select(*args):
    from typer.testing import CliRunner

    from gpseq.cli import app

    return CliRunner().invoke(app, ["select", *map(str, args)], catch_exceptions=False)


def check_prodigy_task(task: dict) -> None:
    """The fields of Prodigy's task format for ner_manual / spans_manual: text; tokens with text,
    start, end (character offsets into text), id (0, 1, …) and ws; spans with start, end,
    token_start, token_end (inclusive) and label, aligned with the tokens; meta of scalars."""
    assert isinstance(task["text"], str) and task["text"]
    tokens = task["tokens"]
    for i, token in enumerate(tokens):
        assert set(token) >= {"text", "start", "end", "id", "ws"}
        assert token["id"] == i and isinstance(token["ws"], bool)
        assert task["text"][token["start"]:token["end"]] == token["text"]
        if i + 1 < len(tokens):
            assert tokens[i + 1]["start"] == token["end"] + (1 if token["ws"] else 0)
    for span in task["spans"]:
        assert set(span) >= {"start", "end", "token_start", "token_end", "label"}
        assert isinstance(span["label"], str) and span["label"]
        assert 0 <= span["token_start"] <= span["token_end"] < len(tokens)
        assert span["start"] == tokens[span["token_start"]]["start"]
        assert span["end"] == tokens[span["token_end"]]["end"]
        assert span["text"] == task["text"][span["start"]:span["end"]]
        assert 0.0 <= span["score"] <= 1.0
    assert all(isinstance(v, (str, int, float)) for v in task["meta"].values())
    assert isinstance(task["meta"]["score"], float)


def check_labelstudio_tasks(tasks: list, from_name="label", to_name="text") -> None:
    """Label Studio's import format with pre-annotations ("Import pre-annotated data"): a list of
    tasks, each {"data": {...the Text object's value key...}, "predictions": [{"model_version",
    "score", "result": [{"id", "from_name", "to_name", "type": "labels", "value": {"start", "end",
    "text", "labels": [...], "score"}}]}]}; result ids unique."""
    assert isinstance(tasks, list) and tasks
    ids = set()
    for task in tasks:
        text = task["data"][to_name]
        assert isinstance(text, str) and text
        for prediction in task["predictions"]:
            assert isinstance(prediction["model_version"], str)
            assert 0.0 <= prediction["score"] <= 1.0
            for region in prediction["result"]:
                assert region["from_name"] == from_name and region["to_name"] == to_name
                assert region["type"] == "labels"
                assert region["id"] not in ids
                ids.add(region["id"])
                value = region["value"]
                assert 0 <= value["start"] < value["end"] <= len(text)
                assert text[value["start"]:value["end"]] == value["text"]
                assert isinstance(value["labels"], list) and len(value["labels"]) == 1
                assert 0.0 <= value["score"] <= 1.0


def test_select_command_writes_what_prodigy_and_label_studio_import(cli_model):
    model, pool, base = cli_model
    out = base / "tasks.jsonl"
    result = run_select(model, pool, "-n", 3, "--format", "prodigy", "-o", out)
    assert result.exit_code == 0, result.output
    tasks = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(tasks) == 3
    for task in tasks:
        check_prodigy_task(task)
    assert [t["meta"]["rank"] for t in tasks] == [1, 2, 3]
    assert [t["meta"]["score"] for t in tasks] == sorted((t["meta"]["score"] for t in tasks), reverse=True)
    out = base / "tasks.json"
    result = run_select(model, pool, "-n", 3, "--format", "labelstudio", "-o", out, "--strategy", "margin")
    assert result.exit_code == 0, result.output
    check_labelstudio_tasks(json.loads(out.read_text(encoding="utf-8")))
    # the span scores are the exact span probabilities of Tagger.tag of the task's tokens
    from gpseq.tagger import Tagger

    tagger = Tagger.load(model)
    for task in tasks:
        tagged = tagger.tag([[token["text"] for token in task["tokens"]]])[0]
        assert [(s["label"], s["token_start"], s["token_end"] + 1) for s in task["spans"]] == [
            span[:3] for span in tagged.spans]
        assert [s["score"] for s in task["spans"]] == pytest.approx([span[3] for span in tagged.spans], abs=1e-5)


def test_select_conll_output_trains_with_init_and_jsonl_carries_the_scores(cli_model):
    from typer.testing import CliRunner

    from gpseq.cli import app
    from gpseq.corpora import read_conll

    model, pool, base = cli_model
    picked = base / "picked.conll"
    result = run_select(model, pool, "-n", 4, "--strategy", "entropy", "--level", "sequence", "-o", picked)
    assert result.exit_code == 0, result.output
    sentences = read_conll(picked)
    assert len(sentences) == 4 and all(len(s.columns[0]) == 2 for s in sentences)
    assert picked.read_text(encoding="utf-8").startswith("-DOCSTART- rank=1 score=")
    record = json.loads(run_select(model, pool, "-n", 1, "--format", "jsonl").stdout.splitlines()[0])
    assert record["select"]["rank"] == 1 and record["select"]["strategy"] == "bald"
    result = CliRunner().invoke(app, ["train", str(picked), "-o", str(base / "round1"), "--features", "ner",
                                      "--init", str(model)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    bad = run_select(model, pool, "-n", 2, "--strategy", "oracle")
    assert bad.exit_code == 4 and "--strategy" in bad.output


def test_a_pool_of_repeated_sentences_still_gives_n_distinct_ones(trained):
    tagger, train = trained
    pool = [s for _ in range(5) for s in train[120:170]]  # every sentence five times
    picked = tagger.select(pool, 30, "entropy", max_similarity=1.0, candidates=1, chunk_size=60, tag=False)
    assert len(picked) == 30 and len({tuple(p.sentence.tokens) for p in picked}) == 30
    assert all(p.index < 50 for p in picked)  # the first copy read stays


def test_select_conll_output_reads_back_as_the_pool_tokens(cli_model):
    """--format conll writes the pool's columns space-separated: a token with a space (a JSON Lines
    or CoNLL-U pool may hold one, e.g. "New York") made a file that reads back with other columns or
    not at all: exit 2 naming the pool line, nothing written. A CoNLL-U pool's rows start with the
    word ID: a warning says to train with --token-column 1 (it trained on the IDs as tokens)."""
    model, _, base = cli_model
    pool = base / "pool.jsonl"
    pool.write_text('{"tokens": ["Shares", "rose", "."]}\n{"tokens": ["She", "moved", "to", "New York", "."]}\n',
                    encoding="utf-8")
    out = base / "picked-space.conll"
    out.write_text("kept\n", encoding="utf-8")
    result = run_select(model, pool, "-n", 2, "--strategy", "random", "-o", out)
    assert result.exit_code == 2
    assert f"{pool}:2: token 4: field 'New York' is empty or holds white space" in result.output
    assert out.read_text(encoding="utf-8") == "kept\n"
    assert run_select(model, pool, "-n", 2, "--strategy", "random", "--format", "jsonl").exit_code == 0
    conllu = base / "pool.conllu"
    conllu.write_text("".join(
        "".join(f"{i}\t{word}\t{word.lower()}\tX\t_\t_\t0\tdep\t_\t_\n" for i, word in enumerate(words, start=1)) + "\n"
        for words in (["Shares", "rose", "."], ["She", "moved", "to", "Paris", "."])), encoding="utf-8")
    picked = base / "picked-conllu.conll"
    result = run_select(model, conllu, "-n", 2, "--strategy", "random", "-o", picked)
    assert result.exit_code == 0, result.output
    assert f"warning: {picked}: the tokens are column 1 of these lines" in result.output
    assert "--token-column 1" in result.output
    from gpseq.corpora import read_conll

    assert sorted(s.tokens for s in read_conll(picked, token_column=1)) == [["Shares", "rose", "."],
                                                                            ["She", "moved", "to", "Paris", "."]]


def test_monte_carlo_scores_and_marginals_do_not_depend_on_the_batch(trained):
    """One seed is one set of posterior draws for the whole pool: a sentence's BALD score and its
    Monte Carlo marginals are the same scored alone, in a batch of others or in chunks of any size.
    Before, the weights' noise was drawn per batch (for the batch's own features, from a seed with the
    batch's number), so a sentence's score changed with the sentences batched with it."""
    from gpseq.active.selection import score_sentences

    tagger, train = trained
    pool = train[120:160]
    together = score_sentences(tagger, pool, "bald", seed=4)
    alone = np.array([score_sentences(tagger, [s], "bald", seed=4)[0] for s in pool[:6]])
    np.testing.assert_allclose(alone, together[:6], rtol=2e-4, atol=1e-6)
    reversed_ = score_sentences(tagger, pool[::-1], "bald", seed=4)[::-1]
    np.testing.assert_allclose(reversed_, together, rtol=2e-4, atol=1e-6)
    by_chunk = {size: sorted((p.index, p.score) for p in tagger.select(pool, 10, "bald", seed=4, chunk_size=size,
                                                                        max_similarity=1.0, tag=False))
                for size in (3, 2048)}
    assert [i for i, _ in by_chunk[3]] == [i for i, _ in by_chunk[2048]]
    np.testing.assert_allclose([s for _, s in by_chunk[3]], [s for _, s in by_chunk[2048]], rtol=2e-4)
    # another seed is another draw
    assert not np.allclose(score_sentences(tagger, pool, "bald", seed=5), together, rtol=1e-3)
    # sequence level: the sampled paths are keyed by the sentence too
    sequence = score_sentences(tagger, pool[:12], "bald", level="sequence", seed=4)
    single = [score_sentences(tagger, [s], "bald", level="sequence", seed=4)[0] for s in pool[:3]]
    np.testing.assert_allclose(single, sequence[:3], rtol=2e-4, atol=1e-6)
    # Monte Carlo tagging (samples=S): the same marginals for a sentence whatever it is tagged with
    batch = tagger.tag(pool, samples=8)
    for i in (0, 7, 23):
        single = tagger.tag([pool[i]], samples=8)[0]
        np.testing.assert_allclose(single.probabilities, batch[i].probabilities, rtol=1e-4, atol=1e-6)
        assert single.sequence_log_prob == pytest.approx(batch[i].sequence_log_prob, rel=1e-4, abs=1e-6)
