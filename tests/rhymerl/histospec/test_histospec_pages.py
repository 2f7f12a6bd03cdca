import os

import numpy as np
import pytest

from rhymerl.histospec.flat import FlatIndex
from rhymerl.histospec.pages import HUGE_PAGE, huge_arrays, small_pages

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
def test_huge_arrays_copies_onto_huge_pages_and_leaves_the_tail_small():
    # Rule: arrays that fill a 2 MB page are copied, equal and contiguous, into one buffer starting on
    # a huge page's boundary, its whole huge pages advised "hg" (NumPy would not: each is < 4 MB),
    # the part past the last whole one "nh".
    rng = np.random.default_rng(0)
    a = rng.integers(0, 1 << 30, 300_000).astype(np.int32)  # 1.2 MB each: under NumPy's 4 MB
    b = rng.integers(0, 1 << 60, 300_000, dtype=np.uint64)
    a2, b2 = huge_arrays(a, b)
    assert np.array_equal(a, a2) and np.array_equal(b, b2) and a2.dtype == a.dtype and b2.dtype == b.dtype
    assert a2.flags.c_contiguous and b2.flags.c_contiguous
    assert a2.ctypes.data % HUGE_PAGE == 0 and b2.ctypes.data % 64 == 0
    assert "hg" in _vm_flags(a2.ctypes.data)
    assert "nh" in _vm_flags(b2.ctypes.data + b2.nbytes - 1)  # 3.6 MB in all: its last 1.6 MB


def test_huge_arrays_leaves_arrays_that_fill_no_huge_page():
    # Rule: under 2 MB in all, the arrays come back as given (a huge page would hold mostly nothing).
    a, b = np.arange(1000), np.ones((10, 10))
    got = huge_arrays(a, b)
    assert got[0] is a and got[1] is b


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
    assert small.text.base is None or small.text.base is not small.sa.base
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
