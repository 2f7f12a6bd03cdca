"""The MLflow sink (sqlite store in tmp_path) and the reward-curve plot."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from storage.plots import plot_reward_curve
from storage.tracking import MAX_PARAM_VALUE, REDACTED, MlflowTracker, flatten_params, is_secret_key

HISTORY = [
    {"epoch": 0, "step": 0, "reward_mean": 0.25, "reward_std": 0.1, "accuracy": 0.2},
    {"epoch": 0, "step": 1, "reward_mean": 0.5, "reward_std": 0.2, "accuracy": 0.4},
    {"epoch": 1, "step": 2, "reward_mean": 0.625, "reward_std": 0.1, "accuracy": 0.6},
    {"epoch": 1, "step": 3, "reward_mean": 0.75, "reward_std": None, "accuracy": None},
]


@pytest.fixture(scope="module")
def tracking_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One sqlite store per module: creating its tables takes seconds, so tests share it."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def test_logs_params_metrics_and_redacts_secrets(tracking_uri: str) -> None:
    # Rule: params are flattened and stringified, secret-looking keys redacted, metrics per step.
    tracker = MlflowTracker(tracking_uri, "params")
    params = {"train": {"lr": 0.0003, "betas": (0.9, 0.99)}, "rollout": {"max_tokens": 160},
              "hf_token": "hf_abcdef", "aws": {"secretAccessKey": "s3cr3t"}}
    run_id = tracker.start("run-a", params, {"git_sha": "abc123", "api_key": "k-123"})
    tracker.log_metrics({"reward_mean": 0.5, "skipped": None}, step=0)
    tracker.log_metrics({"reward_mean": 0.75}, step=1)
    tracker.finish()
    run = MlflowClient(tracking_uri).get_run(run_id)
    assert run.data.params == {"train.lr": "0.0003", "train.betas": "(0.9, 0.99)",
                               "rollout.max_tokens": "160", "hf_token": REDACTED,
                               "aws.secretAccessKey": REDACTED}
    assert run.data.tags["git_sha"] == "abc123" and run.data.tags["api_key"] == REDACTED
    assert run.info.run_name == "run-a" and run.info.status == "FINISHED"
    history = MlflowClient(tracking_uri).get_metric_history(run_id, "reward_mean")
    assert sorted((m.step, m.value) for m in history) == [(0, 0.5), (1, 0.75)]
    assert "skipped" not in run.data.metrics


@pytest.mark.parametrize("key, secret", [
    ("hf_token", True), ("aws.secret_access_key", True), ("apiKey", True), ("APIKEY", True),
    ("db.password", True), ("rollout.max_tokens", False), ("num_keys", False), ("train.lr", False),
])
def test_secret_keys_are_recognised(key: str, secret: bool) -> None:
    # Rule: a word that is or ends with key/secret/token/password is a secret; plurals are not.
    assert is_secret_key(key) is secret


def test_long_values_are_truncated_to_mlflow_limits() -> None:
    # Rule: a param value longer than MLflow accepts is cut to the limit, not rejected.
    flat = flatten_params({"prompt": {"template": "x" * (MAX_PARAM_VALUE + 500)}})
    assert len(flat["prompt.template"]) == MAX_PARAM_VALUE and flat["prompt.template"].endswith("...")


def test_artifacts_and_failed_status(tracking_uri: str, tmp_path: Path) -> None:
    # Rule: text, dicts and files land in the run's artifacts; an exception marks the run FAILED.
    png = plot_reward_curve(HISTORY, tmp_path / "plots" / "reward.png")
    with pytest.raises(RuntimeError, match="boom"):
        with MlflowTracker(tracking_uri, "artifacts") as tracker:
            run_id = tracker.start("run-b", {}, {})
            tracker.log_text("hello", "notes/hello.txt")
            tracker.log_dict({"a": 1}, "config.json")
            tracker.log_artifact(png)
            raise RuntimeError("boom")
    client = MlflowClient(tracking_uri)
    assert client.get_run(run_id).info.status == "FAILED"
    names = sorted(a.path for a in client.list_artifacts(run_id))
    assert names == ["config.json", "notes", "reward.png"]


def test_resume_continues_the_same_run(tracking_uri: str) -> None:
    # Rule: a resumed run logs to the MLflow run it started, and learns which steps it has.
    tracker = MlflowTracker(tracking_uri, "resume")
    run_id = tracker.start("run-r", {"seed": 0})
    tracker.log_metrics({"reward_mean": 0.5, "loss": 1.0}, step=0)
    tracker.log_metrics({"loss": 0.9}, step=1)
    tracker.finish("failed")
    again = MlflowTracker(tracking_uri, "resume")
    assert again.resume(run_id) == {0, 1}
    assert MlflowClient(tracking_uri).get_run(run_id).info.status == "RUNNING"
    again.log_metrics({"reward_mean": 0.75}, step=2)
    again.finish()
    history = MlflowClient(tracking_uri).get_metric_history(run_id, "reward_mean")
    assert sorted((m.step, m.value) for m in history) == [(0, 0.5), (2, 0.75)]
    assert MlflowClient(tracking_uri).get_run(run_id).info.status == "FINISHED"
    with pytest.raises(ValueError, match="tracking.uri"):
        again.resume("0" * 32)


def test_bad_calls_name_the_fix(tracking_uri: str) -> None:
    # Rule: misuse is refused with a message saying what to do.
    tracker = MlflowTracker(tracking_uri, "misuse")
    with pytest.raises(RuntimeError, match="start"):
        tracker.log_metrics({"a": 1.0}, step=0)
    tracker.start("run-c", {"a": 1})
    with pytest.raises(ValueError, match="'a' must be a number"):
        tracker.log_metrics({"a": "high"}, step=0)
    with pytest.raises(ValueError, match="must be one of"):
        tracker.finish("done")
    tracker.finish("killed")


def test_reward_curve_png(tmp_path: Path) -> None:
    # Rule: the plot is a real PNG file; a step without reward_mean is refused by row index.
    out = plot_reward_curve(HISTORY, tmp_path / "curve.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    with pytest.raises(ValueError, match="row 1"):
        plot_reward_curve([HISTORY[0], {"epoch": 0, "step": 1}], tmp_path / "bad.png")
