"""Prefect tasks that report progress: a line and MLflow metrics per step, plots at the end."""

from __future__ import annotations

import tempfile
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rhymerl.histospec.stats import position_labels
from rhymerl.run.report import epoch_summary, step_line
from storage.lake import LakeWriter
from storage.plots import plot_reward_curve
from tasks.setup import Tracking

_NON_METRICS = {"epoch", "step", "global_step"}


@task(name="log-step", cache_policy=NO_CACHE)
def log_step_task(tracking: Tracking, record: dict) -> None:
    """Print the step's line and log its numbers to MLflow at the global step (once per step)."""
    get_run_logger().info(step_line(record), extra={"rhymerl_step": record})  # rhymerl.run.console's progress line
    if int(record["global_step"]) in tracking.logged_steps:  # logged before a crash; a resumed run
        return
    metrics = {k: float(v) for k, v in record.items() if k not in _NON_METRICS}
    metrics["epoch"] = float(record["epoch"])
    tracking.tracker.log_metrics(metrics, step=int(record["global_step"]))


@task(name="log-epoch", cache_policy=NO_CACHE)
def log_epoch_task(tracking: Tracking | None, history: list[dict], epoch: int) -> dict:
    """The epoch's row of the end-of-run table as MLflow metrics `epoch/<name>` at step = epoch
    (reward, accuracy, HistoSpec's accepted tokens per verification, ... one point per epoch)."""
    rows = [r for r in epoch_summary([h for h in history if h["epoch"] == epoch])]
    if not rows or tracking is None:
        return {}
    metrics = {f"epoch/{k}": float(v) for k, v in rows[0].items() if k not in ("epoch", "steps")}
    tracking.tracker.log_metrics(metrics, step=epoch)
    return metrics


@task(name="plot", cache_policy=NO_CACHE)
def plot_task(tracking: Tracking, history: list[dict]) -> None:
    """Attach the reward/accuracy curve to the MLflow run."""
    with tempfile.TemporaryDirectory() as tmp:
        path = plot_reward_curve(history, Path(tmp) / "reward_curve.png")
        tracking.tracker.log_artifact(str(path))


_STEP_COLUMNS = {"rollout_s": "rollout_s", "reward_s": "reward_s", "train_s": "train_s", "sync_s": "sync_s",
                 "lake_s": "lake_s", "step_s": "total_s", "reward_mean": "reward_mean",
                 "length_mean": "length_mean", "length_max": "length_max",
                 "tokens": "tokens", "rollout_tokens_per_s": "tokens_per_s"}


# accuracy: absent (NULL in the lake) when no reward function judges correctness.
_OPTIONAL_COLUMNS = {"accuracy": "accuracy",
                     "spec/steps": "spec_steps", "spec/tokens": "spec_tokens", "spec/drafted": "spec_drafted",
                     "spec/accepted": "spec_accepted", "spec/mean_accepted_length": "spec_mean_accepted_length",
                     "spec/proposed": "spec_proposed", "spec/predicted_step_s": "spec_step_predicted_s",
                     "spec/measured_step_s": "spec_step_measured_s",
                     "spec/drafter_seconds": "spec_drafter_s", "spec/history_build_s": "spec_history_s",
                     "bubble_ratio": "bubble_ratio", "makespan_s": "makespan_s",
                     "forecast_spearman": "forecast_spearman",
                     "forecast_moved_fraction": "forecast_moved_fraction",
                     "reward_total_s": "reward_total_s", "migrations": "migrations",
                     "train_logprob_abs_diff": "logprob_abs_diff"}


@task(name="lake-step-row", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)
def lake_step_task(lake_url: str, run_id: str, record: dict, spec_method: str | None = None) -> bool:
    """Write the step's timings and quality to the lake's steps table (once per step)."""
    values = step_row(record, spec_method)
    return LakeWriter(lake_url).write_steps_row(run_id, int(record["epoch"]), int(record["step"]), values)


def step_row(record: dict, spec_method: str | None = None) -> dict:
    """The steps-table columns of a flow step record (`storage.schema.STEPS_SCHEMA`); the spec_*
    ones only when the record has speculation counters, the by-response-position lists only when
    it has those (HistoSpec's drafter counts them; vLLM's counters have no positions)."""
    values = {col: record[key] for key, col in _STEP_COLUMNS.items()}
    values["length_max"] = int(values["length_max"])
    values["tokens"] = int(values["tokens"])
    values["policy_version"] = int(record["policy_version"]) - 1  # the weights that generated it
    values.update({col: record[key] for key, col in _OPTIONAL_COLUMNS.items() if key in record})
    if "migrations" in values:
        values["migrations"] = int(values["migrations"])
    if "spec/steps" in record:
        values["spec_method"] = spec_method
        for col in ("spec_steps", "spec_tokens", "spec_drafted", "spec_accepted", "spec_proposed"):
            values[col] = int(values[col])
        values["spec_acceptance_by_pos"] = [
            record[k] for k in sorted((k for k in record if k.startswith("spec/acceptance_pos")),
                                      key=lambda k: int(k.removeprefix("spec/acceptance_pos")))]
        labels = position_labels()
        if f"spec/steps_{labels[0]}" in record:
            for what in ("steps", "tokens"):
                values[f"spec_{what}_by_response_pos"] = [int(record[f"spec/{what}_{b}"]) for b in labels]
    return values
