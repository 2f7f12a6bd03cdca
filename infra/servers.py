"""Local servers for operating RhymeRL: a Prefect server, the MLflow UI and a Prefect worker.

`ServerStack` starts them as child processes (each in its own process group, so Ctrl-C in the
terminal reaches only the parent, which then stops the children in order: worker, MLflow,
Prefect), waits until each answers, deploys `prefect.yaml` to the Prefect server, and stops
everything on `stop()` or when the `with` block ends. `rhymerl ui` and the operations tests
use the same code. Everything binds to `UiConfig.host` (127.0.0.1 unless configured); each
server keeps its state in the project: `PREFECT_HOME` (default `.prefect/`) and the MLflow
SQLite file with `mlruns/` beside it. Child logs go to `<log_dir>/<name>.log`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

WORK_POOL = "rhymerl-local"  # the process work pool prefect.yaml's deployments use
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class ServerError(RuntimeError):
    """A server could not start or answer; the message names it, its log file and the fix."""


@dataclass(frozen=True)
class UiConfig:
    """Where the servers listen and keep their state (paths relative to `project`)."""

    project: Path = Path(".")  # repository root: prefect.yaml, flows/, the default lake
    host: str = "127.0.0.1"  # anything else exposes unauthenticated UIs to the network
    prefect_port: int = 4200
    mlflow_port: int = 5000
    prefect_home: str = ".prefect"
    mlflow_db: str = "mlflow.db"  # SQLite store; artifacts in mlruns/ beside it
    work_pool: str = WORK_POOL
    worker_limit: int = 1  # concurrent flow runs: one RL run at a time fits 2 cores
    deploy: bool = True  # register prefect.yaml's deployments on start
    start_mlflow: bool = True
    start_worker: bool = True
    startup_timeout_s: float = 240.0  # migrations and UI build take minutes on a busy small machine
    extra_env: tuple[tuple[str, str], ...] = ()  # for the worker (and the flow runs it starts)

    def __post_init__(self) -> None:
        for name in ("prefect_port", "mlflow_port"):
            port = getattr(self, name)
            if not 0 < port < 65536:
                raise ValueError(f"{name} {port} is not a TCP port; pick one in 1..65535")
        if self.prefect_port == self.mlflow_port:
            raise ValueError(f"prefect_port and mlflow_port are both {self.prefect_port}; give "
                             "MLflow another port (--mlflow-port)")
        if self.worker_limit < 1:
            raise ValueError("worker_limit must be >= 1")

    def path(self, rel: str) -> Path:
        return (self.project / rel).resolve()

    @property
    def prefect_url(self) -> str:
        return f"http://{_url_host(self.host)}:{self.prefect_port}"

    @property
    def prefect_api_url(self) -> str:
        return f"{self.prefect_url}/api"

    @property
    def mlflow_url(self) -> str:
        return f"http://{_url_host(self.host)}:{self.mlflow_port}"

    @property
    def mlflow_tracking_uri(self) -> str:
        return f"sqlite:///{self.path(self.mlflow_db)}"

    @property
    def log_dir(self) -> Path:
        return self.path(self.prefect_home) / "logs"


def _url_host(host: str) -> str:
    """The address a browser uses: a wildcard bind is reached on the loopback interface."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def port_free(host: str, port: int) -> bool:
    """True if nothing listens on host:port (so a server can bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((_url_host(host), port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (for tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout_s: float, alive: Callable[[], bool] = lambda: True,
              ok: Callable[[bytes], bool] = lambda body: True, poll_s: float = 1.0) -> bool:
    """Poll `url` every `poll_s` until it answers 200 with a body `ok` accepts; False on timeout
    or when `alive()` turns False (the server process died)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200 and ok(resp.read()):
                    return True
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(poll_s)
    return False


@dataclass
class Child:
    """One server process we started, with its log file."""

    name: str
    proc: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 15) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to the child's process group, SIGKILL after `grace_s`."""
        if not self.alive():
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)  # the group we created with start_new_session
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def api_argv(host: str, port: int) -> list[str]:
    """The command line of a Prefect API server wrapped by `infra.local_api.create_app` (replays of
    SQLite-busy answers): what `prefect server start` runs (uvicorn over an app factory, 5 s
    keep-alive). The UI and the services follow the environment (`PREFECT_UI_ENABLED`,
    `PREFECT__SERVER_EPHEMERAL`)."""
    root = Path(__file__).resolve().parents[1]  # so the child imports this `infra`
    return [sys.executable, "-m", "uvicorn", "--app-dir", str(root), "--factory", "infra.local_api:create_app",
            "--host", host, "--port", str(port), "--timeout-keep-alive", "5", "--lifespan", "on"]


def _bin(name: str) -> str:
    """A console script of this interpreter's environment (the venv's prefect, mlflow)."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


@dataclass
class ServerStack:
    """The Prefect server, MLflow UI and process worker of one project; see the module doc."""

    cfg: UiConfig
    say: Callable[[str], None] = print
    children: list[Child] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        """Environment for the children: state in the project, the API on our server."""
        env = dict(os.environ)
        env.update({
            "PREFECT_HOME": str(self.cfg.path(self.cfg.prefect_home)),
            "PREFECT_API_URL": self.cfg.prefect_api_url,
            "PREFECT_UI_URL": self.cfg.prefect_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # no network here
            "PREFECT_SERVER_API_HOST": self.cfg.host,
            "PREFECT_SERVER_API_PORT": str(self.cfg.prefect_port),
            "PREFECT_WORKER_QUERY_SECONDS": "2",  # pick a run up within seconds of its trigger
            "PREFECT_SERVER_DATABASE_TIMEOUT": "60",  # SQLite waits for its lock on a busy small machine
            "RHYMERL_MLFLOW_UI_URL": self.cfg.mlflow_url if self.cfg.start_mlflow else "",
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",  # 2 processes instead of 15
            "RAY_AUTH_MODE": "disabled",
            "TOKENIZERS_PARALLELISM": "false",
            "VLLM_CACHE_ROOT": str(self.cfg.path(".cache/vllm")),
            "TORCHINDUCTOR_CACHE_DIR": str(self.cfg.path(".cache/inductor")),
        })
        env.update(dict(self.cfg.extra_env))
        return env

    def _spawn(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Child:
        self.cfg.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.cfg.log_dir / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(list(argv), cwd=self.cfg.project, env={**self.env(), **(env or {})},
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        child = Child(name, proc, log)
        self.children.append(child)
        return child

    def _wait(self, child: Child, url: str, ok: Callable[[bytes], bool] = lambda b: True) -> None:
        t0 = time.monotonic()
        self.say(f"waiting for {child.name} at {url} ...")
        if not wait_http(url, self.cfg.startup_timeout_s, child.alive, ok):
            state = "exited" if not child.alive() else f"did not answer in {self.cfg.startup_timeout_s:.0f}s"
            raise ServerError(f"{child.name} {state}; its log {child.log} ends with:\n{child.tail()}")
        self.say(f"{child.name} up in {time.monotonic() - t0:.0f}s")

    def _check_ports(self) -> None:
        wanted = [("Prefect", self.cfg.prefect_port, "--prefect-port")]
        if self.cfg.start_mlflow:
            wanted.append(("MLflow", self.cfg.mlflow_port, "--mlflow-port"))
        for name, port, flag in wanted:
            if not port_free(self.cfg.host, port):
                raise ServerError(f"port {port} on {self.cfg.host} is in use (another `rhymerl ui`?); "
                                  f"stop it or give {name} another port with {flag}")

    def start(self) -> ServerStack:
        """Start the servers (and deploy, and the worker, as configured); raises ServerError."""
        self._check_ports()
        try:
            # Prefect's server as `prefect server start` runs it (UI, every service), but with the
            # short in-server retries of a busy SQLite database (infra.local_api.RetryAfter503).
            server = self._spawn("prefect-server", api_argv(self.cfg.host, self.cfg.prefect_port),
                                 {"PREFECT__SERVER_FINAL": "1"})
            if self.cfg.start_mlflow:
                mlflow = self._spawn("mlflow-ui", [
                    _bin("mlflow"), "server", "--backend-store-uri", self.cfg.mlflow_tracking_uri,
                    "--default-artifact-root", self.cfg.path(self.cfg.mlflow_db).parent.joinpath("mlruns").as_uri(),
                    "--host", self.cfg.host, "--port", str(self.cfg.mlflow_port), "--workers", "1"])
            self._wait(server, f"{self.cfg.prefect_api_url}/health", lambda b: b.strip() == b"true")
            if self.cfg.start_mlflow:
                self._wait(mlflow, f"{self.cfg.mlflow_url}/health")
            if self.cfg.deploy:
                self.deploy()
            if self.cfg.start_worker:
                self._spawn("prefect-worker", [
                    _bin("prefect"), "worker", "start", "--pool", self.cfg.work_pool, "--type", "process",
                    "--limit", str(self.cfg.worker_limit), "--name", f"{self.cfg.work_pool}-worker"])
        except BaseException:
            self.stop()
            raise
        return self

    def deploy(self, prefect_file: str = "prefect.yaml") -> None:
        """Create the process work pool (if absent) and register the project's deployments."""
        self.ensure_work_pool()
        argv = [_bin("prefect"), "--no-prompt", "deploy", "--all", "--prefect-file", prefect_file]
        t0 = time.monotonic()
        done = subprocess.run(argv, cwd=self.cfg.project, env=self.env(), capture_output=True,
                              text=True, timeout=self.cfg.startup_timeout_s)
        if done.returncode != 0:
            raise ServerError(f"`{' '.join(argv[1:])}` failed (exit {done.returncode}):\n"
                              f"{(done.stdout + done.stderr)[-3000:]}")
        self.say(f"deployments of {prefect_file} registered in {time.monotonic() - t0:.0f}s")

    def ensure_work_pool(self) -> None:
        """The process work pool, with Prefect's default job template, created unless it exists
        (in this process: a `prefect work-pool create` would start another interpreter)."""
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import WorkPoolCreate
        from prefect.exceptions import ObjectAlreadyExists
        from prefect.settings import PREFECT_API_URL, temporary_settings
        from prefect.workers.process import ProcessWorker

        pool = WorkPoolCreate(name=self.cfg.work_pool, type="process",
                              base_job_template=ProcessWorker.get_default_base_job_template())
        with temporary_settings({PREFECT_API_URL: self.cfg.prefect_api_url}), \
                get_client(sync_client=True) as client:
            try:
                client.create_work_pool(pool)
            except ObjectAlreadyExists:
                pass

    def stop(self) -> None:
        """Stop every child, the last started first (worker before the servers it talks to)."""
        for child in reversed(self.children):
            child.stop()
        self.children.clear()

    def __enter__(self) -> ServerStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
