"""A run scored by the configured reward functions, a built-in and a plug-in file reading an extra
dataset column, end to end: the plug-in breaks in epoch 1, the run stops naming it and the prompt,
the lake keeps nothing of the failed step, and `--resume` after the fix finishes the run with every
lake row's reward equal to what the functions give it (`helpers.rewards`)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

# The plug-in, written by the test so it can break it and fix it. `scale` is an extra dataset column.
REWARD_FN = '''
from pathlib import Path


def scaled_length(prompt, completion, row):
    """Longer responses score more, up to the row's `scale` at 64 characters."""
    if Path({marker!r}).exists() and {breaks}:
        with open({raised_log!r}, "a") as log:  # how many times it was called broken
            log.write(row["question"] + "\\n")
        raise RuntimeError("the marker file is there")
    return row["scale"] * min(len(completion), 64) / 64
'''


def test_a_failing_reward_stops_the_step_and_resume_finishes_with_the_fixed_function(
        prefect_harness, local_ray, tiny_model, tmp_path, monkeypatch):
    from helpers.rewards import check_lake_rewards, check_reward_metrics, jsonl_rows

    import flows.run
    from rhymerl.config.run import config_to_dict, load_config
    from rhymerl.data.builtin import builtin_problems
    from rhymerl.data.rewards import RewardFunctionError
    from storage.lake import Lake

    monkeypatch.chdir(tmp_path)  # the data file and the plug-in are given relative to here
    marker, raised_log = tmp_path / "break-it", tmp_path / "raised.log"
    problems = builtin_problems(num=2, seed=3)
    rows = [{"question": p.question, "answer": p.solution, "scale": scale} for p, scale in zip(problems, (0.5, 2.0))]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plugin = tmp_path / "reward_fn.py"
    plugin.write_text(REWARD_FN.format(marker=str(marker), breaks=True, raised_log=str(raised_log)))
    functions, weights = ["gsm8k", "reward_fn.py:scaled_length"], [1.0, 0.5]
    lake_url, tracking = str(tmp_path / "lake"), f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_config(None, [
        f'model.path="{tiny_model}"', "epochs=2", 'data.dataset="data.jsonl"', "data.num_prompts=2",
        "rollout.prompts_per_step=2", "rollout.n=2", "rollout.num_workers=1", "rollout.max_tokens=32",
        f'lake.url="{lake_url}"', f'tracking.uri="{tracking}"', "pipe.gantt=false",
        f"reward.functions={json.dumps(functions)}", f"reward.weights={json.dumps(weights)}",
    ])
    real_history = flows.run._epoch_history

    def history_breaking_the_reward(ctx, st, epoch, *args):  # the start of an epoch, before its steps
        if epoch == 1:
            marker.write_text("")
        return real_history(ctx, st, epoch, *args)

    monkeypatch.setattr(flows.run, "_epoch_history", history_breaking_the_reward)
    with pytest.raises(RewardFunctionError) as err:
        flows.run.run_flow(config=config_to_dict(cfg))
    lake = Lake(lake_url)
    [crashed] = lake.sql("SELECT run_id, status FROM runs").to_pylist()
    run_id = crashed["run_id"]
    assert crashed["status"] == "failed"
    # The message names the function, the prompt and the exception; the step wrote nothing.
    message = str(err.value)
    prompt_ids = {r["prompt_id"] for r in lake.sql("SELECT DISTINCT prompt_id FROM rollouts").to_pylist()}
    assert "'scaled_length'" in message and "RuntimeError: the marker file is there" in message
    assert any(f"on prompt {pid}:" in message for pid in prompt_ids), message
    assert lake.sql("SELECT DISTINCT epoch, step FROM rollouts").to_pylist() == [{"epoch": 0, "step": 0}]
    assert lake.sql("SELECT count(*) AS n FROM steps").to_pylist() == [{"n": 1}]
    # Scored once: the failed chunk was neither scored again on the driver nor retried.
    assert len(raised_log.read_text().splitlines()) == 1

    plugin.write_text(REWARD_FN.format(marker=str(marker), breaks=False, raised_log=str(raised_log)))  # the fix
    monkeypatch.setattr(flows.run, "_epoch_history", real_history)
    result = flows.run.run_flow(config=config_to_dict(cfg), resume=run_id)

    assert result["run_id"] == run_id and marker.exists()  # the fixed code runs, marker or not
    lake = Lake(lake_url)
    assert lake.sql("SELECT run_id, status FROM runs").to_pylist() == [{"run_id": run_id, "status": "finished"}]
    assert lake.sql("SELECT epoch, step, count(*) AS n FROM rollouts GROUP BY ALL ORDER BY ALL").to_pylist() == [
        {"epoch": 0, "step": 0, "n": 4}, {"epoch": 1, "step": 0, "n": 4}]
    # Every row's reward is what the functions and weights give its response and dataset row.
    assert check_lake_rewards(lake_url, run_id, functions, weights, jsonl_rows(tmp_path / "data.jsonl")) == 8
    values = lake.sql("SELECT reward_values['scaled_length'] AS v FROM rollouts").to_pylist()
    assert any(r["v"] > 0 for r in values)  # the plug-in's column is not trivially zero
    check_reward_metrics(lake_url, run_id, tracking, result["mlflow_run_id"], ["gsm8k", "scaled_length"])
    assert all("reward/scaled_length" in h and "accuracy" in h for h in result["history"])
