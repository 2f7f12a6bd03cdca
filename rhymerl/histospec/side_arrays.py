"""The storage under `SideIndex` (`rhymerl.histospec.side`, whose docstring gives the layout): its
n-gram table (open addressing: a key's home slot, finding, filing an occurrence, rehashing into a
larger table), appending sequences' tokens (`copy_many`) and filing their n-grams after (`flush`:
an index's pending ranges, in the order they were appended; in the step, or behind it), and moving
the token rows and links into larger arrays. Compiled (numba); the functions marked nogil also run
on the engine's helper thread behind the step (`SideIndex.room_ahead`, `flush_slots`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rhymerl.histospec.index import _MUL, _SEED
from rhymerl.histospec.search import prefetch

_U_MIX, _U_32 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(32)
_U_SEED, _U_MUL = np.uint64(_SEED), np.uint64(_MUL)
# The counters in SideIndex.state: sequences, occurrences filed, keys in the table, pending ranges
# (appended, their n-grams not yet filed: `SideIndex.pend`), and their tokens.
NSEQ, NOCC, NKEYS, NPEND, NPTOK = 0, 1, 2, 3, 4
STATE = 5


@njit(cache=True)
def home(key, mask):
    """The table slot a key's probe starts at."""
    return np.int64(((key * _U_MIX) >> _U_32) & np.uint64(mask))


@njit(cache=True)
def find(table, key):
    """The newest occurrence of `key` (-1: none)."""
    mask, bits = table.shape[0] - 1, np.int64(key)
    i = home(key, mask)
    while table[i, 1] != -1:
        if table[i, 0] == bits:
            return table[i, 1]
        i = (i + 1) & mask
    return -1


@njit(cache=True)
def insert(table, links, level, state, key, code):
    """File the occurrence `code` (local: position * rows + seq) under `key`, an n-gram of
    `level` + lo tokens (capacity ensured by the caller)."""
    mask, bits = table.shape[0] - 1, np.int64(key)
    state[NOCC] += 1
    i = home(key, mask)
    while table[i, 1] != -1:
        if table[i, 0] == bits:
            links[code, level], table[i, 1] = table[i, 1], code
            return
        i = (i + 1) & mask
    table[i, 0], table[i, 1] = bits, code
    links[code, level] = -1
    state[NKEYS] += 1


@njit(cache=True, nogil=True)  # the helper thread rehashes behind the step (`SideIndex.room_ahead`)
def rehash(table, new):
    """Move every key into a larger table (chains are untouched: they live in the links)."""
    mask = new.shape[0] - 1
    for i in range(table.shape[0]):
        if table[i, 1] != -1:
            j = home(np.uint64(table[i, 0]), mask)
            while new[j, 1] != -1:
                j = (j + 1) & mask
            new[j, 0], new[j, 1] = table[i, 0], table[i, 1]


@njit(cache=True, nogil=True)
def copy_rows(tok, lens, nseq, new_tok):
    """new_tok[seq, :lens[seq]] = tok[seq, :lens[seq]] for every sequence (not the unwritten rest)."""
    for seq in range(nseq):
        new_tok[seq, :lens[seq]] = tok[seq, :lens[seq]]


@njit(cache=True, nogil=True)
def relayout(links, lens, nseq, old_rows, new_links, rows):
    """Move every sequence's links (positions 0..len) from codes position * old_rows + seq to
    position * rows + seq, rewriting the codes they hold (-1: none) the same way."""
    for seq in range(nseq):
        for pos in range(lens[seq] + 1):
            src, dst = pos * old_rows + seq, pos * rows + seq
            for level in range(links.shape[1]):
                code = links[src, level]
                new_links[dst, level] = code if code < 0 else code // old_rows * rows + code % old_rows


@njit(cache=True, nogil=True)
def relayout_heads(table, old_rows, rows):
    """The table's newest occurrences (local codes; -1: a free slot) rewritten as `relayout` does."""
    for i in range(table.shape[0]):
        code = table[i, 1]
        if code >= 0:
            table[i, 1] = code // old_rows * rows + code % old_rows


@njit(cache=True, nogil=True)
def end_keys(tok, seq, end, lo, hi, out):
    """out[n - lo] = the key of the n tokens of sequence `seq` before position `end`, for n = lo..top,
    top = min(hi, end) (returned; no keys when top < lo). The one rolling hash that filing
    (`index_ends`), asking for slots (`_ask_pending`) and the kernel's pending keys
    (`side_search.pending_keys`) share: the keys of `rhymerl.histospec.index._tail_keys`."""
    key, top = _U_SEED, min(hi, end)
    for n in range(1, top + 1):
        key = key * _U_MUL + np.uint64(tok[seq, end - n] + 1)
        if n >= lo:
            out[n - lo] = key
    return top


@njit(cache=True, nogil=True)
def index_ends(tok, table, links, state, seq, first_end, last_end, lo, hi, keys):
    """Insert every n-gram (lo <= n <= hi) of sequence `seq` ending just before positions
    first_end..last_end (`SuffixIndex._index_range`). keys: scratch of hi - lo + 1."""
    rows = tok.shape[0]
    for end in range(first_end, last_end + 1):
        for level in range(end_keys(tok, seq, end, lo, hi, keys) - lo + 1):
            insert(table, links, level, state, keys[level], end * rows + seq)


@njit(cache=True)
def pend(pending, state, seq, first_end, last_end):
    """Note that sequence `seq`'s n-grams ending at first_end..last_end wait to be filed (room in
    `pending` ensured by the caller)."""
    if last_end >= first_end:
        at = state[NPEND]
        pending[at, 0], pending[at, 1], pending[at, 2] = seq, first_end, last_end
        state[NPEND], state[NPTOK] = at + 1, state[NPTOK] + last_end - first_end + 1


@njit(cache=True)
def copy_rows_of(tok, lens, pending, state, seqs, rows, row_ids, starts, ends):
    """Append rows[row_ids[j], starts[j]:ends[j]] to sequence seqs[j] for every j, in order, their
    n-grams pending (`flush` files them; the engine's token rows are read in place)."""
    for j in range(seqs.shape[0]):
        seq, a, b = seqs[j], starts[j], ends[j]
        start = lens[seq]
        for t in range(b - a):
            tok[seq, start + t] = rows[row_ids[j], a + t]
        lens[seq] = start + b - a
        pend(pending, state, seq, start + 1, start + b - a)


@njit(cache=True, nogil=True)
def _ask_pending(tok, table, state, pending, lo, hi):
    """Ask for the home slot of every n-gram `flush` is about to file before filing any. A step's
    prompts hold ~256 MB of tables at 8K-token contexts and siblings drift apart, so most inserts
    miss the caches (~85 ns each in the step, ~15 ns on one prompt's table alone); asked for together
    the misses overlap (256 requests: the siblings' growth 0.70-0.80 -> 0.60-0.62 ms, 2026-12-06).
    A prefetch, not a load: a pass that loaded each slot first took as long as the inserts it saved."""
    mask, keys = table.shape[0] - 1, np.empty(hi - lo + 1, np.uint64)
    for p in range(state[NPEND]):
        seq = pending[p, 0]
        for end in range(pending[p, 1], pending[p, 2] + 1):
            for level in range(end_keys(tok, seq, end, lo, hi, keys) - lo + 1):
                prefetch(table, 2 * home(keys[level], mask))  # (a slot is two int64s)


@njit(cache=True, nogil=True)
def flush(tok, table, links, state, pending, lo, hi):
    """File the pending ranges' n-grams, in the order they were appended (so every key's chain lists
    its occurrences as if each had been filed when appended)."""
    keys = np.empty(hi - lo + 1, np.uint64)
    for p in range(state[NPEND]):
        index_ends(tok, table, links, state, pending[p, 0], pending[p, 1], pending[p, 2], lo, hi, keys)
    state[NPEND], state[NPTOK] = 0, 0


@njit(cache=True)
def copy_many(s_tok, s_lens, s_pend, s_state, sides, seqs, rows, row_ids, starts, ends):
    """`copy_rows_of` across many indexes (typed lists of their arrays, `rhymerl.histospec.slots`):
    row j goes to sequence seqs[j] of index sides[j] (rows grouped by index: an index's arrays are
    taken from the lists, ~40 ns an item, when it differs from the row before's)."""
    b = 0
    while b < seqs.shape[0]:
        k, e = sides[b], b + 1
        while e < seqs.shape[0] and sides[e] == k:
            e += 1
        copy_rows_of(s_tok[k], s_lens[k], s_pend[k], s_state[k], seqs[b:e], rows, row_ids[b:e], starts[b:e],
                     ends[b:e])
        b = e


@njit(cache=True, nogil=True)
def flush_slots(s_tok, s_table, s_links, s_state, s_pend, at, lo, hi):
    """`flush` the indexes in slots `at` that have pending ranges (a freed slot holds empty arrays),
    all their tables' slots asked for first."""
    for k in at:
        if s_state[k].shape[0] == STATE and s_state[k][NPEND]:
            _ask_pending(s_tok[k], s_table[k], s_state[k], s_pend[k], lo, hi)
    for k in at:
        if s_state[k].shape[0] == STATE and s_state[k][NPEND]:
            flush(s_tok[k], s_table[k], s_links[k], s_state[k], s_pend[k], lo, hi)


@njit(cache=True)
def table_full(slots, nkeys, tokens, levels):
    """Whether a table of `slots` holding `nkeys` keys would be more than half full after `tokens`
    more tokens, if each filed `levels` new keys. At most half full: at 2/3 full, probes ran long
    enough (clusters of ~4 slots) to make an engine step ~40% slower."""
    return 2 * (nkeys + tokens * levels) > slots


@njit(cache=True)
def crowded(s_tok, s_table, s_state, s_pend, at, longest, total, ranges, levels, out):
    """out[j]: whether index at[j] must grow before taking `total[at[j]]` more tokens in
    `ranges[at[j]]` more pending ranges, its longest sequence then `longest[at[j]]` long
    (`SideIndex._room`'s test: a row that long, a full table (`table_full`, pending tokens
    counted), or no room for the ranges). One call for a step's indexes: a Python `reserve` per
    index cost ~3 us each, and almost none grows in a step."""
    for j in range(at.shape[0]):
        k = at[j]
        state = s_state[k]
        out[j] = (longest[k] >= s_tok[k].shape[1]
                  or table_full(s_table[k].shape[0], state[NKEYS], total[k] + state[NPTOK], levels)
                  or state[NPEND] + ranges[k] > s_pend[k].shape[0])


@njit(cache=True)
def appending_many(s_lens, s_state, sides, seqs, starts, ends, longest, total, ranges):
    """Checked before appending ends[j] - starts[j] tokens to sequence seqs[j] of index sides[j]
    for every j: longest[k], the longest sequence of index k after it, total[k], the tokens it
    takes, and ranges[k], its rows (the caller zeroes all three). Returns -1 if a sequence id is
    unknown to its index, else 1 when the rows come grouped by index in ascending order (as
    `copy_many` wants them), 0 when not.
    s_lens / s_state: the indexes' arrays (a typed list, or a tuple of one index's), taken when the
    index differs from the row before's (an engine's rows come grouped by prompt)."""
    ordered, k = 1, -1
    lens, state = s_lens[0], s_state[0]
    for j in range(seqs.shape[0]):
        if sides[j] != k:
            ordered &= sides[j] > k
            k = sides[j]
            lens, state = s_lens[k], s_state[k]
        seq = seqs[j]
        if seq < 0 or seq >= state[NSEQ]:
            return -1
        count = ends[j] - starts[j]
        longest[k], total[k] = max(longest[k], lens[seq] + count), total[k] + count
        ranges[k] += 1
    return ordered
