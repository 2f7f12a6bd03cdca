"""The goodput controller: which draft tokens an engine step verifies, for every `spec.method`.

A step costs `seconds(tokens)` for the tokens it processes (one per decoding request plus the drafts
it verifies; `StepCostModel` fits it online from the engine's own steps, plus what verifying at all
costs). Draft token
j of request i is accepted with chance q[i, j], nonincreasing in j, made of two measurements:
- a table by where the request is in its response (`POSITION_EDGES` buckets, so deep drafts in long
  answers are judged on their own record, not on the pool) and by the drafter's estimate
  (`AcceptanceCalibration`, HistoSpec) or by draft position (`PositionTable`, drafters that give no
  estimate: vLLM's `suffix` and `ngram`, whose controller is `rhymerl.vllm.draft_gate.GoodputGate`);
- the request's own recent record (`RequestRecord`): its accepted tokens over what was predicted
  for them, decayed every step, so a request whose drafts stop matching is cut within a few steps
  and, once its record has faded, tried again.
`keep_lengths` then keeps candidate tokens in decreasing q while they raise expected tokens per
second, and keeps none when nothing pays. The rule only shortens drafts: what is sampled is untouched.
"""

from __future__ import annotations

from typing import Callable, Collection, Sequence

import numpy as np

from rhymerl.config.spec import COST_MEMORY_STEPS
from rhymerl.histospec.stats import POSITION_BUCKETS, POSITION_EDGE_ARRAY

MIN_OBSERVATIONS = 8  # steps before the fit is trusted (until then drafts pass untrimmed)
PROBE_WEIGHT = 0.5  # decayed draft-free steps the cost fit wants before it prices verifying at all
PROBE_EVERY = 32  # at most one draft-free probe step in this many
# A gap this many times the mean step is no step (a pause between generate calls). Measured
# against the steps seen, not the fit's forecast: a fit gone low would otherwise refuse every step
# that could correct it.
PAUSE_FACTOR = 10.0
MIN_SPREAD = 1.0  # variance of a band's tokens per step (one token squared) before its own slope prices it
STARVED_STEPS = 64  # steps without a verified token at a draft position before its record starts to fade
CALIBRATION_BINS = 20  # bins of the drafter's estimate, 0.05 wide
CALIBRATION_PRIOR = 4.0  # pseudo-tokens per bin at the bin's own estimate: a near-empty bin trusts the drafter
# Pseudo-tokens a response-position bucket holds at the pooled table: a bucket departs from the pool
# only on real evidence (a chance set low by a few unlucky drafts would stop the drafts that could correct it).
BUCKET_PRIOR = 16.0
RECORD_DECAY = 0.7  # weight of a request's older drafts per drafted step: its last ~3 drafts decide
RECORD_IDLE_DECAY = 0.9  # the same per step without a draft: a cut request is tried again after ~15 steps
RECORD_PRIOR = 2.0  # pseudo-tokens at the table's prediction: one unlucky draft does not cut a request


class StepCostModel:
    """Seconds per engine step as `c0 + c1 * tokens + cv * [any draft verified]`, fitted online
    (decayed least squares; tokens: one per request plus its draft or prefill tokens).

    `cv` is what verifying costs a step at all (the verifier's pass, which a draft-free step skips):
    a few cheap draft tokens can cost more than they return. It is fitted only once the steps
    identify it, from steps both with and without drafts, which `wants_probe` asks for now and then;
    until then it is left out. (A separate price per request row was tried and dropped: rows and
    drafts grow together, so the two slopes were not identified and drafts were mispriced.)
    """
    def __init__(self, decay: float = 1.0 - 1.0 / COST_MEMORY_STEPS) -> None:
        self.decay = decay  # weight of older steps per new one (spec.cost_memory)
        self.xtx = np.zeros((3, 3))  # decayed sums over steps of x x^T, x = (1, tokens, drafted)
        self.xty = np.zeros(3)
        self.count = 0
        self.since_plain = 0  # steps since the last draft-free one

    def observe(self, tokens: float, seconds: float, drafted: bool = True) -> None:
        """Add one step: `tokens` processed in `seconds`, with (`drafted`) or without draft tokens."""
        x = np.array([1.0, float(tokens), 1.0 if drafted else 0.0])
        self.xtx = self.decay * self.xtx + np.outer(x, x)
        self.xty = self.decay * self.xty + x * seconds
        self.count += 1
        self.since_plain = self.since_plain + 1 if drafted else 0

    def coefficients(self) -> tuple[float, float, float] | None:
        """(c0, c1, cv), None before `MIN_OBSERVATIONS` steps; c1 > 0, c0, cv >= 0: tokens never look free."""
        if self.count < MIN_OBSERVATIONS:
            return None
        n, with_drafts = self.xtx[0, 0], self.xtx[2, 2]
        if min(with_drafts, n - with_drafts) >= 0.2 * PROBE_WEIGHT:  # both kinds of step seen: cv identified
            a = self.xtx + 1e-12 * np.trace(self.xtx) * np.eye(3)
            c0, c1, cv = np.linalg.solve(a, self.xty)
            if c1 > 0 and cv >= 0:
                return max(float(c0), 0.0), float(c1), float(cv)
        return (*self._line(), 0.0)

    def _line(self) -> tuple[float, float]:
        """(c0, c1) of the plain line through every step."""
        n, sx, sy, sxy = map(float, (self.xtx[0, 0], self.xtx[0, 1], self.xty[0], self.xty[1]))
        mx, my = sx / n, sy / n
        var = self.spread()
        if var <= 1e-9 * max(mx * mx, 1.0):  # every step the same size: slope unidentifiable
            return 0.0, max(my / max(mx, 1.0), 1e-9)
        c1 = max((sxy / n - mx * my) / var, 1e-9 * max(my, 1e-9))
        return max(my - c1 * mx, 0.0), c1

    def spread(self) -> float:
        """The (decayed) variance of the tokens per step seen: how well the slope is identified."""
        n = float(self.xtx[0, 0])
        if n <= 0:
            return 0.0
        mx = float(self.xtx[0, 1]) / n
        return float(self.xtx[1, 1]) / n - mx * mx

    def is_step(self, seconds: float) -> bool:
        """Whether a gap of `seconds` between two drafting calls can be an engine step: anything
        before `MIN_OBSERVATIONS` steps, then less than `PAUSE_FACTOR` x the (decayed) mean step."""
        return self.count < MIN_OBSERVATIONS or seconds < PAUSE_FACTOR * self.xty[0] / self.xtx[0, 0]

    def predict(self, tokens: float, drafted: bool = True) -> float | None:
        coef = self.coefficients()
        return None if coef is None else coef[0] + coef[1] * tokens + (coef[2] if drafted else 0.0)

    def wants_probe(self) -> bool:
        """Whether this step should verify no drafts so that `cv` stays measured."""
        plain = self.xtx[0, 0] - self.xtx[2, 2]
        return self.count >= MIN_OBSERVATIONS and plain < PROBE_WEIGHT and self.since_plain >= PROBE_EVERY

    def seconds(self, rows: int) -> Callable[[np.ndarray], np.ndarray] | None:
        """Step seconds as a function of tokens processed for a step of `rows` requests (its
        draft-free size; `keep_lengths`' cost); None before the fit is trusted."""
        coef = self.coefficients()
        if coef is None:
            return None
        a, b, cv = coef
        return lambda t: a + b * np.asarray(t, np.float64) + cv * (np.asarray(t) > rows)


class CostByRows:
    """Step cost by band of running requests (1, 2-3, 4-7, ... rows: `band_of`), each band a
    `StepCostModel` of its own, and one over every step (`pooled`).

    A CPU's (or a GPU's) price of one more token is not the same at 8 rows as at 256: a line fitted
    through both prices the small steps' drafts at the large steps' slope, and the far larger steps
    dominate the fit. A band prices its steps once it has `MIN_OBSERVATIONS` of them and their tokens
    have spread (`MIN_SPREAD`: drafts of different lengths were verified there); until then, and where
    the band's drafts stopped long enough for its spread to fade, the pooled fit prices them, which
    lets drafts through to measure the band afresh. `by_rows=False`: the pooled fit alone.
    """
    def __init__(self, decay: float = 1.0 - 1.0 / COST_MEMORY_STEPS, by_rows: bool = True) -> None:
        self.decay, self.by_rows = decay, by_rows
        self.pooled = StepCostModel(decay)
        self.bands: dict[int, StepCostModel] = {}

    def observe(self, rows: int, tokens: float, seconds: float, drafted: bool = True) -> None:
        """Add one step of `rows` requests (`StepCostModel.observe`), to the pooled fit and its band's."""
        self.pooled.observe(tokens, seconds, drafted)
        if self.by_rows:
            key = band_of(rows)
            if key not in self.bands:
                self.bands[key] = StepCostModel(self.decay)
            self.bands[key].observe(tokens, seconds, drafted)

    def for_rows(self, rows: int) -> StepCostModel:
        """The fit that prices a step of `rows` requests: its band's once identified, else the pooled."""
        band = self.bands.get(band_of(rows)) if self.by_rows else None
        if band is not None and band.count >= MIN_OBSERVATIONS and band.spread() >= MIN_SPREAD:
            return band
        return self.pooled

    def is_step(self, seconds: float) -> bool:
        """`StepCostModel.is_step` against every step seen."""
        return self.pooled.is_step(seconds)


def band_of(rows: int) -> int:
    """The band of a step of `rows` running requests: floor(log2(rows)) (1, 2-3, 4-7, ...)."""
    return max(int(rows), 1).bit_length() - 1


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
                q: np.ndarray | Sequence[Sequence[float]], coef: tuple[float, ...],
                whole: Collection[int] = ()) -> list[list[int]]:
    """`keep_lengths` under the step cost `coef` = (c0, c1[, cv]) (`StepCostModel`), applied to the drafts."""
    c0, c1, cv = (*coef, 0.0)[:3]
    lengths = np.fromiter(map(len, drafts), np.int64, len(drafts))
    q = np.asarray(q, np.float64).reshape(len(drafts), -1)
    kept = keep_lengths(q, lengths, lambda t: c0 + c1 * t + cv * (np.asarray(t) > base_tokens), base_tokens,
                        expected_base, whole)
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
    buckets as (a + 1) / (d + 2), then a running minimum along j.

    A position the controller stopped verifying gets no new evidence, so a low chance measured while
    the drafter was cold (an empty cache, an early epoch) would stand for good: after `STARVED_STEPS`
    steps without a verified token there, its counts halve every step until the prior lets a draft
    through again, and the verifier's answer is measured afresh.
    """
    def __init__(self, width: int, prior: float = BUCKET_PRIOR, buckets: int = POSITION_BUCKETS) -> None:
        self.prior = prior
        self.drafted = np.zeros((buckets, width))
        self.accepted = np.zeros((buckets, width))
        self.starved = np.zeros((buckets, width), np.int64)  # steps since a token was verified there

    def count(self, buckets: np.ndarray, drafted: np.ndarray, accepted: np.ndarray) -> None:
        """Add one step's verified drafts: row r had `drafted[r]` tokens in `buckets[r]`, the first
        `accepted[r]` taken."""
        rows, width = self.drafted.shape
        b = np.asarray(buckets, np.int64)
        fed = np.zeros((rows, width))
        for counts, n in ((self.drafted, drafted), (self.accepted, accepted)):
            hist = np.bincount(b * (width + 1) + np.minimum(np.asarray(n, np.int64), width),
                               minlength=rows * (width + 1)).reshape(rows, width + 1)
            new = np.cumsum(hist[:, ::-1], axis=1)[:, ::-1][:, 1:]  # [b, j]: rows with n > j
            counts += new
            if counts is self.drafted:
                fed = new
        self.starved = np.where(fed > 0, 0, self.starved + 1)
        fade = np.where(self.starved > STARVED_STEPS, 0.5, 1.0)
        self.drafted *= fade
        self.accepted *= fade

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
