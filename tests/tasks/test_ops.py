"""Operations without servers: prefect.yaml, UI parameter checks, retrain's choice of run, the lake
report, and the server helpers' own checks. (`test_ops_e2e.py` runs the servers for real.)"""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers.secret_scan import files_containing
from infra.servers import WORK_POOL, Child, ServerError, ServerStack, UiConfig, port_free
from rhymerl.errors import ConfigError
from storage.lake import LakeError, LakeWriter, rows_to_table
from storage.report import lake_report

ROOT = Path(__file__).resolve().parents[2]


def _deployments() -> dict[str, dict]:
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    return {d["name"]: d for d in spec["deployments"]}


# ---------------------------------------------------------------- prefect.yaml


def test_prefect_yaml_deployments_load_and_their_parameters_validate():
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools.validation import validate

    deps = _deployments()
    assert sorted(deps) == ["lake-report", "retrain", "train"]
    for name, dep in deps.items():
        flow = load_flow_from_entrypoint(str(ROOT / dep["entrypoint"]))
        schema = parameter_schema(flow).model_dump_for_openapi()
        # Every default is valid for the flow's signature (what the UI form is built from) ...
        validate(dep["parameters"], schema, raise_on_error=True)
        # ... and every field has a description for the form.
        assert all(p.get("description") for p in schema["properties"].values()), name
        assert dep["work_pool"]["name"] == WORK_POOL
    # A wrong type is caught by the same schema (the UI and the API refuse it before any run).
    schema = parameter_schema(load_flow_from_entrypoint(str(ROOT / deps["retrain"]["entrypoint"])))
    with pytest.raises(Exception, match="extra_epochs|not of type"):
        validate({"extra_epochs": "two"}, schema.model_dump_for_openapi(), raise_on_error=True)


def test_retrain_is_scheduled_by_cron_and_never_overlaps():
    from prefect.client.schemas.schedules import CronSchedule

    dep = _deployments()["retrain"]
    (sched,) = dep["schedules"]
    CronSchedule(cron=sched["cron"], timezone=sched["timezone"])  # raises on a bad cron
    assert sched["active"] is False  # starting the UI never starts training by itself
    assert dep["concurrency_limit"] == 1


# ---------------------------------------------------------------- parameters from the UI


def test_train_config_names_the_bad_field():
    from tasks.ops import train_config_task

    cfg = train_config_task.fn("", ["epochs=3", "rollout.n=4"])
    assert (cfg["epochs"], cfg["rollout"]["n"]) == (3, 4)
    with pytest.raises(ConfigError, match="rollout.nn"):
        train_config_task.fn("", ["rollout.nn=4"])
    with pytest.raises(ConfigError, match="rollout.n'.*>= 2"):
        train_config_task.fn("", ["rollout.n=1"])
    with pytest.raises(ConfigError, match="missing.toml does not exist"):
        train_config_task.fn("missing.toml", [])
    with pytest.raises(ConfigError, match="'overrides' must be a list"):
        train_config_task.fn("", "epochs=3")


def test_train_config_layers_files_as_rhymerl_run_does(monkeypatch):
    # Rule: config_layers go over config_file in order (`rhymerl run --config A --config B`).
    from tasks.ops import train_config_task

    for name in ("RHYMERL_LAKE", "MLFLOW_TRACKING_URI", "RHYMERL_MODEL"):
        monkeypatch.delenv(name, raising=False)
    gpu, cluster = str(ROOT / "configs" / "gpu-qwen2.5-0.5b.toml"), str(ROOT / "configs" / "cluster.toml")
    cfg = train_config_task.fn(gpu, ["epochs=1"], [cluster])
    assert (cfg["lake"]["url"], cfg["tracking"]["uri"]) == ("s3://rhymerl/lake", "http://127.0.0.1:5000")
    assert (cfg["model"]["path"], cfg["epochs"]) == ("models/Qwen2.5-0.5B-Instruct", 1)
    assert train_config_task.fn(gpu, [], [])["lake"]["url"] == "lake"
    with pytest.raises(ConfigError, match="missing.toml does not exist"):
        train_config_task.fn(gpu, [], [cluster, "missing.toml"])


def test_credentials_in_parameters_are_refused_without_echoing_them():
    from tasks.ops import inline_credentials, train_config_task

    assert inline_credentials({"tracking": {"uri": "http://u:hunter2@mlflow:5000"}}) == ["tracking.uri"]
    assert inline_credentials({"tracking": {"uri": "http://mlflow:5000"}, "lake": {"url": "s3://b/p"}}) == []
    with pytest.raises(ConfigError) as err:
        train_config_task.fn("", ['tracking.uri="http://u:hunter2@mlflow:5000"'])
    assert "tracking.uri" in str(err.value) and "hunter2" not in str(err.value)


def _stored_runs(url: str) -> None:
    w = LakeWriter(url)
    for run_id, exp, started in (("a-old", "exp1", 100.0), ("a-new", "exp1", 200.0), ("b", "exp2", 300.0)):
        w.write_run(run_id, run_id, {"epochs": 2, "tracking": {"experiment": exp}}, started_at=started)
    w.finish_run("a-new", "finished")


def test_retrain_continues_the_latest_run_of_the_experiment(tmp_path):
    from tasks.ops import latest_run_task, retrain_config_task

    url = str(tmp_path / "lake")
    _stored_runs(url)
    run = latest_run_task.fn(url, "exp1")
    assert run["run_id"] == "a-new"  # newest start of exp1; b is newer but another experiment
    cfg = retrain_config_task.fn(run, 3, ["train.lr=0.001"])
    assert (cfg["epochs"], cfg["train"]["lr"], cfg["tracking"]["experiment"]) == (5, 0.001, "exp1")
    with pytest.raises(LakeError, match="no run of experiment 'nope'.*exp1, exp2"):
        latest_run_task.fn(url, "nope")
    with pytest.raises(ConfigError, match="'extra_epochs'"):
        retrain_config_task.fn(run, 0, None)
    changed = retrain_config_task.fn(run, 1, ["data.num_prompts=7"])  # allowed: retrain_plan_task decides
    assert (changed["epochs"], changed["data"]["num_prompts"]) == (3, 7)
    with pytest.raises(ConfigError, match="train.lrr"):
        retrain_config_task.fn(run, 1, ["train.lrr=1"])


def test_retrain_continues_on_the_same_prompts_and_warm_starts_on_new_ones():
    from rhymerl.run.resume import same_prompts
    from tasks.ops import warm_start_config

    meta = {"prompts_digest": "abc", "prompts_per_step": 4}
    assert same_prompts(meta, "abc", 4)
    assert not same_prompts(meta, "abd", 4)  # other prompts (or the same file edited in place)
    assert not same_prompts(meta, "abc", 8)  # other steps per epoch: step numbers would not line up
    config = {"epochs": 7, "model": {"path": "/m", "init_from_run": ""}, "data": {"num_prompts": 9}}
    warm = warm_start_config(config, "r-old", 2)
    assert warm == {"epochs": 2, "model": {"path": "/m", "init_from_run": "r-old"}, "data": {"num_prompts": 9}}
    assert config["model"]["init_from_run"] == ""  # the input is not changed


def test_init_from_run_must_be_a_run_id():
    from rhymerl.config.run import load_config

    assert load_config(None, ['model.init_from_run="run-20261203-1_a.b"']).model.init_from_run == "run-20261203-1_a.b"
    with pytest.raises(ConfigError, match="model.init_from_run.*not a run id"):
        load_config(None, ['model.init_from_run="../other"'])


def test_mlflow_link_uses_the_ui_started_by_rhymerl_ui(monkeypatch):
    from tasks.ops import mlflow_run_url

    monkeypatch.delenv("RHYMERL_MLFLOW_UI_URL", raising=False)
    assert mlflow_run_url("sqlite:///mlflow.db", "1", "abc") is None
    assert mlflow_run_url("http://h:5000/", "1", "abc") == "http://h:5000/#/experiments/1/runs/abc"
    monkeypatch.setenv("RHYMERL_MLFLOW_UI_URL", "http://127.0.0.1:5001")
    assert mlflow_run_url("sqlite:///mlflow.db", "2", "x") == "http://127.0.0.1:5001/#/experiments/2/runs/x"


# ---------------------------------------------------------------- lake report


def _report_lake(url: str) -> None:
    """Run 'new' (2 epochs, 2 prompts x 2 samples) and an older run 'old'."""
    w = LakeWriter(url)
    w.write_run("old", "old", {}, started_at=1.0)
    w.write_run("new", "new", {}, started_at=2.0)
    for epoch in (0, 1):
        # Epoch 1 repeats epoch 0's responses: every token rhymes (rhyme 1.0).
        rows = [{"run_id": "new", "epoch": epoch, "step": 0, "prompt_id": p, "sample_idx": s,
                 "response_token_ids": list(range(n)), "length": n, "reward": float(s)}
                for p, n in (("p", 6), ("q", 10)) for s in (0, 1)]
        w.commit_step("new", epoch, 0, [w.write_rollouts("new", epoch, 0, 0, 0, rows_to_table(rows))])
        w.write_steps_row("new", epoch, 0, {"reward_mean": 0.5, "accuracy": 0.25 * (epoch + 1)})


def test_lake_report_of_the_latest_run(tmp_path):
    url = str(tmp_path / "lake")
    _report_lake(url)
    report = lake_report(url)
    assert report.run_id == "new"  # latest started
    rows = {r["epoch"]: r for r in report.epochs}
    assert sorted(rows) == [0, 1]
    assert rows[0]["responses"] == 4 and rows[0]["length_mean"] == pytest.approx(8.0)
    assert rows[0]["rhyme"] is None and rows[1]["rhyme"] == pytest.approx(1.0)
    assert rows[1]["length_spearman"] == pytest.approx(1.0)  # same length order in both epochs
    assert (rows[0]["accuracy"], rows[1]["accuracy"]) == (pytest.approx(0.25), pytest.approx(0.5))
    assert "| 1 | 1 | 4 | 0.500 | 0.500 | 8.0 |" in report.markdown
    assert "](epochs.png)" in report.markdown
    inline = report.markdown_inline()
    data = inline.split("(data:image/png;base64,")[1].split(")")[0]
    assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"
    path = report.write(tmp_path / "out")
    assert path.read_text() == report.markdown and (tmp_path / "out" / "epochs.png").stat().st_size > 1000
    with pytest.raises(LakeError, match="no run 'zzz'.*new"):
        lake_report(url, "zzz")


def test_lake_report_of_an_empty_lake_says_train_first(tmp_path):
    (tmp_path / "lake").mkdir()
    with pytest.raises(LakeError, match="no run yet"):
        lake_report(str(tmp_path / "lake"))


# ---------------------------------------------------------------- server helpers


def test_ui_config_checks_ports_and_binds_loopback_by_default():
    cfg = UiConfig()
    assert cfg.host == "127.0.0.1" and cfg.prefect_api_url == "http://127.0.0.1:4200/api"
    assert UiConfig(host="0.0.0.0").mlflow_url == "http://127.0.0.1:5000"  # the browser's address
    with pytest.raises(ValueError, match="both 4300"):
        UiConfig(prefect_port=4300, mlflow_port=4300)
    with pytest.raises(ValueError, match="not a TCP port"):
        UiConfig(prefect_port=70000)


def test_busy_port_fails_before_starting_anything(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert not port_free("127.0.0.1", port)
        stack = ServerStack(UiConfig(project=tmp_path, prefect_port=port, mlflow_port=port + 1,
                                     prefect_home=str(tmp_path / "ph")), say=lambda s: None)
        with pytest.raises(ServerError, match=f"port {port} .* in use.*--prefect-port"):
            stack.start()
        assert stack.children == []


def test_child_stop_ends_the_whole_process_group(tmp_path):
    # A child that ignores SIGTERM and has a grandchild: both are gone after stop().
    script = "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
             "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); " \
             "print(p.pid, flush=True); time.sleep(600)"
    log = tmp_path / "c.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=out, start_new_session=True)
    deadline = time.monotonic() + 30
    while not log.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.1)
    grandchild = int(log.read_text().split()[0])
    Child("c", proc, log).stop(grace_s=1.0)
    assert proc.poll() == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("grandchild survived stop()")


def test_ui_command_refuses_busy_port_with_a_clear_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "cli.main", "ui", "--prefect-port", str(port),
                               "--prefect-home", str(tmp_path / "ph")],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert f"port {port} on 127.0.0.1 is in use" in done.stderr


def test_secret_scan_finds_a_planted_secret(tmp_path):
    # The scanner the end-to-end secret check uses has power: it finds a value in any file.
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "db.sqlite").write_bytes(b"\x00\x01 xx fake-secret-123 yy")
    (tmp_path / "b.log").write_text("nothing here")
    assert files_containing(tmp_path, ["fake-secret-123"]) == [str(tmp_path / "a" / "db.sqlite")]
