"""`SpecSwitch`: drafting or plain steps per band of running requests, by measured tokens per second."""

from __future__ import annotations

import pytest

from rhymerl.vllm.switch import RETRY_STEPS, TRIAL_STEPS, SpecSwitch


class Engine:
    """A synthetic engine: a cycle of `rows` requests takes `seconds[mode]` and emits
    `rows * per_row[mode]` tokens, mode 1 drafting, 0 plain."""

    def __init__(self, seconds: tuple[float, float], per_row: tuple[float, float]) -> None:
        self.now, self.seconds, self.per_row = 0.0, seconds, per_row
        self.switch = SpecSwitch(clock=lambda: self.now)
        self.modes: list[bool] = []

    def run(self, rows: int, steps: int) -> list[bool]:
        emitted = rows
        for _ in range(steps):
            drafting = self.switch.start(rows, int(round(emitted)))
            self.modes.append(drafting)
            self.now += self.seconds[int(drafting)]
            emitted = rows * self.per_row[int(drafting)]
        return self.modes[-steps:]


def test_drafting_is_kept_where_it_emits_faster_than_plain_steps():
    # Drafting: 3 tokens a request per 10 ms cycle; plain: 1 per 5 ms. After both are measured the
    # switch drafts but for its trials of plain (TRIAL_STEPS in every RETRY_STEPS + TRIAL_STEPS).
    engine = Engine(seconds=(0.005, 0.010), per_row=(1.0, 3.0))
    engine.run(8, 40)
    later = engine.run(8, 4 * (RETRY_STEPS + TRIAL_STEPS))
    assert sum(later) == 4 * RETRY_STEPS
    assert engine.switch.rate(3, True) == pytest.approx(2400.0, rel=1e-4) and engine.switch.rate(3, False) == pytest.approx(1600.0, rel=1e-4)


def test_plain_steps_are_chosen_where_drafting_does_not_pay_for_itself():
    # Drafting emits 1.2 tokens a request per 8 ms; plain 1 per 5 ms: plain wins, drafting tried
    # for TRIAL_STEPS every RETRY_STEPS cycles, never more.
    engine = Engine(seconds=(0.005, 0.008), per_row=(1.0, 1.2))
    first = engine.run(4, 20)
    assert first[0] and not all(first)  # drafting first, then plain tried
    later = engine.run(4, 4 * (RETRY_STEPS + TRIAL_STEPS))
    assert sum(later) == 4 * TRIAL_STEPS


def test_each_band_of_running_requests_decides_for_itself():
    # One switch, two batch sizes: drafting pays at 2 requests a step (cycle cost barely grows),
    # not at 64 (the cycle's cost grows with the verified drafts); the decisions follow the band.
    class Banded(Engine):
        def run(self, rows: int, steps: int) -> list[bool]:
            self.seconds = (0.005, 0.007) if rows <= 2 else (0.020, 0.080)
            return super().run(rows, steps)

    engine = Banded(seconds=(0.0, 0.0), per_row=(1.0, 2.0))
    for _ in range(3):
        engine.run(64, 60)
        engine.run(2, 60)
    assert sum(engine.run(2, RETRY_STEPS)) >= RETRY_STEPS - TRIAL_STEPS
    assert sum(engine.run(64, RETRY_STEPS)) <= TRIAL_STEPS


def test_a_pause_between_generate_calls_is_no_cycle():
    engine = Engine(seconds=(0.005, 0.010), per_row=(1.0, 3.0))
    engine.run(8, 40)
    weight = engine.switch.weight.sum()
    engine.now += 10.0  # the engine idles between two calls
    engine.run(8, 1)
    engine.run(8, 1)
    assert engine.switch.weight.sum() < weight + 2  # the cycle over the pause was not counted
    assert engine.switch.rate(3, True) > 2000.0
