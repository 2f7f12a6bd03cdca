"""Whether to draft at all this step: speculation against plain sampling, measured on the engine.

The goodput controller (`rhymerl.histospec.goodput`) decides which draft tokens a step verifies,
but it cannot see what drafting costs before any draft exists: the drafter's own time, the step
being shaped around drafts. Where those outweigh what the drafts win (on a CPU, the tail of a long
batch: a few requests, millisecond steps, deep drafts seldom accepted), every speculative step is
slower than a plain one even when the controller keeps nothing. `SpecSwitch` measures both modes
directly, per band of running requests (`goodput.band_of`): a cycle runs from one drafting call to
the next (the drafter's time plus the engine step it shaped) and emits the tokens the next call
sees sampled. Each band runs the mode with the higher decayed rate (tokens per second), and tries
the other for `TRIAL_STEPS` steps now and then so a change (a warmer history, a busier machine) is
seen. Off, the drafter is not called: the step samples plainly, and HistoSpec's per-request state
catches up when drafting resumes (a request it no longer knows is found again by its prompt).
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from rhymerl.histospec.goodput import PAUSE_FACTOR, band_of

SWITCH_DECAY = 0.98  # weight of a band's older cycles per new one in that band (~50 cycles remembered)
TRIAL_STEPS = 8  # cycles a mode runs when it is tried (first in a band, then every RETRY_STEPS)
RETRY_STEPS = 96  # cycles in a band on the better mode before the other is tried again
MIN_WEIGHT = 4.0  # decayed cycles a mode needs in a band before its rate is trusted
BANDS = 16  # up to 32,767 running requests


class SpecSwitch:
    """Per band of running requests, the mode (drafting or plain) with more tokens per second.

    Each drafting call: `start(rows, emitted)` closes the cycle that ran (`emitted` tokens sampled by
    the `rows` requests decoding now) and returns whether this step drafts. A gap far longer than
    the cycles seen (a pause between `generate` calls) is no cycle.
    """
    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.tokens = np.zeros((BANDS, 2))  # [band, mode]: decayed tokens emitted (mode 1: drafting)
        self.seconds = np.zeros((BANDS, 2))
        self.weight = np.zeros((BANDS, 2))  # decayed cycles
        self.since = np.zeros(BANDS, np.int64)  # cycles in the band since its last trial ended
        self.trial = np.zeros(BANDS, np.int64)  # cycles left of a trial of the band's other mode
        self.cycles, self.mean = 0, 0.0
        self._open: tuple[float, int, bool] | None = None  # the running cycle: (start, band, drafting)

    def start(self, rows: int, emitted: int) -> bool:
        """Close the running cycle with `emitted` tokens; whether the step of `rows` requests drafts."""
        now = self.clock()
        if self._open is not None and emitted > 0:
            began, band, drafting = self._open
            self._count(band, int(drafting), emitted, now - began)
        band = min(band_of(rows), BANDS - 1)
        drafting = self._choose(band)
        self._open = (now, band, drafting)
        return drafting

    def rate(self, band: int, drafting: bool) -> float | None:
        """Tokens per second of the band's cycles in that mode; None before `MIN_WEIGHT` cycles."""
        m = int(drafting)
        if self.weight[band, m] < MIN_WEIGHT:
            return None
        return float(self.tokens[band, m] / max(self.seconds[band, m], 1e-12))

    def _count(self, band: int, mode: int, emitted: int, seconds: float) -> None:
        if self.cycles >= TRIAL_STEPS and seconds > PAUSE_FACTOR * self.mean:
            return  # a pause between generate calls, not a step
        self.cycles += 1
        self.mean += (seconds - self.mean) / min(self.cycles, 100)
        self.tokens[band, mode] = SWITCH_DECAY * self.tokens[band, mode] + emitted
        self.seconds[band, mode] = SWITCH_DECAY * self.seconds[band, mode] + seconds
        self.weight[band, mode] = SWITCH_DECAY * self.weight[band, mode] + 1.0

    def _choose(self, band: int) -> bool:
        """Drafting first (a band's trial of plain follows once drafting's rate is known), then the
        better mode, the other tried for `TRIAL_STEPS` cycles every `RETRY_STEPS`."""
        on, off = self.rate(band, True), self.rate(band, False)
        if on is None:
            return True
        if off is None:
            return False
        better = on >= off
        if self.trial[band] > 0:
            self.trial[band] -= 1
            return not better
        self.since[band] += 1
        if self.since[band] >= RETRY_STEPS:
            self.since[band], self.trial[band] = 0, TRIAL_STEPS
        return better
