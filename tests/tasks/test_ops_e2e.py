"""Operations end to end: the servers `rhymerl ui` starts, the project's deployments triggered
through the Prefect API on a local process worker, the Prefect UI in headless Chromium, and no
secret anywhere the runs leave traces.

One Prefect server, MLflow UI and worker (infra.servers.ServerStack, as `rhymerl ui` runs them)
serve the whole module on free ports, with their state in a temporary folder. The worker and
the flow runs it starts see fake AWS credentials in their environment. The runs train the
session's `tiny_model` (conftest; already built when the flow tests ran before this module).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from helpers.marks import chromium
from helpers.secret_scan import files_containing

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "tests" / "output"  # screenshots (git-ignored)
FAKE_KEY_ID = "AKIAFAKEOPSTEST12345"
FAKE_SECRET = "fake/OpsTest+secret-9f8e7d6c5b4a3210"
EXPERIMENT = "ops-e2e"
PROMPTS, PER_STEP, N = 2, 2, 2  # 1 step per epoch of 2 prompts x 2 samples: deployments are under test


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The servers and worker, with the module's state in one folder; yields (stack, folder)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from infra.servers import ServerStack, UiConfig, free_port

    home = tmp_path_factory.mktemp("ops")
    # Environment settings a developer may have exported must not move the runs elsewhere.
    unset = tuple((name, "") for name in ("RHYMERL_LAKE", "RHYMERL_MODEL", "RHYMERL_DATASET",
                                          "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "RAY_ADDRESS"))
    cfg = UiConfig(project=ROOT, prefect_port=free_port(), mlflow_port=free_port(),
                   prefect_home=str(home / "prefect"), mlflow_db=str(home / "mlflow.db"),
                   extra_env=unset + (("AWS_ACCESS_KEY_ID", FAKE_KEY_ID),
                                      ("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)))
    with ServerStack(cfg, say=print) as running, temporary_settings({PREFECT_API_URL: cfg.prefect_api_url}):
        yield running, home


def _run(name: str, parameters: dict[str, Any], timeout: float = 600):
    from prefect.deployments import run_deployment

    t0 = time.monotonic()
    run = run_deployment(name, parameters=parameters, timeout=timeout, poll_interval=2, as_subflow=False)
    print(f"{name}: {run.state.type.value} in {time.monotonic() - t0:.0f}s ({run.state.message})")
    return run


def _run_ids(lake_url: str) -> list[str]:
    from storage.lake import Lake

    with Lake(lake_url) as lake:
        return [r["run_id"] for r in lake.sql("SELECT run_id FROM runs").to_pylist()]


def _artifacts(flow_run_ids: list, key: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=flow_run_ids)))


def _child_runs(parent_id) -> list:
    """Flow runs whose parent task run belongs to `parent_id` (its subflows)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent_id])))


@pytest.fixture(scope="module")
def trained(stack, tiny_model):
    """One tiny training run through the train deployment, then one more epoch by retrain."""
    _, home = stack
    lake = str(home / "lake")
    overrides = [f'model.path="{tiny_model}"', "epochs=1", f"data.num_prompts={PROMPTS}",
                 f"rollout.prompts_per_step={PER_STEP}", f"rollout.n={N}", "rollout.num_workers=1",
                 "rollout.max_tokens=24", f'lake.url="{lake}"',
                 f'tracking.uri="sqlite:///{home / "mlflow.db"}"', f'tracking.experiment="{EXPERIMENT}"']
    train = _run("rhymerl-train/train", {"config_file": "", "overrides": overrides})
    retrain = _run("rhymerl-retrain/retrain", {"experiment": EXPERIMENT, "extra_epochs": 1, "lake": lake})
    return {"train": train, "retrain": retrain, "lake": lake, "home": home}


def test_train_and_retrain_deployments_run_on_the_local_worker(stack, trained):
    from mlflow.tracking import MlflowClient

    from storage.lake import Lake

    running, home = stack
    assert trained["train"].state.is_completed(), trained["train"].state.message
    assert trained["retrain"].state.is_completed(), trained["retrain"].state.message
    # retrain continued the same run: one run id, one MLflow run, epochs 0 and 1, each step once.
    with Lake(trained["lake"]) as lake:
        counts = lake.sql("SELECT epoch, step, count(*) AS n, count(DISTINCT (prompt_id, sample_idx)) AS d "
                          "FROM rollouts GROUP BY ALL ORDER BY ALL").to_pylist()
        runs = lake.sql("SELECT run_id, status, config_json FROM runs").to_pylist()
    assert counts == [{"epoch": e, "step": s, "n": PER_STEP * N, "d": PER_STEP * N}
                      for e in range(2) for s in range(PROMPTS // PER_STEP)]
    ((run_id, status, config),) = [tuple(r.values()) for r in runs]
    assert status == "finished" and json.loads(config)["epochs"] == 2  # 1 + extra_epochs
    client = MlflowClient(running.cfg.mlflow_tracking_uri)
    (mlrun,) = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])
    assert mlrun.info.status == "FINISHED" and mlrun.data.tags["rhymerl.run_id"] == run_id
    assert len(client.get_metric_history(mlrun.info.run_id, "reward_mean")) == 2 * (PROMPTS // PER_STEP)
    # Cross-links: the MLflow run names the Prefect flow run (of the last flow that trained it) ...
    tags = mlrun.data.tags
    assert tags["prefect.root_flow_run_id"] == str(trained["retrain"].id)
    assert tags["prefect.flow_run_url"].startswith(f"{running.cfg.prefect_url}/runs/flow-run/")
    # ... and each rhymerl-run flow run carries a link artifact to the MLflow run in the MLflow UI.
    subflows = [r.id for d in ("train", "retrain") for r in _child_runs(trained[d].id)]
    links = _artifacts(subflows, "mlflow-run")
    assert len(links) == 2
    url = f"{running.cfg.mlflow_url}/#/experiments/{mlrun.info.experiment_id}/runs/{mlrun.info.run_id}"
    assert all(f"]({url})" in a.data for a in links)


def test_bad_parameters_fail_fast_naming_the_field(stack):
    from prefect.exceptions import PrefectHTTPStatusError

    run = _run("rhymerl-train/train", {"config_file": "", "overrides": ["rollout.nn=3"]}, timeout=300)
    assert run.state.is_failed()
    assert "rollout.nn" in run.state.message
    assert (run.end_time - run.start_time).total_seconds() < 60  # no engine started
    # A wrong type never becomes a run: the server checks the deployment's parameter schema.
    with pytest.raises(PrefectHTTPStatusError, match="409|422"):
        _run("rhymerl-retrain/retrain", {"extra_epochs": "two"}, timeout=30)


@pytest.fixture(scope="module")
def report_run(stack, trained):
    return _run("rhymerl-lake-report/lake-report", {"lake": trained["lake"], "run_id": ""}, timeout=300)


def test_lake_report_deployment_attaches_a_report(report_run, trained):
    assert report_run.state.is_completed(), report_run.state.message
    (artifact,) = _artifacts([report_run.id], "lake-report")
    run_id = _run_ids(trained["lake"])[0]
    assert artifact.type == "markdown" and f"# Lake report: `{run_id}`" in artifact.data
    assert "](data:image/png;base64," in artifact.data
    assert f"| 1 | {PROMPTS // PER_STEP} | {PROMPTS * N} |" in artifact.data  # epoch 1: its steps and responses


def test_no_secret_in_logs_parameters_or_mlflow(stack, trained):
    from mlflow.tracking import MlflowClient

    running, home = stack
    client = MlflowClient(running.cfg.mlflow_tracking_uri)
    (mlrun,) = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])
    logged = " ".join(list(mlrun.data.params.values()) + list(mlrun.data.tags.values()))
    assert FAKE_SECRET not in logged and FAKE_KEY_ID not in logged
    # Every file the servers, the worker and the runs wrote: server/worker/MLflow logs, Prefect's
    # database (parameters, logs, artifacts), MLflow's database and artifacts, the lake.
    assert list(running.cfg.log_dir.glob("*.log")), "no server logs to check"
    assert files_containing(home, [FAKE_SECRET, FAKE_KEY_ID]) == []


def _task_runs(flow_run_id) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


def test_prefect_ui_shows_the_finished_run_and_its_tasks(stack, trained, report_run, monkeypatch):
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser, driver_path = chromium()
    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager must never try to download
    running, _ = stack
    ui = running.cfg.prefect_url
    (run,) = _child_runs(trained["train"].id)  # rhymerl-run, the training flow under the deployment run
    (epoch,) = _child_runs(run.id)  # its rhymerl-epoch subflow
    # The UI counts task runs without the one that stands for a subflow in its parent.
    run_tasks = [t for t in _task_runs(run.id) if t.id != epoch.parent_task_run_id]
    epoch_tasks = _task_runs(epoch.id)
    (start_actors,) = [t for t in run_tasks if t.name.startswith("start-actors")]
    checkpoints = [t for t in epoch_tasks if t.name.startswith("checkpoint")]
    assert len(checkpoints) == PROMPTS // PER_STEP  # one per step
    (report,) = _artifacts([report_run.id], "lake-report")
    opts = Options()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1600,1000"):
        opts.add_argument(arg)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    try:
        wait = WebDriverWait(driver, 120)

        def visit(path: str, *texts: str, shot: str) -> None:
            driver.get(f"{ui}{path}")
            try:
                wait.until(lambda d: all(t in d.find_element(By.TAG_NAME, "body").text for t in texts))
            except TimeoutException:
                driver.save_screenshot(str(OUTPUT / shot))
                body = driver.find_element(By.TAG_NAME, "body").text
                pytest.fail(f"{path}: {[t for t in texts if t not in body]} not on the page; it shows:\n{body[:2000]}")
            time.sleep(2)  # let the run graph draw before the screenshot
            driver.save_screenshot(str(OUTPUT / shot))

        # The runs list shows the finished deployment runs.
        visit("/runs", trained["train"].name, trained["retrain"].name, shot="prefect-runs.png")
        # The training flow run: completed, with its task runs (the graph draws them by name) ...
        visit(f"/runs/flow-run/{run.id}", "rhymerl-run", "Completed", f"{len(run_tasks)} Task runs",
              shot="prefect-flow-run.png")
        # ... its epoch subflow with every step's tasks ...
        visit(f"/runs/flow-run/{epoch.id}", "rhymerl-epoch", "Completed", f"{len(epoch_tasks)} Task runs",
              shot="prefect-epoch-run.png")
        # ... and one task run's own page.
        visit(f"/runs/task-run/{start_actors.id}", start_actors.name, "Completed", shot="prefect-task-run.png")
        # The lake report renders with its plot.
        visit(f"/artifacts/artifact/{report.id}", "Lake report", "Per epoch", shot="prefect-lake-report.png")
        widths = [img.get_attribute("naturalWidth") for img in driver.find_elements(By.TAG_NAME, "img")]
        assert any(int(w or 0) > 300 for w in widths), widths
    finally:
        driver.quit()
    assert (OUTPUT / "prefect-flow-run.png").stat().st_size > 10_000
