"""The storage under `SideIndex` (`rhymerl.histospec.side`, whose docstring gives the layout): its
n-gram table (open addressing: a key's home slot, finding, filing an occurrence, rehashing into a
larger table), appending sequences' tokens and filing their n-grams (for one index, and for many in
one call: `append_many`), and moving the token rows and links into larger arrays. Compiled (numba);
the functions marked nogil also run on the engine's helper thread behind the step
(`SideIndex.room_ahead`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rhymerl.histospec.index import _MUL, _SEED
from rhymerl.histospec.search import prefetch

_U_MIX, _U_32 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(32)
_U_SEED, _U_MUL = np.uint64(_SEED), np.uint64(_MUL)
NSEQ, NOCC, NKEYS = 0, 1, 2  # the counters in SideIndex.state


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


@njit(cache=True)
def index_range(tok, lens, table, links, state, seq, first_end, lo, hi):
    """Insert every n-gram (lo <= n <= hi) of sequence `seq` ending just before positions
    first_end..lens[seq] (`SuffixIndex._index_range`)."""
    rows = tok.shape[0]
    for end in range(first_end, lens[seq] + 1):
        key = _U_SEED
        for n in range(1, min(hi, end) + 1):
            key = key * _U_MUL + np.uint64(tok[seq, end - n] + 1)
            if n >= lo:
                insert(table, links, n - lo, state, key, end * rows + seq)


@njit(cache=True)
def append_one(tok, lens, table, links, state, seq, rows, row, a, b, lo, hi):
    """Append rows[row, a:b] to sequence `seq`, indexing the new n-grams (`SuffixIndex.extend`; the
    engine's token rows are read in place: no list of the new tokens is built)."""
    start = lens[seq]
    for t in range(b - a):
        tok[seq, start + t] = rows[row, a + t]
    lens[seq] = start + b - a
    index_range(tok, lens, table, links, state, seq, start + 1, lo, hi)


@njit(cache=True)
def append_rows(tok, lens, table, links, state, seqs, rows, row_ids, starts, ends, lo, hi):
    """`append_one` of rows[row_ids[j], starts[j]:ends[j]] to sequence seqs[j] for every j, in order."""
    for j in range(seqs.shape[0]):
        append_one(tok, lens, table, links, state, seqs[j], rows, row_ids[j], starts[j], ends[j], lo, hi)


@njit(cache=True)
def _ask_slots(s_table, sides, rows, row_ids, starts, ends, lo, hi):
    """Ask for the home slot of every n-gram `append_many` is about to file (rows[row_ids[j]] ending
    at starts[j] + 1..ends[j], as its sequence holds the row's tokens) before filing any. A step's
    prompts hold ~256 MB of tables at 8K-token contexts and siblings drift apart, so most inserts
    miss the caches (~85 ns each in the step, ~15 ns on one prompt's table alone); asked for together
    the misses overlap (256 requests: the siblings' growth 0.70-0.80 -> 0.60-0.62 ms, 2026-12-06).
    A prefetch, not a load: a pass that loaded each slot first took as long as the inserts it saved."""
    k = sides[0]
    table = s_table[k]
    for j in range(sides.shape[0]):
        if sides[j] != k:
            k = sides[j]
            table = s_table[k]
        mask, row = table.shape[0] - 1, row_ids[j]
        for end in range(starts[j] + 1, ends[j] + 1):
            key = _U_SEED
            for n in range(1, min(hi, end) + 1):
                key = key * _U_MUL + np.uint64(rows[row, end - n] + 1)
                if n >= lo:
                    prefetch(table, 2 * home(key, mask))  # (a slot is two int64s)


@njit(cache=True)
def append_many(s_tok, s_lens, s_table, s_links, s_state, sides, seqs, rows, row_ids, starts, ends, lo, hi):
    """`append_rows` across many indexes (typed lists of their arrays, `rhymerl.histospec.slots`):
    row j goes to sequence seqs[j] of index sides[j]. An index's arrays are taken from the lists
    (~40 ns an item) when the index differs from the row before's: rows grouped by index take each
    index's once."""
    _ask_slots(s_table, sides, rows, row_ids, starts, ends, lo, hi)
    k = sides[0]
    tok, lens, table, links, state = s_tok[k], s_lens[k], s_table[k], s_links[k], s_state[k]
    for j in range(seqs.shape[0]):
        if sides[j] != k:
            k = sides[j]
            tok, lens, table, links, state = s_tok[k], s_lens[k], s_table[k], s_links[k], s_state[k]
        append_one(tok, lens, table, links, state, seqs[j], rows, row_ids[j], starts[j], ends[j], lo, hi)


@njit(cache=True)
def table_full(slots, nkeys, tokens, levels):
    """Whether a table of `slots` holding `nkeys` keys would be more than half full after `tokens`
    more tokens, if each filed `levels` new keys. At most half full: at 2/3 full, probes ran long
    enough (clusters of ~4 slots) to make an engine step ~40% slower."""
    return 2 * (nkeys + tokens * levels) > slots


@njit(cache=True)
def crowded(s_tok, s_table, s_state, at, longest, total, levels, out):
    """out[j]: whether index at[j] must grow before taking `total[at[j]]` more tokens, its longest
    sequence then `longest[at[j]]` long (`SideIndex._room`'s test: a row that long, or a full
    table: `table_full`). One call for a step's indexes: a Python `reserve` per index cost ~3 us
    each, and almost none grows in a step."""
    for j in range(at.shape[0]):
        k = at[j]
        out[j] = longest[k] >= s_tok[k].shape[1] or table_full(s_table[k].shape[0], s_state[k][NKEYS], total[k],
                                                               levels)


@njit(cache=True)
def appending_many(s_lens, s_state, sides, seqs, starts, ends, longest, total):
    """Checked before appending ends[j] - starts[j] tokens to sequence seqs[j] of index sides[j]
    for every j: longest[k], the longest sequence of index k after it, and total[k], the tokens it
    takes (the caller zeroes both). Returns -1 if a sequence id is unknown to its index, else 1 when
    the rows come grouped by index in ascending order (as `append_many` wants them), 0 when not.
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
    return ordered
