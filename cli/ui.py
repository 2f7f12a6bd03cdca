"""`rhymerl ui`: the Prefect UI (with a worker that executes runs triggered there) and the MLflow UI.

    rhymerl ui                               # 127.0.0.1:4200 (Prefect) and 127.0.0.1:5000 (MLflow)
    rhymerl ui --prefect-port 4300 --mlflow-port 5300
    rhymerl ui --host 0.0.0.0                # exposes both UIs, unauthenticated, to the network

Starts the servers of `infra.servers.ServerStack`, registers `prefect.yaml`'s deployments,
starts a process worker on the `rhymerl-local` pool, prints the URLs and waits; Ctrl-C (or
SIGTERM) stops the worker and both servers. State: `.prefect/` (Prefect's database, server and
worker logs in `.prefect/logs/`), `mlflow.db` and `mlruns/` (MLflow), all in the project folder.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any

from infra.servers import LOOPBACK, WORK_POOL, ServerError, ServerStack, UiConfig

HOW_TO = """\
Prefect UI : {prefect}        (runs, flow and task runs, logs, artifacts, deployments)
MLflow UI  : {mlflow}         (metrics, params, plots of the same runs)
Work pool  : {pool} (a process worker runs one flow run at a time here)
Logs       : {logs}

Trigger a run
  from the UI  : Deployments -> rhymerl-train/train -> Run -> Custom run (config file, overrides)
  from the CLI : PREFECT_API_URL={api} .venv/bin/prefect deployment run rhymerl-train/train \\
                   --param overrides='["epochs=2"]'
                 PREFECT_API_URL={api} rhymerl run    (runs in your shell, shows in the UI)
Retrain nightly: turn on the schedule of rhymerl-retrain/retrain on its deployment page.
Ctrl-C stops the worker and both servers."""


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _config(args: argparse.Namespace) -> UiConfig:
    return UiConfig(project=Path.cwd(), host=args.host, prefect_port=args.prefect_port,
                    mlflow_port=args.mlflow_port, prefect_home=args.prefect_home,
                    mlflow_db=args.mlflow_db, start_mlflow=not args.no_mlflow,
                    start_worker=not args.no_worker, deploy=not args.no_worker)


def cmd_ui(args: argparse.Namespace) -> int:
    try:
        cfg = _config(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not (cfg.project / "prefect.yaml").is_file() and cfg.deploy:
        print("error: no prefect.yaml here; run `rhymerl ui` from the RhymeRL project folder",
              file=sys.stderr)
        return 2
    if cfg.host not in LOOPBACK:
        print(f"warning: binding {cfg.host}: the Prefect and MLflow UIs have no login; anyone who "
              "can reach this machine can start runs and read results", file=sys.stderr)
    stack = ServerStack(cfg, say=lambda line: print(line, flush=True))
    # SIGTERM (e.g. from a process manager) stops the servers like Ctrl-C does.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        stack.start()
        print(HOW_TO.format(prefect=cfg.prefect_url, mlflow=cfg.mlflow_url if cfg.start_mlflow else "(off)",
                            pool=cfg.work_pool if cfg.start_worker else "(no worker)",
                            logs=cfg.log_dir, api=cfg.prefect_api_url), flush=True)
        while True:
            for child in stack.children:
                if not child.alive():
                    raise ServerError(f"{child.name} exited (code {child.proc.returncode}); its log "
                                      f"{child.log} ends with:\n{child.tail()}")
            time.sleep(1.0)
    except KeyboardInterrupt:
        print("\nstopping ...", flush=True)
        stack.stop()
        print("stopped", flush=True)
        return 0
    except ServerError as exc:
        stack.stop()
        print(f"error: {exc}", file=sys.stderr)
        return 1


def register(subparsers: Any) -> None:
    """Add `ui` to a `rhymerl` subparsers object."""
    ui = subparsers.add_parser(
        "ui", help="start the Prefect UI (+ a worker for runs triggered there) and the MLflow UI",
        description="Start a Prefect server with this project's deployments (train, retrain, "
                    "lake-report) and a process worker that runs them, plus the MLflow UI on the "
                    "project's mlflow.db; print the URLs; Ctrl-C stops everything.")
    ui.add_argument("--host", default="127.0.0.1",
                    help="address both servers bind (default 127.0.0.1; 0.0.0.0 exposes them, "
                         "without login, to the network)")
    ui.add_argument("--prefect-port", type=int, default=4200, help="Prefect server port (default 4200)")
    ui.add_argument("--mlflow-port", type=int, default=5000, help="MLflow UI port (default 5000)")
    ui.add_argument("--prefect-home", default=".prefect",
                    help="Prefect's state folder: database and logs (default .prefect)")
    ui.add_argument("--mlflow-db", default="mlflow.db",
                    help="MLflow SQLite store, artifacts in mlruns/ beside it (default mlflow.db)")
    ui.add_argument("--no-mlflow", action="store_true", help="do not start the MLflow UI")
    ui.add_argument("--no-worker", action="store_true",
                    help=f"only the servers: no deployments, no worker on the {WORK_POOL} pool")
    ui.set_defaults(func=cmd_ui)
