"""rhymerl/run/evaluation.py: when a held-out evaluation is due, how it splits, its rows and figures."""

from __future__ import annotations

import pytest

from rhymerl.config.run import load_config
from rhymerl.config.task import EvalConfig
from rhymerl.data.records import Prompt, Sample
from rhymerl.data.rewards import RewardScore, load_reward_set
from rhymerl.run.evaluation import (BEFORE_TRAINING, eval_due, eval_line, eval_metrics, eval_rows, eval_sampling,
                                    opening_eval, split_prompts)
from workers.stream import Scoring


def _prompt(i: int, answer: str = "3") -> Prompt:
    return Prompt(prompt_id=f"p{i}", index=10 + i, text=f"q{i}\n", token_ids=(i + 1,), answer=answer,
                  row={"question": f"q{i}", "answer": f"a=1 b=2\n#### {answer}"})


def _sample(i: int, k: int, text: str, tokens: int = 3) -> Sample:
    return Sample(prompt_id=f"p{i}", sample_idx=k, token_ids=tuple(range(tokens)), logprobs=(0.0,) * tokens,
                  text=text, finish_reason="stop", worker_id=0, t_start=0.0, t_end=1.0)


def test_due_before_training_and_after_the_last_epoch_only_by_default():
    on = EvalConfig(dataset="held.jsonl")
    # Rule: -1 (before the first epoch) and the last epoch; nothing when evaluation is off.
    assert [e for e in range(-1, 4) if eval_due(on, e, 4)] == [-1, 3]
    assert not any(eval_due(EvalConfig(), e, 4) for e in range(-1, 4))


def test_due_every_n_epochs_and_always_after_the_last():
    every = EvalConfig(dataset="held.jsonl", every_epochs=2)
    # Rule: after epochs 1, 3 (every 2nd, 0-based epoch + 1 divisible) and the last (4).
    assert [e for e in range(-1, 5) if eval_due(every, e, 5)] == [-1, 1, 3, 4]


def test_a_run_opens_on_a_boundary_only_at_an_epoch_start():
    # Rule: a new run is before epoch 0 (-1); a resume at (2, 0) is after epoch 1; mid-epoch is none.
    assert opening_eval(0, 0) == BEFORE_TRAINING
    assert opening_eval(2, 0) == 1
    assert opening_eval(1, 3) is None


def test_shares_are_contiguous_and_balanced():
    prompts = [_prompt(i) for i in range(5)]
    shares = split_prompts(prompts, 3)
    # Rule: sizes differ by at most one, larger first, order kept (concatenation is the input).
    assert [len(s) for s in shares] == [2, 2, 1] and sum(shares, []) == prompts
    assert split_prompts(prompts[:1], 3) == [[prompts[0]], [], []]
    with pytest.raises(ValueError, match="at least one worker"):
        split_prompts(prompts, 0)


def test_sampling_defaults_to_the_rollout_max_tokens_and_greedy():
    cfg = load_config(None, ['eval.dataset="held.jsonl"', "rollout.max_tokens=64"])
    s = eval_sampling(cfg)
    assert (s.n, s.temperature, s.top_p, s.max_tokens) == (1, 0.0, 1.0, 64)
    cfg = load_config(None, ['eval.dataset="held.jsonl"', "eval.max_tokens=16", "eval.n=2", "eval.temperature=0.7"])
    s = eval_sampling(cfg)
    assert (s.n, s.temperature, s.max_tokens) == (2, 0.7, 16)


def test_rows_and_figures_from_the_run_reward_functions(tmp_path):
    plugin = tmp_path / "brevity.py"
    plugin.write_text("def brevity(prompt, completion, row):\n    return 1.0 / (1 + len(completion))\n")
    rewards = load_reward_set(["gsm8k", f"{plugin}:brevity"], [1.0, 2.0])
    prompts = [_prompt(0), _prompt(1)]
    samples = [_sample(0, 0, "#### 3", tokens=4), _sample(1, 0, "#### 4", tokens=2)]
    scores = Scoring.of(rewards, prompts).score(samples)
    rows = eval_rows("r1", BEFORE_TRAINING, 0, 0, prompts, samples, scores)
    assert [(r["prompt_id"], r["prompt_index"], r["correct"], r["tokens"]) for r in rows] == [
        ("p0", 10, True, 4), ("p1", 11, False, 2)]
    assert rows[0]["reward_values"] == {"gsm8k": 1.0, "brevity": pytest.approx(1 / 7)}
    assert rows[0]["reward"] == pytest.approx(1.0 + 2 / 7)  # weighted sum: 1 x gsm8k + 2 x brevity
    m = eval_metrics(rows)
    # Rule: means over samples; accuracy over the judged samples (both here): 1 of 2.
    assert m["eval/reward/gsm8k"] == 0.5 and m["eval/accuracy"] == 0.5 and m["eval/mean_tokens"] == 3.0
    assert m["eval/reward"] == pytest.approx((1.0 + 2 / 7 + 2 / 7) / 2)
    line = eval_line(BEFORE_TRAINING, m, prompts=2, samples=2)
    assert line.startswith("eval before training (2 prompts x 1): reward ") and "gsm8k 0.500" in line
    assert "accuracy 0.500" in line and line.endswith("3.0 tokens")


def test_accuracy_is_left_out_when_no_function_judges_correctness():
    rows = eval_rows("r1", 1, 4, 4, [_prompt(0)], [_sample(0, 0, "x")],
                     [RewardScore(total=0.25, values={"brevity": 0.25}, correct=None)])
    m = eval_metrics(rows)
    assert "eval/accuracy" not in m and m["eval/reward"] == 0.25 and m["eval/reward/brevity"] == 0.25
    assert "accuracy" not in eval_line(1, m, 1, 1) and eval_line(1, m, 1, 1).startswith("eval after epoch 1")
    assert eval_metrics([]) == {}


def test_rows_need_one_score_per_sample():
    with pytest.raises(ValueError, match="score every sample"):
        eval_rows("r1", 0, 1, 1, [_prompt(0)], [_sample(0, 0, "x")], [])
