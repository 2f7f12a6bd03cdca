"""An engine step's compiled bookkeeping around the drafting call (`begin`: find requests and count
verified drafts; `plan`: record lengths, pick drafting rows and budgets; `finish`: record and hand
over the drafts), and the trim of drafts to what pays.

Cost-aware trimming: a step costs about `c0 + c1 * tokens` seconds (`StepCostModel`); draft token j
of request i is accepted with chance q[i][j] (the drafter's estimate, `AcceptanceCalibration`);
`trim_drafts` keeps tokens, in decreasing q, while they raise expected tokens per second; rows forecast
to finish last (`tail_rows`) keep their whole draft. Trimming only shortens drafts: the sampled
distribution is untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, NamedTuple, Sequence

import numpy as np
from numba import njit

from rhymerl.histospec.engine.requests import (BUDGET, DRAFTED, KEY_MIX, N, PROMPT, RESUME, SIB, STEP, TREE,
                                               TREE_N, RequestTable, StepLedger, account_row, row_key,
                                               take_keys)
from rhymerl.config.spec import COST_MEMORY_STEPS
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


MIN_OBSERVATIONS = 8  # steps before the fit is trusted (until then drafts pass untrimmed)
CALIBRATION_BINS = 20  # bins of the drafter's estimate, 0.05 wide
CALIBRATION_PRIOR = 4.0  # pseudo-tokens per bin at the bin's own estimate: a near-empty bin trusts the drafter


@dataclass
class StepCostModel:
    """Seconds per engine step as `c0 + c1 * tokens`, fitted online."""
    decay: float = 1.0 - 1.0 / COST_MEMORY_STEPS  # weight of older steps per new one (spec.cost_memory)
    n: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    count: int = 0

    def observe(self, tokens: float, seconds: float) -> None:
        """Add one step: `tokens` processed in `seconds`."""
        d = self.decay
        self.n = d * self.n + 1.0
        self.sx = d * self.sx + tokens
        self.sy = d * self.sy + seconds
        self.sxx = d * self.sxx + tokens * tokens
        self.sxy = d * self.sxy + tokens * seconds
        self.count += 1

    def coefficients(self) -> tuple[float, float] | None:
        """(c0, c1), None before `MIN_OBSERVATIONS` steps; c1 > 0, c0 >= 0: tokens never look free."""
        if self.count < MIN_OBSERVATIONS or self.n <= 0:
            return None
        mx, my = self.sx / self.n, self.sy / self.n
        var = self.sxx / self.n - mx * mx
        if var <= 1e-9 * max(mx * mx, 1.0):  # every step the same size: slope unidentifiable
            c1 = my / max(mx, 1.0)
            return 0.0, max(c1, 1e-9)
        c1 = max((self.sxy / self.n - mx * my) / var, 1e-9 * max(my, 1e-9))
        return max(my - c1 * mx, 0.0), c1

    def predict(self, tokens: float) -> float | None:
        coef = self.coefficients()
        return None if coef is None else coef[0] + coef[1] * tokens


def position_acceptance(accepted_at: Sequence[int], drafted_at: Sequence[int], length: int) -> list[float]:
    """q[j < length]: running minimum of (a + 1) / (d + 2), draft token j's chance to be accepted."""
    out, low = [], 1.0
    for j in range(length):
        a = accepted_at[j] if j < len(accepted_at) else 0
        d = drafted_at[j] if j < len(drafted_at) else 0
        low = min(low, (a + 1.0) / (d + 2.0))
        out.append(low)
    return out


def trim_drafts(drafts: Sequence[Sequence[int]], base_tokens: float, expected_base: float,
                q: np.ndarray | Sequence[Sequence[float]], coef: tuple[float, float],
                whole: Collection[int] = ()) -> list[list[int]]:
    """Prefixes of `drafts` maximising expected tokens per second. `base_tokens` / `expected_base`:
    tokens processed / emitted without drafts; q: R x W, nonincreasing in j; `whole`: rows kept whole."""
    c0, c1 = coef
    q = np.asarray(q, dtype=np.float64).reshape(len(drafts), -1)
    width = q.shape[1]
    lengths = np.fromiter((min(len(d), width) for d in drafts), np.int64, len(drafts))
    valid = np.arange(width)[None, :] < lengths[:, None]
    in_tail = np.zeros(len(drafts), dtype=bool)
    in_tail[list(whole)] = True
    keep = np.where(in_tail, lengths, 0)
    emitted = expected_base + float(q[in_tail[:, None] & valid].sum())
    seconds = c0 + c1 * (base_tokens + float(keep.sum()))
    rows, cols = np.nonzero(valid & ~in_tail[:, None])
    p = q[rows, cols]
    order = np.lexsort((cols, -p))  # decreasing chance, a draft's earlier token first on ties
    p, rows = p[order], rows[order]
    before = emitted + np.cumsum(p) - p  # tokens expected before each candidate is added
    pays = p * (seconds + c1 * np.arange(p.size)) > c1 * before
    taken = int(np.argmin(pays)) if not pays.all() else p.size  # every later token has p no larger
    keep += np.bincount(rows[:taken], minlength=len(drafts))
    return [list(d[:k]) for d, k in zip(drafts, keep.tolist())]


def tail_rows(remaining: Sequence[float | None], fraction: float) -> set[int]:
    """Rows with remaining >= `fraction` x the longest (None: never; negative: past forecast, always)."""
    known = [r for r in remaining if r is not None]
    if fraction <= 0 or not known:
        return set()
    longest = max(known)
    if any(r < 0 for r in known):
        longest = max(longest, 0.0)
    cut = fraction * longest
    return {i for i, r in enumerate(remaining) if r is not None and (r < 0 or r >= cut)}


class AcceptanceCalibration:
    """Measured acceptance by estimate (`Draft.probs`): `begin` counts verified drafts into `drafted` /
    `accepted` (`requests.count_bin`), `rows` maps estimates to calibrated chances. Bins start with `prior` pseudo-tokens; the table is nondecreasing."""
    def __init__(self, bins: int = CALIBRATION_BINS, prior: float = CALIBRATION_PRIOR) -> None:
        self.bins = bins
        self.prior = prior
        self.drafted = np.zeros(bins)
        self.accepted = np.zeros(bins)
        self.tokens = 0  # draft tokens recorded
        self._table: np.ndarray | None = None

    def _bin(self, p: np.ndarray) -> np.ndarray:
        return np.clip((p * self.bins).astype(np.int64), 0, self.bins - 1)

    def counted(self, tokens: int) -> None:
        """Note `tokens` more draft tokens counted into `drafted` / `accepted` (by a compiled pass)."""
        if tokens:
            self.tokens += tokens
            self._table = None

    def table(self) -> np.ndarray:
        """[b]: calibrated acceptance of a token whose estimate falls in bin b (nondecreasing in b)."""
        if self._table is None:
            centre = (np.arange(self.bins) + 0.5) / self.bins
            self._table = np.array(_isotonic(list(zip(self.accepted + self.prior * centre,
                                                      self.drafted + self.prior))))
        return self._table

    def rows(self, probs: np.ndarray) -> np.ndarray:
        """Calibrated chances for estimates `probs` (R x W), made nonincreasing along each row."""
        return np.minimum.accumulate(self.table()[self._bin(np.asarray(probs, np.float64))], axis=1)


def _isotonic(pairs: list[tuple[float, float]]) -> list[float]:
    """Nondecreasing least-squares fit of the ratios a / w (weights w), by pooling adjacent violators."""
    blocks: list[list[float]] = []  # [sum a, sum w, count]
    for a, w in pairs:
        blocks.append([a, w, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            a2, w2, n2 = blocks.pop()
            blocks[-1][0] += a2
            blocks[-1][1] += w2
            blocks[-1][2] += n2
    out: list[float] = []
    for a, w, n in blocks:
        out.extend([a / w] * int(n))
    return out
