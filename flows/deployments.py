"""The flows behind `prefect.yaml`'s deployments: train, retrain and lake-report.

Each takes plain parameters that the Prefect UI shows as a form (descriptions from the Args
below), checks them first (a bad one fails the flow run within seconds, naming the field) and
then runs: `train` and `retrain` call `flows.run.run_flow` as a subflow (so the epoch flows and
their tasks appear under it), `lake-report` attaches a Markdown report to its flow run. The
heavy imports (torch, Ray, vLLM) happen only after the parameters passed.
"""

from __future__ import annotations

import os

from prefect import flow

from tasks.ops import lake_report_task, latest_run_task, retrain_config_task, retrain_plan_task, train_config_task


def check_inputs(config: dict, resume: str | None = None) -> None:
    """`rhymerl run`'s input checks (flows/preflight.py) on the worker, before anything starts:
    ValueError naming every problem, one line each."""
    from flows.preflight import report, run_checks
    from rhymerl.config.run import config_from_dict

    found = run_checks(config_from_dict(config), os.environ, resume=resume)
    if found:
        raise ValueError(report(found))


@flow(name="rhymerl-train", flow_run_name="train-{config_file}")
def train(config_file: str = "configs/default.toml", overrides: list[str] | None = None,
          config_layers: list[str] | None = None) -> dict:
    """Train a policy with GRPO: one run of `rhymerl run`.

    Args:
        config_file: TOML run config, relative to the project folder ("" = built-in defaults).
        overrides: settings on top of the files, one `key=value` each, values in TOML syntax,
            e.g. `epochs=2`, `rollout.n=8`, `lake.url="s3://bucket/lake"`. No credentials here.
        config_layers: more TOML files over `config_file`, in order, each overriding the earlier
            ones key by key (`rhymerl run --config A --config B`), e.g. `["configs/cluster.toml"]`.
    """
    config = train_config_task(config_file, overrides, config_layers)
    check_inputs(config)
    from flows.run import run_flow

    result = run_flow(config=config)
    return {k: result[k] for k in ("run_id", "mlflow_run_id", "lake", "epochs")}


@flow(name="rhymerl-retrain", flow_run_name="retrain-{experiment}")
def retrain(experiment: str = "rhymerl", extra_epochs: int = 1, lake: str = "lake",
            overrides: list[str] | None = None) -> dict:
    """Continue the latest run of an experiment from its latest checkpoint for more epochs; if its
    data changed, train a new run from that checkpoint's weights on the new data.

    Args:
        experiment: MLflow experiment (`tracking.experiment`) whose most recently started run
            is continued: same run id, lake rows and MLflow run. If the run's prompts changed
            (a `data.*` override, the dataset file edited, `rollout.prompts_per_step`), a new run
            (own run id and MLflow run, same experiment) starts from its weights instead.
        extra_epochs: epochs to add to the run's configured `epochs` (a new run trains this many).
        lake: lake holding the run (local folder relative to the project, or s3://bucket/prefix).
        overrides: `key=value` settings on top of the run's stored config, e.g.
            `data.dataset="data/new.jsonl"`.
    """
    run = latest_run_task(lake, experiment)
    config = retrain_config_task(run, extra_epochs, overrides)
    plan = retrain_plan_task(run, config, extra_epochs)
    check_inputs(plan["config"], plan["resume"])
    from flows.run import run_flow

    result = run_flow(config=plan["config"], resume=plan["resume"])
    return {**{k: result[k] for k in ("run_id", "mlflow_run_id", "lake", "epochs")}, "retrain": plan["reason"],
            "from_run": run["run_id"]}


@flow(name="rhymerl-lake-report", flow_run_name="lake-report-{run_id}")
def lake_report(lake: str = "lake", run_id: str = "") -> dict:
    """Analyse one run in the rollout lake: per-epoch reward, lengths, rhyme between epochs and
    length-rank stability, as a Markdown report with plots (artifact `lake-report`).

    Args:
        lake: local lake folder (relative to the project) or s3://bucket/prefix.
        run_id: run to analyse; "" = the most recently started run in the lake.
    """
    return lake_report_task(lake, run_id)
