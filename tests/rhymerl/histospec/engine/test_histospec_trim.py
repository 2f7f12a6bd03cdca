"""Cost-aware batch drafting: the step-cost fit and the knapsack that trims drafts."""

from __future__ import annotations

import random

import numpy as np
import pytest

from rhymerl.histospec.goodput import (MIN_OBSERVATIONS, PAUSE_FACTOR, PROBE_EVERY, AcceptanceCalibration, CostByRows,
                                      StepCostModel, band_of, position_acceptance, tail_rows, trim_drafts)
from helpers.histospec_calls import record_calibration


def test_cost_model_recovers_the_line_through_noisy_steps():
    # Rule: seconds = c0 + c1 * tokens is recovered from noisy observations; no fit before
    # MIN_OBSERVATIONS steps.
    rng = random.Random(0)
    model = StepCostModel()
    for k in range(200):
        tokens = rng.randint(10, 400)
        if k == MIN_OBSERVATIONS - 1:
            assert model.coefficients() is None
        model.observe(tokens, 0.02 + 0.0005 * tokens + rng.gauss(0, 0.002))
    c0, c1, cv = model.coefficients()
    assert c0 == pytest.approx(0.02, abs=0.004) and c1 == pytest.approx(0.0005, rel=0.05)
    assert cv == 0.0  # every step drafted: what verifying at all costs is not identified, so not charged
    assert model.predict(100) == pytest.approx(0.07, rel=0.05)


def test_cost_model_follows_a_changing_engine_and_never_makes_tokens_free():
    model = StepCostModel()
    for t in range(100):
        model.observe(100 + t % 7, 0.01 + 0.001 * (100 + t % 7))
    for t in range(300):  # the engine gets 4x slower per token (e.g. a bigger batch shape): ~3 memories
        model.observe(100 + t % 7, 0.01 + 0.004 * (100 + t % 7))
    assert model.coefficients()[1] == pytest.approx(0.004, rel=0.1)
    flat = StepCostModel()
    for _ in range(20):
        flat.observe(50, 0.1)  # no spread in tokens: all cost goes to tokens, none is free
    assert flat.coefficients() == (0.0, pytest.approx(0.002), 0.0)


def test_each_band_of_running_requests_is_priced_by_its_own_steps():
    # Rule: a full batch (256 rows: 20 ms + 0.05 ms a token) and its tail (16-31 rows: 4 ms + 0.12 ms
    # a token, as this machine's long task measures) each get their own line; the pooled line, which
    # the far larger steps dominate, prices the tail's tokens at under half their cost. A band whose
    # tokens never varied (one row, never a draft) is priced by the pooled line, as is every band
    # with by_rows=False.
    rng = random.Random(2)
    cost, flat = CostByRows(), CostByRows(by_rows=False)
    for k in range(400):
        rows = 256 if k % 2 else rng.randint(16, 31)
        tokens = rows + rng.randint(0, 10 * rows if rows == 256 else 2 * rows)
        seconds = (0.020 + 0.00005 * tokens if rows == 256 else 0.004 + 0.00012 * tokens) + rng.gauss(0, 0.0002)
        for model in (cost, flat):
            model.observe(rows, tokens, seconds)
        if k % 10 == 0:
            cost.observe(1, 1, 0.003, drafted=False)
    tail, full = cost.for_rows(20).coefficients(), cost.for_rows(256).coefficients()
    assert tail[:2] == (pytest.approx(0.004, abs=0.0005), pytest.approx(0.00012, rel=0.1))
    assert full[:2] == (pytest.approx(0.020, abs=0.002), pytest.approx(0.00005, rel=0.1))
    assert cost.pooled.coefficients()[1] < 0.5 * 0.00012
    assert band_of(1) != band_of(2) == band_of(3) != band_of(4)
    assert cost.for_rows(1) is cost.pooled and cost.bands[band_of(1)].count == 40
    assert flat.for_rows(20) is flat.pooled and not flat.bands


def test_a_pause_is_no_step_but_a_slow_step_is():
    # Rule: a gap of PAUSE_FACTOR x the mean step or more (a pause between generate calls) is not
    # fitted; a step the forecast puts far lower still is (a fit gone low must be able to recover:
    # measured against the forecast, such steps were refused and the fit stayed wrong for good).
    model = StepCostModel()
    assert model.is_step(100.0)  # nothing known yet
    for k in range(40):  # small steps take 1 ms, big ones 100 ms: mean ~50 ms
        tokens = 10 if k % 2 else 1000
        model.observe(tokens, 0.001 + 0.0000990 * (tokens - 10))
    assert model.predict(10) < 0.002
    assert model.is_step(0.03)  # 15x the forecast for a small step, yet an engine step
    assert not model.is_step(PAUSE_FACTOR * 0.06)


def test_cost_model_prices_verifying_at_all_from_steps_with_and_without_drafts():
    # Rule: seconds = c0 + c1 * tokens + cv * [drafted] is recovered once draft-free steps are seen;
    # until then the fit asks for a draft-free probe step (at most one in PROBE_EVERY).
    rng = random.Random(1)
    model = StepCostModel()
    probes = 0
    for k in range(300):
        drafted = not model.wants_probe()
        probes += not drafted
        tokens = rng.randint(100, 300) + (20 if drafted else 0)
        model.observe(tokens, 0.01 + 0.0002 * tokens + (0.004 if drafted else 0.0) + rng.gauss(0, 0.0002), drafted)
    c0, c1, cv = model.coefficients()
    assert c0 == pytest.approx(0.01, abs=0.002) and c1 == pytest.approx(0.0002, rel=0.1)
    assert cv == pytest.approx(0.004, rel=0.2)
    assert 1 <= probes <= 300 // PROBE_EVERY + 1
    # a draft that the line alone would take is refused when the verifier's fixed price is counted
    q = [[0.9]] * 100
    assert trim_drafts([[1]] * 100, 100, 100, q, (c0, c1)) != [[]] * 100
    assert trim_drafts([[1]] * 100, 100, 100, q, (c0, c1, 0.03)) == [[]] * 100


def test_position_acceptance_is_smoothed_and_nonincreasing():
    # (a + 1) / (d + 2): 9/10 -> 10/12, 1/2 -> 0.5, then 6/6 -> 7/8 capped at 0.5; unseen 0.5.
    assert position_acceptance([9, 1, 6], [10, 2, 6], 4) == pytest.approx([10 / 12, 0.5, 0.5, 0.5])


def test_trim_keeps_the_tokens_that_raise_throughput():
    # Hand-computed (c0 = 8, c1 = 1; 2 decoding requests: E = 2 tokens in T = 10 s):
    # q 0.9: 9 > 2 keep (E 2.9, T 11); q 0.9: 9.9 > 2.9 keep (3.8, 12);
    # q 0.5: 6 > 3.8 keep (4.3, 13); q 0.2: 2.6 < 4.3 stop.
    q = [[0.9, 0.5, 0.2], [0.9, 0.5, 0.2]]
    assert trim_drafts([[1, 2, 3], [4]], 2, 2, q, (8.0, 1.0)) == [[1, 2], [4]]
    # A fixed cost that dominates keeps everything; a purely per-token cost keeps nothing
    # (0.9 * 2 s < 1 s/token * 2 tokens): speculation cannot pay when every token costs the same.
    assert trim_drafts([[1, 2, 3], [4]], 2, 2, q, (1000.0, 1.0)) == [[1, 2, 3], [4]]
    assert trim_drafts([[1, 2, 3], [4]], 2, 2, q, (0.0, 1.0)) == [[], []]
    assert trim_drafts([[], []], 2, 2, q, (8.0, 1.0)) == [[], []]


def test_trim_prefers_the_few_over_the_many():
    # The same drafts are kept whole for a small batch and cut for a large one.
    q = [[0.8, 0.6, 0.4, 0.2]] * 4
    drafts = [[7, 7, 7, 7]] * 4
    small = trim_drafts(drafts, 4, 4, q, (0.01, 0.0001))  # 4 requests: step cost is mostly fixed
    big = trim_drafts(drafts, 400, 400, q, (0.01, 0.0001))  # 400 requests: tokens dominate
    assert all(len(d) == 4 for d in small)
    assert sum(len(d) for d in big) < sum(len(d) for d in small)


def test_trim_keeps_a_confident_draft_and_cuts_a_doubtful_one():
    # Same positions, different chances: (c0 2, c1 1, 2 requests: E 2 in T 4). 0.9 * 4 > 2 keep
    # (2.9, 5); 0.9 * 5 > 2.9 keep (3.8, 6); then 0.3 * 6 = 1.8 < 3.8 stop: the doubtful draft goes.
    q = [[0.9, 0.9], [0.3, 0.3]]
    assert trim_drafts([[1, 2], [3, 4]], 2, 2, q, (2.0, 1.0)) == [[1, 2], []]


def test_calibration_maps_estimates_to_measured_acceptance():
    # Tokens estimated at 0.95 were accepted 1 time in 4, tokens at 0.55 always: with prior 0 the
    # table pools the two (monotone in the estimate) and a draft's chances never rise along it.
    cal = AcceptanceCalibration(bins=20, prior=0.0001)
    for _ in range(100):
        record_calibration(cal, [[0.95, 0.95, 0.95, 0.95], [0.55]], accepted=[1, 1])
    table = cal.table()[0].tolist()  # response-position bucket 0 (the helper's default position)
    assert table == sorted(table)
    assert table[19] == pytest.approx(table[11], rel=1e-3)
    assert table[19] == pytest.approx((100 + 100) / (400 + 100), rel=1e-3)
    assert cal.rows([[0.95, 0.55, 0.95]]).tolist() == [[table[19], table[11], table[11]]]


def test_calibration_trusts_the_estimate_where_nothing_was_seen():
    cal = AcceptanceCalibration()
    assert cal.rows([[0.97, 0.42]])[0].tolist() == pytest.approx([0.975, 0.425])


def test_tail_rows_are_those_forecast_to_finish_last():
    # Longest remaining 100: fraction 0.5 keeps >= 50; past its forecast (-3) counts as longest;
    # no forecast (None) never; fraction 0 turns it off.
    assert tail_rows([100, 60, 40, None, -3], 0.5) == {0, 1, 4}
    assert tail_rows([100, 60, 40], 0.0) == set()
    assert tail_rows([None, None], 0.5) == set()


def test_tail_rows_keep_whole_drafts_the_knapsack_would_cut():
    # c0 0, c1 1: the knapsack alone keeps nothing (q < 1), but row 0 is in the tail and keeps its
    # draft (E 2 + 1.4 in T 4); row 1's 0.6 * 4 = 2.4 < 3.4 then does not pay.
    q = [[0.9, 0.5], [0.6, 0.5]]
    assert trim_drafts([[1, 2], [3, 4]], 2, 2, q, (0.0, 1.0)) == [[], []]
    assert trim_drafts([[1, 2], [3, 4]], 2, 2, q, (0.0, 1.0), whole={0}) == [[1, 2], []]


def test_trim_matches_the_greedy_token_by_token_rule():
    # The vectorised trim equals the knapsack taken one token at a time (random drafts, q
    # nonincreasing per draft, random costs; ties resolved to a draft's earlier token).
    rng = np.random.default_rng(0)
    for _ in range(200):
        rows = int(rng.integers(1, 12))
        lengths = rng.integers(0, 6, rows)
        drafts = [[7] * int(n) for n in lengths]
        q = np.minimum.accumulate(np.round(rng.random((rows, 5)), 1), axis=1)
        coef = (float(rng.random()), float(rng.random()) * 0.2 + 1e-3)
        whole = set(np.flatnonzero(rng.random(rows) < 0.2).tolist())
        keep = [len(d) if i in whole else 0 for i, d in enumerate(drafts)]
        emitted = rows + sum(q[i, :keep[i]].sum() for i in whole)
        seconds = coef[0] + coef[1] * (rows + sum(keep))
        items = sorted(((q[i, j], j, i) for i in range(rows) if i not in whole
                        for j in range(min(len(drafts[i]), 5))), key=lambda t: (-t[0], t[1]))
        for p, j, i in items:
            if p * seconds <= coef[1] * emitted:
                break
            keep[i], emitted, seconds = j + 1, emitted + p, seconds + coef[1]
        assert [len(d) for d in trim_drafts(drafts, rows, rows, q, coef, whole)] == keep
