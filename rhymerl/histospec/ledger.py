"""What an engine step's verification says, counted in compiled code (`StepLedger`, `account_row`).

After every engine step the drafter learns, for each continuing request, how many of its draft
tokens the verifier accepted (its sampled tokens less one). That one fact feeds four consumers:
the acceptance counters (`SpecStats`, for reports), the lifetime acceptance per draft position
(`_trim`'s fallback), the acceptance calibration by estimated probability, and the fail back-off.
Counting them as separate NumPy and Python steps cost ~0.1-0.2 ms of a 256-request step (a Tally,
two `SpecStats.add`s, a gather of the rows' probabilities, the back-off: ~30 calls, each 3-8 us with
the step's caches cold), a tenth of issue 17's drafting budget. Here the step's compiled pass
(`rhymerl.histospec.step_pass.begin`) counts each row once (`account_row`) into arrays (`Counts`);
the `SpecStats` objects get them added when read (`StepLedger.flush`), so a step does no Python
list work for them. Engine thread only.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rhymerl.histospec.requests import DRAFTED, FAILS, N, PLEN, RESUME, back_off_row
from rhymerl.histospec.stats import POSITION_BUCKETS, SpecStats, Tally, tally_position, tally_row
from rhymerl.histospec.step_budget import count_bin


class Counts:
    """`SpecStats`' counters as arrays, added to in compiled passes (`arrays`: totals (steps, tokens,
    drafts, drafted, accepted), draft / accepted length histograms (`width` + 1 lengths), and the
    position buckets' steps and tokens)."""

    def __init__(self, width: int) -> None:
        self.arrays = (np.zeros(5, np.int64), np.zeros(width + 1, np.int64), np.zeros(width + 1, np.int64),
                       np.zeros(POSITION_BUCKETS, np.int64), np.zeros(POSITION_BUCKETS, np.int64))

    def flush(self, stats: SpecStats, positions: bool) -> None:
        """Add the counts to `stats` (`positions`: the position buckets too) and zero them: `stats`
        then holds what `SpecStats.add` of each step's `Tally` would have given."""
        totals, hist, acc, pos_steps, pos_tokens = self.arrays
        if not totals[0]:
            return
        steps, tokens, drafts, drafted, accepted = totals.tolist()
        size = int(np.flatnonzero(hist)[-1]) + 1 if drafts else 0  # a Tally's lists: longest draft + 1
        stats.add(Tally(steps, tokens, drafts, drafted, accepted, hist[:size].tolist(), acc[:size].tolist(),
                        pos_steps.tolist(), pos_tokens.tolist()), positions)
        for a in self.arrays:
            a.fill(0)


class StepLedger:
    """The counts of the steps since the last `flush`: for the drafter's `stats` (`step`) and its
    `lifetime` (`lifetime`, whose position buckets are never read)."""

    def __init__(self, width: int) -> None:
        self.step, self.lifetime = Counts(width), Counts(width)

    def flush(self, stats: SpecStats, lifetime: SpecStats) -> None:
        """Add the counts since the last flush to `stats` and (without positions) `lifetime`."""
        self.step.flush(stats, positions=True)
        self.lifetime.flush(lifetime, positions=False)


@njit(cache=True)
def account_row(fields, probs, s, size, step_counts, life_counts, edges, cal_drafted, cal_hits, step, backoff):
    """Request slot s sampled `size` tokens (>= 1) in the step verified at `step`: its draft of
    fields[DRAFTED, s] tokens (estimates probs[s]) had size - 1 of them accepted, at fields[N, s] -
    fields[PLEN, s] response tokens. Counts it in both `Counts.arrays` (the lifetime's without
    position) and the calibration's bins; with `backoff` > 0, the fail back-off (`requests.back_off_row`).
    Returns (drafted, accepted, draft tokens added to the calibration)."""
    # Position: response tokens before the verified step (`n`, its length when drafted for, less the
    # prompt's). A migrated request counts those it wrote on its old worker too (its prompt is in this
    # bundle). A prompt not in the bundle has plen 0: its prompt counts as response, but such a row
    # never drafts (1-token steps). The lifetime keeps draft positions only: not these.
    d = fields[DRAFTED, s]
    a = min(size - 1, d)
    tally_row(step_counts[0], step_counts[1], step_counts[2], d, a)
    tally_row(life_counts[0], life_counts[1], life_counts[2], d, a)
    tally_position(edges, step_counts[3], step_counts[4], fields[N, s] - fields[PLEN, s], a)
    counted = min(d, probs.shape[1])
    for i in range(counted):
        count_bin(probs[s, i], i < a, cal_drafted, cal_hits)
    if backoff > 0 and d > 0:
        back_off_row(fields[FAILS], fields[RESUME], s, a, step, backoff)
    return d, a, counted
