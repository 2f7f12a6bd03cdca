"""HistoPipe worker cost model: the continuous-batching replay and calibration from timings."""

from __future__ import annotations

import pytest

from rhymerl.histopipe.costmodel import CostModel, calibrate, replay


def test_replay_admits_in_order_as_slots_free() -> None:
    # capacity 2: [3, 1] start; 1 ends at iteration 1 (occupancy 2), then 2 joins and ends with 3 at 3
    # occupancy sums: 2 after iteration 1, 2 + 2*2 = 6 after iteration 3
    assert replay([3, 1, 2], capacity=2) == [(3.0, 6.0), (1.0, 2.0), (3.0, 6.0)]


def test_replay_charges_at_least_one_iteration() -> None:
    # an empty response still costs the engine one step
    assert replay([0, 2], capacity=1) == [(1.0, 1.0), (3.0, 3.0)]


def test_request_times_are_linear_in_the_parameters() -> None:
    cost = CostModel(base_s=1.0, per_seq_s=0.5, startup_s=0.25, capacity=2)
    # end = startup + base * iterations + per_seq * occupancy, with the replay above
    assert cost.request_times([3, 1, 2]) == [0.25 + 3 + 3, 0.25 + 1 + 1, 0.25 + 3 + 3]
    assert cost.worker_time([3, 1, 2]) == 6.25
    assert cost.worker_time([]) == 0.0


def test_estimate_is_exact_when_batches_pack_perfectly() -> None:
    cost = CostModel(base_s=1.0, per_seq_s=0.5, startup_s=0.25, capacity=2)
    # iterations = max(peak 3, 6 tokens / 2 slots) = 3; occupancy sum = tokens = 6
    assert cost.estimate(total_tokens=6, peak_tokens=3) == cost.worker_time([3, 1, 2]) == 6.25
    # over capacity the token bound dominates: 10 tokens over 2 slots = 5 iterations
    assert cost.estimate(total_tokens=10, peak_tokens=2) == 0.25 + 5 + 5
    assert cost.estimate(0, 0) == 0.0


def test_cost_model_rejects_impossible_settings() -> None:
    with pytest.raises(ValueError, match="capacity"):
        CostModel(capacity=0)
    with pytest.raises(ValueError, match="must be >= 0"):
        CostModel(base_s=-1.0)
    with pytest.raises(ValueError, match="an iteration takes time"):
        CostModel(base_s=0.0, per_seq_s=0.0)


def _timed_records(cost: CostModel, batches: dict[tuple[int, int], list[int]], t0: float = 1000.0) -> list[dict]:
    """Lake-style rows whose gen_end follow `cost` exactly; every batch starts at t0 + 100 * step."""
    rows = []
    for (step, worker), lengths in batches.items():
        start = t0 + 100.0 * step
        for length, end in zip(lengths, cost.request_times(lengths)):
            rows.append({"epoch": 0, "step": step, "worker_id": worker, "length": length,
                         "gen_start": start, "gen_end": start + end})
    return rows


def test_calibrate_recovers_known_parameters() -> None:
    truth = CostModel(base_s=0.02, per_seq_s=0.001, startup_s=0.5, capacity=4)
    rows = _timed_records(truth, {(0, 0): [5, 9, 2, 7, 3, 11], (0, 1): [4, 4, 8], (1, 0): [20, 1, 1, 1, 1, 6]})
    fit = calibrate(rows, capacity=4)
    # noise-free timings from the model itself: least squares returns the parameters exactly
    assert fit.cost.base_s == pytest.approx(0.02, rel=1e-9)
    assert fit.cost.per_seq_s == pytest.approx(0.001, rel=1e-9)
    assert fit.cost.startup_s == pytest.approx(0.5, rel=1e-9)
    assert fit.cost.capacity == 4
    assert (fit.requests, fit.groups) == (15, 3)
    assert fit.rms_s == pytest.approx(0.0, abs=1e-9) and fit.r2 == pytest.approx(1.0)


def test_calibrate_names_missing_columns_and_degenerate_data() -> None:
    with pytest.raises(ValueError, match=r"lacks \['gen_end'\]"):
        calibrate([{"worker_id": 0, "gen_start": 0.0, "length": 3}], capacity=4)
    with pytest.raises(ValueError, match="at least 3 timed requests"):
        calibrate(_timed_records(CostModel(), {(0, 0): [3, 4]}), capacity=4)
    # one batch, equal lengths, all admitted at once: iterations and occupancy move together
    alike = _timed_records(CostModel(capacity=8), {(0, 0): [5, 5, 5, 5]})
    with pytest.raises(ValueError, match="cannot separate"):
        calibrate(alike, capacity=8)
