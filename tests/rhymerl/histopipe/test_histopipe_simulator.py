"""HistoPipe step simulator against hand-computed schedules, and its metrics."""

from __future__ import annotations

import random

import pytest

from rhymerl.histopipe.costmodel import CostModel
from rhymerl.histopipe.schedule import Assignment, Unit
from rhymerl.histopipe.simulator import MigrationSettings, RequestSpan, busy_intervals, measure, simulate


def placed(*workers: list[str]) -> Assignment:
    """One single-sample unit per prompt id, per worker, in admission order."""
    return Assignment("handmade", tuple(tuple(Unit(p, (0,), 1.0, 1.0) for p in w) for w in workers))


def spans_by_prompt(result) -> dict[str, tuple[int, float, float]]:
    return {s.prompt_id: (s.worker, s.start, s.end) for s in result.spans}


def test_serial_workers_by_hand() -> None:
    # capacity 1, 1 s per token: w0 runs a (3) then b (2), w1 runs c (4)
    cost = CostModel(base_s=1.0, per_seq_s=0.0, capacity=1)
    r = simulate(placed(["a", "b"], ["c"]), {("a", 0): 3, ("b", 0): 2, ("c", 0): 4}, cost)
    assert spans_by_prompt(r) == {"a": (0, 0.0, 3.0), "b": (0, 3.0, 5.0), "c": (1, 0.0, 4.0)}
    # makespan 5; busy 5 + 4 of 2 x 5 worker-seconds -> bubble 0.1
    assert r.makespan == 5.0 and r.bubble_ratio == pytest.approx(0.1)
    assert r.busy == (((0.0, 5.0),), ((0.0, 4.0),))


def test_continuous_batching_by_hand() -> None:
    # capacity 2, iteration = 1 + 1 * running: a (2) and b (1) run at 3 s/token; b ends at 3, c joins;
    # a and c each need one more token at 3 s -> both end at 6
    cost = CostModel(base_s=1.0, per_seq_s=1.0, capacity=2)
    r = simulate(placed(["a", "b", "c"]), {("a", 0): 2, ("b", 0): 1, ("c", 0): 1}, cost)
    assert spans_by_prompt(r) == {"a": (0, 0.0, 6.0), "b": (0, 0.0, 3.0), "c": (0, 3.0, 6.0)}
    assert r.bubble_ratio == 0.0


def test_startup_delays_every_finish_but_counts_as_busy() -> None:
    cost = CostModel(base_s=1.0, per_seq_s=0.0, startup_s=0.5, capacity=1)
    r = simulate(placed(["a"], ["b"]), {("a", 0): 2, ("b", 0): 1}, cost)
    assert spans_by_prompt(r) == {"a": (0, 0.0, 2.5), "b": (1, 0.0, 1.5)}
    assert r.bubble_ratio == pytest.approx(1 - 4.0 / 5.0)


def test_one_worker_matches_the_cost_model() -> None:
    # the simulator and CostModel.request_times share one definition of a worker
    rng = random.Random(3)
    lengths = [rng.randint(1, 40) for _ in range(25)]
    cost = CostModel(base_s=0.01, per_seq_s=0.002, startup_s=0.3, capacity=4)
    names = [f"r{i}" for i in range(len(lengths))]
    r = simulate(placed(names), {(p, 0): x for p, x in zip(names, lengths)}, cost)
    ends = {s.prompt_id: s.end for s in r.spans}
    assert [ends[p] for p in names] == pytest.approx(cost.request_times(lengths))


# Migration case: w0 has x (2 tokens), w1 runs y and z (8 tokens each) at 3 s per token.
MIG_LENGTHS = {("x", 0): 2, ("y", 0): 8, ("z", 0): 8}
MIG_COST = CostModel(base_s=1.0, per_seq_s=1.0, capacity=4)


def test_without_migration_the_loaded_worker_sets_the_pace() -> None:
    r = simulate(placed(["x"], ["y", "z"]), MIG_LENGTHS, MIG_COST)
    # x ends at 2 x 2 s = 4; y and z run together at 3 s/token -> 24
    assert r.makespan == 24.0 and r.migrations == 0


def test_straggler_moves_to_the_idle_worker_with_its_prefix() -> None:
    spec = MigrationSettings(tail_fraction=1.0, threshold=1.0)
    r = simulate(placed(["x"], ["y", "z"]), MIG_LENGTHS, MIG_COST, spec, {"x": 2, "y": 2, "z": 100})
    # w0 idles from 4; y reaches its forecast (2 tokens) at 6 and moves; y's last 6 tokens run alone
    # at 2 s (ends 18) while z, now alone on w1, does its last 6 at 2 s too (ends 18)
    got = sorted((s.prompt_id, s.worker, s.start, s.end, s.tokens, s.migrated) for s in r.spans)
    assert got == [("x", 0, 0.0, 4.0, 2, False), ("y", 0, 6.0, 18.0, 6, True),
                   ("y", 1, 0.0, 6.0, 2, False), ("z", 1, 0.0, 18.0, 8, False)]
    assert r.migrations == 1 and r.makespan == 18.0
    # busy: w0 4 + 12, w1 18 of 2 x 18
    assert r.bubble_ratio == pytest.approx(1 - 34 / 36)


def test_migration_pays_the_prefix_reprefill_and_respects_the_tail() -> None:
    paid = MigrationSettings(tail_fraction=1.0, threshold=1.0, prefill_s_per_token=0.5)
    assert simulate(placed(["x"], ["y", "z"]), MIG_LENGTHS, MIG_COST, paid, {"x": 2, "y": 2, "z": 100}).makespan == 19.0
    # with a 10% tail nothing moves: x finishing is only 1 of 3 requests done
    early = MigrationSettings(tail_fraction=0.1, threshold=1.0)
    assert simulate(placed(["x"], ["y", "z"]), MIG_LENGTHS, MIG_COST, early, {"x": 2, "y": 2, "z": 2}).migrations == 0


def test_simulate_names_missing_inputs() -> None:
    with pytest.raises(ValueError, match=r"no recorded length for \[\('b', 0\)\]"):
        simulate(placed(["a", "b"]), {("a", 0): 1}, MIG_COST)
    with pytest.raises(ValueError, match="migration needs forecasts"):
        simulate(placed(["a"]), {("a", 0): 1}, MIG_COST, MigrationSettings())


def test_measured_step_metrics_from_lake_rows() -> None:
    rows = [{"prompt_id": "a", "sample_idx": 0, "worker_id": 0, "gen_start": 100.0, "gen_end": 104.0, "length": 8},
            {"prompt_id": "a", "sample_idx": 1, "worker_id": 0, "gen_start": 101.0, "gen_end": 103.0, "length": 4},
            {"prompt_id": "b", "sample_idx": 0, "worker_id": 1, "gen_start": 100.0, "gen_end": 102.0, "length": 4}]
    r = measure(rows, workers=3)
    # makespan 4 from the first start; busy 4 + 2 + 0 of 3 x 4 -> bubble 0.5 (worker 2 never worked)
    assert r.makespan == 4.0 and r.bubble_ratio == pytest.approx(0.5)
    assert r.busy == (((0.0, 4.0),), ((0.0, 2.0),), ())


def test_busy_intervals_merge_overlaps_and_check_workers() -> None:
    spans = [RequestSpan("a", 0, 0, 0.0, 2.0, 1), RequestSpan("b", 0, 0, 1.0, 3.0, 1),
             RequestSpan("c", 0, 0, 5.0, 6.0, 1)]
    assert busy_intervals(spans, 1) == (((0.0, 3.0), (5.0, 6.0)),)
    with pytest.raises(ValueError, match="outside 0..0"):
        busy_intervals([RequestSpan("a", 0, 1, 0.0, 1.0, 1)], 1)
