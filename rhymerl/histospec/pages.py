"""Which page size the indexes' arrays live on (Linux transparent huge pages): `small_pages`
declines huge pages for arrays written a little at a time, `huge_empty` asks for them for arrays
read at random and never grown.

An engine step's drafting reads each row's history at a few random places (a bisection of its
sorted keys, the text around its occurrences: `rhymerl.histospec.kernel`), and by the next step the
CPU's caches and TLB hold little of it (other work, other tenants of the host). On 4 KB pages nearly
every such read also misses the TLB and walks the page table; NumPy asks for huge pages only for
arrays of 4 MB or more, and a 256K-token history's text and positions are 1 MB each. With its
arrays on huge pages the drafting kernel took 0.64-0.71 instead of 0.75-0.80 ms a step (256 requests
at 8K-token contexts, the prompt's index alone; `rhymerl bench spec-scale`, 2026-12-05, (g)).
Elsewhere (macOS, a kernel without THP) both are no-ops on where the memory lives.
"""

from __future__ import annotations

import ctypes
import mmap
import sys

import numpy as np

HUGE_PAGE = 2 << 20  # x86-64 and most arm64 kernels' transparent huge page
_MADV_HUGEPAGE, _MADV_NOHUGEPAGE = 14, 15  # Linux
_PAGE = mmap.PAGESIZE
_ALIGN = 64  # each array of an arena starts on its own cache line


def _libc_madvise():
    """libc's madvise on Linux (the advice numbers are Linux's), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None


_madvise = _libc_madvise()


def _advise(start: int, end: int, advice: int) -> None:
    """madvise the whole 4 KB pages of [start, end) (errors ignored: advice only)."""
    start, end = -(-start // _PAGE) * _PAGE, end // _PAGE * _PAGE
    if end > start and _madvise is not None:
        _madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), advice)


def small_pages(a: np.ndarray) -> np.ndarray:
    """`a` (freshly allocated, untouched) with Linux's transparent huge pages declined for its
    memory, so its pages are faulted in 4 KB at a time. NumPy asks for huge pages for every array
    of 4 MB or more; the siblings' rows and links are written a little at a time, and on this
    project's machine (THP defrag "madvise") each 2 MB fault could compact memory first: widening
    16 x 16K-token siblings took 12-18 ms of CPU with huge pages, ~2 ms without (2026-12-05)."""
    _advise(a.ctypes.data, a.ctypes.data + a.nbytes, _MADV_NOHUGEPAGE)
    return a


def huge_empty(*specs: tuple[int, np.dtype]) -> tuple[np.ndarray, ...]:
    """1-D arrays, one per (length, dtype) in `specs`, their contents unspecified (the caller writes
    them), laid one after another in one buffer whose whole 2 MB pages are advised as transparent
    huge pages (the buffer's tail, less than one such page, is not: a huge page there would hold
    mostly nothing). Arrays that together fill no huge page, or a platform without the advice, are
    plain `np.empty`s. For arrays written once and then only read at random (a history's index),
    written in place: a copy into such a buffer afterwards competed with the engine's step for
    memory (+1 ms on the longest step while 16 histories were built, 2026-12-05)."""
    dtypes = [np.dtype(dtype) for _, dtype in specs]
    sizes = [-(-int(n) * d.itemsize // _ALIGN) * _ALIGN for (n, _), d in zip(specs, dtypes)]
    total = sum(sizes)
    if total < HUGE_PAGE or _madvise is None:
        return tuple(np.empty(int(n), d) for (n, _), d in zip(specs, dtypes))
    buf = np.empty(total + HUGE_PAGE, np.uint8)  # room to start on a huge page's boundary
    start = -(-buf.ctypes.data // HUGE_PAGE) * HUGE_PAGE
    whole = start + total // HUGE_PAGE * HUGE_PAGE
    _advise(start, whole, _MADV_HUGEPAGE)
    _advise(whole, buf.ctypes.data + buf.nbytes, _MADV_NOHUGEPAGE)  # NumPy may have advised "huge" here
    # Fault the pages in now, the GIL released (ctypes): a huge page's fault zeroes 2 MB and may
    # compact memory first, which inside a NumPy call that holds the GIL would hold up the engine.
    ctypes.memset(start, 0, total)
    out, at = [], start - buf.ctypes.data
    for (n, _), d, size in zip(specs, dtypes, sizes):
        out.append(buf[at:at + int(n) * d.itemsize].view(d))
        at += size
    return tuple(out)
