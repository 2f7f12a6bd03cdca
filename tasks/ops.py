"""Prefect tasks behind the deployments (`flows/deployments.py`): configs from UI parameters,
the run a scheduled retrain continues, the lake report artifact, and the Prefect <-> MLflow links.

Parameters typed in the Prefect UI are checked here before any heavy work starts, so a bad one
fails the flow run within seconds with a message naming the field. Credentials never belong in
parameters (the UI shows them and the API stores them): they come from the worker's environment
(AWS_*, MLFLOW_TRACKING_PASSWORD, ...), and a URL with a password in it is refused.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Mapping
from urllib.parse import urlsplit

from prefect import get_run_logger, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.utilities.urls import url_for

from rhymerl.config.fields import apply_overrides, flatten
from rhymerl.config.run import RunConfig, config_from_dict, config_to_dict, load_config, resolve_config
from rhymerl.errors import ConfigError
from rhymerl.run.resume import prompts_digest, same_prompts
from storage.checkpoints import CheckpointStore, checkpoint_url
from storage.lake import Lake, LakeError
from storage.report import lake_report

if TYPE_CHECKING:  # tasks.setup starts Ray's import: ops' checks must answer before it
    from tasks.setup import Tracking

RUNS_SQL = """SELECT run_id, name, status, started_at, config_json FROM runs
              ORDER BY started_at DESC NULLS LAST, run_id DESC"""


def inline_credentials(config: Mapping[str, Any]) -> list[str]:
    """Config keys whose value is a URL carrying a password (`scheme://user:secret@host`)."""
    bad = []
    for key, value in flatten(dict(config)).items():
        if isinstance(value, str) and "://" in value:
            try:
                if urlsplit(value).password:
                    bad.append(key)
            except ValueError:
                continue
    return bad


def _refuse_credentials(config: Mapping[str, Any], field: str) -> None:
    bad = inline_credentials(config)
    if bad:  # name the keys, never echo the values
        raise ConfigError(f"parameter '{field}': {', '.join(bad)} holds a URL with a password; "
                          "Prefect shows parameters in the UI: give credentials through the "
                          "worker's environment (AWS_*, MLFLOW_TRACKING_USERNAME/PASSWORD) instead")


def _overrides(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"parameter 'overrides' must be a list of key=value strings, got {value!r}")
    return list(value)


@task(name="resolve-config", cache_policy=NO_CACHE)
def train_config_task(config_file: str, overrides: list[str] | None,
                      config_layers: list[str] | None = None) -> dict[str, Any]:
    """The run config from a TOML file (relative to the project), the files of `config_layers` over it
    in order, and `key=value` overrides, with the worker's environment settings between the files and
    the overrides, as `rhymerl run --config FILE --config LAYER ...` does; validated."""
    files = [f for f in (config_file, *(config_layers or [])) if f]
    try:
        cfg = load_config(files, _overrides(overrides), env=os.environ)
    except ConfigError as exc:
        raise ConfigError(f"invalid parameters (config_file={config_file!r}, config_layers, overrides): "
                          f"{exc}") from None
    data = config_to_dict(cfg)
    _refuse_credentials(data, "overrides")
    return data


@task(name="find-latest-run", cache_policy=NO_CACHE)
def latest_run_task(lake_url: str, experiment: str) -> dict[str, Any]:
    """The most recently started run in the lake logged to MLflow experiment `experiment`."""
    if not experiment:
        raise ConfigError("parameter 'experiment' is empty; give the MLflow experiment of the runs "
                          "to continue (tracking.experiment, 'rhymerl' by default)")
    try:
        with Lake(lake_url) as lake:
            rows = lake.sql(RUNS_SQL).to_pylist()
    except LakeError as exc:
        raise LakeError(f"parameter 'lake': {exc}") from None
    for row in rows:
        stored = json.loads(row["config_json"])
        if stored.get("tracking", {}).get("experiment") == experiment:
            return {**row, "config": stored}
    found = sorted({json.loads(r["config_json"]).get("tracking", {}).get("experiment", "?") for r in rows})
    raise LakeError(f"parameter 'experiment': lake {lake_url} has no run of experiment {experiment!r}; "
                    f"experiments there: {', '.join(found) or 'none'} (train one first with the train "
                    "deployment)")


@task(name="retrain-config", cache_policy=NO_CACHE)
def retrain_config_task(run: Mapping[str, Any], extra_epochs: int, overrides: list[str] | None) -> dict[str, Any]:
    """The stored config of `run` with `epochs` raised by `extra_epochs` and `overrides` on top
    (checked, credentials refused); `retrain_plan_task` then decides continue or warm start."""
    if not isinstance(extra_epochs, int) or isinstance(extra_epochs, bool) or extra_epochs < 1:
        raise ConfigError(f"parameter 'extra_epochs' must be an integer >= 1, got {extra_epochs!r}")
    stored = run["config"]
    wanted = [f"epochs={int(stored.get('epochs', 0)) + extra_epochs}", *_overrides(overrides)]
    try:
        cfg = config_to_dict(resolve_config(apply_overrides(stored, wanted), env=os.environ))
    except ConfigError as exc:
        raise ConfigError(f"invalid parameters (overrides): {exc}") from None
    _refuse_credentials(cfg, "overrides")
    if run["status"] == "running":
        get_run_logger().warning("run %s is recorded as running (a crash, or another process still "
                                 "training it); continuing it from its last checkpoint", run["run_id"])
    return cfg


def warm_start_config(config: Mapping[str, Any], source_run: str, extra_epochs: int) -> dict[str, Any]:
    """A new run's config: `config` trained for `extra_epochs` epochs from `source_run`'s weights."""
    return {**config, "epochs": extra_epochs, "model": {**config["model"], "init_from_run": source_run}}


@task(name="retrain-plan", cache_policy=NO_CACHE)
def retrain_plan_task(run: Mapping[str, Any], config: dict[str, Any], extra_epochs: int) -> dict[str, Any]:
    """Continue `run` (same run id, lake rows, MLflow run) when its data is unchanged, else start a
    new run warm-started from its newest checkpoint on the new data. The prompts are loaded with
    `config` and compared with the checkpoint's digest, so a dataset file edited in place counts
    as changed too. Returns {"config", "resume": run id or None, "reason"}."""
    from tasks.setup import prepare_model_task, prepare_prompts_task  # tokenizer, Ray: after the checks

    cfg = config_from_dict(config)
    store = CheckpointStore(checkpoint_url(cfg.lake.url, cfg.checkpoint.dir))
    latest = store.latest_meta(run["run_id"])
    if latest is None:
        raise LakeError(f"run {run['run_id']} has no committed checkpoint in {store.url}, so retrain can neither "
                        "continue it nor start from its weights; train a new run with the train deployment")
    prompts, _ = prepare_prompts_task.fn(cfg, prepare_model_task.fn(cfg))
    log = get_run_logger()
    if same_prompts(latest[1], prompts_digest(prompts), cfg.rollout.prompts_per_step):
        log.info("retrain: continuing run %s from its checkpoint at global step %d", run["run_id"], latest[0])
        return {"config": config, "resume": run["run_id"], "reason": "same data"}
    log.info("retrain: the data of run %s changed (prompts or rollout.prompts_per_step): a new run of %d "
             "epoch(s) starts from its checkpoint at global step %d", run["run_id"], extra_epochs, latest[0])
    return {"config": warm_start_config(config, run["run_id"], extra_epochs), "resume": None,
            "reason": "data changed"}


@task(name="lake-report", cache_policy=NO_CACHE)
def lake_report_task(lake_url: str, run_id: str) -> dict[str, Any]:
    """Run the lake's analysis views for one run and attach the Markdown report with its plots
    to this flow run (artifact key `lake-report`); returns the run id and per-epoch rows."""
    try:
        report = lake_report(lake_url, run_id)
    except LakeError as exc:
        raise LakeError(f"parameters 'lake'/'run_id': {exc}") from None
    create_markdown_artifact(markdown=report.markdown_inline(), key="lake-report",
                             description=f"Lake report of run {report.run_id}")
    get_run_logger().info("lake report of run %s: %d epoch(s)", report.run_id, len(report.epochs))
    return {"run_id": report.run_id, "epochs": report.epochs}


def mlflow_run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str | None:
    """The MLflow UI page of a run: on RHYMERL_MLFLOW_UI_URL (set by `rhymerl ui`), or on the
    tracking server itself when tracking is over HTTP; None when no UI is known."""
    base = os.environ.get("RHYMERL_MLFLOW_UI_URL", "")
    if not base and tracking_uri.startswith(("http://", "https://")):
        base = tracking_uri
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}" if base else None


@task(name="link-runs", cache_policy=NO_CACHE)
def link_runs_task(cfg: RunConfig, run_id: str, tracking: Tracking | None) -> None:
    """Cross-link the Prefect flow run and the MLflow run: MLflow tags with the flow run's id and
    URL; a `mlflow-run` artifact on the flow run with the MLflow run's link (or id)."""
    if tracking is None:
        return
    try:
        _link(cfg, run_id, tracking)
    except Exception as exc:  # links are a convenience: never fail a training run over them
        get_run_logger().warning("could not cross-link the Prefect and MLflow runs: %s", exc)


def _link(cfg: RunConfig, run_id: str, tracking: Tracking) -> None:
    # url_for gives the UI's page of the run (runtime's flow_run.ui_url names an API-style path).
    ui = url_for("flow-run", obj_id=flow_run.id) if flow_run.id else None
    tracking.tracker.set_tags({"prefect.flow_run_id": flow_run.id or "", "prefect.flow_run_name": flow_run.name or "",
                         "prefect.flow_run_url": ui or "", "prefect.root_flow_run_id": flow_run.root_flow_run_id or ""})
    url = mlflow_run_url(cfg.tracking.uri, tracking.tracker.experiment_id, tracking.mlflow_run_id)
    text = f"MLflow run {tracking.mlflow_run_id} (run {run_id})"
    if url:
        create_link_artifact(link=url, link_text=text, key="mlflow-run",
                             description=f"MLflow run of {run_id}")
    else:
        create_markdown_artifact(markdown=f"{text} in `{cfg.tracking.uri}`; browse it with `rhymerl ui`",
                                 key="mlflow-run", description=f"MLflow run of {run_id}")
