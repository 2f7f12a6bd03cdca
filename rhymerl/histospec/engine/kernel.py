"""The engine's drafting kernel (numba): every row of a batch drafted in one call, bit for bit as
`HistoSpecDrafter.own` drafts it (the reference the tests compare against). Per row: the longest
matched tail in history (`match`) and siblings, the `limit` most recent occurrences, and the walk
down their continuations (`follow`). R rows, W the widest budget.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from rhymerl.histospec.engine.cpu_tricks import (LOCKSTEP, PREFETCH_RUN, first_at_least, lower, pair_lowers,
                                                 prefetch)
from rhymerl.histospec.index import PAD
from rhymerl.histospec.sibling_table import STRIDE, sibling_match


# The kernel's packed arguments (namedtuples numba reads by field): per slot, the histories' and siblings'
# arrays (numba typed lists); per row (int64), its history / siblings slot (-1: none), its siblings' code
# shift, token row, context length and budget; the drafting rules; the outputs (lengths 0: no draft).
HistoryArrays = namedtuple("HistoryArrays", "texts sas keys samples starts rewards")
SiblingArrays = namedtuple("SiblingArrays", "tok lens table links rewards")
Rows = namedtuple("Rows", "slots sides shifts row_ids nums budgets")
Params = namedtuple("Params", "limit min_match max_match max_spec_factor reward_weighted min_token_prob prior")
Drafts = namedtuple("Drafts", "tokens lengths match score probs")


@njit(cache=True)
def _first_at_least_from(key, lo, v):
    """bisect_left(key, v, lo): galloping from lo (the range after lo is short: one n-gram's)."""
    size, step, hi = key.shape[0], 1, lo
    while hi < size and key[hi] < v:
        lo = hi + 1
        hi = lo + step
        step *= 2
    return lower(key, lo, min(hi, size), v)


@njit(cache=True)
def _first_at_least_back(key, hi, v):
    """bisect_left(key, v, 0, hi) when key[hi:] >= v, galloping back from hi (the run is usually short)."""
    step, lo = 1, hi - 1
    while lo >= 0 and key[lo] >= v:
        hi = lo
        lo = hi - step
        step *= 2
    return lower(key, max(lo + 1, 0), hi, v)


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
            if hi - lo <= PREFETCH_RUN:
                for j in range(lo, hi):
                    prefetch(text, sa[j] - 4)
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
        lo = first_at_least(key, sample, k1)
    hi = _first_at_least_from(key, lo, k1 + (np.uint64(1) << np.uint64(32)))
    if lo < hi:
        return 1, lo, hi
    return 0, 0, 0


@njit(cache=True)
def _best_token(toks, alive, n, codes, rewards, reward_weighted):
    """`drafter._best_group` over alive[:n] with tokens toks[:n] at this depth: (token, group size).
    Rewards summed in ascending codes, as the Python drafter; no ties (codes are distinct)."""
    best, bc, br, bl = -1, 0, 0.0, -1
    for i in range(n):
        tok = toks[i]
        seen = False
        for e in range(i):
            if toks[e] == tok:
                seen = True
                break
        if seen:
            continue
        count, reward, latest = 0, 0.0, -1
        for e in range(i, n):
            if toks[e] == tok:
                count += 1
                if reward_weighted:
                    reward += rewards[alive[e]]
                latest = max(latest, codes[alive[e]])
        if reward_weighted:
            better = (reward > br or (reward == br and (count > bc or (count == bc and latest > bl))))
        else:
            better = count > bc or (count == bc and latest > bl)
        if best < 0 or better:
            best, bc, br, bl = tok, count, reward, latest
    return best, bc


@njit(cache=True)
def _column(text, stext, pos, own, alive, n, depth, toks):
    """How many of alive[:n] go on at `depth` (kept in place, ascending), their tokens into toks."""
    kept, i = 0, 0
    while i < n and alive[i] < own:
        tok = text[pos[alive[i]] + depth]
        if tok != PAD:
            alive[kept], toks[kept] = alive[i], tok
            kept += 1
        i += 1
    while i < n:
        tok = stext[pos[alive[i]] + depth]
        if tok != PAD:
            alive[kept], toks[kept] = alive[i], tok
            kept += 1
        i += 1
    return kept


@njit(cache=True)
def follow(text, stext, pos, own, m, codes, rewards, budget, reward_weighted, min_token_prob, prior,
           out, out_prob, r, alive, toks):
    """`drafter.follow` over m continuations (codes ascending): the first `own` in the history's text
    at pos[:own], the rest in `stext` at pos[own:m], each PAD-ended. Writes out[r] / out_prob[r];
    (length, score summed as Python's `sum`). `alive`, `toks`: room for m. 0 < budget. Column by
    column instead of sorting: the same draft, as a group's choice depends on its members only."""
    for a in range(m):
        alive[a] = a
    for a in range(own):
        prefetch(text, pos[a] + budget - 1)
    n = _column(text, stext, pos, own, alive, m, 0, toks)  # the non-empty ones
    if n == 0:
        return 0, 0.0
    prob = n / (n + prior)
    if prob < min_token_prob:
        return 0, 0.0
    depth, score = 0, 0.0
    while True:
        tok, count = toks[0], 0
        for i in range(n):
            count += toks[i] == tok
        if count < n:  # a branch: keep the best group (a majority is: no other is as large)
            if reward_weighted or 2 * count <= n:
                tok, count = _best_token(toks, alive, n, codes, rewards, reward_weighted)
            prob *= count / n
            if prob < min_token_prob:
                return depth, score
            kept = 0
            for i in range(n):
                if toks[i] == tok:
                    alive[kept] = alive[i]
                    kept += 1
            n = kept
        out[r, depth], out_prob[r, depth] = tok, prob
        score += prob
        depth += 1
        if depth == budget:
            break
        n = _column(text, stext, pos, own, alive, n, depth, toks)
        if n == 0:
            break
    return depth, score


@njit(cache=True)
def _sorted_into(sa, lo, hi, near):
    """near[:hi - lo] = sorted(sa[lo:hi]) by insertion (a few dozen entries)."""
    for j in range(hi - lo):
        v, b = sa[lo + j], j
        while b > 0 and near[b - 1] > v:
            near[b] = near[b - 1]
            b -= 1
        near[b] = v


@njit(cache=True)
def _sift(heap, k, v):
    """Put v at the root of the min-heap heap[:k] and sift it down."""
    b = 0
    while True:
        c = 2 * b + 1
        if c >= k:
            break
        if c + 1 < k and heap[c + 1] < heap[c]:
            c += 1
        if heap[c] >= v:
            break
        heap[b] = heap[c]
        b = c
    heap[b] = v


@njit(cache=True)
def _top_into(sa, lo, hi, k, near, ascending):
    """near[:k] = the k largest (most recent) entries of sa[lo:hi], ascending only if `ascending`
    (0 < k <= hi - lo), by a min-heap in one pass."""
    for j in range(k):
        v, b = sa[lo + j], j
        while b > 0 and near[(b - 1) >> 1] > v:  # heapify by sifting up
            near[b] = near[(b - 1) >> 1]
            b = (b - 1) >> 1
        near[b] = v
    for j in range(lo + k, hi):
        if sa[j] > near[0]:
            _sift(near, k, sa[j])
    if ascending:
        _sorted_into(near, 0, k, near)


@njit(cache=True)
def _seq_of(starts, code):
    """bisect_right(starts, code) - 1: the history sequence holding an occurrence code."""
    lo, hi = 0, starts.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if code < starts[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo - 1



@njit(cache=True)
def draft_rows(hist, sib, tokens, rows, params, out):
    """Draft row r from tokens[rows.row_ids[r], :rows.nums[r]], <= rows.budgets[r] tokens, from the
    `params.limit` most recent occurrences of the longest tail (the history's first if it matched as
    long, then the siblings'). A prompt's rows should be adjacent: its arrays are taken once per run."""
    count, limit, lo_match, width = rows.slots.shape[0], params.limit, params.min_match, out.tokens.shape[1]
    q, keys, found, pos, codes, rewards, alive, toks, near = (
        np.empty(params.max_match, np.int64), np.empty(params.max_match, np.uint64), np.empty(limit, np.int64),
        np.empty(limit, np.int64), np.empty(limit, np.int64), np.zeros(limit), np.empty(limit, np.int64),
        np.empty(limit, np.int64), np.empty(limit, np.int32))
    stext = np.empty(limit * (width + 1), np.int32)  # the siblings' continuations, each PAD-ended
    pair_lo, work = np.empty(count, np.int64), np.empty((3, count), np.int64)
    pair_lowers(hist.keys, hist.samples, rows.slots, tokens, rows.row_ids, rows.nums, pair_lo, work, LOCKSTEP)
    text, sa, key, sample, start, seq_rew = near, near, np.empty(0, np.uint64), np.empty(0, np.uint64), \
        np.empty(0, np.int64), rewards
    seq_lens, seq_tok, s_tab, s_link, sib_rew = codes, np.empty((0, 0), np.int32), np.empty((0, 2), np.int64), \
        np.empty((0, 0), np.int32), rewards
    held, held_side = -1, -1
    for r in range(count):
        out.lengths[r], out.match[r], out.score[r] = 0, 0, 0.0
        slot, side, num = rows.slots[r], rows.sides[r], rows.nums[r]
        nq = min(num, params.max_match)
        for j in range(nq):
            q[j] = tokens[rows.row_ids[r], num - 1 - j]
        nf, lo, hi = 0, 0, 0
        if slot >= 0:
            if slot != held:
                text, sa, key, sample = hist.texts[slot], hist.sas[slot], hist.keys[slot], hist.samples[slot]
                start, seq_rew, held = hist.starts[slot], hist.rewards[slot], slot
            nf, lo, hi = match(text, sa, key, sample, q, nq, lo_match, pair_lo[r])
        n, flim, found_n, extra, budget = nf, limit, 0, 0, rows.budgets[r]
        if side >= 0:
            if side != held_side:
                seq_lens, seq_tok, s_tab, s_link = sib.lens[side], sib.tok[side], sib.table[side], sib.links[side]
                sib_rew, held_side = sib.rewards[side], side
            n, found_n = sibling_match(seq_lens, s_tab, s_link, seq_tok.shape[0], q, nq, nf, lo_match, limit, keys,
                                       found)
            flim = limit - found_n if nf == n else 0
            for c in range(found_n):  # an occurrence at a sibling's end continues nothing
                if min(budget, seq_lens[found[c] // STRIDE] - found[c] % STRIDE, width) > 0:
                    extra += 1
        k = min(hi - lo, flim) if nf == n else 0
        if n == 0 or k + extra == 0:
            continue
        if params.max_spec_factor > 0:
            budget = min(budget, int(params.max_spec_factor * n))
            if budget <= 0:
                continue
        own = _history_candidates(sa, start, seq_rew, nf, lo, hi, k, params, pos, codes, rewards, near) if k else 0
        m = own
        if extra:
            m = _sibling_candidates(seq_lens, seq_tok, sib_rew, found, found_n, min(rows.budgets[r], width, budget),
                                    rows.shifts[r], params.reward_weighted, m, pos, codes, rewards, stext)
        size, score = follow(text, stext, pos, own, m, codes, rewards, budget, params.reward_weighted,
                             params.min_token_prob, params.prior, out.tokens, out.probs, r, alive, toks)
        if size:
            out.lengths[r], out.match[r], out.score[r] = size, n, score


@njit(cache=True)
def _history_candidates(sa, start, seq_rew, nf, lo, hi, k, params, pos, codes, rewards, near):
    """The k most recent of the history's occurrences sa[lo:hi] into pos / codes / rewards[:k]; k.
    A run matched max_match deep (>= 2) is in position order, so they are its last k entries."""
    weighted = params.reward_weighted
    ordered = nf == params.max_match and nf >= 2
    if ordered:
        lo = hi - k
    elif hi - lo > k:  # ascending when follow sums rewards oldest first
        _top_into(sa, lo, hi, k, near, weighted)
    elif weighted:
        _sorted_into(sa, lo, hi, near)
    for j in range(k):
        c = sa[lo + j] if ordered or (hi - lo == k and not weighted) else near[j]
        pos[j], codes[j] = c, c  # (text ends in pads: a continuation read from it ends there)
        if weighted:
            rewards[j] = seq_rew[_seq_of(start, c)]
    return k


@njit(cache=True)
def _sibling_candidates(seq_lens, seq_tok, sib_rew, found, found_n, cap, shift, weighted, m, pos, codes, rewards,
                        stext):
    """The new m: found[:found_n] that continue appended to pos / codes / rewards, copied to `stext`."""
    w = 0
    for c in range(found_n):
        seq, at = found[c] // STRIDE, found[c] % STRIDE
        size = min(cap, seq_lens[seq] - at)
        if size > 0:
            for t in range(size):
                stext[w + t] = seq_tok[seq, at + t]
            stext[w + size] = PAD
            pos[m], codes[m] = w, found[c] + shift
            rewards[m] = sib_rew[seq] if weighted else 0.0
            w += size + 1
            m += 1
    return m
