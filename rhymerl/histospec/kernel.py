"""HistoSpec's drafting from flat histories as one compiled call per engine step (numba).

`draft_rows` does for every row of a batch what `PromptIndex.recent_match` (history part) and
`follow` do in Python — the longest matched tail in the row's `FlatIndex`, its `limit` most recent
occurrences, the walk down their continuations — bit for bit: the same draft, match length and
score (floats added in the same order). The Python code stays the reference; tests compare the two.

Why compiled: at 256 requests per step the Python walk cost ~50 us per request (13 ms per step),
two orders of magnitude over a step's budget for drafting (issue 17: 1 ms for 256 requests). Here a
request costs a few bisections and a walk down its candidates' continuations where they lie.
The search for a row's match is `rhymerl.histospec.search` (every row's first bisections run
before the rows are drafted, a prompt's rows in lockstep).

Rows read the arrays of their prompt's index through slots (numba typed lists, one entry per
attached `FlatIndex` and per `SideIndex`: see `rhymerl.histospec.slots`), history and siblings in the
same call: the siblings' continuations (`rhymerl.histospec.side_search.sibling_match`) follow the history's
as `PromptIndex.recent_match` appends them. Shapes: R rows, W the widest budget.
"""

from __future__ import annotations

import numpy as np
from llvmlite.binding import ffi
from numba import njit

from rhymerl.histospec.index import STRIDE
from rhymerl.histospec.search import LOCKSTEP, match, pair_lowers, prefetch, publish
from rhymerl.histospec.side_arrays import NPTOK
from rhymerl.histospec.side_search import pending_keys, sibling_match

PAD = -1  # as rhymerl.histospec.flat.PAD


def _answer_dict_probes_plainly() -> None:
    """Let vLLM's kernel registry scan a process that has loaded numba.

    vLLM (CPU platform start-up, and RhymeRL's exact verifier) registers kernel overrides with
    `vllm.triton_utils.dispatcher.register_kernels`, which walks every loaded module's globals and
    calls `vars(value).get("kernel")` on each value that has a `__dict__`. llvmlite's library handle
    (`llvmlite.binding.ffi.lib`) answers any attribute with a C-function wrapper, `__dict__`
    included, so that scan crashed ("'_lib_fn_wrapper' object has no attribute 'get'") in every
    engine process that had imported this module. An empty entry in the handle's function table
    makes it answer `__dict__` with a plain empty dict, as an object with no attributes would.
    """
    ffi.lib._fntab.setdefault("__dict__", {})


_answer_dict_probes_plainly()


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
    choice depends on its members, not on their order), read where the continuations lie: copying 32
    of them out of the history and sorting them cost ~0.15 ms of a step of 256 requests with 64
    history responses per prompt (2026-12-06). (Rows are written by index, not through views.)"""
    for a in range(m):
        alive[a] = a
    # A history continuation of 16 tokens spans two cache lines about as often as one: ask for each
    # one's last line now, so those misses overlap with the first lines' instead of coming one by one
    # at later depths (16K x 64 histories, 256 requests: the kernel 0.74 -> 0.64 ms in the step).
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
    """near[:hi - lo] = sorted(sa[lo:hi]) by insertion (a few dozen entries: numba's sort call cost
    more than the sorting, ~20% of the kernel)."""
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
    particular order unless `ascending` (0 < k <= hi - lo). One pass that keeps the k largest so far
    in a min-heap: a range comes in suffix order, unrelated to position, so ~k ln((hi - lo) / k)
    entries displace the smallest kept, each in log k steps, and nothing is allocated. (With 64
    history responses a prompt's n-grams occur ~65 times: a copy of the range sorted by numba's
    `sort` per row took 0.03-0.1 ms of a 1.2-1.3 ms kernel, keeping them by insertion ~0.05.)"""
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


@njit(cache=True, nogil=True)
def draft_rows_beside(texts, sas, keys, samples, starts, seq_rewards, slots, s_tok, s_lens, s_table, s_links,
                      s_rewards, s_state, s_pend, sides, shifts, rows, row_ids, nums, budgets, limit, min_match,
                      max_match, max_spec_factor, reward_weighted, min_token_prob, prior, out, out_len, out_n,
                      out_score, out_prob, progress):
    """`draft_rows` without the GIL, while the helper thread reads its rows as they are done (`progress`,
    `rhymerl.histospec.tree_asks`). Only then: another thread that takes the GIL meanwhile (a history
    build) may keep it for up to Python's switch interval after the kernel returns (steps while
    histories built: longest 4-8 -> ~21 ms at 16K x 64 x 256 with the GIL always released, 2026-12-06)."""
    draft_rows(texts, sas, keys, samples, starts, seq_rewards, slots, s_tok, s_lens, s_table, s_links, s_rewards,
               s_state, s_pend, sides, shifts, rows, row_ids, nums, budgets, limit, min_match, max_match,
               max_spec_factor, reward_weighted, min_token_prob, prior, out, out_len, out_n, out_score, out_prob,
               progress)


@njit(cache=True)
def draft_rows(texts, sas, keys, samples, starts, seq_rewards, slots, s_tok, s_lens, s_table, s_links, s_rewards,
               s_state, s_pend, sides, shifts, rows, row_ids, nums, budgets, limit, min_match, max_match,
               max_spec_factor, reward_weighted, min_token_prob, prior, out, out_len, out_n, out_score, out_prob,
               progress):
    """Draft every row r: its context is rows[row_ids[r], :nums[r]], its history texts[slots[r]] (slot -1:
    none) and its siblings s_*[sides[r]] (-1: none; their codes shifted by shifts[r] past the history's;
    their pending n-grams read as if filed, `rhymerl.histospec.side_search.pending_keys`),
    at most budgets[r] tokens, from the `limit` most recent occurrences of the longest tail.
    progress[0]: the rows done so far (written as each row starts, for a thread reading them meanwhile).

    With siblings, the match length is the longer of the history's and the siblings'; the siblings'
    `limit` most recent occurrences of it join, after the history's most recent `limit` minus as many
    (if the history matched that long). Writes out[r, :out_len[r]], out_n[r] (match length; 0: empty
    draft), out_score[r] and the tokens' probabilities out_prob[r, :out_len[r]].

    A history matched max_match deep (>= 2) gives its run's last `limit` entries: every history was
    sorted exactly that deep, ties by position (`FlatIndex`; `FlatSlots` refuses another depth), so
    they are its most recent occurrences, in order. A shallower run's are selected (`_top_into`).
    """
    q = np.empty(max_match, dtype=np.int64)
    tail = np.empty(max_match, dtype=np.uint64)  # the siblings' keys of the tail
    found = np.empty(limit, dtype=np.int64)  # the siblings' occurrences of a row's match
    width = out.shape[1]
    pos = np.empty(limit, dtype=np.int64)  # one row's candidates: where their continuations start
    stext = np.empty(limit * (width + 1), dtype=np.int32)  # the siblings' continuations, each PAD-ended
    codes = np.empty(limit, dtype=np.int64)
    rewards = np.zeros(limit)
    alive = np.empty(limit, dtype=np.int64)  # follow's continuations still followed
    toks = np.empty(limit, dtype=np.int64)  # and their tokens at a depth
    near = np.empty(limit, dtype=np.int32)  # (as sas) a long range's most recent occurrences (a heap)
    # The arrays of the slot drafted from, taken from the typed lists when the slot changes: an
    # engine's rows come grouped by prompt, and each take costs a reference count (~9% of the kernel).
    held = -1
    text, sa, key, sample, start, seq_rew = near, near, np.empty(0, np.uint64), np.empty(0, np.uint64), \
        np.empty(0, np.int64), rewards
    held_side = -1  # the same for the siblings' arrays
    seq_lens, seq_tok, s_tab, s_link, sib_rew = codes, np.empty((0, 0), np.int32), np.empty((0, 2), np.int64), \
        np.empty((0, 0), np.int32), rewards
    # the siblings' n-grams appended but not filed yet (`SideIndex.flush`, behind the step): keyed once per prompt
    pk, p_info, npe = np.empty((64, max_match - min_match + 1), np.uint64), np.empty((64, 3), np.int64), 0
    # Every row's pair looked up first, a prompt's rows together (their cache misses overlap).
    pair_lo, scratch = np.empty(slots.shape[0], np.int64), np.empty((3, slots.shape[0]), np.int64)
    pair_lowers(keys, samples, slots, rows, row_ids, nums, pair_lo, scratch, LOCKSTEP)
    for r in range(slots.shape[0]):
        publish(progress, r)  # rows before r are drafted
        out_len[r], out_n[r], out_score[r] = 0, 0, 0.0
        num, slot, side = nums[r], slots[r], sides[r]
        nq = min(num, max_match)
        for j in range(nq):
            q[j] = rows[row_ids[r], num - 1 - j]
        nf, lo, hi = 0, 0, 0
        if slot >= 0:
            if slot != held:
                text, sa, key, sample = texts[slot], sas[slot], keys[slot], samples[slot]
                start, seq_rew, held = starts[slot], seq_rewards[slot], slot
            nf, lo, hi = match(text, sa, key, sample, q, nq, min_match, pair_lo[r])
        n, flim, found_n, extra = nf, limit, 0, 0
        if side >= 0:
            if side != held_side:
                seq_lens, seq_tok, s_tab, s_link = s_lens[side], s_tok[side], s_table[side], s_links[side]
                sib_rew, held_side, state = s_rewards[side], side, s_state[side]
                if state[NPTOK] > pk.shape[0]:
                    pk, p_info = np.empty((state[NPTOK], pk.shape[1]), np.uint64), np.empty((state[NPTOK], 3), np.int64)
                npe = pending_keys(seq_tok, seq_lens, state, s_pend[side], min_match, max_match, pk, p_info)
            n, found_n = sibling_match(seq_lens, s_tab, s_link, seq_tok.shape[0], q, nq,
                                       nf, min_match, limit, tail, found, pk, p_info, npe)
            flim = limit - found_n if nf == n else 0
            for c in range(found_n):  # an occurrence at a sibling's end continues nothing
                if min(budgets[r], seq_lens[found[c] // STRIDE] - found[c] % STRIDE, width) > 0:
                    extra += 1
        k = min(hi - lo, flim) if nf == n else 0
        if n == 0 or k + extra == 0:
            continue
        budget = budgets[r]
        if max_spec_factor > 0:
            budget = min(budget, int(max_spec_factor * n))
            if budget <= 0:
                continue
        m = 0
        if k:
            ordered = nf == max_match and nf >= 2  # a run as deep as the sort is in position order
            if ordered:
                lo = hi - k
            elif hi - lo > k:  # its k most recent (ascending when follow sums rewards oldest first)
                _top_into(sa, lo, hi, k, near, reward_weighted)
            elif reward_weighted:  # follow sums rewards oldest first; else the order does not matter
                _sorted_into(sa, lo, hi, near)
            for j in range(k):
                c = sa[lo + j] if ordered or (hi - lo == k and not reward_weighted) else near[j]
                pos[m], codes[m] = c, c  # (text ends in pads: a continuation read from it ends there)
                if reward_weighted:
                    rewards[m] = seq_rew[_seq_of(start, c)]
                m += 1
        own, w = m, 0
        if extra:
            for c in range(found_n):  # the siblings' lines asked for at once (each a row of its own)
                seq, at = found[c] // STRIDE, found[c] % STRIDE
                prefetch(seq_tok[seq], at)
            for c in range(found_n):
                seq, at = found[c] // STRIDE, found[c] % STRIDE
                size = min(budgets[r], seq_lens[seq] - at, width, budget)
                if size > 0:
                    for t in range(size):
                        stext[w + t] = seq_tok[seq, at + t]
                    stext[w + size] = PAD
                    pos[m], codes[m] = w, found[c] + shifts[r]
                    rewards[m] = sib_rew[seq] if reward_weighted else 0.0
                    w += size + 1
                    m += 1
        size, score = follow(text, stext, pos, own, m, codes, rewards, budget, reward_weighted, min_token_prob,
                             prior, out, out_prob, r, alive, toks)
        if size:
            out_len[r], out_n[r], out_score[r] = size, n, score
    publish(progress, slots.shape[0])
