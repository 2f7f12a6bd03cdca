"""HistoPipe in the run: placement from lake history, and the step's measured bubble ratio."""

import pytest

from rhymerl.data.rewards import RewardScore
from rhymerl.config.pipe import PipeConfig
from rhymerl.data.records import Prompt, Sample
from rhymerl.run.rollout import rollout_rows
from storage.lake import LakeWriter, rows_to_table
from tasks.plan import step_measures, plan_task, tail_seconds


def P(i, prompt_len=4):
    return Prompt(prompt_id=f"p{i}", index=i, text=f"q{i}", token_ids=tuple(range(prompt_len)), answer="1")


def S(pid, k, length, worker=0, start=0.0, end=1.0):
    return Sample(prompt_id=pid, sample_idx=k, token_ids=(1,) * length, logprobs=(-0.1,) * length,
                  text="t", finish_reason="stop", worker_id=worker, t_start=start, t_end=end)


def write_epoch(url, prompts, lengths, epoch):
    samples = [S(p.prompt_id, k, lengths[p.prompt_id]) for p in prompts for k in range(2)]
    rows = rollout_rows("run", epoch, 0, prompts, samples, [RewardScore(0.0, {"gsm8k": 0.0}, False)] * len(samples), 0)
    w = LakeWriter(url)
    key = w.write_rollouts("run", epoch, 0, worker=0, attempt=1, table=rows_to_table(rows))
    w.commit_step("run", epoch, 0, files=[key])


def test_lpt_puts_the_longest_history_first_and_balances(tmp_path):
    # History: p0 long (100), p1..p3 short (30 each): LPT gives p0 a worker of its own, longest first.
    url = str(tmp_path / "lake")
    prompts = [P(i) for i in range(4)]
    write_epoch(url, prompts, {"p0": 100, "p1": 30, "p2": 30, "p3": 30}, epoch=0)
    plan = plan_task.fn(PipeConfig(policy="lpt"), url, "run", 1, 0, prompts, 2, 2, 160)
    ids = [[p.prompt_id for p in chunk] for chunk in plan.placement]
    assert sorted(ids, key=len) == [["p0"], ["p1", "p2", "p3"]]
    assert plan.forecast_mean["p0"] == pytest.approx(100)
    naive = plan_task.fn(PipeConfig(policy="naive"), url, "run", 1, 0, prompts, 2, 2, 160)
    assert [[p.prompt_id for p in c] for c in naive.placement] == [["p0", "p1"], ["p2", "p3"]]


def test_first_epoch_uses_prior_and_reads_no_history(tmp_path):
    # No lake at all in epoch 0: the plan still covers every prompt once, with no history forecasts.
    prompts = [P(i, prompt_len=2 + i) for i in range(3)]
    plan = plan_task.fn(PipeConfig(), str(tmp_path / "absent"), "run", 0, 0, prompts, 2, 4, 64)
    assert sorted(p.prompt_id for c in plan.placement for p in c) == ["p0", "p1", "p2"]
    assert plan.forecast_mean == {}


def test_measure_bubble_ratio(tmp_path):
    # Worker 0 busy 0..4 s, worker 1 busy 0..1 s: idle 3 of 2 x 4 worker-seconds -> 0.375.
    prompts = [P(0), P(1)]
    plan = plan_task.fn(PipeConfig(policy="naive"), str(tmp_path), "run", 0, 0, prompts, 2, 1, 64)
    samples = [S("p0", 0, 10, worker=0, start=0.0, end=4.0), S("p1", 0, 5, worker=1, start=0.0, end=1.0)]
    out = step_measures(plan, samples, 2)
    assert out["bubble_ratio"] == pytest.approx(0.375) and out["makespan_s"] == pytest.approx(4.0)
    assert out["tail_s"] == pytest.approx(0.0)  # of 2 requests the 90th percentile is the last


def test_tail_runs_from_the_90th_percentile_finish_to_the_last():
    # 20 requests finishing at 1..19 s and one straggler at 50 s: the 90th percentile of 20 is the
    # 18th finish (18 s), so the tail is 50 - 18 = 32 s.
    assert tail_seconds([float(t) for t in range(1, 20)] + [50.0]) == pytest.approx(32.0)
    assert tail_seconds([3.0]) == 0.0 and tail_seconds([]) == 0.0


def test_tier2_plan_splits_a_long_group_with_exact_sample_indices(tmp_path):
    # History: p0 is 10x longer than p1..p3, so tier2 runs p0 as single samples on both workers.
    # Every (prompt, sample) is one request on one worker; p0's indices 0..3 are split, not renumbered.
    url = str(tmp_path / "lake")
    prompts = [P(i) for i in range(4)]
    write_epoch(url, prompts, {"p0": 150, "p1": 15, "p2": 15, "p3": 15}, epoch=0)
    plan = plan_task.fn(PipeConfig(policy="tier2"), url, "run", 1, 0, prompts, 2, 4, 160)
    keys = [[r.key for r in reqs] for reqs in plan.requests]
    assert sorted(k for ks in keys for k in ks) == [(f"p{i}", k) for i in range(4) for k in range(4)]
    p0_on = {w for w, ks in enumerate(keys) for pid, _ in ks if pid == "p0"}
    assert p0_on == {0, 1}
    assert all(ks[0][0] == "p0" for ks in keys)  # the long requests are admitted first
    assert plan.forecast_peak["p0"] == pytest.approx(150)
    # placement lists each worker's distinct prompts (p0 on both).
    assert all(c[0].prompt_id == "p0" for c in plan.placement)
    # Odd steps visit workers in the other order: the same requests, mirrored.
    odd = plan_task.fn(PipeConfig(policy="tier2"), url, "run", 1, 1, prompts, 2, 4, 160)
    assert [[r.key for r in reqs] for reqs in odd.requests] == keys[::-1]


def test_work_units_refuse_a_placement_that_loses_or_repeats_a_sample():
    from rhymerl.histopipe.schedule import Assignment, Unit
    from tasks.plan import work_units

    prompts = [P(0), P(1)]
    good = Assignment("t", ((Unit("p0", (0, 2), 2, 1), Unit("p1", (0, 1, 2), 3, 1)), (Unit("p0", (1,), 1, 1),)))
    units = work_units(good, prompts, 3)
    assert [[r.key for r in w] for w in units] == [[("p0", 0), ("p0", 2), ("p1", 0), ("p1", 1), ("p1", 2)],
                                                   [("p0", 1)]]
    lost = Assignment("t", ((Unit("p0", (0, 2), 2, 1), Unit("p1", (0, 1, 2), 3, 1)), ()))
    with pytest.raises(ValueError, match="exactly once"):
        work_units(lost, prompts, 3)
    twice = Assignment("t", ((Unit("p0", (0, 1, 2), 3, 1), Unit("p1", (0, 1, 2), 3, 1)), (Unit("p0", (1,), 1, 1),)))
    with pytest.raises(ValueError, match="1 duplicates"):
        work_units(twice, prompts, 3)
    stranger = Assignment("t", ((Unit("p9", (0,), 1, 1),),))
    with pytest.raises(ValueError, match="p9"):
        work_units(stranger, prompts, 3)
