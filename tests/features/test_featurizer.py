"""Feature extraction and vectorisation: hand-computed feature sets, CRF++ expansion, round trips."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import scipy.sparse as sp

from gpseq.corpora.types import Sentence
from gpseq.errors import ConfigError, InputFormatError, ModelFormatError
from gpseq.features import (
    PAD_ID,
    FeatureConfig,
    Featurizer,
    get_preset,
    list_presets,
    parse_crfpp_template,
)


def sentence(rows: list[str]) -> Sentence:
    """A Sentence from 'word POS label' lines (label = last column)."""
    columns = [row.split(" ") for row in rows]
    return Sentence([c[0] for c in columns], [c[-1] for c in columns], columns)


def active_names(featurizer: Featurizer, matrix) -> list[set[str]]:
    names = featurizer.feature_names()
    return [{names[c] for c in matrix.rows[i].indices} for i in range(matrix.rows.shape[0])]


def read_crfpp(path, encoding: str, limit: int) -> list[Sentence]:
    """Minimal CRF++ data reader: ASCII space/tab separators only (U+3000 is a token)."""
    out, rows = [], []
    with open(path, encoding=encoding) as handle:
        for raw in handle:
            line = raw.rstrip("\r\n")
            if not line.strip(" \t"):
                if rows:
                    out.append(Sentence([r[0] for r in rows], [r[-1] for r in rows], rows))
                    rows = []
                    if len(out) == limit:
                        break
                continue
            rows.append([field for field in line.replace("\t", " ").split(" ") if field != ""])
    return out


THREE = sentence(["The DT B-NP", "Cat NN I-NP", "sat VBD B-VP"])


def test_window_and_conjunction_features_hand_computed():
    config = FeatureConfig(
        attributes=["lower"], window=1, token_attributes=["shape"], columns=[1], column_window=0,
        conjunctions=[(("lower", -1), ("lower", 0))], bias=True,
    )
    featurizer = Featurizer(config)
    matrix = featurizer.fit_transform([THREE])
    assert active_names(featurizer, matrix) == [
        {"bias", "lower[-1]=__BOS-1__", "lower[0]=the", "lower[1]=cat", "shape[0]=Xxx", "col1[0]=DT",
         "lower[-1]|lower[0]=__BOS-1__|the"},
        {"bias", "lower[-1]=the", "lower[0]=cat", "lower[1]=sat", "shape[0]=Xxx", "col1[0]=NN",
         "lower[-1]|lower[0]=the|cat"},
        {"bias", "lower[-1]=cat", "lower[0]=sat", "lower[1]=__EOS+1__", "shape[0]=xxx", "col1[0]=VBD",
         "lower[-1]|lower[0]=cat|sat"},
    ]
    assert np.all(matrix.rows.data == 1)
    assert matrix.rows.dtype == np.float32
    assert matrix.offsets.tolist() == [0, 3]
    assert PAD_ID not in matrix.rows.indices
    assert featurizer.feature_names()[PAD_ID] == "<unseen>"
    assert featurizer.n_features == 1 + len(set().union(*active_names(featurizer, matrix)))


def test_one_token_and_empty_sentences():
    config = FeatureConfig(attributes=["word"], window=2, bias=False,
                           conjunctions=[(("word", -1), ("word", 0), ("word", 1))])
    featurizer = Featurizer(config)
    batch = [Sentence([]), Sentence(["Hi"]), Sentence([])]
    matrix = featurizer.fit_transform(batch)
    assert matrix.offsets.tolist() == [0, 0, 1, 1]
    assert matrix.lengths.tolist() == [0, 1, 0]
    assert active_names(featurizer, matrix) == [
        {"word[-2]=__BOS-2__", "word[-1]=__BOS-1__", "word[0]=Hi", "word[1]=__EOS+1__", "word[2]=__EOS+2__",
         "word[-1]|word[0]|word[1]=__BOS-1__|Hi|__EOS+1__"}
    ]
    empty = featurizer.transform([Sentence([])])
    assert empty.rows.shape == (0, featurizer.n_features) and empty.offsets.tolist() == [0, 0]
    assert featurizer.transform([]).rows.shape == (0, featurizer.n_features)
    indices, values, lengths = matrix.padded_batch([0, 1, 2])
    assert indices.shape == (3, 1, 6) and lengths.tolist() == [0, 1, 0]
    assert np.all(indices[[0, 2]] == PAD_ID) and np.all(values[[0, 2]] == 0)


def test_crfpp_expansion_matches_crfpp_rules():
    template = "# comment\n\nU00:%x[-2,0]\nU01:%x[0,0]/%x[0,1]\nU02:%x[2,1]\nU03:%x[-1,0]/%x[0,0]/%x[1,0]\nU04:const\n\nB\n"
    unigram, bigram = parse_crfpp_template(template)
    assert [t.name for t in unigram] == ["U00:%x[-2,0]", "U01:%x[0,0]/%x[0,1]", "U02:%x[2,1]",
                                         "U03:%x[-1,0]/%x[0,0]/%x[1,0]", "U04:const"]
    assert bigram == ["B"]
    featurizer = Featurizer(get_preset("crfpp", template=template))
    data = sentence(["He PRP B-NP", "reckons VBZ B-VP", "the DT B-NP"])
    matrix = featurizer.fit_transform([data])
    # By CRF++'s getIndex: row pos+r < 0 → BOS[-(pos+r)-1] = "_B-1", "_B-2", …;
    # pos+r >= size → EOS[pos+r-size] = "_B+1", …; the feature is the line with macros replaced.
    assert active_names(featurizer, matrix) == [
        {"U00:_B-2", "U01:He/PRP", "U02:DT", "U03:_B-1/He/reckons", "U04:const"},
        {"U00:_B-1", "U01:reckons/VBZ", "U02:_B+1", "U03:He/reckons/the", "U04:const"},
        {"U00:He", "U01:the/DT", "U02:_B+2", "U03:reckons/the/_B+1", "U04:const"},
    ]


@pytest.mark.parametrize(
    "text", ["X00:%x[0,0]", "U00:%x[9,0]", "U00:%y[0,0]", "U00:%x[0;0]", "U00:%x[a,0]", " U00:%x[0,0]", "# only"]
)
def test_bad_crfpp_templates_raise_config_error(text):
    with pytest.raises(ConfigError):
        get_preset("crfpp", template=text + "\n")


def test_crfpp_bigram_with_macro_warns_and_is_accepted():
    with pytest.warns(UserWarning):
        unigram, bigram = parse_crfpp_template("U00:%x[0,0]\nB01:%x[0,0]\n")
    assert bigram == ["B01:%x[0,0]"] and len(unigram) == 1


@pytest.mark.parametrize("name,encoding", [("basenp", "ascii"), ("chunking", "ascii"), ("seg", "utf-8"),
                                           ("JapaneseNE", "euc-jp")])
def test_shared_crfpp_templates_load_and_expand(corpora_dir, name, encoding):
    folder = corpora_dir / "crfpp" / name
    config = FeatureConfig.from_template_file(folder / "template")
    text = (folder / "template").read_text()
    u_lines = [line for line in text.splitlines() if line.startswith("U")]
    assert [t.name for t in config.templates()] == u_lines
    data = read_crfpp(folder / "train.data", encoding, limit=5)
    featurizer = Featurizer(config)
    matrix = featurizer.fit_transform(data)
    first = active_names(featurizer, matrix)[0]
    tokens = data[0].columns
    # U00:%x[-2,0] and U02:%x[0,0] on the first token, U01 on the second, per the CRF++ rules
    assert "U00:_B-2" in first and f"U02:{tokens[0][0]}" in first
    second = active_names(featurizer, matrix)[1]
    assert f"U01:{tokens[0][0]}" in second
    assert np.all(np.diff(matrix.rows.indptr) == len(u_lines))
    # round trip through JSON keeps the template text
    again = FeatureConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again.crfpp_template == text


def test_template_given_as_path_or_text(tmp_path):
    path = tmp_path / "template"
    path.write_text("U00:%x[0,0]\nB\n")
    assert get_preset("crfpp", template=str(path)).crfpp_template == "U00:%x[0,0]\nB\n"
    assert get_preset("crfpp", template="U00:%x[0,0]\nB\n").crfpp_template == "U00:%x[0,0]\nB\n"
    with pytest.raises(ConfigError):
        get_preset("crfpp")
    with pytest.raises(ConfigError):
        get_preset("crfpp", template=str(tmp_path / "missing"))


def test_presets_validate_and_round_trip_json():
    assert set(list_presets()) == {"chunking", "ner", "pos", "segmentation", "crfpp"}
    data = [sentence(["Rockwell NNP B-NP", "said VBD B-VP", "3.5 CD B-NP", "% NN I-NP", ". . O"])]
    for name in ["chunking", "ner", "pos", "segmentation"]:
        config = get_preset(name)
        again = FeatureConfig.from_dict(json.loads(json.dumps(config.to_dict())))
        assert again == config
        matrix = Featurizer(config).fit_transform(data)
        # one feature per template per token (all seen in fit)
        assert np.all(np.diff(matrix.rows.indptr) == len(config.templates()))
    assert get_preset("chunking", window=1).window == 1
    with pytest.raises(ConfigError):
        get_preset("nope")
    with pytest.raises(ConfigError):
        get_preset("chunking", not_a_field=1)
    with pytest.raises(ConfigError):
        get_preset("chunking", attributes=["no_such_attribute"])
    with pytest.raises(ConfigError):
        FeatureConfig.from_dict({"preset": "x", "bogus": 1})


def test_lexical_attributes_equal_spacy_token_attributes():
    import spacy
    from spacy.tokens import Doc

    words = ["The", "U.S.", "3.5", "%", "Hello", "WORLD", "dogs", "!", "twenty"]
    flags = ["is_title", "is_upper", "is_digit", "like_num", "is_punct"]
    config = FeatureConfig(attributes=[], token_attributes=["lower", "norm", "shape", "prefix", "suffix", *flags],
                           bias=False)
    featurizer = Featurizer(config)
    matrix = featurizer.fit_transform([Sentence(words)])
    doc = Doc(spacy.blank("en").vocab, words=words)
    expected = [
        {f"lower[0]={t.lower_}", f"norm[0]={t.norm_}", f"shape[0]={t.shape_}", f"prefix[0]={t.prefix_}",
         f"suffix[0]={t.suffix_}", *(f"{flag}[0]={getattr(t, flag)}" for flag in flags)}
        for t in doc
    ]
    assert active_names(featurizer, matrix) == expected


def test_save_load_round_trip_identical(tmp_path):
    train = [THREE, sentence(["He PRP B-NP", "reckons VBZ B-VP", "the DT B-NP", "deficit NN I-NP"])]
    test = [sentence(["The DT B-NP", "deficit NN I-NP", "rose VBD B-VP"]), Sentence([])]
    for overrides in [{}, {"hashing_dim": 1 << 12}, {"l2_normalize": True, "dtype": "float64"}]:
        featurizer = Featurizer(get_preset("chunking", **overrides)).fit(train)
        featurizer.save(tmp_path / "f")
        loaded = Featurizer.load(tmp_path / "f")
        for data in (train, test):
            a, b = featurizer.transform(data), loaded.transform(data)
            assert a.rows.dtype == b.rows.dtype
            assert (a.rows != b.rows).nnz == 0 and a.rows.shape == b.rows.shape
            assert np.array_equal(a.offsets, b.offsets)
        assert loaded.feature_names() == featurizer.feature_names()
        assert loaded.n_features == featurizer.n_features
    # no stray temp files; the format is versioned and checked
    assert sorted(p.name for p in (tmp_path / "f").iterdir()) == ["featurizer.json", "vocabulary.npz"]
    meta = json.loads((tmp_path / "f" / "featurizer.json").read_text())
    meta["version"] = 99
    (tmp_path / "f" / "featurizer.json").write_text(json.dumps(meta))
    with pytest.raises(ModelFormatError):
        Featurizer.load(tmp_path / "f")
    with pytest.raises(ModelFormatError):
        Featurizer.load(tmp_path / "missing")


def test_corrupt_vocabulary_is_detected(tmp_path):
    featurizer = Featurizer(get_preset("pos")).fit([THREE])
    featurizer.save(tmp_path)
    payload = bytearray((tmp_path / "vocabulary.npz").read_bytes())
    payload[-10] ^= 0xFF
    (tmp_path / "vocabulary.npz").write_bytes(bytes(payload))
    with pytest.raises(ModelFormatError):
        Featurizer.load(tmp_path)


def test_unseen_features_are_ignored():
    train = [sentence(["the DT B", "cat NN I"])]
    new = [sentence(["the DT B", "dog NN I", "barked VBD O"])]
    config = get_preset("chunking")
    seen = Featurizer(config).fit(train)
    full = Featurizer(config).fit(train + new)  # knows every feature of `new`
    rows = seen.transform(new).rows.toarray()
    got = active_names(seen, seen.transform(new))
    everything = active_names(full, full.transform(new))
    expected = [names & set(seen.feature_names()) for names in everything]
    # what the vocabulary lacks is dropped, and counted in column 0 ("<unseen>") as k
    dropped = [len(names - set(seen.feature_names())) for names in everything]
    assert [names - {"<unseen>"} for names in got] == expected
    np.testing.assert_allclose(rows[:, 0], dropped, rtol=1e-5)
    assert any(dropped)  # something was dropped


def test_long_sentence_of_2000_tokens():
    rng = random.Random(0)
    words = [rng.choice(["alpha", "Beta", "gamma", "42", ",", "delta"]) + str(rng.randrange(50)) for _ in range(2000)]
    featurizer = Featurizer(FeatureConfig(attributes=["word"], window=2, bias=False))
    matrix = featurizer.fit_transform([Sentence(words)])
    assert matrix.rows.shape[0] == 2000
    names = active_names(featurizer, matrix)
    for t in (0, 1, 1000, 1998, 1999):
        expected = set()
        for offset in range(-2, 3):
            p = t + offset
            value = words[p] if 0 <= p < 2000 else (f"__BOS-{-p}__" if p < 0 else f"__EOS+{p - 1999}__")
            expected.add(f"word[{offset}]={value}")
        assert names[t] == expected
    indices, values, lengths = matrix.padded_batch([0])
    assert indices.shape == (1, 2000, 5) and lengths.tolist() == [2000]


def _dense_from_padded(indices, values, n_features):
    dense = np.zeros(indices.shape[:2] + (n_features,))
    b, t, f = np.indices(indices.shape)
    np.add.at(dense, (b, t, indices), values)
    return dense


def test_padded_batch_equals_csr_rows():
    data = [THREE, Sentence([]), sentence(["He PRP B", "reckons VBZ B", "the DT B", "deficit NN I", ". . O"]),
            sentence(["Go VB B"])]
    featurizer = Featurizer(get_preset("chunking", l2_normalize=True))
    matrix = featurizer.fit_transform(data)
    ids = [2, 0, 1, 3]
    indices, values, lengths = matrix.padded_batch(ids)
    assert indices.dtype == np.int32 and lengths.dtype == np.int32
    assert lengths.tolist() == [5, 3, 0, 1]
    dense = _dense_from_padded(indices, values, featurizer.n_features)
    for b, sid in enumerate(ids):
        rows = matrix.rows[matrix.offsets[sid] : matrix.offsets[sid + 1]].toarray()
        assert np.allclose(dense[b, : lengths[b]], rows)
        assert np.all(dense[b, lengths[b] :] == 0)
    assert np.all(dense[:, :, PAD_ID] == 0)
    wide, _, _ = matrix.padded_batch(ids, width=64)
    assert wide.shape == (4, 5, 64)
    with pytest.raises(ValueError):
        matrix.padded_batch(ids, width=2)


def test_l2_normalised_rows_have_unit_norm():
    matrix = Featurizer(get_preset("ner", l2_normalize=True)).fit_transform([THREE])
    norms = np.sqrt(np.asarray(matrix.rows.multiply(matrix.rows).sum(axis=1)).ravel())
    assert np.allclose(norms, 1.0)


def test_hashing_preserves_token_similarities_and_collides_when_small():
    data = [THREE, sentence(["He PRP B", "reckons VBZ B", "the DT B", "deficit NN I"]), Sentence(["the", "cat"])]
    config = FeatureConfig(attributes=["lower"], window=1, token_attributes=["shape"], bias=True)
    vocab = Featurizer(config).fit_transform(data).rows
    hashed_featurizer = Featurizer(FeatureConfig(**{**config.to_dict(), "hashing_dim": 1 << 24}))
    hashed = hashed_featurizer.fit_transform(data).rows
    assert hashed.shape[1] == hashed_featurizer.n_features == 1 << 24
    assert hashed.indices.min() >= 1
    # with no collisions the token-token inner products equal those of the exact vocabulary
    assert np.array_equal((hashed @ hashed.T).toarray(), (vocab @ vocab.T).toarray())
    # a fresh instance hashes identically (stable across processes: blake2b, not hash())
    again = Featurizer(FeatureConfig(**{**config.to_dict(), "hashing_dim": 1 << 24})).transform(data).rows
    assert (again != hashed).nnz == 0
    tiny = FeatureConfig(**{**config.to_dict(), "hashing_dim": 3, "binary": False})
    counts = Featurizer(tiny).transform(data).rows
    assert counts.shape[1] == 3 and counts.indices.min() >= 1
    assert np.all(np.asarray(counts.sum(axis=1)).ravel() == len(config.templates()))
    binary = Featurizer(FeatureConfig(**{**tiny.to_dict(), "binary": True})).transform(data).rows
    assert np.all(binary.data == 1)
    with pytest.raises(ConfigError):
        FeatureConfig(hashing_dim=16, min_count=2, attributes=["word"]).validate()


def test_min_count_and_max_features_follow_training_counts():
    rng = random.Random(1)
    data = [Sentence([rng.choice(["a", "b", "c", "d", "rare" + str(i)]) for _ in range(rng.randrange(1, 8))])
            for i in range(40)]
    config = FeatureConfig(attributes=["word"], window=1, bias=False,
                           conjunctions=[(("word", 0), ("word", 1))])
    full = Featurizer(config).fit(data)
    counts = np.asarray(full.transform(data).rows.sum(axis=0)).ravel()  # brute-force feature counts
    names = full.feature_names()
    pruned = Featurizer(FeatureConfig(**{**config.to_dict(), "min_count": 3})).fit(data)
    assert set(pruned.feature_names()) - {"<unseen>"} == {names[c] for c in range(1, len(names)) if counts[c] >= 3}
    order = np.sort(counts[1:])[::-1]
    k = next(i for i in range(5, len(order)) if order[i - 1] > order[i])  # a cut without ties
    capped = Featurizer(FeatureConfig(**{**config.to_dict(), "max_features": k})).fit(data)
    assert capped.n_features == k + 1
    assert set(capped.feature_names()) - {"<unseen>"} == {names[c] for c in range(1, len(names)) if counts[c] >= order[k - 1]}


def test_errors_for_unfitted_missing_column_and_missing_pipeline():
    featurizer = Featurizer(get_preset("chunking"))
    with pytest.raises(ConfigError):
        featurizer.transform([THREE])
    with pytest.raises(InputFormatError, match=r"^f\.txt:3: token 1 of the sentence \('no'\) has 1 column\(s\); "
                                               r"feature column 1 needed$"):
        featurizer.fit([Sentence(["no", "pos"], source="f.txt", line=3)])
    ragged = Sentence(["a", "b"], ["O", "O"], [["a", "DT", "O"], ["b"]], source="c.jsonl", line=9)
    with pytest.raises(InputFormatError, match=r"^c\.jsonl:9: token 2 of the sentence \('b'\)"):
        featurizer.fit([ragged])  # JSON Lines: the sentence's line, whichever token
    with pytest.raises(ConfigError, match="pipeline"):
        Featurizer(FeatureConfig(columns=["tag_"])).fit([THREE])


TAGGED = [
    (["I", "like", "green", "apples"], ["PRP", "VBP", "JJ", "NNS"]),
    (["You", "eat", "red", "apples"], ["PRP", "VBP", "JJ", "NNS"]),
    (["They", "like", "big", "dogs"], ["PRP", "VBP", "JJ", "NNS"]),
    (["We", "see", "small", "cats"], ["PRP", "VBP", "JJ", "NNS"]),
]


@pytest.fixture(scope="module")
def tiny_tagger():
    """A spaCy tagger trained here on four sentences (no download)."""
    import spacy
    from spacy.tokens import Doc
    from spacy.training import Example

    nlp = spacy.blank("en")
    nlp.add_pipe("tagger")
    examples = [Example.from_dict(Doc(nlp.vocab, words=w), {"tags": t}) for w, t in TAGGED]
    optimizer = nlp.initialize(lambda: examples)
    for _ in range(30):
        nlp.update(examples, sgd=optimizer)
    return nlp


def test_pipeline_attributes_become_features(tiny_tagger, tmp_path):
    from spacy.tokens import Doc

    nlp = tiny_tagger
    sentences = [Sentence(words) for words, _ in TAGGED] + [Sentence(["They", "eat", "green", "cats"])]
    predicted = [[t.tag_ for t in nlp(Doc(nlp.vocab, words=s.tokens))] for s in sentences]
    assert predicted[:4] == [tags for _, tags in TAGGED]  # the tagger learned its data
    config = FeatureConfig(attributes=["word"], window=0, columns=["tag_"], column_window=1, bias=False)
    featurizer = Featurizer(config, nlp=nlp)
    matrix = featurizer.fit_transform(sentences)
    names = active_names(featurizer, matrix)
    for b, tags in enumerate(predicted):
        for t, tag in enumerate(tags):
            assert f"tag_[0]={tag}" in names[matrix.offsets[b] + t]
    # the same features from Docs the pipeline already processed
    docs = list(nlp.pipe(Doc(nlp.vocab, words=s.tokens) for s in sentences))
    assert (featurizer.transform_docs(docs).rows != matrix.rows).nnz == 0
    # …and from a pipeline named by path in the config (what a saved model records)
    nlp.to_disk(tmp_path / "pipeline")
    by_path = Featurizer(FeatureConfig(**{**config.to_dict(), "pipeline": str(tmp_path / "pipeline")}))
    assert (by_path.fit_transform(sentences).rows != matrix.rows).nnz == 0
    # a corpus POS column maps to token.tag_ for Docs: same rows as sentences carrying those tags
    column_config = FeatureConfig(attributes=["word"], window=0, columns=[1], column_window=1,
                                  column_attributes={1: "tag_"}, bias=False)
    with_column = [Sentence(s.tokens, None, [[w, tag] for w, tag in zip(s.tokens, tags)])
                   for s, tags in zip(sentences, predicted)]
    column_featurizer = Featurizer(column_config).fit(with_column)
    assert (column_featurizer.transform_docs(docs).rows != column_featurizer.transform(with_column).rows).nnz == 0
    with pytest.raises(ConfigError, match="column_attributes"):
        Featurizer(FeatureConfig(columns=[2], bias=False)).fit_docs(docs)  # no attribute for column 2


def test_padded_batch_matmul_under_xla_equals_csr_product():
    tf = pytest.importorskip("tensorflow")
    data = [THREE, sentence(["He PRP B", "reckons VBZ B", "the DT B", "deficit NN I", ". . O"])]
    featurizer = Featurizer(get_preset("chunking", l2_normalize=True, dtype="float64"))
    matrix = featurizer.fit_transform(data)
    weights = np.random.default_rng(0).normal(size=(featurizer.n_features, 3))
    indices, values, lengths = matrix.padded_batch([1, 0])

    @tf.function(jit_compile=True)
    def unary(indices, values, weights):  # [B, T, F], [B, T, F], [D, V] -> [B, T, V]
        return tf.reduce_sum(values[..., None] * tf.gather(weights, indices), axis=-2)

    got = unary(tf.constant(indices), tf.constant(values), tf.constant(weights)).numpy()
    expected = matrix.rows @ weights  # scipy CSR product
    for b, sid in enumerate([1, 0]):
        assert np.allclose(got[b, : lengths[b]], expected[matrix.offsets[sid] : matrix.offsets[sid + 1]])


def test_the_token_attributes_known_without_spacy_are_spacy_token_attributes():
    from spacy.tokens import Token

    from gpseq.features.config import _COMMON_TOKEN_ATTRIBUTES

    assert all(hasattr(Token, name) for name in _COMMON_TOKEN_ATTRIBUTES)


@pytest.mark.parametrize("preset,min_count,max_features", [("chunking", 1, None), ("pos", 2, None),
                                                           ("ner", 1, 500), ("segmentation", 3, 200)])
def test_fit_in_blocks_builds_the_vocabulary_of_a_fit_on_the_whole_corpus(preset, min_count, max_features):
    """`fit` reads its sentences a block at a time (counts of distinct features merged between
    blocks, under value spaces that grow): the same columns, names and rows as one block."""
    from helpers import SAMPLE

    from gpseq.corpora import read_conll

    sentences = read_conll(SAMPLE / "train.conll")
    config = get_preset(preset)
    config.min_count, config.max_features = min_count, max_features
    whole = Featurizer(config).fit(sentences, block_size=len(sentences) + 1)
    blocks = Featurizer(config).fit(iter(sentences), block_size=7)  # any iterable, read once
    assert blocks.n_features == whole.n_features and blocks.feature_names() == whole.feature_names()
    assert (blocks.transform(sentences).rows != whole.transform(sentences).rows).nnz == 0
    if min_count > 1 or max_features:
        assert whole.n_features < Featurizer(get_preset(preset)).fit(sentences).n_features  # the counts mattered
