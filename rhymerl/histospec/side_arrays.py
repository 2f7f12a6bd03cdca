"""The storage under `SideIndex` (`rhymerl.histospec.side`, whose docstring gives the layout): its
n-gram table (open addressing: a key's home slot, finding, filing an occurrence, rehashing into a
larger table) and moving its token rows and links into larger arrays. Compiled (numba); the
functions marked nogil also run on the engine's helper thread behind the step
(`SideIndex.room_ahead`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

_U_MIX, _U_32 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(32)
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
