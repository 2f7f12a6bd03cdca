"""An engine step's compiled bookkeeping around the drafting call (`begin`: find requests and count
verified drafts; `plan`: record lengths, pick drafting rows and budgets; `finish`: record and hand
over the drafts). What the drafts are trimmed to is the goodput controller's (`rhymerl.histospec.goodput`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from rhymerl.histospec.engine.requests import (BUDGET, DRAFTED, KEY_MIX, N, PROMPT, RESUME, SIB, STEP, TREE,
                                               TREE_N, RequestTable, StepLedger, account_row, row_key,
                                               take_keys)
from rhymerl.histospec.goodput import AcceptanceCalibration
from rhymerl.histospec.stats import POSITION_EDGE_ARRAY


class StepRows(NamedTuple):
    """The step's decoding rows (those with sampled tokens), as `begin` found them; per row j:"""
    live: np.ndarray  # its row in the engine's batch
    ends: np.ndarray  # its length now
    before: np.ndarray  # its length before this step's sampled tokens
    slots: np.ndarray  # its request's slot (-1: a request seen for the first time)
    kept: np.ndarray  # its key at `ends` (`RequestTable.keep`)
    drafted: np.ndarray  # a continuing request's verified draft length (0 for new ones)
    accepted: np.ndarray  # how many of them the verifier accepted
    sib: np.ndarray  # the rows (indexes j) of continuing requests with a sibling sequence
    due: np.ndarray  # those with a response in the cross-prompt tree and >= `tree_chunk` tokens to add
    processed: int  # tokens the verified step processed for the continuing requests (one each + drafts)
    new: np.ndarray  # the rows (indexes j) of requests seen for the first time (slot -1)


def begin(req: RequestTable, ledger: StepLedger, calibration: AcceptanceCalibration, sizes: np.ndarray,
          num_tokens: np.ndarray, tokens: np.ndarray, step: int, backoff: int, tree_chunk: int) -> StepRows:
    """Row i sampled sizes[i] tokens (0: not decoding) and holds num_tokens[i]. Finds the decoding rows'
    requests (out of `req` until `keep`), counts their drafts in `ledger` and `calibration`, backs off."""
    size = len(sizes)
    live, ends, before, slots = (np.empty(size, np.int64) for _ in range(4))
    drafted, accepted, sib, due, new = (np.zeros(size, np.int64) for _ in range(5))
    kept = np.empty(size, np.uint64)
    count, left, processed, counted, n_sib, n_due, n_new = _begin(
        sizes, np.asarray(num_tokens, np.int64), tokens, KEY_MIX, req.keys, req.slots, req.index, req.fields, req.probs,
        ledger.step.arrays, ledger.lifetime.arrays, POSITION_EDGE_ARRAY, calibration.drafted, calibration.accepted,
        step, backoff, tree_chunk, live, ends, before, slots, kept, drafted, accepted, sib, due, new)
    req.keys, req.slots = req.keys[:left], req.slots[:left]
    calibration.counted(counted)
    return StepRows(live[:count], ends[:count], before[:count], slots[:count], kept[:count], drafted[:count],
                    accepted[:count], sib[:n_sib], due[:n_due], processed, new[:n_new])


@njit(cache=True)
def _begin(sizes, num_tokens, tokens, mix, keys, stored, index, fields, probs, step_counts, life_counts, edges,
           cal_drafted, cal_hits, step, backoff, tree_chunk, live, ends, before, slots, kept, drafted, accepted,
           sib, due, new):
    """`begin`'s pass: (decoding, keys left, processed, calibrated, n_sib, n_due, n_new)."""
    count = 0
    for i in range(sizes.shape[0]):
        if sizes[i] > 0:
            live[count], ends[count], before[count] = i, num_tokens[i], num_tokens[i] - sizes[i]
            count += 1
    query = np.empty(count, np.uint64)
    for j in range(count):
        query[j] = row_key(tokens, live[j], before[j], mix)
        kept[j] = row_key(tokens, live[j], ends[j], mix)
    left = take_keys(keys, stored, index, query, slots[:count])
    processed, counted, n_sib, n_due, n_new = 0, 0, 0, 0, 0
    for j in range(count):
        s = slots[j]
        if s < 0:
            new[n_new] = j
            n_new += 1
            continue
        d, a, c = account_row(fields, probs, s, sizes[live[j]], step_counts, life_counts, edges, cal_drafted,
                              cal_hits, step, backoff)
        drafted[j], accepted[j] = d, a
        processed += 1 + d
        counted += c
        if fields[SIB, s] >= 0:
            sib[n_sib] = j
            n_sib += 1
        if fields[TREE, s] >= 0 and ends[j] - fields[TREE_N, s] >= tree_chunk:
            due[n_due] = j
            n_due += 1
    return count, left, processed, counted, n_sib, n_due, n_new


def plan(req: RequestTable, rows: StepRows, last_seen: np.ndarray, step: int, k: int,
         max_model_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Record each row's length and `step` (draft reset) and `last_seen`; the rows j that draft (known
    prompt, not backing off, room left) and their budgets (<= k and the room in max_model_len)."""
    drafting, budgets = np.empty(len(rows.slots), np.int64), np.empty(len(rows.slots), np.int64)
    count = _plan(req.fields, rows.slots, rows.ends, step, k, max_model_len, last_seen, drafting, budgets)
    return drafting[:count], budgets[:count]


@njit(cache=True)
def _plan(fields, slots, ends, step, k, max_model_len, last_seen, drafting, budgets):
    """`plan`'s pass: how many rows draft."""
    count = 0
    for j in range(slots.shape[0]):
        s = slots[j]
        fields[N, s], fields[STEP, s], fields[DRAFTED, s] = ends[j], step, 0
        prompt = fields[PROMPT, s]
        if prompt >= 0:
            last_seen[prompt] = step
        budget = min(fields[BUDGET, s], k, max_model_len - ends[j])
        if prompt >= 0 and budget > 0 and fields[RESUME, s] <= step:
            drafting[count], budgets[count] = j, budget
            count += 1
    return count


def finish(req: RequestTable, slots: np.ndarray, rows: np.ndarray, toks: np.ndarray, lens: np.ndarray,
           draft_probs: np.ndarray, out: list[list[int]]) -> None:
    """Record the drafts for the next `begin` and hand them over: out[rows[j]] = toks[j, :lens[j]]."""
    flat, bounds = np.empty(int(lens.sum()), toks.dtype), np.empty(len(slots) + 1, np.int64)
    _finish(req.fields, req.probs, slots, lens, draft_probs, toks, flat, bounds)
    tokens, cut = flat.tolist(), bounds.tolist()  # the ints made in two calls, not a slice per row
    for i, a, b in zip(rows.tolist(), cut, cut[1:]):
        if b > a:
            out[i] = tokens[a:b]


@njit(cache=True)
def _finish(fields, probs, slots, lens, draft_probs, toks, flat, bounds):
    """`finish`'s pass: fields recorded, flat[bounds[j]:bounds[j + 1]] = toks[j, :lens[j]]."""
    width = min(draft_probs.shape[1], probs.shape[1])
    at = 0
    for j in range(slots.shape[0]):
        s = slots[j]
        fields[DRAFTED, s] = lens[j]
        probs[s, :width] = draft_probs[j, :width]
        probs[s, width:] = 0.0
        bounds[j] = at
        flat[at:at + lens[j]] = toks[j, :lens[j]]
        at += lens[j]
    bounds[slots.shape[0]] = at


def warm() -> None:
    """Compile (or load from numba's cache) the passes now, not inside an engine step."""
    req, ledger, calibration = RequestTable(1), StepLedger(1), AcceptanceCalibration()
    for dtype in (np.int32, np.int64):
        rows = begin(req, ledger, calibration, np.ones(1, np.int64), np.ones(1, np.int64), np.zeros((1, 1), dtype),
                     1, 1, 1)
        rows.slots[:] = req.alloc()
        plan(req, rows, np.zeros(1, np.int64), 1, 1, 2)
        finish(req, rows.slots, rows.live, np.ones((1, 1), np.int64), np.ones(1, np.int64), np.ones((1, 1)), [[]])
        req.keep(rows.kept, rows.slots, 1, 1)
