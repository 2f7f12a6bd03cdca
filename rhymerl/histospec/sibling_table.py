"""The compiled storage and queries under `SideIndex`, shared by its methods and the engine's kernel.

Layout (one prompt's siblings): `tok[seq, pos]` the tokens (`lens[seq]` written); a position's local
code is pos * rows + seq (rows: a power of two, so wider rows keep every code); `table` is open
addressing (linear probing, at most half full) of (key bits, newest occurrence's local code; -1: free);
`links[code, n - lo]` the previous occurrence of the n-gram ending at `code` (-1: none), a chain
newest first. Keys are 64-bit polynomial hashes: a collision can only cost a rejected draft. Codes
handed out are seq * STRIDE + position.
"""

from __future__ import annotations

import numpy as np
from numba import njit

STRIDE = 1 << 32  # occurrence code = seq_id * STRIDE + position of the continuation token
SEED, MUL = 0x243F6A8885A308D3, 0x9E3779B97F4A7C15
_U_MIX, _U_32 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(32)
_U_SEED, _U_MUL = np.uint64(SEED), np.uint64(MUL)
NSEQ, NOCC, NKEYS = 0, 1, 2  # the counters in `SideIndex.state`: sequences, occurrences, keys
STATE = 3


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
    """File the occurrence `code` (local) under `key`, an n-gram of `level` + lo tokens."""
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


@njit(cache=True)
def rehash(table, new):
    """Move every key into a larger, free table (the chains live in the links: untouched)."""
    mask = new.shape[0] - 1
    for i in range(table.shape[0]):
        if table[i, 1] != -1:
            j = home(np.uint64(table[i, 0]), mask)
            while new[j, 1] != -1:
                j = (j + 1) & mask
            new[j, 0], new[j, 1] = table[i, 0], table[i, 1]


@njit(cache=True)
def copy_rows(tok, lens, nseq, new_tok):
    """new_tok[seq, :lens[seq]] = tok[seq, :lens[seq]] for every sequence."""
    for seq in range(nseq):
        new_tok[seq, :lens[seq]] = tok[seq, :lens[seq]]


@njit(cache=True)
def relayout(links, table, lens, nseq, old_rows, new_links, rows):
    """Re-code links and table heads from position * old_rows + seq to position * rows + seq."""
    for seq in range(nseq):
        for pos in range(lens[seq] + 1):
            src, dst = pos * old_rows + seq, pos * rows + seq
            for level in range(links.shape[1]):
                code = links[src, level]
                new_links[dst, level] = code if code < 0 else code // old_rows * rows + code % old_rows
    for i in range(table.shape[0]):
        code = table[i, 1]
        if code >= 0:
            table[i, 1] = code // old_rows * rows + code % old_rows


@njit(cache=True)
def end_keys(tok, seq, end, lo, hi, out):
    """top = min(hi, end), returned; out[n - lo]: key of the n tokens of `seq` before `end`, n = lo..top."""
    key, top = _U_SEED, min(hi, end)
    for n in range(1, top + 1):
        key = key * _U_MUL + np.uint64(tok[seq, end - n] + 1)
        if n >= lo:
            out[n - lo] = key
    return top


@njit(cache=True)
def index_ends(tok, table, links, state, seq, first_end, last_end, lo, hi):
    """File every n-gram (lo..hi) of sequence `seq` ending just before positions first_end..last_end."""
    rows, keys = tok.shape[0], np.empty(hi - lo + 1, np.uint64)
    for end in range(first_end, last_end + 1):
        for level in range(end_keys(tok, seq, end, lo, hi, keys) - lo + 1):
            insert(table, links, level, state, keys[level], end * rows + seq)


@njit(cache=True)
def append_rows(tok, lens, table, links, state, seqs, rows, row_ids, starts, ends, lo, hi):
    """Append rows[row_ids[j], starts[j]:ends[j]] to sequence seqs[j] in order, filing n-grams (room given)."""
    for j in range(seqs.shape[0]):
        seq, a, b = seqs[j], starts[j], ends[j]
        start = lens[seq]
        for t in range(b - a):
            tok[seq, start + t] = rows[row_ids[j], a + t]
        lens[seq] = start + b - a
        index_ends(tok, table, links, state, seq, start + 1, start + b - a, lo, hi)


@njit(cache=True)
def append_many(s_tok, s_lens, s_table, s_links, s_state, sides, seqs, rows, row_ids, starts, ends, lo, hi):
    """`append_rows` across indexes (typed lists): row j to seqs[j] of sides[j], rows grouped by index."""
    b = 0
    while b < seqs.shape[0]:
        k, e = sides[b], b + 1
        while e < seqs.shape[0] and sides[e] == k:
            e += 1
        append_rows(s_tok[k], s_lens[k], s_table[k], s_links[k], s_state[k], seqs[b:e], rows, row_ids[b:e],
                    starts[b:e], ends[b:e], lo, hi)
        b = e


@njit(cache=True)
def table_full(slots, nkeys, tokens, levels):
    """Whether `slots` holding `nkeys` keys would pass half full after `tokens` x `levels` new keys."""
    return 2 * (nkeys + tokens * levels) > slots


@njit(cache=True)
def crowded(s_tok, s_table, s_state, at, longest, total, levels, out):
    """out[j]: whether index at[j] must grow (rows or table) for `total` more tokens and `longest`."""
    for j in range(at.shape[0]):
        k = at[j]
        out[j] = (longest[k] >= s_tok[k].shape[1]
                  or table_full(s_table[k].shape[0], s_state[k][NKEYS], total[k], levels))


@njit(cache=True)
def appending_many(s_lens, s_state, sides, seqs, starts, ends, longest, total):
    """Before appending ends[j] - starts[j] tokens to sequence seqs[j] of index sides[j]: longest[k] and
    total[k] (zeroed by the caller), index k's longest sequence after and tokens taken. -1: an unknown
    sequence id; 1: rows grouped by index in ascending order (as `append_many` wants); else 0."""
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


@njit(cache=True)
def tail_keys(q, nq, out):
    """out[n - 1]: the key of the last n tokens for n = 1..nq, the tail reversed in q (q[j]: j + 1 back)."""
    key = _U_SEED
    for n in range(nq):
        key = key * _U_MUL + np.uint64(q[n] + 1)
        out[n] = key


@njit(cache=True)
def _log2(rows):
    shift = 0
    while (1 << shift) < rows:
        shift += 1
    return shift


@njit(cache=True)
def longest(lens, table, links, rows, keys, nq, lo, floor):
    """The longest n (floor..nq, floor >= lo) whose key keys[n - 1] occurred with a token after; 0: none."""
    shift, mask = _log2(rows), rows - 1
    for n in range(nq, floor - 1, -1):
        o = find(table, keys[n - 1])
        while o != -1:
            if o >> shift < lens[o & mask]:
                return n
            o = links[o, n - lo]
    return 0


@njit(cache=True)
def recent(table, links, rows, key, level, limit, out):
    """c: out[:c] holds the `limit` most recent codes of `key` (level + lo tokens), oldest first."""
    shift, mask = _log2(rows), rows - 1
    o, count = find(table, key), 0
    while o != -1 and count < limit:
        out[count] = (o & mask) * STRIDE + (o >> shift)
        count += 1
        o = links[o, level]
    for j in range(count // 2):
        out[j], out[count - 1 - j] = out[count - 1 - j], out[j]
    return count


@njit(cache=True)
def sibling_match(lens, table, links, rows, q, nq, n_flat, lo, limit, keys, codes):
    """(n, count) for a row with reversed tail q[:nq] and history match n_flat: n the longer match (0:
    none), codes[:count] the siblings' `limit` most recent occurrences of it, oldest first."""
    tail_keys(q, nq, keys)
    n = n_flat
    if n != nq:  # the history matched the whole tail: no sibling match is longer
        n = max(longest(lens, table, links, rows, keys, nq, lo, max(n + 1, lo)), n)
    if n == 0:
        return 0, 0
    return n, recent(table, links, rows, keys[n - 1], n - lo, limit, codes)
