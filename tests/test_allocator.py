"""`gpseq.training.allocator.arrays_reused`: a large array freed inside is reused by the next
allocation of its size (no page faults: the kernel's count of minor faults is the witness); after
it, glibc's initial thresholds are back and such an array is mapped (and faulted in) afresh."""

from __future__ import annotations

import resource

import numpy as np
import pytest

from gpseq.training import allocator

pytestmark = pytest.mark.skipif(allocator._glibc() is None, reason="glibc's allocator only")

SIZE = 24 << 20  # above glibc's initial mmap threshold, below the largest it accepts


def _faults_of_a_fresh_array() -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    array = np.ones(SIZE // 8)  # written: every page touched
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    del array
    return after - before


def test_arrays_freed_inside_are_reused_and_the_thresholds_restored_after():
    with allocator.arrays_reused():
        _faults_of_a_fresh_array()  # the first one is faulted in
        inside = [_faults_of_a_fresh_array() for _ in range(3)]
    after = [_faults_of_a_fresh_array() for _ in range(3)]
    # a fresh 24 MiB takes at least one fault per 2 MiB (transparent huge pages; 4 KiB pages: 6,144)
    fresh = SIZE // (2 << 20)
    assert max(inside) < fresh <= min(after), (inside, after)  # inside: the same memory again


def test_arrays_reused_does_nothing_without_glibc(monkeypatch):
    monkeypatch.setattr(allocator, "_glibc", lambda: None)
    with allocator.arrays_reused():
        assert np.ones(3).sum() == 3
