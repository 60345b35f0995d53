"""`gpseq.training.allocator.arrays_reused`: a large array freed inside is reused by the next
allocation of its size (no page faults: the kernel's count of minor faults is the witness); on
leaving it, the freed memory is handed back to the system (faulted in again when reallocated)."""

from __future__ import annotations

import resource

import numpy as np
import pytest

from gpseq.training import allocator

pytestmark = pytest.mark.skipif(allocator._glibc() is None, reason="glibc's allocator only")


def _faults_of_a_fresh_array(size: int) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    array = np.ones(size // 8)  # written: every page touched
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    del array
    return after - before


def test_arrays_freed_inside_are_reused():
    size = 24 << 20  # above glibc's initial mmap threshold, below the largest it accepts
    fresh = size // (2 << 20)  # at least one fault per 2 MiB (transparent huge pages; 4 KiB: 6,144)
    with allocator.arrays_reused():
        first = _faults_of_a_fresh_array(size)  # faulted in once
        inside = [_faults_of_a_fresh_array(size) for _ in range(3)]
    assert first >= fresh and max(inside) < fresh, (first, inside)  # then the same memory again


def test_after_it_the_freed_memory_is_handed_back():
    """96 MiB freed inside stays in the process until the end (1 GiB trim threshold); on leaving,
    `malloc_trim` hands it back, so the same arrays allocated again are faulted in afresh."""
    size, count = 24 << 20, 4
    with allocator.arrays_reused():
        arrays = [np.ones(size // 8) for _ in range(count)]
        del arrays
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    arrays = [np.ones(size // 8) for _ in range(count)]
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del arrays
    assert faults >= count * size // (2 << 20), faults


def test_arrays_reused_does_nothing_without_glibc(monkeypatch):
    monkeypatch.setattr(allocator, "_glibc", lambda: None)
    with allocator.arrays_reused():
        assert np.ones(3).sum() == 3
