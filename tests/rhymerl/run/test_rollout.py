"""Pure step helpers: placement, group checks, advantages, stats and lake rows."""

import pytest

from rhymerl.data.rewards import RewardScore
from rhymerl.data.records import Prompt, Sample
from rhymerl.run.report import epoch_summary, format_summary, format_table, step_line
from rhymerl.run.rollout import (advantages_for, check_groups, epoch_order, rollout_rows, step_batches, step_stats,
                             train_examples)


def P(i):
    return Prompt(prompt_id=f"p{i}", index=i, text=f"q{i}", token_ids=(i, i + 1), answer=str(i))


def S(pid, k, n_tokens=3, finish="stop"):
    return Sample(prompt_id=pid, sample_idx=k, token_ids=tuple(range(n_tokens)), logprobs=(-0.5,) * n_tokens,
                  text="x", finish_reason=finish, worker_id=0, t_start=1.0, t_end=2.0)


def test_step_batches_and_epoch_order():
    prompts = [P(i) for i in range(5)]
    assert [len(b) for b in step_batches(prompts, 2)] == [2, 2, 1]
    order0 = epoch_order(prompts, 0, seed=1)
    assert sorted(p.index for p in order0) == list(range(5))  # every prompt once
    assert order0 == epoch_order(prompts, 0, seed=1)  # reproducible
    # Epochs get different orders (the odds of 4 equal shuffles of 5 items are ~1e-6).
    orders = {tuple(p.index for p in epoch_order(prompts, e, seed=1)) for e in range(4)}
    assert len(orders) > 1


def test_check_groups_catches_lost_and_duplicated():
    prompts = [P(0), P(1)]
    good = [S("p0", 0), S("p0", 1), S("p1", 0), S("p1", 1)]
    check_groups(prompts, good, 2)
    with pytest.raises(RuntimeError, match="p1"):
        check_groups(prompts, good[:3], 2)  # one lost
    with pytest.raises(RuntimeError):
        check_groups(prompts, good + [S("p1", 1)], 2)  # one duplicated
    with pytest.raises(RuntimeError, match=r"p1.*\[0, 0\]"):
        check_groups(prompts, good[:3] + [S("p1", 0)], 2)  # right count, sample index 1 missing, 0 twice
    with pytest.raises(RuntimeError, match="p9"):
        check_groups(prompts, good[:3] + [S("p9", 1)], 2)  # a prompt not in the step


def test_advantages_grouped_by_prompt_in_any_order():
    # Group p0 rewards (1, 0): mean 0.5, unbiased std 0.7071 -> +-0.7071; p1 all equal -> 0.
    samples = [S("p0", 0), S("p1", 0), S("p0", 1), S("p1", 1)]
    adv = advantages_for(samples, [1.0, 1.0, 0.0, 1.0], scale=True, eps=0.0)
    assert adv == pytest.approx([0.70710678, 0.0, -0.70710678, 0.0])
    assert advantages_for(samples, [1.0, 1.0, 0.0, 1.0], scale=False, eps=0.0) == pytest.approx([0.5, 0, -0.5, 0])


def test_train_examples_are_the_same_for_a_whole_step_and_group_by_group():
    # Rule (streamed training): advantages are normalised within a group, so a group's examples do
    # not depend on the other groups of the step.
    samples, rewards = [S("p0", 0), S("p1", 0), S("p0", 1), S("p1", 1)], [1.0, 1.0, 0.0, 0.5]
    whole = train_examples([P(0), P(1)], samples, rewards, scale=True, eps=1e-6)
    p0 = train_examples([P(0)], samples[::2], rewards[::2], scale=True, eps=1e-6)
    p1 = train_examples([P(1)], samples[1::2], rewards[1::2], scale=True, eps=1e-6)
    assert whole == [p0[0], p1[0], p0[1], p1[1]]
    assert whole[0].prompt_ids == (0, 1) and whole[0].sampler_logprobs == (-0.5,) * 3
    assert whole[0].advantage == pytest.approx(0.5 / 0.5 ** 0.5, rel=1e-5)


def test_step_stats_and_rows():
    samples = [S("p0", 0, 2), S("p0", 1, 4, finish="length")]
    # totals are 1 x gsm8k + 0.5 x brevity
    scores = [RewardScore(1.25, {"gsm8k": 1.0, "brevity": 0.5}, True),
              RewardScore(0.0, {"gsm8k": 0.0, "brevity": 0.0}, False)]
    st = step_stats(samples, scores)
    assert (st.reward_mean, st.accuracy, st.length_mean, st.length_max, st.tokens, st.truncated) == \
        (0.625, 0.5, 3.0, 4, 6, 1)
    metrics = st.as_metrics()
    assert (metrics["reward/gsm8k"], metrics["reward/brevity"], metrics["accuracy"]) == (0.5, 0.25, 0.5)
    rows = rollout_rows("r", 1, 2, [P(0)], samples, scores, policy_version=7)
    assert [r["length"] for r in rows] == [2, 4] and rows[0]["prompt_text"] == "q0"
    assert rows[1]["policy_version"] == 7 and rows[1]["finish_reason"] == "length"
    assert rows[0]["reward"] == 1.25 and rows[0]["reward_values"] == [("gsm8k", 1.0), ("brevity", 0.5)]
    assert rows[0]["correct"] is True and "formatted" not in rows[0]


def test_accuracy_is_left_out_when_no_function_judges_correctness():
    # Rule: no verdict at all -> no accuracy (not 0); verdicts on some samples -> over those only.
    samples = [S("p0", 0, 2), S("p0", 1, 2)]
    st = step_stats(samples, [RewardScore(0.3, {"len": 0.3}, None), RewardScore(0.1, {"len": 0.1}, None)])
    assert st.accuracy is None and "accuracy" not in st.as_metrics()
    assert st.as_metrics()["reward/len"] == pytest.approx(0.2)
    st = step_stats(samples, [RewardScore(1.0, {}, True), RewardScore(0.0, {}, None)])
    assert st.accuracy == 1.0
    rows = rollout_rows("r", 0, 0, [P(0)], samples, [RewardScore(0.3, {"len": 0.3}, None)] * 2, policy_version=0)
    assert rows[0]["correct"] is None


def test_epoch_summary_weights_by_samples_and_sums_seconds():
    # Step A: 10 samples (tokens 20 / mean length 2) reward 1; step B: 30 samples reward 0 -> 0.25.
    base = {"accuracy": 0.0, "rollout_s": 1.0, "reward_s": 0.0, "lake_s": 0.0, "train_s": 2.0,
            "sync_s": 0.0, "step_s": 3.0, "rollout_tokens_per_s": 1.0}
    hist = [{**base, "epoch": 0, "reward_mean": 1.0, "tokens": 20, "length_mean": 2.0},
            {**base, "epoch": 0, "reward_mean": 0.0, "tokens": 60, "length_mean": 2.0}]
    row = epoch_summary(hist)[0]
    assert row["reward_mean"] == pytest.approx(0.25) and row["step_s"] == 6.0 and row["steps"] == 2
    assert "reward_mean" in format_table([row], ["epoch", "reward_mean"])


def test_summary_has_each_functions_mean_and_no_accuracy_without_a_verdict():
    # Rule: reward/<name> is sample-weighted like reward_mean; accuracy absent from every step is
    # absent from the epoch row, the step line and the end-of-run table (not 0).
    base = {"rollout_s": 1.0, "reward_s": 0.0, "lake_s": 0.0, "train_s": 2.0, "sync_s": 0.0, "step_s": 3.0,
            "rollout_tokens_per_s": 1.0, "length_max": 3.0, "step": 0}
    hist = [{**base, "epoch": 0, "reward_mean": 1.0, "reward/len": 1.0, "tokens": 20, "length_mean": 2.0},
            {**base, "epoch": 0, "reward_mean": 0.0, "reward/len": 0.0, "tokens": 60, "length_mean": 2.0}]
    row = epoch_summary(hist)[0]
    assert row["reward/len"] == pytest.approx(0.25) and "accuracy" not in row
    table = format_summary([row], "r", "lake", "sqlite:///m.db", "m1", 0)
    assert "reward/len" in table and "accuracy" not in table
    assert " acc " not in step_line(hist[0])
    judged = epoch_summary([{**hist[0], "accuracy": 0.5}, hist[1]])[0]
    assert judged["accuracy"] == 0.5  # over the steps that have one
