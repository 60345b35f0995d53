"""`gpseq tag` of one sentence imports neither SciPy (pre-tokenised or raw text) nor, once the language's
tokenizer rules are cached, spaCy: those imports were most of its start-up. What it writes is what the
imported libraries give: SciPy's sparse product, spaCy's tokens."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpseq.features import rows as rows_module

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "en_pos_conll2000"
RUN = (
    "import sys\n"
    "from gpseq.cli import main\n"
    "sys.argv = ['gpseq', 'tag', *sys.argv[1:]]\n"
    "try:\n    main()\nexcept SystemExit as exit:\n    assert not exit.code, exit.code\n"
    "print('LOADED', sorted({name.split('.')[0] for name in sys.modules} & {'scipy', 'spacy', 'tensorflow'}))\n"
)


def _tag(*args: str, cache: Path) -> tuple[list[list[str]], str]:
    env = {**os.environ, "GPSEQ_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, timeout=180,
                         check=True, env=env).stdout
    rows = [line.split("\t") for line in out.splitlines() if "\t" in line]
    return rows, next(line for line in out.splitlines() if line.startswith("LOADED"))


@pytest.fixture(scope="module")
def model():
    if not (MODEL / "arrays.npz").is_file():
        pytest.skip("the pretrained POS model is not in this checkout")
    return MODEL


def test_pretokenised_sentence_without_scipy(model, tmp_path, monkeypatch):
    text = tmp_path / "one.conll"
    text.write_text("The\ncat\nsat\non\nthe\nmat\n.\n\n", encoding="utf-8")
    lines, loaded = _tag(str(model), str(text), cache=tmp_path / "cache")
    assert loaded == "LOADED []"
    from gpseq.corpora import read_corpus
    from gpseq.tagger import Tagger

    monkeypatch.setattr(rows_module, "SCIPY_NNZ", 0)  # every product through scipy.sparse
    [expected] = Tagger.load(model).tag(read_corpus(text, label_column=None))
    assert [label for _, label, _ in lines] == list(expected.labels)
    chosen = [expected.label_set.index(label) for label in expected.labels]
    np.testing.assert_allclose([float(p) for _, _, p in lines],
                               expected.probabilities[np.arange(len(lines)), chosen], atol=2e-6)


def test_raw_text_without_spacy_once_rules_are_cached(model, tmp_path):
    text = tmp_path / "one.txt"
    text.write_text("Dr. Smith didn't pay $5.50 for the U.S. book (2nd ed.)! Did he?\n\nYes.\n", encoding="utf-8")
    cache = tmp_path / "cache"
    first, loaded_first = _tag(str(model), str(text), cache=cache)
    assert "spacy" in loaded_first and list((cache / "tokenizer").glob("en-spacy-*.json"))
    second, loaded_second = _tag(str(model), str(text), cache=cache)
    assert loaded_second == "LOADED []"
    assert second == first  # spaCy's tokens, sentences and so tags, from the cached rules
    assert [row[0] for row in first][:6] == ["Dr.", "Smith", "did", "n't", "pay", "$"]
