"""Large arrays reused, not re-mapped, while the NumPy training runs (glibc's allocator).

The default training evaluates its objective hundreds of times, and each evaluation allocates and
frees the same arrays: token-by-label ones of a chunk ([65,536, V]: 11 MB at V = 44) and the
weights' gradient ([D, V]). glibc serves an allocation above its mmap threshold (at most 32 MiB,
adjusted upwards as large blocks are freed) with a fresh mapping, and returns freed memory at the
top of the heap once it exceeds its trim threshold; the next evaluation then page-faults the same
memory in again, zero-filled by the kernel: a large share of an evaluation's time once the arrays
exceed the thresholds (at V = 44 on CoNLL-2000, not at V = 22).

`arrays_reused()` raises both thresholds for the duration of a training, then hands the freed
memory back (`malloc_trim`) and leaves the mmap threshold at 32 MiB with a trim threshold of
twice that: the state glibc's own dynamic adjustment reaches once a process has freed a 32 MiB
block (any NumPy-heavy process does), which it can no longer reach by itself — its adjustment
stays off once a threshold has been set, as after any `mallopt` call — whereas glibc's initial
128 KiB, fixed, would map and fault in every array above 128 KiB the process allocates after
training (tagging's, say). Peak memory is unchanged: freed blocks are reused, not added to.

`one_arena()` (which `arrays_reused` calls too) makes every thread created after it allocate from
the heap the process already has: glibc otherwise gives each new thread an arena of its own, and
with the raised trim threshold each keeps its freed arrays — the chunk workers' forward–backward
arrays and the sparse products' ones, held two or three times over. The setting lasts for the
process (glibc fixes its arena limit the first time a thread needs one); a command that trains
calls it before it starts any thread (the progress display's).
Elsewhere (another C library, another platform) both do nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # the largest glibc accepts on 64-bit systems
TRIM_THRESHOLD = 1 << 30
AFTER_TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # glibc's dynamic rule: trim = 2 × the mmap threshold


def _glibc():
    """The process's C library when it is glibc (it has `gnu_get_libc_version`), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # musl and others have no such symbol
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except (OSError, AttributeError):
        return None


def one_arena() -> None:
    """Threads created from now on share the existing arenas (the main heap, when no thread has
    made one yet) instead of each making its own (module docstring)."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_ARENA_MAX, 1)


@contextlib.contextmanager
def arrays_reused():
    """Within: freed large arrays stay in the process for the next allocation (module docstring)."""
    libc = _glibc()
    if libc is None:
        yield
        return
    libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    one_arena()
    try:
        yield
    finally:
        libc.mallopt(M_TRIM_THRESHOLD, AFTER_TRIM_THRESHOLD)
        libc.malloc_trim(0)
