"""The engine's drafting kernel (numba): every row of a batch drafted in one call, bit for bit as
`HistoSpecDrafter.own` drafts it (same draft, match length and score, floats added in the same order;
the Python drafter is the reference the tests compare against).

For each row: the longest matched tail in its prompt's history (`search.match`) and siblings
(`sibling_table.sibling_match`), the `limit` most recent occurrences of it (the history's, then the
siblings'), and the walk down their continuations (`follow`). The arrays come packed
(`HistoryArrays`, `SiblingArrays`: typed lists of every attached index's arrays, by slot; `Rows`: the
rows' slots and contexts; `Params`; `Drafts`: the outputs). R rows, W the widest budget.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from rhymerl.histospec.engine.search import LOCKSTEP, match, pair_lowers
from rhymerl.histospec.index import PAD
from rhymerl.histospec.sibling_table import STRIDE, sibling_match


class HistoryArrays(NamedTuple):
    """The attached histories' arrays by slot (numba typed lists): `FlatIndex` text, sa, key, its
    sampled keys, sequence starts and rewards."""

    texts: object
    sas: object
    keys: object
    samples: object
    starts: object
    rewards: object


class SiblingArrays(NamedTuple):
    """The siblings' arrays by slot (numba typed lists): `SideIndex` tok, lens, table, links, rewards."""

    tok: object
    lens: object
    table: object
    links: object
    rewards: object


class Rows(NamedTuple):
    """Per row r (int64 arrays): its history slot (-1: none), siblings slot (-1: none), the shift of
    its siblings' codes past the history's, its row in the token matrix, its context length, its budget."""

    slots: np.ndarray
    sides: np.ndarray
    shifts: np.ndarray
    row_ids: np.ndarray
    nums: np.ndarray
    budgets: np.ndarray


class Params(NamedTuple):
    """The drafting rules: occurrences followed, match lengths, the draft caps, the branch rule, PRIOR."""

    limit: int
    min_match: int
    max_match: int
    max_spec_factor: float
    reward_weighted: bool
    min_token_prob: float
    prior: float


class Drafts(NamedTuple):
    """The outputs: tokens (R x W), lengths (0: no draft), match lengths, scores, probabilities (R x W)."""

    tokens: np.ndarray
    lengths: np.ndarray
    match: np.ndarray
    score: np.ndarray
    probs: np.ndarray


@njit(cache=True)
def _best_token(toks, alive, n, codes, rewards, reward_weighted):
    """`drafter._best_group` over the continuations alive[:n], reading toks[:n] at this depth: (the
    best group's token, its size). Rewards are summed in the order of `alive` (ascending codes, as
    the Python drafter sums them); groups never tie, as no two occurrences share a code."""
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
    """Keep in alive[:n] the continuations that go on at `depth` and put their tokens there in
    toks; how many are kept. (`alive` stays ascending, so the history's come first: two loops, no
    test of which array a continuation is in per token.)"""
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
    """`drafter.follow` over m continuations, the first `own` read from the history's text at
    pos[:own], the rest from the siblings' tokens copied to `stext` at pos[own:m] (each ends at a
    PAD, an empty one at once; codes ascending, rewards each): writes the draft to out[r] and its
    tokens' probabilities to out_prob[r]; (its length, its score, the probabilities summed one by
    one as `sum` does in Python). `alive`, `toks`: room for m. 0 < budget.

    Column by column where the Python drafter sorts: at each depth the continuations still followed
    all read one token or split into groups, of which the best is kept. The same draft (a group's
    choice depends on its members, not on their order), read where the continuations lie."""
    for a in range(m):
        alive[a] = a
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
    """near[:k] = the k largest entries of sa[lo:hi] (its most recent occurrences; distinct), in no
    particular order unless `ascending` (0 < k <= hi - lo): one pass keeping the k largest so far in
    a min-heap, nothing allocated."""
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
    """Draft every row r from its context tokens[rows.row_ids[r], :rows.nums[r]], at most
    rows.budgets[r] tokens, from the `params.limit` most recent occurrences of the longest tail;
    rows of one prompt are expected together (their arrays are taken once per run of rows)."""
    count, limit = rows.slots.shape[0], params.limit
    scratch = (np.empty(params.max_match, np.int64), np.empty(params.max_match, np.uint64),
               np.empty(limit, np.int64), np.empty(limit, np.int64),
               np.empty(limit * (out.tokens.shape[1] + 1), np.int32), np.empty(limit, np.int64), np.zeros(limit),
               np.empty(limit, np.int64), np.empty(limit, np.int64), np.empty(limit, np.int32))
    pair_lo, work = np.empty(count, np.int64), np.empty((3, count), np.int64)
    pair_lowers(hist.keys, hist.samples, rows.slots, tokens, rows.row_ids, rows.nums, pair_lo, work, LOCKSTEP)
    near, none_f = scratch[9], np.zeros(0)
    h = (near, near, np.empty(0, np.uint64), np.empty(0, np.uint64), np.empty(0, np.int64), none_f)
    s = (np.empty(0, np.int64), np.empty((0, 0), np.int32), np.empty((0, 2), np.int64), np.empty((0, 0), np.int32),
         none_f)
    held, held_side = -1, -1
    for r in range(count):
        slot, side = rows.slots[r], rows.sides[r]
        if slot >= 0 and slot != held:
            h, held = (hist.texts[slot], hist.sas[slot], hist.keys[slot], hist.samples[slot], hist.starts[slot],
                       hist.rewards[slot]), slot
        if side >= 0 and side != held_side:
            s, held_side = (sib.lens[side], sib.tok[side], sib.table[side], sib.links[side], sib.rewards[side]), side
        _draft_row(r, h, slot >= 0, s, side >= 0, tokens, rows, params, pair_lo[r], scratch, out)


@njit(cache=True)
def _draft_row(r, h, has_history, s, has_siblings, tokens, rows, params, pair_lo, scratch, out):
    """Row r's draft into `out`: the history's candidates first (if it matched as long as the
    siblings), then the siblings' (their `limit` most recent, after the history's `limit` minus as many)."""
    q, keys, found, pos, stext, codes, rewards, alive, toks, near = scratch
    text, sa, key, sample, start, seq_rew = h
    seq_lens, seq_tok, s_tab, s_link, sib_rew = s
    out.lengths[r], out.match[r], out.score[r] = 0, 0, 0.0
    num, limit, lo_match = rows.nums[r], params.limit, params.min_match
    nq = min(num, params.max_match)
    for j in range(nq):
        q[j] = tokens[rows.row_ids[r], num - 1 - j]
    nf, lo, hi = 0, 0, 0
    if has_history:
        nf, lo, hi = match(text, sa, key, sample, q, nq, lo_match, pair_lo)
    n, flim, found_n, extra = nf, limit, 0, 0
    width, budget = out.tokens.shape[1], rows.budgets[r]
    if has_siblings:
        n, found_n = sibling_match(seq_lens, s_tab, s_link, seq_tok.shape[0], q, nq, nf, lo_match, limit, keys,
                                   found)
        flim = limit - found_n if nf == n else 0
        for c in range(found_n):  # an occurrence at a sibling's end continues nothing
            if min(budget, seq_lens[found[c] // STRIDE] - found[c] % STRIDE, width) > 0:
                extra += 1
    k = min(hi - lo, flim) if nf == n else 0
    if n == 0 or k + extra == 0:
        return
    if params.max_spec_factor > 0:
        budget = min(budget, int(params.max_spec_factor * n))
        if budget <= 0:
            return
    m = _history_candidates(sa, start, seq_rew, nf, lo, hi, k, params, pos, codes, rewards, near) if k else 0
    own = m
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
    """The siblings' occurrences found[:found_n] that continue, each copied to `stext` (at most `cap`
    tokens, PAD-ended), appended to pos / codes / rewards from m on; the new m."""
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
