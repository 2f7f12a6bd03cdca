"""The search half of the engine's drafting kernel (numba): a row's longest matched tail in a
`FlatIndex`'s arrays (`match`, as `FlatIndex.match_range`) and the first step of every row's search
for a whole batch at once (`pair_lowers`).

A history's keys are sorted (the two tokens before each position, packed in a uint64), and its
`samples` hold every SAMPLE-th key, so a search bisects the samples (small, shared by the rows of a
step) and then one block of SAMPLE keys. `pair_lowers` advances the bisections of up to LOCKSTEP rows
of one prompt a level at a time together, so their memory loads overlap.
"""

from __future__ import annotations

import numpy as np
from numba import njit

SAMPLE = 64  # a history's search keys sampled every SAMPLE entries (`FlatSlots`)
LOCKSTEP = 16  # rows searched together: an engine's rows come grouped by prompt, 16 samples each


@njit(cache=True)
def _lower(key, lo, hi, v):
    """First index in [lo, hi) with key >= v (bisect_left)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if key[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _first_at_least(key, sample, v):
    """bisect_left(key, v), the sampled keys (sample[j] = key[j * SAMPLE]) searched first: the
    bisection's first levels read a small array the rows of a step share (in cache) instead of
    one cache line each deep in a history's keys."""
    lo, hi = _block(_lower(sample, 0, sample.shape[0], v), key.shape[0])
    return _lower(key, lo, hi, v)


@njit(cache=True)
def _block(j, size):
    """The keys to search after the samples' bisection put the value at j: those after sample j - 1
    (it is below the value) up to sample j (not below it); none when j == 0 (key[0] is not below)."""
    if j == 0:
        return 0, 0
    return (j - 1) * SAMPLE + 1, min(size, j * SAMPLE)


@njit(cache=True)
def _first_at_least_from(key, lo, v):
    """bisect_left(key, v, lo): galloping from lo (the range after lo is short: one n-gram's)."""
    size, step, hi = key.shape[0], 1, lo
    while hi < size and key[hi] < v:
        lo = hi + 1
        hi = lo + step
        step *= 2
    return _lower(key, lo, min(hi, size), v)


@njit(cache=True)
def _first_at_least_back(key, hi, v):
    """bisect_left(key, v, 0, hi) when key[hi:] >= v: galloping back from hi (what lies before hi
    and is >= v is one token's run, usually short and on the lines the pair's search just read)."""
    step, lo = 1, hi - 1
    while lo >= 0 and key[lo] >= v:
        hi = lo
        lo = hi - step
        step *= 2
    return _lower(key, max(lo + 1, 0), hi, v)


@njit(cache=True)
def _bisect_back(text, sa, lo, hi, back, tok, right):
    """bisect_left (right: bisect_right) of `tok` in sa[lo:hi] keyed by text[g - back]."""
    while lo < hi:
        mid = (lo + hi) >> 1
        t = text[sa[mid] - back]
        if t < tok or (right and t == tok):
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def match(text, sa, key, sample, q, nq, min_match, pair_lo):
    """(n, lo, hi) as `FlatIndex.match_range` for the reversed tail q[:nq] (q[j]: j + 1 back);
    pair_lo: bisect_left(key, the key of the tail's last pair) when nq >= 2 (`pair_lowers`)."""
    size = key.shape[0]
    if nq < min_match or size == 0:
        return 0, 0, 0
    k1 = np.uint64(q[0] + 1) << np.uint64(32)
    if nq >= 2:
        k2 = k1 | np.uint64(q[1] + 1)
        lo = pair_lo
        hi = _first_at_least_from(key, lo, k2 + np.uint64(1))
        if lo < hi:
            n = 2
            while n < nq:
                back, tok = n + 1, q[n]
                if hi - lo == 1:
                    if text[sa[lo] - back] != tok:
                        break
                    a, b = lo, hi
                else:  # the range's ends first: in rhyming histories all of it often reads `tok`
                    a = lo if text[sa[lo] - back] >= tok else _bisect_back(text, sa, lo + 1, hi, back, tok, False)
                    b = hi if text[sa[hi - 1] - back] <= tok else _bisect_back(text, sa, a, hi - 1, back, tok, True)
                    if a >= b:
                        break
                n, lo, hi = n + 1, a, b
            if n >= min_match:
                return n, lo, hi
            return 0, 0, 0
    if min_match > 1:
        return 0, 0, 0
    if nq >= 2:  # the token's run, if it has one, holds the pair's place or ends right before it
        lo = _first_at_least_back(key, pair_lo, k1)
    else:
        lo = _first_at_least(key, sample, k1)
    hi = _first_at_least_from(key, lo, k1 + (np.uint64(1) << np.uint64(32)))
    if lo < hi:
        return 1, lo, hi
    return 0, 0, 0


@njit(cache=True)
def _lockstep_lower(arr, vals, lo, hi, a, b):
    """lo[i] = bisect_left(arr, vals[i], lo[i], hi[i]) for each i in [a, b), the bisections
    advanced a level at a time together (their loads independent, so in flight at once)."""
    active = True
    while active:
        active = False
        for i in range(a, b):
            low, high = lo[i], hi[i]
            if low < high:
                mid = (low + high) >> 1
                less = arr[mid] < vals[i]  # both ends set without a branch on it
                lo[i] = mid + 1 if less else low
                hi[i] = high if less else mid
                active = True


@njit(cache=True)
def pair_lowers(keys, samples, slots, rows, row_ids, nums, pair_lo, scratch, group):
    """pair_lo[r] = bisect_left of row r's last pair's key (its tokens rows[row_ids[r], :nums[r]]) in
    its slot's keys; -1 where it has no history (slot -1, no keys) or fewer than 2 tokens. Runs of
    rows with the same slot are searched `group` at a time, in lockstep. scratch: 3 x R int64."""
    vals, lo, hi = scratch[0].view(np.uint64), scratch[1], scratch[2]
    count, r = slots.shape[0], 0
    while r < count:
        slot, e = slots[r], r + 1
        while e < count and slots[e] == slot and e - r < group:
            e += 1
        if slot < 0 or keys[slot].shape[0] == 0:
            pair_lo[r:e] = -1
            r = e
            continue
        key, sample = keys[slot], samples[slot]
        for i in range(r, e):
            num, row = nums[i], row_ids[i]
            vals[i] = np.uint64(0)
            if num >= 2:
                vals[i] = (np.uint64(rows[row, num - 1] + 1) << np.uint64(32)) | np.uint64(rows[row, num - 2] + 1)
            lo[i], hi[i] = 0, sample.shape[0]
        _lockstep_lower(sample, vals, lo, hi, r, e)
        for i in range(r, e):
            lo[i], hi[i] = _block(lo[i], key.shape[0])
        _lockstep_lower(key, vals, lo, hi, r, e)
        for i in range(r, e):
            pair_lo[i] = lo[i] if nums[i] >= 2 else -1
        r = e
