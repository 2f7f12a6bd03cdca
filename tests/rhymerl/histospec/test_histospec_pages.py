import os

import numpy as np
import pytest

from rhymerl.histospec.flat import FlatIndex
from rhymerl.histospec.pages import HUGE_PAGE, huge_empty, small_pages

THP = pytest.mark.skipif(not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"),
                         reason="a Linux kernel with transparent huge pages (madvise advice, /proc/self/smaps)")


@THP
def test_small_pages_marks_the_arrays_memory_no_huge_pages():
    # Rule: small_pages(a) returns a, its memory advised MADV_NOHUGEPAGE: the kernel lists the
    # mapping holding it with the "nh" flag (NumPy's own advice for arrays >= 4 MB is "hg").
    a, plain = small_pages(np.empty(16 << 20, np.uint8)), np.empty(16 << 20, np.uint8)
    assert "nh" in _vm_flags(a.ctypes.data + (8 << 20))
    assert "nh" not in _vm_flags(plain.ctypes.data + (8 << 20))


@THP
def test_huge_empty_lays_arrays_on_huge_pages_and_leaves_the_tail_small():
    # Rule: arrays that fill a 2 MB page share one buffer starting on a huge page's boundary (each on
    # its own cache line), its whole huge pages advised "hg" (NumPy would not: each is < 4 MB), the
    # part past the last whole one "nh".
    a, b = huge_empty((300_001, np.int32), (300_000, np.uint64))  # 1.2 + 2.4 MB
    assert (a.shape, a.dtype, b.shape, b.dtype) == ((300_001,), np.int32, (300_000,), np.uint64)
    assert a.base is b.base and a.ctypes.data % HUGE_PAGE == 0 and b.ctypes.data % 64 == 0
    assert b.ctypes.data >= a.ctypes.data + a.nbytes
    a[:], b[:] = 7, 9  # they do not overlap
    assert (a == 7).all() and (b == 9).all()
    assert "hg" in _vm_flags(a.ctypes.data)
    assert "nh" in _vm_flags(b.ctypes.data + b.nbytes - 1)  # 3.6 MB in all: its last 1.6 MB


def test_huge_empty_gives_plain_arrays_that_fill_no_huge_page():
    # Rule: under 2 MB in all, each array is its own np.empty (a huge page would hold mostly nothing).
    a, b = huge_empty((1000, np.int64), (10, np.float64))
    assert a.shape == (1000,) and b.dtype == np.float64 and a.base is None and b.base is None


def test_a_large_history_index_lives_on_huge_pages_with_the_same_answers():
    # Rule: FlatIndex.build puts text, positions and keys of a history over 2 MB in one huge-page
    # buffer; what it answers does not depend on where they live.
    rng = np.random.default_rng(1)
    base = rng.integers(0, 1000, 50_000)
    tokens = np.concatenate([base, base, base])  # 150K tokens: ~2.4 MB of arrays
    flat = FlatIndex.build(tokens, [50_000] * 3, min_match=1, max_match=7)
    assert flat.sa.base is not None and flat.sa.base is flat.key.base is flat.text.base
    assert flat.text.ctypes.data % HUGE_PAGE == 0
    small = FlatIndex.build(tokens[:3000], [1000] * 3, min_match=1, max_match=7)
    assert small.text.base is None and small.sa.base is None
    context = base[500:520].tolist()
    n, codes = flat.recent_match(context, 8)
    assert n == 7 and len(codes) == 3
    assert [flat.seq_pos(c) for c in codes] == [(s, 520) for s in range(3)]


def _vm_flags(address):
    """The VmFlags of the mapping holding `address` in /proc/self/smaps."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError("no mapping holds the address")
