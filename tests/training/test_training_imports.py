"""The default training imports no `scipy.sparse`: its products run SciPy's compiled loops loaded
on their own (`gpseq.features.rows.sparsetools`), because the package's import costs a third of a
second and ~24 MB, a tenth of a small corpus's training. The model it writes is the one the same
training gives with the package imported first (the same loops, the same bits)."""

import subprocess
import sys

import numpy as np
import pytest

from helpers import SAMPLE

RUN = (
    "import sys\n"
    "if sys.argv[1] == 'first': import scipy.sparse\n"
    "from gpseq.cli import main\n"
    "sys.argv = ['gpseq', 'train', *sys.argv[2:]]\n"
    "try:\n    main()\nexcept SystemExit as exit:\n    assert not exit.code, exit.code\n"
    "print('SPARSE', 'scipy.sparse' in sys.modules)\n"
)


@pytest.mark.parametrize("path", [[], ["--set", "training.cross_fit_tokens=0"]], ids=["cross-fitting", "dev-split"])
def test_default_training_without_scipys_sparse_package(tmp_path, path):
    if not (SAMPLE / "train.conll").is_file():
        pytest.skip("the bundled sample corpus (corpora/sample/train.conll) is not there")
    blocks = (SAMPLE / "train.conll").read_text(encoding="utf-8").split("\n\n")[:60]
    corpus = tmp_path / "small.conll"
    corpus.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    models = {}
    for when in ("never", "first"):
        models[when] = tmp_path / when
        done = subprocess.run([sys.executable, "-c", RUN, when, str(corpus), "--features", "ner", "-o",
                               str(models[when]), *path], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert f"SPARSE {when == 'first'}" in done.stdout
    never, first = (np.load(models[when] / "arrays.npz") for when in ("never", "first"))
    assert set(never.files) == set(first.files)
    for name in never.files:
        np.testing.assert_array_equal(never[name], first[name], err_msg=name)
