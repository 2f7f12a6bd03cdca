"""The goodput controller: which draft tokens an engine step verifies, for every `spec.method`.

A step costs `seconds(tokens)` for the tokens it processes (one per decoding request plus the drafts
it verifies; `StepCostModel` fits `c0 + c1 * tokens` online from the engine's own steps). Draft token
j of request i is accepted with chance q[i, j], nonincreasing in j, made of two measurements:
- a table by where the request is in its response (`POSITION_EDGES` buckets, so deep drafts in long
  answers are judged on their own record, not on the pool) and by the drafter's estimate
  (`AcceptanceCalibration`, HistoSpec) or by draft position (`PositionTable`, drafters that give no
  estimate: vLLM's `suffix` and `ngram`);
- the request's own recent record (`RequestRecord`): its accepted tokens over what was predicted
  for them, decayed every step, so a request whose drafts stop matching is cut within a few steps
  and, once its record has faded, tried again.
`keep_lengths` then keeps candidate tokens in decreasing q while they raise expected tokens per
second, and keeps none when nothing pays. The rule only shortens drafts: what is sampled is untouched.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Collection, Sequence

import numpy as np

from rhymerl.config.spec import COST_MEMORY_STEPS
from rhymerl.histospec.stats import POSITION_BUCKETS, POSITION_EDGE_ARRAY, SpecStats

MIN_OBSERVATIONS = 8  # steps before the fit is trusted (until then drafts pass untrimmed)
CALIBRATION_BINS = 20  # bins of the drafter's estimate, 0.05 wide
CALIBRATION_PRIOR = 4.0  # pseudo-tokens per bin at the bin's own estimate: a near-empty bin trusts the drafter
# Pseudo-tokens a response-position bucket holds at the pooled table: a bucket departs from the pool
# only on real evidence (a chance set low by a few unlucky drafts would stop the drafts that could correct it).
BUCKET_PRIOR = 16.0
RECORD_DECAY = 0.7  # weight of a request's older drafts per drafted step: its last ~3 drafts decide
RECORD_IDLE_DECAY = 0.9  # the same per step without a draft: a cut request is tried again after ~15 steps
RECORD_PRIOR = 2.0  # pseudo-tokens at the table's prediction: one unlucky draft does not cut a request


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


def bucket_of(response_tokens: np.ndarray | Sequence[int]) -> np.ndarray:
    """The `POSITION_EDGES` bucket of each request's response length (tokens written so far)."""
    return np.searchsorted(POSITION_EDGE_ARRAY, np.asarray(response_tokens, np.int64), side="right")


def keep_lengths(q: np.ndarray, lengths: np.ndarray, seconds: Callable[[np.ndarray], np.ndarray],
                 base_tokens: float, expected_base: float, whole: Collection[int] = ()) -> np.ndarray:
    """Per row, how many leading draft tokens to verify so expected tokens per second is highest.

    q: R x W chances (each row nonincreasing); lengths[i]: row i's draft length; `seconds(tokens)`:
    step seconds for an array of tokens processed; `base_tokens` / `expected_base`: tokens processed /
    emitted without drafts; rows in `whole` keep their whole draft. Candidates join in decreasing q (a
    draft's earlier token first on ties); the prefix with the best rate wins, ties to fewer tokens.
    """
    q = np.asarray(q, np.float64).reshape(len(lengths), -1)
    lengths = np.minimum(np.asarray(lengths, np.int64), q.shape[1])
    valid = np.arange(q.shape[1])[None, :] < lengths[:, None]
    in_whole = np.zeros(len(lengths), bool)
    in_whole[list(whole)] = True
    keep = np.where(in_whole, lengths, 0)
    emitted = expected_base + float(q[in_whole[:, None] & valid].sum())
    rows, cols = np.nonzero(valid & ~in_whole[:, None])
    p = q[rows, cols]
    order = np.lexsort((cols, -p))
    rows = rows[order]
    gained = emitted + np.concatenate(([0.0], np.cumsum(p[order])))
    tokens = base_tokens + float(keep.sum()) + np.arange(len(gained), dtype=np.float64)
    rate = gained / np.maximum(np.asarray(seconds(tokens), np.float64), 1e-12)
    best = int(np.argmax(rate >= rate.max() * (1 - 1e-12)))  # the first (fewest tokens) of the best
    return keep + np.bincount(rows[:best], minlength=len(lengths))


def trim_drafts(drafts: Sequence[Sequence[int]], base_tokens: float, expected_base: float,
                q: np.ndarray | Sequence[Sequence[float]], coef: tuple[float, float],
                whole: Collection[int] = ()) -> list[list[int]]:
    """`keep_lengths` under the linear step cost `coef` = (c0, c1), applied to the drafts themselves."""
    c0, c1 = coef
    lengths = np.fromiter(map(len, drafts), np.int64, len(drafts))
    q = np.asarray(q, np.float64).reshape(len(drafts), -1)
    kept = keep_lengths(q, lengths, lambda t: c0 + c1 * t, base_tokens, expected_base, whole)
    return [list(d[:k]) for d, k in zip(drafts, kept.tolist())]


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


def position_acceptance(accepted_at: Sequence[int], drafted_at: Sequence[int], length: int) -> list[float]:
    """q[j < length]: running minimum of (a + 1) / (d + 2), draft token j's chance to be accepted."""
    out, low = [], 1.0
    for j in range(length):
        a = accepted_at[j] if j < len(accepted_at) else 0
        d = drafted_at[j] if j < len(drafted_at) else 0
        low = min(low, (a + 1.0) / (d + 2.0))
        out.append(low)
    return out


def record_factor(accepted: np.ndarray, expected: np.ndarray, prior: float = RECORD_PRIOR) -> np.ndarray:
    """A request's multiplier on the table's chances: (accepted + prior) / (expected + prior), in [0, 1 / max q]."""
    return (np.asarray(accepted, np.float64) + prior) / (np.asarray(expected, np.float64) + prior)


def within(q: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """q with the entries past each row's length set to 0."""
    return np.where(np.arange(q.shape[1])[None, :] < np.asarray(lengths)[:, None], q, 0.0)


def adjust(q: np.ndarray, factor: np.ndarray) -> np.ndarray:
    """Each row of q with its request's factor applied to every conditional chance (token j's chance
    given token j - 1 was accepted: q[j] / q[j - 1]), capped at 1: a request that beats the table
    gains most at depth, where the table, pooled over requests, knows least about it."""
    q = np.asarray(q, np.float64)
    before = np.concatenate([np.ones((len(q), 1)), q[:, :-1]], axis=1)
    step = np.divide(q, before, out=np.zeros_like(q), where=before > 0)
    return np.cumprod(np.minimum(step * np.asarray(factor, np.float64)[:, None], 1.0), axis=1)


class RequestRecord:
    """Per request (a slot), its decayed accepted draft tokens and the tokens the table (before the
    request's own factor) predicted for them: the factor is the request's departure from the table.

    `verified(slots, accepted)` closes the step that ran (every request seen, drafted or not, so an
    idle record fades back to the table); `predicted(slots, expected)` notes this step's prediction.
    """
    def __init__(self, capacity: int = 64, decay: float = RECORD_DECAY, idle_decay: float = RECORD_IDLE_DECAY) -> None:
        self.decay, self.idle_decay = decay, idle_decay
        self.arrays = np.zeros((3, capacity))  # [accepted, expected, pending prediction (-1: none)]
        self.arrays[2] = -1.0

    def reset(self, slot: int) -> None:
        """Slot `slot` starts a new request."""
        if slot >= self.arrays.shape[1]:
            grown = np.zeros((3, max(2 * self.arrays.shape[1], slot + 1)))
            grown[2] = -1.0
            grown[:, :self.arrays.shape[1]] = self.arrays
            self.arrays = grown
        self.arrays[:, slot] = (0.0, 0.0, -1.0)

    def verified(self, slots: np.ndarray, accepted: np.ndarray) -> None:
        acc, exp, pending = self.arrays
        slots = np.asarray(slots, np.int64)
        known = pending[slots] > 0  # a draft the controller predicted (the others teach nothing)
        decay = np.where(known, self.decay, self.idle_decay)
        acc[slots] = decay * acc[slots] + np.where(known, accepted, 0.0)
        exp[slots] = decay * exp[slots] + np.where(known, pending[slots], 0.0)
        pending[slots] = -1.0

    def predicted(self, slots: np.ndarray, expected: np.ndarray) -> None:
        self.arrays[2, np.asarray(slots, np.int64)] = expected

    def factor(self, slots: np.ndarray) -> np.ndarray:
        slots = np.asarray(slots, np.int64)
        return record_factor(self.arrays[0, slots], self.arrays[1, slots])


class AcceptanceCalibration:
    """Measured acceptance by the drafter's estimate (`Draft.probs`) per response-position bucket.

    The engine pass counts verified draft tokens into `drafted` / `accepted` [bucket, bin]
    (`requests.count_bin`); `rows` maps estimates to calibrated chances. A bucket's bins start from
    `bucket_prior` pseudo-tokens at the pooled table (itself from `prior` at the bin's own estimate), so a
    sparse bucket follows the pool and a sparse pool trusts the drafter; tables are nondecreasing.
    """
    def __init__(self, bins: int = CALIBRATION_BINS, prior: float = CALIBRATION_PRIOR,
                 buckets: int = POSITION_BUCKETS, bucket_prior: float = BUCKET_PRIOR) -> None:
        self.bins, self.prior, self.bucket_prior = bins, prior, bucket_prior
        self.drafted = np.zeros((buckets, bins))
        self.accepted = np.zeros((buckets, bins))
        self.tokens = 0  # draft tokens recorded
        self._table: np.ndarray | None = None

    def counted(self, tokens: int) -> None:
        """Note `tokens` more draft tokens counted into `drafted` / `accepted` (by a compiled pass)."""
        if tokens:
            self.tokens += tokens
            self._table = None

    def table(self) -> np.ndarray:
        """[bucket, b]: calibrated acceptance of a token whose estimate falls in bin b (nondecreasing in b)."""
        if self._table is None:
            centre = (np.arange(self.bins) + 0.5) / self.bins
            pooled = np.array(_isotonic(list(zip(self.accepted.sum(0) + self.prior * centre,
                                                 self.drafted.sum(0) + self.prior))))
            self._table = np.array([_isotonic(list(zip(a + self.bucket_prior * pooled, d + self.bucket_prior)))
                                    for a, d in zip(self.accepted, self.drafted)])
        return self._table

    def rows(self, probs: np.ndarray, buckets: np.ndarray | None = None) -> np.ndarray:
        """Calibrated chances for estimates `probs` (R x W) of rows in `buckets` (None: the first),
        made nonincreasing along each row."""
        probs = np.asarray(probs, np.float64)
        b = np.zeros(len(probs), np.int64) if buckets is None else np.asarray(buckets, np.int64)
        bins = np.clip((probs * self.bins).astype(np.int64), 0, self.bins - 1)
        return np.minimum.accumulate(self.table()[b[:, None], bins], axis=1)


class PositionTable:
    """Measured acceptance by draft position j per response-position bucket, for drafters without
    estimates: token j's chance is (accepted + prior x pooled) / (drafted + prior), pooled over
    buckets as (a + 1) / (d + 2), then a running minimum along j."""
    def __init__(self, width: int, prior: float = BUCKET_PRIOR, buckets: int = POSITION_BUCKETS) -> None:
        self.prior = prior
        self.drafted = np.zeros((buckets, width))
        self.accepted = np.zeros((buckets, width))

    def count(self, buckets: np.ndarray, drafted: np.ndarray, accepted: np.ndarray) -> None:
        """Add verified drafts: row r had `drafted[r]` tokens in `buckets[r]`, the first `accepted[r]` taken."""
        j = np.arange(self.drafted.shape[1])[None, :]
        b = np.asarray(buckets, np.int64)
        np.add.at(self.drafted, b, (j < np.asarray(drafted)[:, None]).astype(np.float64))
        np.add.at(self.accepted, b, (j < np.asarray(accepted)[:, None]).astype(np.float64))

    def rows(self, buckets: np.ndarray) -> np.ndarray:
        """[r, j]: the chances of rows in `buckets` (R x width), nonincreasing along j."""
        pooled = (self.accepted.sum(0) + 1.0) / (self.drafted.sum(0) + 2.0)
        table = (self.accepted + self.prior * pooled) / (self.drafted + self.prior)
        return np.minimum.accumulate(table[np.asarray(buckets, np.int64)], axis=1)


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


class GoodputGate:
    """The controller for drafters that give tokens alone (vLLM's `suffix` and `ngram`), by request id.

    Call `gate` once per engine step, right after the drafter proposed: it closes the step that ran
    (each request's accepted count: `sampled - 1`, capped at what it was given), times it (the gap
    since the last call) against the tokens it processed, and returns the drafts trimmed by
    `keep_lengths`. Before `MIN_OBSERVATIONS` timed steps the drafts pass whole. `stats` counts the
    tokens proposed and the forecast against the measured step seconds (the verifier's own counters
    count drafted and accepted).
    """
    def __init__(self, width: int, cost_memory: int = COST_MEMORY_STEPS,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.cost = StepCostModel(decay=1.0 - 1.0 / cost_memory)
        self.table = PositionTable(width)
        self.record = RequestRecord()
        self.clock = clock
        self.slots: dict[str, int] = {}  # request id -> its record's slot
        self._free: list[int] = []  # slots of finished requests
        self.given: dict[str, tuple[int, int]] = {}  # request id -> (tokens given last step, its bucket)
        self.stats = SpecStats()
        self._stamp: float | None = None
        self._predicted: float | None = None

    def gate(self, req_ids: Sequence[str], sampled: Sequence[int], response_tokens: Sequence[int],
             drafts: Sequence[Sequence[int]]) -> list[list[int]]:
        """Row i: request `req_ids[i]` sampled `sampled[i]` tokens this step (0: not decoding) and has
        written `response_tokens[i]`; its proposed draft `drafts[i]`. Returns the drafts to verify."""
        now = self.clock()
        live = [i for i, n in enumerate(sampled) if n > 0]
        slots = np.fromiter((self._slot(req_ids[i]) for i in live), np.int64, len(live))
        self._close(req_ids, sampled, live, slots, now)
        out = [list(d) for d in drafts]
        self.stats.proposed += sum(len(out[i]) for i in live)
        coef = self.cost.coefficients()
        if coef is not None and live:
            table = self.table.rows(bucket_of([response_tokens[i] for i in live]))
            q = adjust(table, self.record.factor(slots))
            lengths = np.fromiter((len(out[i]) for i in live), np.int64, len(live))
            kept = keep_lengths(q, lengths, lambda t: coef[0] + coef[1] * t, len(live), len(live))
            self.record.predicted(slots, within(table, kept).sum(1))
            self._predicted = coef[0] + coef[1] * (len(live) + int(kept.sum()))
            for i, k in zip(live, kept.tolist()):
                out[i] = out[i][:k]
        self.given = {req_ids[i]: (len(out[i]), int(b)) for i, b in zip(live, bucket_of(
            [response_tokens[i] for i in live]).tolist())}
        self._stamp = self.clock()
        return out

    def _slot(self, req_id: str) -> int:
        slot = self.slots.get(req_id)
        if slot is None:
            slot = self.slots[req_id] = self._free.pop() if self._free else len(self.slots)
            self.record.reset(slot)
        return slot

    def _close(self, req_ids: Sequence[str], sampled: Sequence[int], live: list[int], slots: np.ndarray,
               now: float) -> None:
        """Count the verified drafts of the step that ran and time it."""
        given = [self.given.get(req_ids[i], (0, 0)) for i in live]
        drafted = np.fromiter((g for g, _ in given), np.int64, len(live))
        accepted = np.minimum(np.fromiter((sampled[i] - 1 for i in live), np.int64, len(live)), drafted)
        self.table.count(np.fromiter((b for _, b in given), np.int64, len(live)), drafted, accepted)
        self.record.verified(slots, accepted)
        if self._stamp is not None and live:
            processed, seconds = len(live) + int(drafted.sum()), now - self._stamp
            guess = self.cost.predict(processed)
            if guess is None or seconds < 10 * guess:  # a pause between generate calls is no step
                self.cost.observe(processed, seconds)
                if self._predicted is not None:
                    self.stats.timed_step(self._predicted, seconds)
        self._predicted = None
        gone = set(self.slots) - {req_ids[i] for i in live} - set(self.given)
        for req_id in gone:  # finished (or unscheduled two steps running): free the slot
            self._free.append(self.slots.pop(req_id))
