"""Resuming a run: the pure decisions (next step, reused lake rows) and one end-to-end resume."""

from __future__ import annotations

import pytest

from rhymerl.records import Prompt
from rhymerl.resume import plan_resume, prompts_digest, samples_from_rows


def _prompt(i: int) -> Prompt:
    return Prompt(prompt_id=f"p{i}", index=i, text=f"q{i}", token_ids=(i + 1,), answer=str(i))


def _rows(prompts, n, version=3):
    # Stored in an order unlike the batch's (the lake gives no order): worker 1 first.
    return [{"prompt_id": p.prompt_id, "sample_idx": k, "response_token_ids": [5, k], "logprobs": [-0.1, -0.2],
             "response_text": f"r{k}", "finish_reason": "stop", "worker_id": 1, "gen_start": 1.0,
             "gen_end": 2.0, "reward": float(k), "correct": k == 1, "formatted": True,
             "policy_version": version} for p in reversed(prompts) for k in reversed(range(n))]


def test_next_step_within_and_across_epochs():
    # Rule: continue right after the checkpointed step; the last step of an epoch rolls over.
    assert plan_resume((0, 0, 0), 2, 2, []) == plan_resume((0, 0, 0), 2, 2, [(0, 0)])
    p = plan_resume((0, 0, 0), 2, 2, [(0, 0)])
    assert (p.epoch, p.step, p.global_step, p.reuse, p.done) == (0, 1, 1, frozenset(), False)
    p = plan_resume((0, 1, 1), 2, 2, [(0, 0), (0, 1)])
    assert (p.epoch, p.step, p.global_step, p.done) == (1, 0, 2, False)


def test_steps_committed_after_the_checkpoint_are_reused():
    # Rule: a crash between lake commit and checkpoint: those steps train on their lake rows.
    p = plan_resume((0, 1, 1), 2, 3, [(0, 0), (0, 1), (1, 0), (1, 1)])
    assert (p.epoch, p.step, p.global_step) == (1, 0, 2)
    assert p.reuse == {(1, 0), (1, 1)}


def test_a_gap_in_committed_steps_is_refused():
    # Rule: step (1, 1) cannot be committed while (1, 0) is not; the lake lost a step.
    with pytest.raises(ValueError, match="a step is missing"):
        plan_resume((0, 1, 1), 2, 3, [(1, 1)])


def test_a_finished_run_has_nothing_left():
    p = plan_resume((1, 1, 3), 2, 2, [(0, 0), (0, 1), (1, 0), (1, 1)])
    assert p.done and p.reuse == frozenset()
    assert not plan_resume((1, 1, 3), 2, 3, []).done  # more epochs asked for: continue


def test_checkpoint_must_fit_the_steps_per_epoch():
    with pytest.raises(ValueError, match="prompts_per_step"):
        plan_resume((0, 5, 5), 2, 2, [])


def test_rows_come_back_in_batch_order():
    # Rule: samples follow the batch's prompt order, then sample_idx; scores line up with them.
    prompts = [_prompt(0), _prompt(1)]
    samples, scores = samples_from_rows(_rows(prompts, 2), prompts, n=2, policy_version=3)
    assert [(s.prompt_id, s.sample_idx) for s in samples] == [("p0", 0), ("p0", 1), ("p1", 0), ("p1", 1)]
    assert samples[1].token_ids == (5, 1) and samples[1].logprobs == (-0.1, -0.2)
    assert scores[:2] == [(0.0, False, True), (1.0, True, True)]


def test_rows_of_other_prompts_or_policies_are_refused():
    prompts = [_prompt(0), _prompt(1)]
    with pytest.raises(ValueError, match="needs 2 for each of its 2 prompts"):
        samples_from_rows(_rows(prompts[:1], 2), prompts, n=2, policy_version=3)
    with pytest.raises(ValueError, match="off-policy"):
        samples_from_rows(_rows(prompts, 2, version=2), prompts, n=2, policy_version=3)


def test_prompts_digest_depends_on_order():
    a, b = _prompt(0), _prompt(1)
    assert prompts_digest([a, b]) == prompts_digest([a, b]) != prompts_digest([b, a])
