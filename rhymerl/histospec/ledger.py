"""What an engine step's verification says, counted in one compiled pass (`StepLedger`).

After every engine step the drafter learns, for each continuing request, how many of its draft
tokens the verifier accepted (its sampled tokens less one). That one fact feeds four consumers:
the acceptance counters (`SpecStats`, for reports), the lifetime acceptance per draft position
(`_trim`'s fallback), the acceptance calibration by estimated probability, and the fail back-off.
Counting them as separate NumPy and Python steps cost ~0.1-0.2 ms of a 256-request step (a Tally,
two `SpecStats.add`s, a gather of the rows' probabilities, the back-off: ~30 calls, each 3-8 us with
the step's caches cold), a tenth of issue 17's drafting budget. Here one compiled pass over the
rows' slots does all four, into arrays (`Counts`); the `SpecStats` objects get them added when read
(`flush`), so a step does no per-step Python list work. Engine thread only.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rhymerl.histospec.requests import _fail
from rhymerl.histospec.stats import _BUCKETS, _EDGES, SpecStats, Tally
from rhymerl.histospec.step_budget import AcceptanceCalibration, _count_bin


class Counts:
    """`SpecStats`' counters as arrays, added to in compiled passes: totals (steps, tokens, drafts,
    drafted, accepted), draft / accepted length histograms (`width` + 1 lengths), position buckets."""

    def __init__(self, width: int) -> None:
        self.totals = np.zeros(5, np.int64)
        self.hist, self.acc = np.zeros(width + 1, np.int64), np.zeros(width + 1, np.int64)
        self.pos_steps, self.pos_tokens = np.zeros(_BUCKETS, np.int64), np.zeros(_BUCKETS, np.int64)

    def flush(self, stats: SpecStats, positions: bool) -> None:
        """Add the counts to `stats` (`positions`: the position buckets too) and zero them: `stats`
        then holds what `SpecStats.add` of each step's `Tally` would have given."""
        if not self.totals[0]:
            return
        steps, tokens, drafts, drafted, accepted = self.totals.tolist()
        size = int(np.flatnonzero(self.hist)[-1]) + 1 if drafts else 0  # a Tally's lists: longest draft + 1
        stats.add(Tally(steps, tokens, drafts, drafted, accepted, self.hist[:size].tolist(),
                        self.acc[:size].tolist(), self.pos_steps.tolist(), self.pos_tokens.tolist()), positions)
        for a in (self.totals, self.hist, self.acc, self.pos_steps, self.pos_tokens):
            a.fill(0)


class StepLedger:
    """Counts each step's verified drafts (`account`) for the drafter's stats, lifetime acceptance
    and calibration, and applies the fail back-off; `flush` adds the counts to the `SpecStats`."""

    def __init__(self, width: int) -> None:
        self.step, self.lifetime = Counts(width), Counts(width)
        z = np.zeros(1, np.int64)
        self.account(z[:0], z[:0], z, z, z, np.zeros((1, 1)), z, z, 0, 0, AcceptanceCalibration())  # compile now

    def account(self, slots: np.ndarray, sizes: np.ndarray, drafted: np.ndarray, n: np.ndarray, plen: np.ndarray,
                probs: np.ndarray, fails: np.ndarray, resume: np.ndarray, step: int, backoff: int,
                calibration: AcceptanceCalibration) -> tuple[int, np.ndarray, np.ndarray]:
        """Request slots[j] sampled sizes[j] tokens (>= 1): its draft of drafted[slot] tokens (estimates
        probs[slot]) had sizes[j] - 1 of them accepted, at n[slot] - plen[slot] response tokens. Count
        every row (both `Counts`, `calibration`); with `backoff` > 0, `RequestTable.back_off` on fails /
        resume. Returns the tokens the verified step processed for them (one each plus their drafts),
        and the rows' drafted and accepted lengths."""
        st, life = self.step, self.lifetime
        got, accepted = np.empty(len(slots), np.int64), np.empty(len(slots), np.int64)
        processed, counted = _account(slots, sizes, drafted, n, plen, probs, fails, resume, step, backoff,
                                      st.totals, st.hist, st.acc, st.pos_steps, st.pos_tokens, life.totals,
                                      life.hist, life.acc, _EDGES, calibration.drafted, calibration.accepted,
                                      got, accepted)
        calibration.counted(counted)
        return processed, got, accepted

    def flush(self, stats: SpecStats, lifetime: SpecStats) -> None:
        """Add the counts since the last flush to `stats` and (without positions) `lifetime`."""
        self.step.flush(stats, positions=True)
        self.lifetime.flush(lifetime, positions=False)


@njit(cache=True)
def _account(slots, sizes, drafted, n, plen, probs, fails, resume, step, backoff, totals, hist, acc, pos_steps,
             pos_tokens, l_totals, l_hist, l_acc, edges, cal_drafted, cal_hits, got, accepted):
    """`StepLedger.account`'s pass: (tokens processed, draft tokens added to the calibration)."""
    processed, counted = 0, 0
    for j in range(slots.shape[0]):
        s = slots[j]
        d = drafted[s]
        a = min(sizes[j] - 1, d)
        got[j], accepted[j] = d, a
        processed += 1 + d
        _tally(totals, hist, acc, d, a)
        _tally(l_totals, l_hist, l_acc, d, a)
        b = np.searchsorted(edges, n[s] - plen[s], side="right")
        pos_steps[b] += 1
        pos_tokens[b] += a + 1
        for i in range(min(d, probs.shape[1])):
            _count_bin(probs[s, i], i < a, cal_drafted, cal_hits)
            counted += 1
        if backoff > 0 and d > 0:
            _fail(fails, resume, s, a, step, backoff)
    return processed, counted


@njit(cache=True)
def _tally(totals, hist, acc, d, a):
    """Count one verification of a d-token draft with a accepted (as `SpecStats.record`)."""
    totals[0] += 1
    totals[1] += a + 1
    totals[3] += d
    totals[4] += a
    if d > 0:
        totals[2] += 1
        hist[d] += 1
        acc[a] += 1
