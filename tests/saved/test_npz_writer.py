"""`write_npz` (gpseq/saved/files.py), the writer of arrays.npz and vocabulary.npz: against NumPy's
own `np.savez` / `np.savez_compressed`, member by member, with the pieces it hands the archive
smaller than one array so that every array spans several, and read back by `np.load` and by
gpseq's checked reader `read_npz`."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from gpseq.saved import files
from gpseq.saved.files import read_npz, write_npz


@pytest.mark.parametrize("compress", [True, False])
def test_write_npz_holds_the_members_numpy_writes(tmp_path, monkeypatch, compress):
    monkeypatch.setattr(files, "WRITE_PIECE_BYTES", 1000)
    rng = np.random.default_rng(0)
    arrays = {"weights": rng.normal(size=(300, 7)).astype(np.float32), "ids": np.arange(5), "scalar": np.array(2.5),
              "empty": np.zeros((0, 3)), "keys": rng.integers(0, 2**63, size=9, dtype=np.uint64),
              "last": rng.normal(size=1001)}
    path = tmp_path / "arrays.npz"
    write_npz(path, arrays, compress=compress)
    reference = io.BytesIO()
    (np.savez_compressed if compress else np.savez)(reference, **arrays)
    with zipfile.ZipFile(path) as ours, zipfile.ZipFile(reference) as theirs:
        assert ours.namelist() == theirs.namelist()
        for name in theirs.namelist():
            assert ours.read(name) == theirs.read(name), name
            assert ours.getinfo(name).compress_type == theirs.getinfo(name).compress_type
    loaded = np.load(path)
    with open(path, "rb") as handle:
        checked = read_npz(handle, path)
    for name, value in arrays.items():
        for read in (loaded[name], checked[name]):
            assert read.dtype == value.dtype and read.shape == value.shape
            np.testing.assert_array_equal(read, value)


def test_write_npz_writes_a_fortran_ordered_array_as_its_values_and_refuses_objects(tmp_path):
    values = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    write_npz(tmp_path / "a.npz", {"a": values}, compress=True)
    np.testing.assert_array_equal(np.load(tmp_path / "a.npz")["a"], values)
    with pytest.raises(ValueError, match="Python objects"):
        write_npz(tmp_path / "b.npz", {"b": np.array([{}, 1], dtype=object)}, compress=False)
