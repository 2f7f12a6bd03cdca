"""The siblings' queries, compiled (numba): the longest matched tail of a row and its most recent
occurrences in a prompt's `SideIndex` (`rhymerl.histospec.side`, whose docstring gives the layout),
for the Python queries (`SideIndex.longest` / `recent`) and the engine step's drafting kernel
(`sibling_match`, `rhymerl.histospec.kernel`).

The kernel also reads what a step appended and has not filed yet (`pending_keys`: the engine's
helper thread files it behind the step, `SideSlots.extend_rows(defer=True)`): those n-grams are keyed
once per prompt and step, matched beside the table, and count as the newest occurrences, so the
answers are those the filed table would give (`tests/rhymerl/histospec/test_histospec_side.py`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rhymerl.histospec.index import STRIDE
from rhymerl.histospec.search import prefetch
from rhymerl.histospec.side_arrays import _U_MUL, _U_SEED, NPEND, end_keys, find, home


@njit(cache=True)
def tail_keys(q, nq, out):
    """out[n - 1]: the key of the last n tokens for n = 1..nq, the tail reversed in q (q[j]: j + 1
    back), as `rhymerl.histospec.index._tail_keys`."""
    key = _U_SEED
    for n in range(nq):
        key = key * _U_MUL + np.uint64(q[n] + 1)
        out[n] = key


@njit(cache=True)
def _log2(rows):
    """log2 of a power of two."""
    shift = 0
    while (1 << shift) < rows:
        shift += 1
    return shift


@njit(cache=True)
def longest(lens, table, links, rows, keys, nq, lo, floor):
    """The longest n (floor..nq, floor >= lo, the index's shortest n-gram) whose key keys[n - 1]
    occurred with a token after it; 0 if none (`SuffixIndex.longest`: an occurrence at its
    sequence's end continues nothing). `rows`: the sequences the arrays hold, a power of two (local
    codes are position * rows + seq)."""
    shift, mask = _log2(rows), rows - 1
    for n in range(nq, floor - 1, -1):
        o = find(table, keys[n - 1])
        while o != -1:
            if o >> shift < lens[o & mask]:
                return n
            o = links[o, n - lo]
    return 0


@njit(cache=True)
def recent(table, links, rows, key, level, limit, out, count):
    """The `limit` most recent occurrences of `key` (an n-gram of `level` + lo tokens) as codes
    (seq_id * STRIDE + position), oldest first, in out[:c]; c. The `count` codes out holds on entry
    (newer ones not filed yet, newest first) count among them. `rows`: as `longest`."""
    shift, mask = _log2(rows), rows - 1
    o = find(table, key)
    while o != -1 and count < limit:
        out[count] = (o & mask) * STRIDE + (o >> shift)
        count += 1
        o = links[o, level]
    for j in range(count // 2):  # oldest first, in place (a reversed copy allocated per row)
        out[j], out[count - 1 - j] = out[count - 1 - j], out[j]
    return count


@njit(cache=True)
def pending_keys(tok, lens, state, pending, lo, hi, pk, info):
    """The n-grams of the pending ranges (`SideIndex.flush` has not filed them), in the order they
    will be filed: for the e-th pending end, pk[e, n - lo] the key of the n tokens before it for
    n = lo..info[e, 1], info[e, 0] its code (seq * STRIDE + end), info[e, 2] 1 if a token follows
    it. How many (pk, info: room for state[NPTOK])."""
    e = 0
    for p in range(state[NPEND]):
        seq = pending[p, 0]
        for end in range(pending[p, 1], pending[p, 2] + 1):
            top = end_keys(tok, seq, end, lo, hi, pk[e])
            info[e, 0], info[e, 1], info[e, 2] = seq * STRIDE + end, top, end < lens[seq]
            e += 1
    return e


@njit(cache=True)
def _longest_pending(pk, info, npe, keys, nq, lo, floor):
    """`longest` over the pending occurrences alone (floor >= lo; 0: none)."""
    best = 0
    for e in range(npe):
        if info[e, 2]:
            for m in range(min(nq, info[e, 1]), max(floor, best + 1) - 1, -1):
                if pk[e, m - lo] == keys[m - 1]:
                    best = m
                    break
    return best


@njit(cache=True)
def sibling_match(lens, table, links, rows, q, nq, n_flat, lo, limit, keys, codes, pk, info, npe):
    """For a row whose tail, reversed, is q[:nq] and whose history matched its last n_flat tokens:
    (n, count), n the match length (the longer of the history's and the siblings'; 0: none) and the
    siblings' `limit` most recent occurrences of its last n tokens in codes[:count], oldest first
    (what `PromptIndex.recent_match` takes from the siblings; keys: scratch of nq keys). pk, info,
    npe: the pending occurrences (`pending_keys`), answered as if filed: they are the newest."""
    tail_keys(q, nq, keys)
    n = n_flat
    if n != nq:  # the history matched the whole tail: no sibling match is longer (no search)
        floor, mask = max(n + 1, lo), table.shape[0] - 1  # only a longer match than the history's counts
        best = _longest_pending(pk, info, npe, keys, nq, lo, floor) if npe else 0
        if best:  # a pending occurrence matched `best` (>= floor): only a longer filed match counts
            n, floor = best, best + 1
        for m in range(floor, nq + 1):  # the levels' slots asked for at once: longest probes them in turn
            prefetch(table, 2 * home(keys[m - 1], mask))
        n = max(longest(lens, table, links, rows, keys, nq, lo, floor), n)
    if n == 0:
        return 0, 0
    count, key = 0, keys[n - 1]
    for e in range(npe - 1, -1, -1):  # the pending ones newest first: filed later than every filed one
        if count == limit:
            break
        if info[e, 1] >= n and pk[e, n - lo] == key:
            codes[count] = info[e, 0]
            count += 1
    return n, recent(table, links, rows, key, n - lo, limit, codes, count)
