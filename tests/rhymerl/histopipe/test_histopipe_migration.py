"""HistoPipe straggler migration in the run: the selection rule and the join of the two parts."""

import pytest

from rhymerl.data.rewards import RewardScore
from rhymerl.histopipe.migration import MigrationRule, Move, WorkerView, join_prefix, select_migrations
from rhymerl.histopipe.simulator import measure
from rhymerl.data.records import Partial, Prompt, Sample
from rhymerl.run.rollout import check_groups, rollout_rows
from storage.schema import rows_to_table

PEAK = {"a": 10.0, "b": 40.0}


def view(running, queued=0, busy=True):
    return WorkerView(running=running, queued=queued, busy=busy)


def test_no_move_before_the_tail():
    # 100 requests, 11 unfinished > 10% tail: nothing moves even with an idle worker and a straggler.
    workers = [view({("a", 0): 50, ("a", 1): 5}), view({}, busy=False)]
    assert select_migrations(MigrationRule(), 100, 89, workers, PEAK, 160) == []
    assert select_migrations(MigrationRule(), 100, 90, workers, PEAK, 160) == [Move(("a", 0), 0, 1)]


def test_threshold_is_relative_to_the_prompts_forecast_peak():
    # a: 12 tokens vs peak 10 is overdue by 2 at threshold 1; b: 30 vs peak 40 is not (threshold 1),
    # but at threshold 0.5 b is overdue by 10 and moves first (most overdue first).
    workers = [view({("a", 0): 12, ("b", 3): 30}), view({}, busy=False)]
    assert select_migrations(MigrationRule(), 10, 9, workers, PEAK, 160) == [Move(("a", 0), 0, 1)]
    half = MigrationRule(threshold=0.5)
    assert select_migrations(half, 10, 9, workers, PEAK, 160) == [Move(("b", 3), 0, 1)]


def test_no_idle_worker_no_move():
    workers = [view({("a", 0): 50, ("a", 1): 50}), view({("b", 0): 1})]
    assert select_migrations(MigrationRule(), 10, 9, workers, PEAK, 160) == []


def test_a_lone_request_stays_and_queued_work_counts_as_other_work():
    # Worker 0 runs one straggler and nothing else: moving it gains nothing. With one request still
    # queued behind it (not yet reported running) it has other work, so the straggler may go.
    lone = [view({("a", 0): 50}), view({}, busy=False)]
    assert select_migrations(MigrationRule(), 10, 9, lone, PEAK, 160) == []
    queued = [view({("a", 0): 50}, queued=1), view({}, busy=False)]
    assert select_migrations(MigrationRule(), 10, 9, queued, PEAK, 160) == [Move(("a", 0), 0, 1)]


def test_moved_unforecast_and_finished_length_requests_stay():
    # ("a",0) moved once already; "c" has no forecast; ("a",1) is at max_tokens (nothing left to go).
    workers = [view({("a", 0): 90, ("c", 0): 90, ("a", 1): 64, ("a", 2): 11}), view({}, busy=False)]
    moves = select_migrations(MigrationRule(), 10, 9, workers, PEAK, 64, moved={("a", 0)})
    assert moves == [Move(("a", 2), 0, 1)]


def test_each_idle_worker_takes_per_worker_and_sources_keep_work():
    # Two idle workers, per_worker=1: the two most overdue move, one to each, ties by worker index.
    # Worker 0 has 3 requests: it may give 2 and keep 1.
    w0 = view({("a", 0): 30, ("a", 1): 20, ("a", 2): 25})
    idle = view({}, busy=False)
    moves = select_migrations(MigrationRule(), 10, 10, [w0, idle, idle], PEAK, 160)
    assert moves == [Move(("a", 0), 0, 1), Move(("a", 2), 0, 2)]
    two = MigrationRule(per_worker=2)
    moves = select_migrations(two, 10, 10, [w0, idle, idle], PEAK, 160)
    assert [m.key for m in moves] == [("a", 0), ("a", 2)]  # the third would leave worker 0 empty
    assert [m.dest for m in moves] == [1, 1]


def test_rule_rejects_bad_settings():
    with pytest.raises(ValueError, match="tail_fraction"):
        MigrationRule(tail_fraction=0)
    with pytest.raises(ValueError, match="threshold"):
        MigrationRule(threshold=-1)
    with pytest.raises(ValueError, match="per_worker"):
        MigrationRule(per_worker=0)


PROMPT = Prompt(prompt_id="a", index=3, text="1+2=", token_ids=(5, 6, 7), answer="3")


def parts():
    prefix = Partial("a", 4, (11, 12, 13), (-0.1, -0.2, -0.3), "xyz", worker_id=0, t_start=100.0, t_stop=104.0)
    cont = Sample("a", 4, (14, 15), (-0.4, -0.5), "uv", "stop", worker_id=1, t_start=104.5, t_end=107.0)
    return prefix, cont


def test_join_keeps_one_logprob_per_token_and_the_sample_index():
    prefix, cont = parts()
    s = join_prefix(prefix, cont)
    assert s.token_ids == (11, 12, 13, 14, 15)
    assert s.logprobs == (-0.1, -0.2, -0.3, -0.4, -0.5)
    assert (s.prompt_id, s.sample_idx, s.text, s.finish_reason) == ("a", 4, "xyzuv", "stop")
    # First admitted on worker 0 at 100, moved at 104.5, finished on worker 1 at 107.
    assert (s.worker_id, s.migrated_from_worker, s.t_start, s.migrated_at, s.t_end) == (1, 0, 100.0, 104.5, 107.0)
    assert s.migrations == 1


def test_join_refuses_mismatched_parts():
    prefix, cont = parts()
    from dataclasses import replace
    with pytest.raises(ValueError, match="cannot join"):
        join_prefix(prefix, replace(cont, sample_idx=3))
    with pytest.raises(ValueError, match="log-probs"):
        join_prefix(replace(prefix, logprobs=(-0.1,)), cont)


def test_a_migrated_sample_is_one_lake_row_with_its_migration():
    prefix, cont = parts()
    joined = join_prefix(prefix, cont)
    others = [Sample("a", k, (9,), (-1.0,), "9", "stop", 0, 100.0, 101.0) for k in (0, 1, 2, 3)]
    samples = others + [joined]
    check_groups([PROMPT], samples, 5)  # sample indices 0..4 exactly once
    rows = rollout_rows("run", 0, 0, [PROMPT], samples, [RewardScore(1.0, {"gsm8k": 1.0}, True)] * 5, policy_version=7)
    table = rows_to_table(rows).to_pylist()
    assert len(table) == 5
    row = table[-1]
    assert row["sample_idx"] == 4 and row["length"] == 5
    assert len(row["response_token_ids"]) == len(row["logprobs"]) == 5
    assert (row["migrations"], row["migrated_from_worker"], row["migrated_at"]) == (1, 0, 104.5)
    assert all((r["migrations"], r["migrated_from_worker"]) == (0, None) for r in table[:4])


def test_measure_counts_a_migrated_request_on_both_workers():
    # Worker 0: request x from 0 to 4 (moved at 4), y from 0 to 10. Worker 1 idle until x arrives
    # at 4, busy to 7. Makespan 10; busy 10 + 3 of 20 worker-seconds: bubble 7/20 = 0.35.
    rows = [{"prompt_id": "a", "sample_idx": 0, "worker_id": 1, "gen_start": 0.0, "gen_end": 7.0, "length": 9,
             "migrated_from_worker": 0, "migrated_at": 4.0},
            {"prompt_id": "a", "sample_idx": 1, "worker_id": 0, "gen_start": 0.0, "gen_end": 10.0, "length": 9,
             "migrated_from_worker": None, "migrated_at": None}]
    result = measure(rows, 2)
    assert result.makespan == pytest.approx(10.0)
    assert result.bubble_ratio == pytest.approx(0.35)
    assert result.migrations == 1
    assert result.busy == (((0.0, 10.0),), ((4.0, 7.0),))
