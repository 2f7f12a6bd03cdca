"""The search half of HistoSpec's drafting kernel (numba): a row's longest matched tail in a
`FlatIndex`'s arrays (`match`, as `FlatIndex.match_range`), the first step of every row's search
done for a whole batch at once (`pair_lowers`), and a software prefetch (`prefetch`) for the kernel
and the siblings' inserts (`side_arrays`); `publish` / `observe` hand a count between threads.

A history's keys are sorted (`FlatIndex`: the two tokens before each position, packed in a uint64),
and `samples` holds every SAMPLE-th of them, so a search bisects the samples (a small array the
rows of a step share, in cache) and then one block of SAMPLE keys. Each level of a bisection is a
load that depends on the one before: with 64 history responses per prompt, at 8K-token contexts,
most of those loads miss the caches (~0.2-0.3 ms of a step of 256 requests at 4K x 64).
`pair_lowers` runs the bisections of up to LOCKSTEP rows of one prompt a level at a time together,
so their loads are in flight at once (2026-12-06, captured calls at 4K x 64: kernel 1.08 -> 0.97 ms).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

# A pair's run up to this long has the lines of its occurrences' contexts asked for at once: with 64
# history responses a rhyming pair occurs ~65 times, and a level's run reads all one token ~4% of the
# time (5% of tokens changed), so most levels bisect, each probe a miss that waits on the one before
# (16K x 64 histories, 256 requests: the kernel ~0.64 -> ~0.60 ms in the step). Longer runs (a common
# pair in real text) are left alone: asking for hundreds of lines would evict what the step reads.
PREFETCH_RUN = 128
SAMPLE = 64  # a history's search keys sampled every SAMPLE entries (`FlatSlots`: ~1/8 byte per token)
LOCKSTEP = 16  # rows searched together: an engine's rows come grouped by prompt, 16 samples each


@intrinsic
def prefetch(typingctx, arr, idx):
    """Ask for the cache line of arr[idx] now, for reading soon (LLVM's `prefetch`: a hint, which
    never faults, so idx may lie past the array's end)."""

    def codegen(context, builder, signature, args):
        i8p = ir.IntType(8).as_pointer()
        at = builder.bitcast(builder.gep(context.make_array(arr)(context, builder, args[0]).data, [args[1]]), i8p)
        signature = ir.FunctionType(ir.VoidType(), [i8p] + [ir.IntType(32)] * 3)
        fn = cgutils.get_or_insert_function(builder.module, signature, "llvm.prefetch.p0i8")
        builder.call(fn, [at] + [ir.Constant(ir.IntType(32), v) for v in (0, 3, 1)])  # read, keep close, data
        return context.get_dummy_value()

    return types.void(arr, idx), codegen


@intrinsic
def publish(typingctx, arr, value):
    """arr[0] = value as an atomic store with release order: a thread that reads the new value also
    sees every store made before it (LLVM may neither sink it out of a loop nor move earlier stores
    past it, as it may a plain store). arr: int64, C-contiguous."""

    def codegen(context, builder, signature, args):
        at = context.make_array(arr)(context, builder, args[0]).data
        builder.store_atomic(args[1], at, "release", 8)
        return context.get_dummy_value()

    return types.void(arr, types.int64), codegen


@intrinsic
def observe(typingctx, arr, i):
    """arr[i] as an atomic load with acquire order: what was stored before the `publish` of the value
    read is seen after it. arr: int64, C-contiguous."""

    def codegen(context, builder, signature, args):
        at = builder.gep(context.make_array(arr)(context, builder, args[0]).data, [args[1]])
        return builder.load_atomic(at, "acquire", 8)

    return types.int64(arr, types.intp), codegen


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
            if hi - lo <= PREFETCH_RUN:  # each level's bisections would read the tokens before them one by one
                for j in range(lo, hi):
                    prefetch(text, sa[j] - 4)  # (at the default max_match 7, levels 3..7 read 3..7 tokens back)
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
