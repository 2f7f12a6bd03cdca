"""Checking a finished run's rewards against its reward functions, for any task's end-to-end test.

`check_lake_rewards` recomputes every committed lake row's reward of a run from its response text
and its dataset row with the configured functions and weights, and asserts that the lake holds the
same total (`reward`), the same value of each function (`reward_values`) and the same verdict
(`correct`). `check_reward_metrics` asserts that MLflow has each function's per-step mean
(`reward/<name>`) equal to the lake's, and accuracy only where some function judges correctness.
`jsonl_rows` reads a JSONL dataset's rows by position (the lake's `prompt_index`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import pytest

from rhymerl.data.rewards import RewardSet, load_reward_set
from storage.lake import Lake

_ROWS_SQL = """SELECT epoch, step, prompt_id, prompt_index, prompt_text, response_text, reward, reward_values, correct
               FROM rollouts WHERE run_id = ? ORDER BY epoch, step, prompt_id, sample_idx"""


def jsonl_rows(path: str | Path) -> dict[int, dict[str, Any]]:
    """A JSONL file's rows by 0-based line position (blank lines skipped, as the loader does)."""
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    return {i: json.loads(line) for i, line in enumerate(lines)}


def lake_reward_rows(lake_url: str, run_id: str) -> list[dict[str, Any]]:
    """The run's committed rollouts with what scoring wrote, `reward_values` as a dict."""
    rows = Lake(lake_url).sql(_ROWS_SQL, [run_id]).to_pylist()
    for r in rows:
        r["reward_values"] = dict(r["reward_values"] or ())
    return rows


def check_lake_rewards(lake_url: str, run_id: str, functions: Sequence[str], weights: Sequence[float],
                       rows_by_index: Mapping[int, Mapping[str, Any]], answer_key: str = "answer",
                       base_dir: str | Path | None = None) -> int:
    """Assert every committed row of `run_id` holds what `functions` with `weights` give its
    response to its dataset row (`rows_by_index[prompt_index]`); returns the rows checked (> 0).
    `reward` is float32 in the lake, so totals compare to float32 precision."""
    rewards: RewardSet = load_reward_set(functions, weights, answer_key=answer_key, base_dir=base_dir)
    rows = lake_reward_rows(lake_url, run_id)
    assert rows, f"run {run_id} has no committed rows in {lake_url}"
    for r in rows:
        want = rewards.score(r["prompt_text"], r["response_text"], rows_by_index[r["prompt_index"]], r["prompt_id"])
        where = f"epoch {r['epoch']} step {r['step']} prompt {r['prompt_id']}: {r['response_text']!r}"
        assert r["reward"] == pytest.approx(want.total, rel=1e-6, abs=1e-6), where
        assert list(r["reward_values"]) == list(rewards.names), where
        assert r["reward_values"] == pytest.approx(dict(want.values), rel=1e-12, abs=1e-12), where
        assert r["correct"] == want.correct, where
    return len(rows)


def check_reward_metrics(lake_url: str, run_id: str, tracking_uri: str, mlflow_run_id: str,
                         names: Sequence[str]) -> None:
    """Assert MLflow has, at each global step (the run's steps in order), `reward/<name>` equal to
    the lake's mean of that function's values, and `accuracy` exactly when the lake has verdicts."""
    from mlflow.tracking import MlflowClient

    by_step: dict[tuple[int, int], list[dict]] = {}
    for r in lake_reward_rows(lake_url, run_id):
        by_step.setdefault((r["epoch"], r["step"]), []).append(r)
    client = MlflowClient(tracking_uri)
    for name in names:
        logged = sorted(client.get_metric_history(mlflow_run_id, f"reward/{name}"), key=lambda m: m.step)
        assert [m.step for m in logged] == list(range(len(by_step))), name
        for m, key in zip(logged, sorted(by_step)):
            rows = by_step[key]
            assert m.value == pytest.approx(sum(r["reward_values"][name] for r in rows) / len(rows)), (name, key)
    judged = any(r["correct"] is not None for rows in by_step.values() for r in rows)
    assert bool(client.get_metric_history(mlflow_run_id, "accuracy")) == judged
