"""Both examples of `examples/` trained end to end, shrunk (1 epoch, 2 prompts x 2 samples, 16
tokens, the session's tiny model) through the real flow from the repository root, as `rhymerl run
--config examples/NAME/config.toml` runs them: every lake row's reward is what the configured
functions and weights give its response and dataset row, MLflow has each function's per-step value,
and chat-reward's held-out set is evaluated (the `evals` table, scored by the same functions)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SHRINK = ["epochs=1", "data.num_prompts=2", "rollout.prompts_per_step=2", "rollout.n=2", "rollout.num_workers=1",
          "rollout.max_tokens=16", "eval.num_prompts=2", "pipe.gantt=false"]


def test_both_examples_train_and_score_as_configured(prefect_harness, local_ray, tiny_model, tmp_path, monkeypatch):
    from helpers.rewards import check_lake_rewards, check_reward_metrics, jsonl_rows

    from flows.run import run_flow
    from rhymerl.config.run import config_to_dict, load_config
    from rhymerl.data.rewards import load_reward_set
    from storage.lake import Lake

    monkeypatch.chdir(ROOT)  # the configs' paths (data, reward file, template) are relative to it
    for name in ("math-boxed", "chat-reward"):
        lake_url, tracking = str(tmp_path / name / "lake"), f"sqlite:///{tmp_path / name / 'mlflow.db'}"
        cfg = load_config(f"examples/{name}/config.toml", [
            *SHRINK, f'model.path="{tiny_model}"', f'lake.url="{lake_url}"', f'tracking.uri="{tracking}"'])
        result = run_flow(config=config_to_dict(cfg))
        functions, weights = cfg.reward.functions, cfg.reward.weight_list
        rows = jsonl_rows(cfg.data.dataset)
        assert check_lake_rewards(lake_url, result["run_id"], functions, weights, rows, cfg.data.answer_key) == 4
        names = load_reward_set(functions, weights, cfg.data.answer_key).names
        check_reward_metrics(lake_url, result["run_id"], tracking, result["mlflow_run_id"], names)
        lake = Lake(lake_url)
        if not cfg.eval.enabled:
            assert name == "math-boxed" and lake.sql("SELECT count(*) AS n FROM evals").to_pylist() == [{"n": 0}]
            continue
        # Before the first epoch and after the last, each of eval.num_prompts rows once (greedy, n = 1),
        # scored by the run's functions on the eval set's own rows.
        evals = lake.sql("SELECT epoch, prompt_index, prompt_text, prompt_id, response_text, reward, reward_values "
                         "FROM evals ORDER BY epoch, prompt_index").to_pylist()
        assert [(e["epoch"]) for e in evals] == [-1, -1, 0, 0]
        eval_rows, rewards = jsonl_rows(cfg.eval.dataset), load_reward_set(functions, weights, cfg.data.answer_key)
        for e in evals:
            want = rewards.score(e["prompt_text"], e["response_text"], eval_rows[e["prompt_index"]], e["prompt_id"])
            assert e["reward"] == pytest.approx(want.total, abs=1e-6)
            assert dict(e["reward_values"]) == pytest.approx(dict(want.values))
        assert [m["epoch"] for m in result["evals"]] == [-1, 0]
        assert all("eval/reward/near_miss" in m for m in result["evals"])
