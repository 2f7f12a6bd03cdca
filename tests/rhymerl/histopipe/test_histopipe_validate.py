"""HistoPipe simulator check against measured steps: calibration, replay of the real placement, errors."""

from __future__ import annotations

import random

import pytest

from rhymerl.histopipe.costmodel import Calibration, CostModel
from rhymerl.histopipe.schedule import Assignment, Unit
from rhymerl.histopipe.simulator import simulate
from rhymerl.histopipe.validate import check_run, measured_assignment, oracle_gap

TRUTH = CostModel(base_s=0.02, per_seq_s=0.001, startup_s=0.3, capacity=8)  # 8 slots: queues form


def _steps(count: int, seed: int = 0) -> list[list[list[tuple[str, int, int]]]]:
    """Per step, per worker (W=2), (prompt_id, sample_idx, length) in admission order:
    5 prompts x 4 samples per worker, lengths 1..60."""
    rng = random.Random(seed)
    return [[[(f"s{g}p{w}{i}", k, rng.randint(1, 60)) for i in range(5) for k in range(4)] for w in range(2)]
            for g in range(count)]


def _rows(steps, cost: CostModel, skew_s: float = 0.0, slow: dict[int, float] | None = None,
          late: dict[int, float] | None = None) -> list[dict]:
    """Lake rows whose timings follow `cost` exactly, as the engine stamps them: one gen_start per
    worker call (worker w starts `skew_s * w` late), rows in admission order. Step g's timings are
    stretched by `slow[g]`, and its last-finishing request ends `late[g]` seconds later."""
    slow, late = slow or {}, late or {}
    rows = []
    for g, placed in enumerate(steps):
        units = tuple(tuple(Unit(p, (k,), x, x) for p, k, x in mine) for mine in placed)
        lengths = {(p, k): x for mine in placed for p, k, x in mine}
        ends = {(s.prompt_id, s.sample_idx): s.end for s in simulate(Assignment("t", units), lengths, cost).spans}
        last = max(ends, key=ends.get)
        for w, mine in enumerate(placed):
            start = 1000.0 + 100.0 * g + skew_s * w
            for p, k, x in mine:
                end = ends[p, k] * slow.get(g, 1.0) + (late.get(g, 0.0) if (p, k) == last else 0.0)
                rows.append({"epoch": g // 2, "step": g % 2, "prompt_id": p, "sample_idx": k, "worker_id": w,
                             "length": x, "gen_start": start, "gen_end": start + end})
    return rows


def test_rows_from_the_model_itself_check_with_zero_error() -> None:
    check = check_run(_rows(_steps(4), TRUTH), capacity=8)
    # fit on global steps 0, 2; check 1, 3; noise-free timings give back the parameters exactly
    assert check.fit_steps == (0, 2) and [s.global_step for s in check.steps] == [1, 3]
    assert [(s.epoch, s.step) for s in check.steps] == [(0, 1), (1, 1)]
    assert check.calibration.cost.base_s == pytest.approx(TRUTH.base_s, rel=1e-6)
    assert check.calibration.cost.per_seq_s == pytest.approx(TRUTH.per_seq_s, rel=1e-6)
    assert check.calibration.cost.startup_s == pytest.approx(TRUTH.startup_s, rel=1e-6)
    assert check.workers == 2 and all(s.requests == 40 for s in check.steps)
    assert check.max_abs_error == pytest.approx(0.0, abs=1e-9)
    for s in check.steps:
        assert s.simulated_s == pytest.approx(s.measured_s, rel=1e-9)
        assert s.bubble_simulated == pytest.approx(s.bubble_measured, abs=1e-9)
        assert s.worker_simulated_s == pytest.approx(s.worker_measured_s, rel=1e-9)
        assert s.start_skew_s == 0.0
    assert check.within(0.15)


def test_check_steps_slower_than_the_fit_report_that_error() -> None:
    # checked steps take 1.25x the model's time: simulated = measured / 1.25, error = -20% exactly
    check = check_run(_rows(_steps(4), TRUTH, slow={1: 1.25, 3: 1.25}), capacity=8)
    assert check.calibration.cost.base_s == pytest.approx(TRUTH.base_s, rel=1e-6)  # fit steps untouched
    assert [s.error for s in check.steps] == pytest.approx([-0.2, -0.2], abs=1e-9)
    assert check.mean_abs_error == pytest.approx(0.2) and check.max_abs_error == pytest.approx(0.2)
    assert not check.within(0.15)


def test_one_late_request_per_checked_step_shows_as_its_delay() -> None:
    # the step's last request ends 1 s later (a pause): measured = model + 1, error = model / (model + 1) - 1
    clean = check_run(_rows(_steps(4), TRUTH), capacity=8)
    late = check_run(_rows(_steps(4), TRUTH, late={1: 1.0, 3: 1.0}), capacity=8)
    for c, s in zip(clean.steps, late.steps):
        assert s.measured_s == pytest.approx(c.measured_s + 1.0)
        assert s.error == pytest.approx(c.measured_s / (c.measured_s + 1.0) - 1.0, rel=1e-6)


def test_worker_start_skew_is_reported_and_counts_in_the_measured_makespan() -> None:
    # worker 1 starts 0.5 s late; the simulator starts both at 0, so the gap can only shrink it
    check = check_run(_rows(_steps(4), TRUTH, skew_s=0.5), capacity=8)
    assert check.calibration.cost.startup_s == pytest.approx(TRUTH.startup_s, rel=1e-6)  # per-worker clocks
    for s in check.steps:
        assert s.start_skew_s == pytest.approx(0.5)
        assert s.worker_measured_s[1] == pytest.approx(s.worker_simulated_s[1] + 0.5)
        assert s.simulated_s <= s.measured_s + 1e-9


def test_fit_all_checks_in_sample_and_even_needs_two_steps() -> None:
    rows = _rows(_steps(1), TRUTH)
    with pytest.raises(ValueError, match="at least 2 steps"):
        check_run(rows, capacity=8)
    check = check_run(rows, capacity=8, fit="all")
    assert check.fit_steps == (0,) and len(check.steps) == 1
    assert check.max_abs_error == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="fit='odd'"):
        check_run(rows, capacity=8, fit="odd")


def test_warmup_steps_are_left_out_of_fit_and_check() -> None:
    # global step 0 runs 3x slow (a cold engine); with warmup=1 the fit uses 2, 4 and the check 1, 3, 5
    rows = _rows(_steps(6), TRUTH, slow={0: 3.0})
    cold = check_run(rows, capacity=8)
    assert cold.fit_steps == (0, 2, 4) and cold.max_abs_error > 0.01  # the cold step skews the fit
    warm = check_run(rows, capacity=8, warmup=1)
    assert warm.fit_steps == (2, 4) and [s.global_step for s in warm.steps] == [1, 3, 5]
    assert warm.max_abs_error == pytest.approx(0.0, abs=1e-9)
    assert check_run(rows, capacity=8, fit="all", warmup=1).fit_steps == (1, 2, 3, 4, 5)
    with pytest.raises(ValueError, match="needs at least 7 steps"):
        check_run(rows, capacity=8, warmup=5)


def test_admission_order_is_gen_start_then_row_order() -> None:
    rows = [{"prompt_id": "a", "sample_idx": 0, "worker_id": 0, "gen_start": 2.0, "length": 5},
            {"prompt_id": "b", "sample_idx": 0, "worker_id": 0, "gen_start": 1.0, "length": 7},
            {"prompt_id": "c", "sample_idx": 1, "worker_id": 0, "gen_start": 1.0, "length": 3},
            {"prompt_id": "d", "sample_idx": 0, "worker_id": 1, "gen_start": 1.0, "length": 4}]
    placed = measured_assignment(rows, workers=3)
    # b and c tie at 1.0 and keep row order; a came later; worker 2 ran nothing
    assert placed.requests(0) == [("b", 0), ("c", 1), ("a", 0)]
    assert placed.requests(1) == [("d", 0)] and placed.requests(2) == []


def test_bad_rows_name_the_column() -> None:
    rows = _rows(_steps(2), TRUTH)
    rows[3] = {**rows[3], "gen_end": None}
    with pytest.raises(ValueError, match="has no 'gen_end'"):
        check_run(rows, capacity=8)
    del rows[3]["worker_id"]
    with pytest.raises(ValueError, match="has no 'worker_id'"):
        check_run(rows, capacity=8)
    with pytest.raises(ValueError, match="no rollout rows"):
        check_run([], capacity=8)
    with pytest.raises(ValueError, match="appears twice"):
        check_run(_rows(_steps(2), TRUTH) + _rows(_steps(2), TRUTH)[40:41], capacity=8)


def _placed_rows(placed: list[list[tuple[str, int, int]]]) -> list[dict]:
    return [{"epoch": 0, "step": 0, "prompt_id": p, "sample_idx": k, "worker_id": w, "length": x,
             "gen_start": 0.0, "gen_end": 1.0} for w, mine in enumerate(placed) for p, k, x in mine]


def test_oracle_gap_by_hand() -> None:
    # One request at a time, 0.1 s per token: a worker's time is the sum of its lengths.
    cal = Calibration(CostModel(base_s=0.1, per_seq_s=0.0, capacity=1), requests=4, groups=1, rms_s=0.0, r2=1.0)
    # Both long samples on worker 0: 10 + 10 tokens = 2.0 s; the oracle pairs long with short: 1.1 s.
    bad = oracle_gap(_placed_rows([[("a", 0, 10), ("a", 1, 10)], [("b", 0, 1), ("b", 1, 1)]]), cal, workers=2)
    assert bad.placement_s == pytest.approx(2.0) and bad.oracle_s == pytest.approx(1.1)
    assert bad.gap == pytest.approx(2.0 / 1.1 - 1)
    good = oracle_gap(_placed_rows([[("a", 0, 10), ("b", 0, 1)], [("a", 1, 10), ("b", 1, 1)]]), cal, workers=2)
    assert good.gap == pytest.approx(0.0)
    with pytest.raises(ValueError, match="expected 0..1"):  # sample indices must be 0..n-1
        oracle_gap(_placed_rows([[("a", 0, 10), ("a", 2, 10)]]), cal, workers=1)
