"""The CPU tricks the drafting kernel keeps: they hide memory latency (a step's histories are mostly
out of the caches after the forward pass).

- `prefetch`: LLVM's software prefetch (never faults) of a matched run's contexts and each
  candidate continuation's end, before the loads that need them.
- sampled keys: sorted search keys sampled every SAMPLE entries (`first_at_least` bisects the sample).
- `pair_lowers`: the first bisection of up to LOCKSTEP rows advanced together, loads in flight at once.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

SAMPLE = 64  # a history's search keys sampled every SAMPLE entries (`FlatSlots`)
LOCKSTEP = 16  # rows searched together: an engine's rows come grouped by prompt, 16 samples each
PREFETCH_RUN = 128  # a matched run up to this long has its contexts' lines asked for at once


@intrinsic
def prefetch(typingctx, arr, idx):
    """Prefetch the cache line of arr[idx] for reading (never faults: idx may lie past the end)."""

    def codegen(context, builder, signature, args):
        i8p = ir.IntType(8).as_pointer()
        at = builder.bitcast(builder.gep(context.make_array(arr)(context, builder, args[0]).data, [args[1]]), i8p)
        signature = ir.FunctionType(ir.VoidType(), [i8p] + [ir.IntType(32)] * 3)
        fn = cgutils.get_or_insert_function(builder.module, signature, "llvm.prefetch.p0i8")
        builder.call(fn, [at] + [ir.Constant(ir.IntType(32), v) for v in (0, 3, 1)])  # read, keep close, data
        return context.get_dummy_value()

    return types.void(arr, idx), codegen


@njit(cache=True)
def lower(key, lo, hi, v):
    """First index in [lo, hi) with key >= v (bisect_left)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if key[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def first_at_least(key, sample, v):
    """bisect_left(key, v), searching the shared, cached sample (sample[j] = key[j * SAMPLE]) first."""
    lo, hi = _block(lower(sample, 0, sample.shape[0], v), key.shape[0])
    return lower(key, lo, hi, v)


@njit(cache=True)
def _block(j, size):
    """The key block between samples j - 1 and j, where the sample bisection put the value (j == 0: none)."""
    if j == 0:
        return 0, 0
    return (j - 1) * SAMPLE + 1, min(size, j * SAMPLE)


@njit(cache=True)
def _lockstep_lower(arr, vals, lo, hi, a, b):
    """lo[i] = bisect_left(arr, vals[i], lo[i], hi[i]) for i in [a, b), advanced a level at a time together."""
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
    """pair_lo[r] = bisect_left of row r's last pair's key in its slot's keys (-1: no history or < 2
    tokens); same-slot rows searched `group` at a time in lockstep. scratch: 3 x R int64."""
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
