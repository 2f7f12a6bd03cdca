"""Prefect tasks that report progress: a line and MLflow metrics per step, plots at the end."""

from __future__ import annotations

import tempfile
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rhymerl.report import step_line
from storage.lake import LakeWriter
from storage.tracking import plot_reward_curve

_NON_METRICS = {"epoch", "step", "global_step"}


@task(name="log-step", cache_policy=NO_CACHE)
def log_step_task(rt, record: dict) -> None:
    """Print the step's line and log its numbers to MLflow at the global step."""
    get_run_logger().info(step_line(record))
    metrics = {k: float(v) for k, v in record.items() if k not in _NON_METRICS}
    metrics["epoch"] = float(record["epoch"])
    rt.tracker.log_metrics(metrics, step=int(record["global_step"]))


@task(name="plot", cache_policy=NO_CACHE)
def plot_task(rt) -> None:
    """Attach the reward/accuracy curve to the MLflow run."""
    with tempfile.TemporaryDirectory() as tmp:
        path = plot_reward_curve(rt.history, Path(tmp) / "reward_curve.png")
        rt.tracker.log_artifact(str(path))


_STEP_COLUMNS = {"rollout_s": "rollout_s", "reward_s": "reward_s", "train_s": "train_s", "sync_s": "sync_s",
                 "lake_s": "lake_s", "step_s": "total_s", "reward_mean": "reward_mean",
                 "accuracy": "accuracy", "length_mean": "length_mean", "length_max": "length_max",
                 "tokens": "tokens", "rollout_tokens_per_s": "tokens_per_s"}


@task(name="lake-step-row", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)
def lake_step_task(lake_url: str, run_id: str, record: dict) -> bool:
    """Write the step's timings and quality to the lake's steps table (once per step)."""
    values = {col: record[key] for key, col in _STEP_COLUMNS.items()}
    values["length_max"] = int(values["length_max"])
    values["tokens"] = int(values["tokens"])
    values["policy_version"] = int(record["policy_version"]) - 1  # the weights that generated it
    return LakeWriter(lake_url).write_steps_row(run_id, int(record["epoch"]), int(record["step"]), values)
