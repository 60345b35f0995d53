"""Corpus readers/writers, splits and the catalogue, checked against raw bytes and hand-made files."""

from __future__ import annotations

import hashlib
import io
import shutil
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpseq.corpora import (
    Sentence,
    corpus_path,
    fetch_corpus,
    get_corpus,
    iter_conll,
    kfold_indices,
    list_corpora,
    load_corpus,
    read_conll,
    read_conllu,
    train_dev_split,
    write_conll,
)
from gpseq.errors import ConfigError, GpseqError, InputFormatError

# ---- the shared third-party corpora: counts as stated in ../shared/corpora/README.md ----------
# (folder, file, encoding, sentences, tokens, number of distinct labels)
README_COUNTS = [
    ("conll2000", "train.txt", "ascii", 8936, 211727, 22),
    ("conll2000", "test.txt", "ascii", 2012, 47377, 19),
    ("crfpp/basenp", "train.data", "ascii", 77, 1896, 3),
    ("crfpp/basenp", "test.data", "ascii", 823, 19172, 3),
    ("crfpp/chunking", "train.data", "ascii", 77, 1896, 14),
    ("crfpp/chunking", "test.data", "ascii", 823, 19172, 17),
    ("crfpp/seg", "train.data", "utf-8", 36, 965, 2),
    ("crfpp/seg", "test.data", "utf-8", 19, 981, 2),
    ("crfpp/JapaneseNE", "train.data", "euc-jp", 216, 4772, 17),
    ("crfpp/JapaneseNE", "test.data", "euc-jp", 500, 12678, 18),
]


@pytest.mark.parametrize("folder, name, encoding, n_sentences, n_tokens, n_labels", README_COUNTS)
def test_shared_corpora_counts(corpora_dir, folder, name, encoding, n_sentences, n_tokens, n_labels):
    path = corpora_dir / folder / name
    sentences = read_conll(path, encoding=encoding)
    assert len(sentences) == n_sentences
    assert sum(len(s) for s in sentences) == n_tokens
    assert len({label for s in sentences for label in s.labels}) == n_labels
    # independently: every non-blank raw line is a token, and its last field is its label
    raw_lines = [line for line in path.read_bytes().split(b"\n") if line.strip(b" \t")]
    assert len(raw_lines) == n_tokens
    raw_labels = Counter(
        line.rstrip(b" \t").replace(b"\t", b" ").split(b" ")[-1].decode(encoding) for line in raw_lines
    )
    assert Counter(label for s in sentences for label in s.labels) == raw_labels
    assert all(s.source == str(path) and s.line >= 1 for s in sentences)


@pytest.mark.parametrize(
    "folder, only_in_test",
    [
        ("conll2000", {"I-LST"}),
        ("crfpp/chunking", {"B-CONJP", "B-INTJ", "I-CONJP"}),
        ("crfpp/JapaneseNE", {"B-TIME"}),
    ],
)
def test_labels_only_in_test(corpora_dir, folder, only_in_test):
    suffix = ".txt" if folder == "conll2000" else ".data"
    encoding = "euc-jp" if "Japanese" in folder else "utf-8"
    train, test = (
        read_conll(corpora_dir / folder / f"{split}{suffix}", encoding=encoding)
        for split in ("train", "test")
    )
    labels = [{label for s in part for label in s.labels} for part in (train, test)]
    assert labels[1] - labels[0] == only_in_test


@pytest.mark.parametrize(
    "folder, encoding, separator", [("crfpp/seg", "utf-8", "\t"), ("crfpp/JapaneseNE", "euc-jp", " ")]
)
@pytest.mark.parametrize("split", ["train", "test"])
def test_first_last_and_ideographic_space_tokens_survive(corpora_dir, folder, encoding, separator, split):
    path = corpora_dir / folder / f"{split}.data"
    raw = path.read_bytes().decode(encoding)
    token_lines = [line for line in raw.split("\n") if line.strip(" \t")]
    raw_tokens = [line.split(separator)[0] for line in token_lines]
    sentences = read_conll(path, encoding=encoding)
    tokens = [t for s in sentences for t in s.tokens]
    assert tokens[0] == raw_tokens[0] and tokens[-1] == raw_tokens[-1]
    assert tokens == raw_tokens
    assert tokens.count("\u3000") == raw_tokens.count("\u3000")
    if folder.endswith("JapaneseNE"):
        assert tokens.count("\u3000") > 0
        if split == "test":
            assert tokens[0] == "\u3000"  # the file's very first token is the ideographic space
    assert {len(row) for s in sentences for row in s.columns} == {4 if "Japanese" in folder else 3}


# ---- format details and malformed files -------------------------------------------------------
def _write(tmp_path, text: str | bytes, name="data.txt"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def test_token_rows_read_as_the_list_of_row_tuples_they_store():
    """`TokenRows` (a column file's `Sentence.columns`, stored column by column) reads as the list
    of one tuple per token it was made from: indexing (negative too), slices, iteration, length,
    equality both ways, its columns; rows of unequal length are refused."""
    from gpseq.corpora import TokenRows

    rows = [("The", "DT", "B-NP"), ("dog", "NN", "I-NP"), ("barks", "VBZ", "B-VP")]
    stored = TokenRows.from_rows(rows)
    assert len(stored) == 3 and stored.width == 3
    assert [stored[t] for t in range(-3, 3)] == rows[-3:] + rows
    assert stored[1:] == rows[1:] and stored[::2] == rows[::2] and list(stored) == rows
    assert stored == rows and rows == stored and stored != rows[:2] and stored != [list(r) for r in rows[::-1]]
    assert stored.column(1) == ("DT", "NN", "VBZ")
    with pytest.raises(IndexError):
        stored[3]
    with pytest.raises(IndexError):
        stored.column(3)
    with pytest.raises(ValueError, match="differ in length"):
        TokenRows.from_rows([("a", "b"), ("c",)])
    assert len(TokenRows.from_rows([])) == 0 and list(TokenRows.from_rows([])) == []


def test_docstart_comments_blank_lines_and_columns(tmp_path):
    path = _write(
        tmp_path,
        "-DOCSTART- -X- O\n\n# a comment\nThe DT B-NP\ndog NN I-NP\n \t \nbarks VBZ B-VP\n-DOCSTART- -X- O\nHi UH O\n",
    )
    sentences = read_conll(path, comment_prefix="#")
    assert [s.tokens for s in sentences] == [["The", "dog"], ["barks"], ["Hi"]]
    assert [s.labels for s in sentences] == [["B-NP", "I-NP"], ["B-VP"], ["O"]]
    assert sentences[0].columns == [("The", "DT", "B-NP"), ("dog", "NN", "I-NP")]  # a tuple per token
    assert [s.line for s in sentences] == [4, 7, 9]
    # without comment handling the comment is a token line like any other: nothing is dropped
    assert read_conll(path)[0].columns[0] == ("#", "a", "comment")
    pos = read_conll(path, comment_prefix="#", label_column=1)
    assert pos[0].labels == ["DT", "NN"]
    unlabelled = read_conll(path, comment_prefix="#", label_column=None, docstart=False)
    assert unlabelled[0].tokens == ["-DOCSTART-"] and unlabelled[1].labels is None


def test_crlf_tabs_runs_of_separators_and_bom(tmp_path):
    path = _write(tmp_path, "\ufeffa\t\tX  B\r\nb \t Y\tI\r\n\r\n\u3000 Z O\r\n")
    sentences = read_conll(path)
    assert [s.columns for s in sentences] == [[("a", "X", "B"), ("b", "Y", "I")], [("\u3000", "Z", "O")]]


def test_streams_and_iterables(tmp_path):
    text = "a B\nb I\n\nc O\n"
    from_text = read_conll(io.StringIO(text), name="<stdin>")
    from_bytes = read_conll(io.BytesIO(text.encode("utf-8")))
    from_lines = read_conll(text.splitlines(keepends=True), name="lines")
    assert (
        [s.tokens for s in from_text]
        == [s.tokens for s in from_bytes]
        == [s.tokens for s in from_lines]
        == [["a", "b"], ["c"]]
    )
    assert from_text[0].source == "<stdin>"
    with pytest.raises(InputFormatError, match=r"^<stdin>:2: 3 column"):
        read_conll(io.StringIO("a B\nb X I\n"), name="<stdin>")
    generator = iter_conll(_write(tmp_path, text))
    assert next(generator).tokens == ["a", "b"]


@pytest.mark.parametrize(
    "content, kwargs, message",
    [
        ("a DT B\nb NN I\n\nc NN\n", {}, r"data\.txt:4: 2 column\(s\), expected 3 \(as on line 1\)"),
        ("a DT B\nb NN I\n", {"n_columns": 2}, r"data\.txt:1: 3 column\(s\), expected 2"),
        ("a\nb\n", {}, r"data\.txt:1: label column missing"),
        ("a B\n", {"label_column": 3}, r"data\.txt:1: label column 3 missing"),
        ("a B\n", {"token_column": -3}, r"data\.txt:1: token column -3 missing"),
        (b"a B\n\xe6\x97 I\n", {}, r"data\.txt:2: bytes .* are not valid utf-8"),
        ("a B\n\u65e5 I\n".encode("euc-jp"), {}, r"data\.txt:2: bytes"),
        ("a B\n", {"encoding": "no-such-codec"}, r"unknown encoding"),
    ],
)
def test_malformed_files_name_file_and_line(tmp_path, content, kwargs, message):
    path = _write(tmp_path, content)
    with pytest.raises(InputFormatError, match=message) as error:
        read_conll(path, **kwargs)
    assert str(path) in str(error.value)


def test_latin1_and_euc_jp_and_utf16(tmp_path):
    assert read_conll(_write(tmp_path, "Espa\u00f1a B-LOC\n".encode("latin-1")), encoding="latin-1")[
        0
    ].tokens == ["Espa\u00f1a"]
    assert read_conll(_write(tmp_path, "\u3000 S O\n\u65e5 K B\n".encode("euc-jp")), encoding="euc-jp")[
        0
    ].tokens == ["\u3000", "\u65e5"]
    utf16 = read_conll(_write(tmp_path, "\u65e5 B\n\nx I\n".encode("utf-16")), encoding="utf-16")
    assert [s.tokens for s in utf16] == [["\u65e5"], ["x"]]


def test_writer_refuses_what_would_not_read_back(tmp_path):
    for bad in (
        [Sentence(["a b"], ["O"])],
        [Sentence([], [])],
        [Sentence(["-DOCSTART-"], ["O"])],
        [Sentence(["a"], ["O"]), Sentence(["b"], None)],
    ):
        with pytest.raises(InputFormatError):
            write_conll(tmp_path / "out.txt", bad)
    assert not (tmp_path / "out.txt").exists()  # atomic: nothing left behind
    assert not list(tmp_path.iterdir())
    with pytest.raises(InputFormatError, match="cannot be encoded as euc-jp"):
        write_conll(tmp_path / "out.txt", [Sentence(["\U0001f600"], ["O"])], encoding="euc-jp")


# characters for property tests: ASCII, accented, CJK, the ideographic space, and '#'/'-'
_FIELD = st.text(
    alphabet=st.sampled_from(list("abcXYZ019#-_.,é\u00df\u65e5\u672c\u3000\u00a0\u2028")),
    min_size=1,
    max_size=6,
).filter(lambda text: text != "-DOCSTART-")


@st.composite
def corpora(draw):
    width = draw(st.integers(1, 4))
    sentences = draw(
        st.lists(
            st.lists(st.lists(_FIELD, min_size=width, max_size=width), min_size=1, max_size=6),
            min_size=1,
            max_size=5,
        )
    )
    return width, sentences


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corpora(), st.sampled_from([" ", "\t"]), st.sampled_from(["utf-8", "utf-16"]))
def test_write_read_round_trip(tmp_path, case, separator, encoding):
    width, rows = case
    label_column = -1 if width > 1 else None
    sentences = [
        Sentence([r[0] for r in s], None if label_column is None else [r[-1] for r in s], s) for s in rows
    ]
    path = tmp_path / "round.txt"
    write_conll(path, sentences, encoding=encoding, separator=separator)
    back = read_conll(path, encoding=encoding, label_column=label_column)
    assert [(s.tokens, s.labels, s.columns) for s in back] == [
        (s.tokens, s.labels, [tuple(row) for row in s.columns]) for s in sentences
    ]
    buffer = io.BytesIO()
    write_conll(buffer, sentences, encoding=encoding, separator=separator)
    assert buffer.getvalue() == path.read_bytes()
    text = io.StringIO()
    write_conll(text, sentences, separator=separator)
    back = read_conll(io.StringIO(text.getvalue()), label_column=label_column)
    assert [s.columns for s in back] == [[tuple(row) for row in sentence] for sentence in rows]


def test_writer_appends_labels_to_token_only_sentences(tmp_path):
    path = tmp_path / "out.txt"
    write_conll(path, [Sentence(["a", "b"], ["B-NP", "I-NP"])])
    assert path.read_text() == "a B-NP\nb I-NP\n\n"


def test_shared_files_round_trip_bytes(corpora_dir, tmp_path):
    for folder, encoding in (("crfpp/JapaneseNE", "euc-jp"), ("crfpp/seg", "utf-8")):
        source = corpora_dir / folder / "train.data"
        separator = "\t" if folder.endswith("seg") else " "
        write_conll(
            tmp_path / "copy.data",
            read_conll(source, encoding=encoding),
            encoding=encoding,
            separator=separator,
        )
        # identical bytes up to the final blank line (seg's train.data has none)
        assert (tmp_path / "copy.data").read_bytes().rstrip(b"\n") == source.read_bytes().rstrip(b"\n")


# ---- CoNLL-U ---------------------------------------------------------------------------------
CONLLU = (
    "# sent_id = 1\n"
    "# text = Vámonos al mar.\n"
    "1-2\tVámonos\t_\t_\t_\t_\t_\t_\t_\t_\n"
    "1\tVamos\tir\tVERB\tVM\t_\t0\troot\t_\t_\n"
    "2\tnos\tnosotros\tPRON\tPP\t_\t1\tobj\t_\t_\n"
    "3-4\tal\t_\t_\t_\t_\t_\t_\t_\t_\n"
    "3\ta\ta\tADP\tSP\t_\t5\tcase\t_\t_\n"
    "4\tel\tel\tDET\tDA\t_\t5\tdet\t_\t_\n"
    "4.1\tmar\t_\tNOUN\t_\t_\t_\t_\t1:obl\t_\n"
    "5\tmar\tmar\tNOUN\tNC\t_\t1\tobl\t_\tSpaceAfter=No\n"
    "6\t.\t.\tPUNCT\tFp\t_\t1\tpunct\t_\t_\n"
    "\n"
    "# sent_id = 2\n"
    "1\tnew york\tnew york\tPROPN\tNP\t_\t0\troot\t_\t_\n"
)


def test_conllu_skips_ranges_and_empty_nodes(tmp_path):
    path = _write(tmp_path, CONLLU, "x.conllu")
    upos = read_conllu(path)
    assert [s.tokens for s in upos] == [["Vamos", "nos", "a", "el", "mar", "."], ["new york"]]
    assert upos[0].labels == ["VERB", "PRON", "ADP", "DET", "NOUN", "PUNCT"]
    assert read_conllu(path, label="xpos")[0].labels == ["VM", "PP", "SP", "DA", "NC", "Fp"]
    assert read_conllu(path, label=None)[1].labels is None
    assert upos[0].line == 4 and upos[1].line == 14 and len(upos[0].columns[0]) == 10


@pytest.mark.parametrize(
    "line, message",
    [
        ("2\tx\tx\tX\tX\t_\t0\tdep\t_\t_\n", r"x\.conllu:13: word ID 2, expected 1"),
        ("1\tx\tx\tX\n", r"x\.conllu:13: 4 tab-separated field"),
        ("1\tx\tx\t_\tX\t_\t0\tdep\t_\t_\n", r"x\.conllu:13: UPOS of 'x' is '_'"),
        ("a\tx\tx\tX\tX\t_\t0\tdep\t_\t_\n", r"x\.conllu:13: malformed ID"),
        ("3-2\tx\t_\t_\t_\t_\t_\t_\t_\t_\n", r"x\.conllu:13: multi-word token range"),
    ],
)
def test_conllu_errors(tmp_path, line, message):
    path = _write(tmp_path, CONLLU.split("# sent_id = 2\n")[0] + line, "x.conllu")
    with pytest.raises(InputFormatError, match=message):
        read_conllu(path)


# ---- splits ----------------------------------------------------------------------------------
@pytest.mark.parametrize("n, k", [(10, 3), (7, 7), (100, 5)])
def test_kfold_partitions_deterministically(n, k):
    folds = kfold_indices(n, k, seed=3)
    tests = np.concatenate([test for _, test in folds])
    assert sorted(tests.tolist()) == list(range(n))
    sizes = [len(test) for _, test in folds]
    assert max(sizes) - min(sizes) <= 1 and len(folds) == k
    for train, test in folds:
        assert sorted(np.concatenate([train, test]).tolist()) == list(range(n))
    again = kfold_indices(n, k, seed=3)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(folds, again))
    other = kfold_indices(n, k, seed=4)
    assert n == k or any(not np.array_equal(a[1], b[1]) for a, b in zip(folds, other))
    with pytest.raises(ConfigError):
        kfold_indices(n, n + 1)


def test_train_dev_split():
    train, dev = train_dev_split(50, 0.1, seed=0)
    assert len(dev) == 5 and sorted(np.concatenate([train, dev]).tolist()) == list(range(50))
    assert np.array_equal(dev, train_dev_split(50, 0.1, seed=0)[1])
    assert len(train_dev_split(3, 0.01)[1]) == 1
    capped_train, capped_dev = train_dev_split(50, 0.1, seed=0, max_dev=3)  # the first 3 of the same draw
    assert len(capped_dev) == 3 and set(capped_dev) <= set(dev) and len(capped_train) == 47
    with pytest.raises(ConfigError):
        train_dev_split(10, 1.0)


# ---- catalogue -------------------------------------------------------------------------------
def test_catalogue_entries_are_complete():
    entries = {entry["name"]: entry for entry in list_corpora()}
    assert set(entries) == {
        "conll2000",
        "conll2002-es",
        "conll2002-nl",
        "crfpp-basenp",
        "crfpp-chunking",
        "crfpp-seg",
        "crfpp-japanesene",
    }
    for entry in entries.values():
        for key in (
            "description",
            "task",
            "columns",
            "token_column",
            "label_column",
            "encoding",
            "tag_scheme",
            "licence",
        ):
            assert entry[key] is not None, (entry["name"], key)
        for spec in entry["files"].values():
            assert spec["url"].startswith("https://")
    assert set(entries["conll2002-nl"]["files"]) == {"train", "testa", "testb"}
    assert entries["conll2002-nl"]["encoding"] == "latin-1" and entries["conll2002-nl"]["docstart"]
    assert entries["conll2000"]["files"]["train"]["url"].endswith("/conll2000/chunking/train.txt.gz")
    assert get_corpus("CRFPP-JapaneseNE")["encoding"] == "euc-jp"
    with pytest.raises(ConfigError, match="unknown corpus"):
        get_corpus("conll2099")


def test_catalogue_hashes_are_those_of_the_shared_copies(corpora_dir):
    known = 0
    for entry in list_corpora():
        for spec in entry["files"].values():
            path = corpora_dir / spec["path"]
            if path.exists():
                assert spec["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest(), spec["path"]
                known += 1
            else:
                assert spec["sha256"] is None
    assert known == 14


def test_fetch_through_a_mirror_verifies_checksums(corpora_dir, tmp_path):
    mirror = tmp_path / "mirror"
    shutil.copytree(corpora_dir / "crfpp" / "seg", mirror / "crfpp" / "seg")
    folder = fetch_corpus("crfpp-seg", tmp_path / "dest", mirror=mirror)
    assert folder == tmp_path / "dest" / "crfpp" / "seg"
    for name in ("train.data", "test.data", "template"):
        assert (folder / name).read_bytes() == (corpora_dir / "crfpp" / "seg" / name).read_bytes()
    assert [len(s) for s in load_corpus("crfpp-seg", "test", root=tmp_path / "dest")][:3] == [
        len(s) for s in read_conll(corpora_dir / "crfpp" / "seg" / "test.data")
    ][:3]
    assert corpus_path("crfpp-seg", "train", root=tmp_path / "dest") == folder / "train.data"
    # a corrupted mirror file is refused, named, and leaves nothing behind
    corrupt = mirror / "crfpp" / "seg" / "test.data"
    corrupt.chmod(0o644)
    corrupt.write_bytes(corrupt.read_bytes().replace(b"\tB\n", b"\tI\n", 1))
    with pytest.raises(GpseqError, match=r"test\.data: sha256 .* does not match"):
        fetch_corpus("crfpp-seg", tmp_path / "dest2", mirror=mirror)
    assert not (tmp_path / "dest2" / "crfpp" / "seg" / "test.data").exists()
    assert not [p for p in (tmp_path / "dest2" / "crfpp" / "seg").iterdir() if p.name.startswith(".")]
    # an existing good copy is kept (and checked); force re-copies and then fails on the bad mirror
    fetch_corpus("crfpp-seg", tmp_path / "dest", mirror=mirror)
    with pytest.raises(GpseqError, match="does not match"):
        fetch_corpus("crfpp-seg", tmp_path / "dest", mirror=mirror, force=True)
    assert (folder / "test.data").read_bytes() == (corpora_dir / "crfpp" / "seg" / "test.data").read_bytes()
    with pytest.raises(GpseqError, match="not in the mirror"):
        fetch_corpus("crfpp-basenp", tmp_path / "dest", mirror=mirror)
    with pytest.raises(ConfigError, match="no 'dev'"):
        corpus_path("crfpp-seg", "dev", root=tmp_path / "dest")


@pytest.mark.parametrize("force", [False, True])
def test_fetch_onto_a_directory_names_it_and_leaves_it(corpora_dir, tmp_path, force):
    """A corpus file's place taken by a directory: a one-line error naming that path (not a
    temporary file), and the directory and what is in it left as they were."""
    mirror = tmp_path / "mirror"
    shutil.copytree(corpora_dir / "crfpp" / "seg", mirror / "crfpp" / "seg")
    taken = tmp_path / "dest" / "crfpp" / "seg" / "test.data"
    taken.mkdir(parents=True)
    (taken / "mine.txt").write_text("keep me")
    with pytest.raises(GpseqError) as raised:
        fetch_corpus("crfpp-seg", tmp_path / "dest", mirror=mirror, force=force)
    assert str(raised.value).startswith(f"{taken}: ") and ".tmp-" not in str(raised.value)
    assert "\n" not in str(raised.value)
    assert (taken / "mine.txt").read_text() == "keep me"
    assert not [p for p in taken.parent.iterdir() if p.name.startswith(".")]


def test_fetch_conll2000_from_the_shared_mirror(corpora_dir, tmp_path):
    folder = fetch_corpus("conll2000", tmp_path, mirror=corpora_dir)
    assert (folder / "test.txt").read_bytes() == (corpora_dir / "conll2000" / "test.txt").read_bytes()
    assert len(load_corpus("conll2000", "test", root=tmp_path)) == 2012


def test_conllu_label_column_chooses_upos_or_xpos_and_any_other_column_is_an_error(tmp_path):
    from gpseq.corpora import read_corpus

    path = _write(tmp_path, CONLLU, "x.conllu")
    assert read_corpus(path)[0].labels == ["VERB", "PRON", "ADP", "DET", "NOUN", "PUNCT"]
    assert read_corpus(path, label_column=3)[0].labels == read_corpus(path)[0].labels
    assert read_corpus(path, label_column=4)[0].labels == ["VM", "PP", "SP", "DA", "NC", "Fp"]  # XPOS
    for columns, problem in (({"label_column": 7}, "CoNLL-U labels are UPOS (label column 3, the default) or "
                                                   "XPOS (4), not column 7"),
                             ({"token_column": 2}, "CoNLL-U tokens are the FORM column (1), not column 2")):
        with pytest.raises(InputFormatError) as error:
            read_corpus(path, **columns)
        assert str(error.value) == f"{path}: {problem}"


# ---- read_corpus: every format behind one registry -------------------------------------------


def test_read_corpus_formats_agree_with_their_readers(tmp_path):
    """auto goes by the suffix (.conllu → CoNLL-U, else CoNLL columns for a labelled corpus, raw
    text for unlabelled input); crfpp keeps a -DOCSTART- token that conll treats as a separator;
    raw text has no labels; an unknown format is a ConfigError naming the known ones."""
    from gpseq.corpora import detect_format, read_corpus

    conllu = _write(tmp_path, CONLLU, "x.conllu")
    assert [(s.tokens, s.labels) for s in read_corpus(conllu)] == [(s.tokens, s.labels) for s in read_conllu(conllu)]
    columns = _write(tmp_path, "-DOCSTART- X\n\nThe B-NP\ncat I-NP\n\n-DOCSTART- X\nsat B-VP\n", "x.data")
    assert [s.tokens for s in read_corpus(columns)] == [["The", "cat"], ["sat"]]
    assert [s.tokens for s in read_corpus(columns, "crfpp")] == [["-DOCSTART-"], ["The", "cat"], ["-DOCSTART-", "sat"]]
    assert detect_format(tmp_path / "train.txt") == "conll"
    assert detect_format(tmp_path / "notes.txt", labelled=False) == "text"
    text = _write(tmp_path, "The cat sat. It slept\n\nA second block.\n", "notes.txt")
    sentences = read_corpus(text, labelled=False)
    assert [(s.tokens, s.labels, s.line) for s in sentences] == [
        (["The", "cat", "sat", "."], None, 1), (["It", "slept"], None, 1), (["A", "second", "block", "."], None, 3)]
    assert sentences[0].spaces == [True, True, False, False]
    with pytest.raises(InputFormatError, match="raw text has no labels") as raised:
        read_corpus(text, "text")
    assert str(raised.value).startswith(f"{text}: ")  # the file named, not None
    with pytest.raises(ConfigError, match="known: auto, conll, crfpp, conllu, jsonl, spacy, text"):
        read_corpus(columns, "xml")
    with pytest.raises(InputFormatError, match="no sentences"):
        read_corpus(_write(tmp_path, "\n\n", "empty.conll"))


def test_a_registered_format_is_read_by_read_corpus(tmp_path, monkeypatch):
    """A new format is one decorated reader: read_corpus finds it by name and by suffix."""
    from gpseq.corpora import formats

    monkeypatch.setattr(formats, "FORMATS", dict(formats.FORMATS))
    monkeypatch.setattr(formats, "SUFFIXES", dict(formats.SUFFIXES))

    @formats.register_format("slash", (".slash",))
    def read_slash(source, name, options):
        for number, line in enumerate(source.read_text().splitlines(), 1):
            pairs = [word.rsplit("/", 1) for word in line.split()]
            yield Sentence([w for w, _ in pairs], [t for _, t in pairs] if options.labelled else None,
                           source=name, line=number)

    path = _write(tmp_path, "The/DT cat/NN\nsat/VBD\n", "x.slash")
    assert [(s.tokens, s.labels) for s in formats.read_corpus(path)] == [(["The", "cat"], ["DT", "NN"]),
                                                                         (["sat"], ["VBD"])]
    assert formats.read_corpus(path, "slash", labelled=False)[1].labels is None


def test_jsonl_line_nested_too_deeply_names_file_and_line(tmp_path):
    """A JSON Lines line of deeply nested brackets: InputFormatError naming file and line (was a
    RecursionError traceback from json.loads)."""
    from gpseq.corpora import read_corpus

    path = tmp_path / "deep.jsonl"
    path.write_text('{"tokens": ["ok"], "labels": ["O"]}\n' + "[" * 100_000 + "\n", encoding="utf-8")
    with pytest.raises(InputFormatError, match=r"deep.jsonl:2: .*nested too deeply"):
        read_corpus(path)
    with pytest.raises(InputFormatError, match=r"deep.jsonl:2: "):
        read_corpus(path, labelled=False)


def test_the_dev_split_is_runs_of_consecutive_sentences():
    """Large splits are whole runs of `DEV_BLOCK` consecutive sentences (aligned, drawn without
    replacement); the runs shrink to keep ≥ `BLOCKS_IN_DEV` of them, and at one sentence the
    split is the plain seeded permutation's first indices."""
    from gpseq.corpora.splits import BLOCKS_IN_DEV, DEV_BLOCK

    n = 8936
    train, dev = train_dev_split(n, 0.1, seed=3)
    assert len(dev) == 894 and len(train) + len(dev) == n and not set(train) & set(dev)
    runs = np.split(dev, np.flatnonzero(np.diff(dev) > 1) + 1)
    # whole aligned runs: every run starts a block, and the split touches no more blocks than whole
    # runs need (one more: the corpus's short last block)
    assert len(runs) >= BLOCKS_IN_DEV and all(run[0] % DEV_BLOCK == 0 for run in runs)
    assert len(np.unique(dev // DEV_BLOCK)) <= -(-len(dev) // DEV_BLOCK) + 1
    # 200 sentences: 20 in dev, runs of 2
    _, small = train_dev_split(200, 0.1, seed=3)
    pairs = np.unique(small // 2)
    assert len(pairs) == 10 and np.array_equal(small, np.sort(np.concatenate([2 * pairs, 2 * pairs + 1])))
    # 60 sentences: 6 in dev, single sentences drawn as a seeded permutation
    _, single = train_dev_split(60, 0.1, seed=3)
    assert np.array_equal(single, np.sort(np.random.default_rng(3).permutation(60)[:6]))
