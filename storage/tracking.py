"""MLflow sink: one tracker object per run (the reward curve it logs is drawn in `storage.plots`).

The tracker talks to MLflow through an explicit `MlflowClient(tracking_uri=...)`, never through
the global `mlflow.set_tracking_uri` state, so several trackers (and tests) can coexist in one
process. Params are flattened to dotted keys, stringified, truncated to MLflow's limits and
redacted when their key looks like a credential, so a config can be logged whole and safely.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path
from typing import Any, Mapping

from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils import validation as _limits

MAX_KEY = getattr(_limits, "MAX_ENTITY_KEY_LENGTH", 250)
MAX_PARAM_VALUE = getattr(_limits, "MAX_PARAM_VAL_LENGTH", 6000)
MAX_TAG_VALUE = getattr(_limits, "MAX_TAG_VAL_LENGTH", 8000)
PARAMS_PER_BATCH = getattr(_limits, "MAX_PARAMS_TAGS_PER_BATCH", 100)
METRICS_PER_BATCH = getattr(_limits, "MAX_METRICS_PER_BATCH", 1000)
REDACTED = "***redacted***"
_SECRET_WORDS = ("key", "secret", "secrets", "token", "password", "passwd", "credential", "credentials")
_STATUSES = {"finished": "FINISHED", "failed": "FAILED", "killed": "KILLED"}


def is_secret_key(key: str) -> bool:
    """True if a param/tag key names a credential.

    The key is split into words (on non-letters and camelCase); a word that is, or ends with,
    key/secret/token/password/credential counts: `aws.secret_access_key`, `hf_token`, `apiKey`,
    `APIKEY`. A plural like `max_tokens` or `num_keys` is a hyperparameter, not a secret.
    """
    words = re.split(r"[^A-Za-z]+|(?<=[a-z])(?=[A-Z])", key)
    return any(w.lower().endswith(s) for w in words for s in _SECRET_WORDS)


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def flatten_params(params: Mapping[str, Any] | Any, prefix: str = "") -> dict[str, str]:
    """Nested dicts/dataclasses -> {dotted.key: value as text}, secrets redacted, within limits."""
    if dataclasses.is_dataclass(params) and not isinstance(params, type):
        params = dataclasses.asdict(params)
    out: dict[str, str] = {}
    for key, value in params.items():
        full = f"{prefix}{key}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        if isinstance(value, Mapping) and value:
            out.update(flatten_params(value, f"{full}."))
            continue
        text = REDACTED if is_secret_key(full) else str(value)
        out[_truncate(full, MAX_KEY)] = _truncate(text, MAX_PARAM_VALUE)
    return out


def _artifact_root(uri: str) -> str | None:
    """For a sqlite store, keep artifacts in `mlruns/` beside the database file.

    For `sqlite:///mlflow.db` run from the repo root this is MLflow's own default (./mlruns); for
    a database elsewhere (a test's tmp_path) the artifacts stay next to it instead of the cwd.
    """
    if not uri.startswith("sqlite:///"):
        return None
    db = Path(uri[len("sqlite:///"):])
    return (db.resolve().parent / "mlruns").as_uri()


class MlflowTracker:
    """Logs one run at a time to an MLflow tracking store (`sqlite:///file.db`, a server URL...)."""

    def __init__(self, uri: str, experiment: str) -> None:
        if not uri or not experiment:
            raise ValueError("MlflowTracker needs a tracking uri and an experiment name; set "
                             "tracking.uri (e.g. sqlite:///mlflow.db) and tracking.experiment")
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment_id = self._experiment(experiment)
        self.run_id: str | None = None

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name, artifact_location=_artifact_root(self.uri))
        except MlflowException:
            found = self.client.get_experiment_by_name(name)  # another process created it first
            if found is None:
                raise
            return found.experiment_id

    def _active(self) -> str:
        if self.run_id is None:
            raise RuntimeError("no MLflow run is active; call MlflowTracker.start(...) first")
        return self.run_id

    def start(self, run_name: str, params: Mapping[str, Any] | Any, tags: Mapping[str, Any] | None = None) -> str:
        """Create a run, log its flattened params and tags; return the MLflow run id."""
        if self.run_id is not None:
            raise RuntimeError(f"MLflow run {self.run_id} is still active; call finish() first")
        clean_tags = {_truncate(str(k), MAX_KEY): REDACTED if is_secret_key(str(k))
                      else _truncate(str(v), MAX_TAG_VALUE) for k, v in (tags or {}).items()}
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=clean_tags)
        self.run_id = run.info.run_id
        flat = [Param(k, v) for k, v in flatten_params(params).items()]
        for i in range(0, len(flat), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=flat[i:i + PARAMS_PER_BATCH])
        return self.run_id

    def resume(self, mlflow_run_id: str) -> set[int]:
        """Reopen an existing run (status RUNNING again) to keep logging to it; returns the steps
        at which it already has metrics, so a resumed run need not log a step twice."""
        if self.run_id is not None:
            raise RuntimeError(f"MLflow run {self.run_id} is still active; call finish() first")
        try:
            run = self.client.get_run(mlflow_run_id)
        except MlflowException as exc:
            raise ValueError(f"MLflow run {mlflow_run_id!r} is not in {self.uri}; resume with the "
                             "tracking.uri the run was started with") from exc
        self.client.update_run(mlflow_run_id, status="RUNNING")
        self.run_id = mlflow_run_id
        return {m.step for key in run.data.metrics for m in self.client.get_metric_history(mlflow_run_id, key)}

    def log_metrics(self, metrics: Mapping[str, float | int | None], step: int) -> None:
        """Log numeric metrics at `step`; None values are skipped."""
        run_id = self._active()
        now_ms = int(time.time() * 1000)
        batch = []
        for key, value in metrics.items():
            if value is None:
                continue
            try:
                number = float(value) if not isinstance(value, str) else None
            except (TypeError, ValueError):
                number = None
            if number is None:
                raise ValueError(f"metric '{key}' must be a number, got {value!r}")
            batch.append(Metric(key, number, now_ms, int(step)))
        for i in range(0, len(batch), METRICS_PER_BATCH):
            self.client.log_batch(run_id, metrics=batch[i:i + METRICS_PER_BATCH])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Copy a local file (or folder) into the run's artifacts."""
        if not Path(path).exists():
            raise FileNotFoundError(f"artifact {path} does not exist; write it before logging it")
        self.client.log_artifact(self._active(), str(path), artifact_path)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self._active(), text, artifact_file)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set (or overwrite) tags on the active run; credential-like keys are redacted."""
        run_id = self._active()
        for key, value in tags.items():
            self.client.set_tag(run_id, _truncate(str(key), MAX_KEY),
                                REDACTED if is_secret_key(str(key)) else _truncate(str(value), MAX_TAG_VALUE))

    def log_dict(self, data: Mapping[str, Any], artifact_file: str) -> None:
        """Save a dict as a .json or .yaml artifact (by the file's extension)."""
        self.client.log_dict(self._active(), dict(data), artifact_file)

    def finish(self, status: str = "finished") -> None:
        """End the active run with status finished, failed or killed (any case)."""
        name = _STATUSES.get(status.lower())
        if name is None:
            raise ValueError(f"run status {status!r} must be one of {sorted(_STATUSES)}")
        self.client.set_terminated(self._active(), name)
        self.run_id = None

    def __enter__(self) -> MlflowTracker:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if self.run_id is not None:
            self.finish("failed" if exc_type is not None else "finished")
