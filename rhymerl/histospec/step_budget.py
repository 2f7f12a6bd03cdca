"""Cost-aware drafting across a batch: keep only the draft tokens that raise tokens per second.

The per-request budget rules (`drafter.BUDGET_RULES`) decide how far one request may draft; they do
not see the batch. But a verification step costs about `c0 + c1 * tokens` seconds, where `tokens`
counts every token the engine processes in the step (one per running request plus all draft
tokens, plus prefill). Where the fixed part `c0` dominates (a GPU decoding a small model, or the
last few long requests of a step) drafts are nearly free and speculation multiplies throughput;
where the per-token part dominates (a CPU running hundreds of requests) every rejected draft token
costs as much as a useful one and speculation can make a step slower than no speculation at all.

`StepCostModel` fits `c0` and `c1` online from the engine's own step times (least squares with
exponential forgetting, so it follows the batch as it shrinks). `trim_drafts` then solves the
step's fractional knapsack: draft token j of request i is accepted with probability q[i][j]
(nonincreasing in j), so it adds q[i][j] expected tokens for c1 seconds. Taking tokens in
decreasing q while q * T > c1 * E (E expected tokens, T seconds of the step so far) maximises
E / T; each request keeps a prefix of its draft. Trimming only shortens drafts, so the verifier,
and therefore the sampled distribution, is untouched.

The rollout's end. Throughput is not the whole story: a rollout ends when its last request does,
and that request's steps cost the fixed `c0` each however few requests remain. A draft token of a
request forecast to finish last shortens the rollout by up to a step (worth `c0` or more) for `c1`,
while one of a request that will finish early anyway saves at most its own `c1` per step. So the
requests whose forecast remaining length (their prompt's earlier responses, minus what they have
written; a request past its forecast counts as longest) is at least `tail_fraction` of the batch's
longest (`tail_rows`) keep their whole draft, and only the others go through the knapsack
(DAS-style length-aware speculation, decided per step inside the engine).

Where q comes from. Each draft token carries the drafter's own estimate that the draft is right up
to it (`Draft.probs`: count shares along the walk). Those estimates rank tokens well but are not
calibrated (a continuation seen in 3 of 3 histories is not accepted 100% of the time), so
`AcceptanceCalibration` maps them to measured acceptance: per bin of the estimate, the share of
draft tokens the verifier accepted, kept monotone in the estimate. A confident draft then keeps
its length while a doubtful one is cut, where a position-only q (`position_acceptance`, used
before any estimate is recorded) would cut both alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence

import numpy as np
from numba import njit

MIN_OBSERVATIONS = 8  # steps before the fit is trusted (until then drafts pass untrimmed)
COST_MEMORY_STEPS = 100  # the fit's memory (spec.cost_memory's default; see SpecConfig for why 100)
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
        """(c0, c1), or None until `MIN_OBSERVATIONS` steps with some spread in tokens were seen.

        c1 is kept positive and c0 non-negative: a noisy fit must never make tokens look free.
        """
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
    """q[j] for j < length: chance a draft's token j is accepted, nonincreasing in j.

    Laplace-smoothed counts ((a + 1) / (d + 2)) so unseen positions start at one half, then a
    running minimum: a token can only be accepted after every token before it.
    """
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
    """Prefixes of `drafts` that maximise expected emitted tokens per second of the step.

    `base_tokens`: tokens the step processes without any draft (running requests + prefill);
    `expected_base`: tokens it emits without drafts (one per decoding request); `q[i, j]`: the
    chance draft i's token j is accepted (R x W, nonincreasing in j; a draft longer than W is
    cut at W); `coef`: the step cost (c0, c1); `whole`: rows kept whole (the tail's, see
    `tail_rows`), counted in the step before the others are chosen. Vectorised: one sort of the
    step's draft tokens (~4K at 256 requests) instead of a Python loop over them.
    """
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
    """Rows forecast to finish last: remaining length >= `fraction` x the longest (None: no forecast,
    never in the tail; a negative remaining, a request past its forecast, counts as the longest)."""
    known = [r for r in remaining if r is not None]
    if fraction <= 0 or not known:
        return set()
    longest = max(known)
    if any(r < 0 for r in known):
        longest = max(longest, 0.0)
    cut = fraction * longest
    return {i for i, r in enumerate(remaining) if r is not None and (r < 0 or r >= cut)}


class AcceptanceCalibration:
    """Measured acceptance of draft tokens by the drafter's estimated probability (`Draft.probs`).

    `record(probs, accepted)` counts verified drafts: draft i's first `accepted[i]` tokens were
    accepted. `rows(probs)` maps estimates (R x W) to calibrated chances, nonincreasing along each
    draft. Bins hold `CALIBRATION_PRIOR` pseudo-tokens at their own estimate, and the table is made
    nondecreasing in the estimate (pool-adjacent-violators), so sparse bins never reorder drafts.
    """

    def __init__(self, bins: int = CALIBRATION_BINS, prior: float = CALIBRATION_PRIOR) -> None:
        self.bins = bins
        self.prior = prior
        self.drafted = np.zeros(bins)
        self.accepted = np.zeros(bins)
        self.tokens = 0  # draft tokens recorded
        self._table: np.ndarray | None = None
        none = np.zeros(0, np.int64)
        _count_bins(np.zeros((0, 1)), none, none, np.zeros(1), np.zeros(1))  # compile now, not in a step

    def _bin(self, p: np.ndarray) -> np.ndarray:
        return np.clip((p * self.bins).astype(np.int64), 0, self.bins - 1)

    def record(self, probs: Sequence[Sequence[float]], accepted: Sequence[int]) -> None:
        """`record_rows` of drafts given as one estimate list per draft."""
        lengths = np.fromiter(map(len, probs), np.int64, len(probs))
        padded = np.zeros((len(probs), int(lengths.max(initial=0))))
        for i, p in enumerate(probs):
            padded[i, :len(p)] = p
        self.record_rows(padded, lengths, np.asarray(accepted, np.int64))

    def record_rows(self, probs: np.ndarray, lengths: np.ndarray, accepted: np.ndarray) -> None:
        """`record` of drafts given padded: draft i's estimates are probs[i, :lengths[i]]."""
        counted = _count_bins(np.asarray(probs, np.float64), np.asarray(lengths, np.int64),
                              np.asarray(accepted, np.int64), self.drafted, self.accepted)
        self.counted(counted)

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


@njit(cache=True)
def _count_bins(probs, lengths, accepted, drafted, hits):
    """Add each draft token (probs[i, :lengths[i]]) to drafted[its bin], and to hits[its bin] when
    accepted (j < accepted[i]); the tokens counted. One pass: the engine step records every row's."""
    counted = 0
    for i in range(probs.shape[0]):
        for j in range(min(lengths[i], probs.shape[1])):
            count_bin(probs[i, j], j < accepted[i], drafted, hits)
            counted += 1
    return counted


@njit(cache=True)
def count_bin(p, hit, drafted, hits):
    """Add one draft token of estimate p (accepted: `hit`) to its bin."""
    bins = drafted.shape[0]
    b = min(max(int(p * bins), 0), bins - 1)  # as AcceptanceCalibration._bin
    drafted[b] += 1.0
    if hit:
        hits[b] += 1.0


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
