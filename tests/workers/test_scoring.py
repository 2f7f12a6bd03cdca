"""workers/stream.py's scoring with the run's reward functions: a plug-in reading an extra dataset
column, the scores each sample keeps, and a failing function that stops the step (never scored
again, never retried)."""

from __future__ import annotations

import pytest
import ray

from rhymerl.data.records import Prompt, Sample
from rhymerl.data.rewards import RewardFunctionError, RewardScore, load_reward_set
from workers.stream import Scoring, StreamedRollout, collect_scores, reward_error, score_timed

PLUGIN = '''
def keyword(prompt, completion, row):
    """1 when the completion says the row's extra column `keyword`; no verdict on correctness."""
    if row["keyword"] == "boom":
        raise ValueError("no keyword for this row")
    return 1.0 if row["keyword"] in completion else 0.0
'''


def prompt(pid: str, answer: str, keyword: str) -> Prompt:
    return Prompt(pid, 0, f"question {pid}\n", (1,), answer=answer,
                  row={"question": f"question {pid}", "answer": f"so\n#### {answer}", "keyword": keyword})


def sample(pid: str, k: int, text: str) -> Sample:
    return Sample(pid, k, (4, 5), (-0.1, -0.2), text, "stop", 0, 0.0, 1.0)


@pytest.fixture
def scoring(tmp_path):
    (tmp_path / "plugin.py").write_text(PLUGIN)
    rewards = load_reward_set(["gsm8k", "plugin.py:keyword"], [1.0, 0.5], base_dir=tmp_path)
    return Scoring.of(rewards, [prompt("a", "7", "cat"), prompt("b", "5", "dog"), prompt("c", "1", "boom")])


def test_each_sample_keeps_its_total_each_functions_value_and_verdict(scoring):
    # Rule: total = 1 x gsm8k + 0.5 x keyword; the plug-in reads the row's extra column; correct
    # comes from gsm8k alone (the plug-in gives no verdict).
    samples = [sample("a", 0, "a cat\n#### 7"), sample("a", 1, "#### 8"), sample("b", 0, "dog, cat\n#### 5")]
    scores, seconds = score_timed(scoring, samples)
    assert scores == [RewardScore(1.5, {"gsm8k": 1.0, "keyword": 1.0}, True),
                      RewardScore(0.0, {"gsm8k": 0.0, "keyword": 0.0}, False),
                      RewardScore(1.5, {"gsm8k": 1.0, "keyword": 1.0}, True)]
    assert seconds >= 0
    # A chunk's task gets only its own prompts' rows.
    assert set(scoring.only(samples[:2]).prompts) == {"a"}


def test_a_function_that_raises_names_itself_the_prompt_and_the_cause(scoring):
    with pytest.raises(RewardFunctionError, match=r"'keyword' \(plugin.py:keyword\) raised on prompt c: "
                                                   r"ValueError: no keyword for this row"):
        scoring.score([sample("a", 0, "#### 7"), sample("c", 0, "#### 1")])


def test_the_failure_behind_a_ray_task_comes_back_plain():
    # Rule: a task that failed in a reward function gives that error (its Ray traceback as the
    # cause); any other task failure is not a reward error (the chunk is scored again instead).
    inner = RewardFunctionError("reward function 'f' (f.py:f) raised on prompt p: KeyError: 'x'")
    wrapped = ray.exceptions.RayTaskError("score_timed", "Traceback ... f.py line 3", inner)
    error = reward_error(wrapped)
    assert type(error) is RewardFunctionError and str(error) == str(inner) and error.__cause__ is wrapped
    assert reward_error(ray.exceptions.RayTaskError("score_timed", "tb", OSError("disk"))) is None
    assert reward_error(ray.exceptions.WorkerCrashedError()) is None


def test_collect_scores_raises_the_reward_error_without_scoring_again(local_ray, scoring, tmp_path):
    # The failing chunk runs as a Ray task; collect_scores raises its error and does not score the
    # chunk again on the driver (it would fail the same way, and a slow function would cost twice).
    rollout = StreamedRollout(samples=[sample("a", 0, "cat\n#### 7"), sample("b", 0, "#### 5")])
    scores, _ = collect_scores(rollout, scoring)
    assert [s.total for s in scores] == [1.5, 1.0]
    broken = StreamedRollout(samples=[sample("a", 0, "#### 7"), sample("c", 0, "#### 1")])
    with pytest.raises(RewardFunctionError, match="raised on prompt c: ValueError") as err:
        collect_scores(broken, scoring)
    assert "no keyword for this row" in str(err.value.__cause__)  # the remote traceback, for the log


def test_a_reward_error_is_not_retried_by_prefect():
    from prefect.states import Completed, Failed

    from tasks.steps import retry_unless_reward_error

    assert not retry_unless_reward_error(None, None, Failed(data=RewardFunctionError("f raised on prompt p")))
    assert retry_unless_reward_error(None, None, Failed(data=OSError("a lost worker")))
    assert retry_unless_reward_error(None, None, Completed(data=1))
