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


_ARENAS_AFTER_WORKERS = """
import ctypes, sys, tempfile, threading
import numpy as np
from gpseq.training import allocator
if sys.argv[1] == "one":
    allocator.one_arena()
def work():
    for _ in range(500):
        np.ones(1 << 14).sum()
workers = [threading.Thread(target=work) for _ in range(8)]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
with tempfile.NamedTemporaryFile("r") as out:  # glibc's own report: one <heap> element per arena
    stream = libc.fopen(out.name.encode(), b"w")
    libc.malloc_info(0, ctypes.c_void_p(stream))
    libc.fclose(ctypes.c_void_p(stream))
    print(out.read().count("<heap nr="))
"""


def _arenas_after_workers(mode: str) -> int:
    import subprocess
    import sys

    # a process of its own each: glibc fixes its arena limit for the process
    done = subprocess.run([sys.executable, "-c", _ARENAS_AFTER_WORKERS, mode], capture_output=True, text=True,
                          timeout=120, check=True)
    return int(done.stdout.split()[-1])


def test_one_arena_keeps_the_workers_on_the_main_heap():
    """Threads allocating at once get arenas of their own from glibc (its `malloc_info` lists them);
    after `one_arena` the process has the main heap only."""
    assert _arenas_after_workers("default") > 1
    assert _arenas_after_workers("one") == 1
