"""Prefect tasks that report progress: a line and MLflow metrics per step, plots at the end."""

from __future__ import annotations

import tempfile
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rhymerl.report import step_line
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
