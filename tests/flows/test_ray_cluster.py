"""A real two-node Ray cluster on the loopback interface runs a short RL run through `RAY_ADDRESS`.

The head (`ray start --head`, custom resource `trainer_node`) and a worker node (`ray start
--address`, custom resource `rollout_node`) are separate `ray start --block` processes with their
own temp dir; the run is the `rhymerl` CLI in its own process, pointed at everything through the
switchboard's environment (RAY_ADDRESS, RHYMERL_MODEL, RHYMERL_LAKE on S3, MLFLOW_TRACKING_URI). The
config pins the rollout worker to `rollout_node` and the trainer to `trainer_node`, so the test can
check each landed on its own node.

Loopback: Ray rewrites 127.0.0.1 to the machine's network address, so the nodes use 127.0.0.2
(same loopback range, left as given); no packet leaves the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

HOST = "127.0.0.2"
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"Ray head did not listen on {HOST}:{port} in {timeout:.0f}s")


@dataclass
class RayCluster:
    address: str
    temp_dir: str
    procs: list[subprocess.Popen]

    def nodes(self) -> list[dict]:
        """[{node_id, resources}] of the live nodes, asked from a separate driver process."""
        code = ("import json, ray; ray.init(address=%r, log_to_driver=False); "
                "print(json.dumps([{'node_id': n['NodeID'], 'resources': n['Resources']} "
                "for n in ray.nodes() if n['Alive']]))") % self.address
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             check=True, env=_ray_env())
        return json.loads(out.stdout.strip().splitlines()[-1])

    def stop(self) -> None:
        """SIGTERM each `ray start --block` (it stops the node's own processes), then its group."""
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
            try:  # anything the node left in its process group (only ours: its own session)
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _ray_env() -> dict[str, str]:
    """This process's environment without any switchboard setting a developer may have exported."""
    from rhymerl.config.environment import CONFIG_ENV

    drop = {"RAY_ADDRESS", "PREFECT_API_URL"} | {s.name for s in CONFIG_ENV}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    return env


def _start_node(args: list[str], temp_dir: str, log: Path) -> subprocess.Popen:
    # Every port a node opens is a free one: other Ray instances may run on this machine.
    ports = [f"--{name}-port={_free_port()}" for name in
             ("dashboard-agent-listen", "dashboard-agent-grpc", "metrics-export", "runtime-env-agent")]
    common = [f"--node-ip-address={HOST}", "--num-gpus=0", f"--temp-dir={temp_dir}", "--block",
              "--disable-usage-stats", "--object-store-memory=300000000", *ports]
    return subprocess.Popen([str(BIN / "ray"), "start", *args, *common], env=_ray_env(),
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture(scope="module")
def ray_cluster():
    # Short temp dir: Ray's socket paths must fit in 107 characters.
    temp_dir = tempfile.mkdtemp(prefix="rr", dir="/tmp")
    port = _free_port()
    cluster = RayCluster(f"{HOST}:{port}", temp_dir, [])
    try:
        head_log = Path(temp_dir) / "head.log"
        cluster.procs.append(_start_node(
            ["--head", f"--port={port}", "--num-cpus=1", '--resources={"trainer_node": 1}',
             "--include-dashboard=false", f"--dashboard-port={_free_port()}",
             f"--ray-client-server-port={_free_port()}"], temp_dir, head_log))
        _wait_port(port, cluster.procs[0], head_log)
        cluster.procs.append(_start_node(
            [f"--address={cluster.address}", "--num-cpus=1", '--resources={"rollout_node": 1}'],
            temp_dir, Path(temp_dir) / "worker.log"))
        deadline = time.time() + 180
        while len(cluster.nodes()) < 2:
            if time.time() > deadline:
                raise TimeoutError("the worker node did not join in 180 s")
            time.sleep(2)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_run_through_a_two_node_cluster(ray_cluster, tiny_model, tmp_path, s3_url, prefect_harness):
    # The lake is on S3 over HTTP (moto, started by conftest): the cluster path of a real deployment.
    # The run reports to the session's Prefect test server (PREFECT_API_URL), as a run on a cluster
    # reports to its Prefect server, instead of starting a temporary one (10-30 s).
    from mlflow.tracking import MlflowClient
    from prefect.settings import PREFECT_API_URL

    from storage.lake import Lake

    nodes = ray_cluster.nodes()
    worker_node = next(n["node_id"] for n in nodes if "rollout_node" in n["resources"])
    head_node = next(n["node_id"] for n in nodes if "trainer_node" in n["resources"])
    assert worker_node != head_node
    prompts, per_step, n = 4, 2, 2
    config = tmp_path / "cluster.toml"
    config.write_text(textwrap.dedent(f"""
        name = "cluster"
        epochs = 1
        [data]
        num_prompts = {prompts}
        [rollout]
        num_workers = 1
        prompts_per_step = {per_step}
        n = {n}
        max_tokens = 24
        [spec]
        enabled = false   # placement is under test here, not speculation
        [pipe]
        gantt = false
        [checkpoint]
        every_steps = 0
        [placement]
        rollout_resource = "rollout_node"
        trainer_resource = "trainer_node"
    """))
    lake, db = s3_url, tmp_path / "mlflow.db"
    env = {**_ray_env(), "RAY_ADDRESS": ray_cluster.address, "RHYMERL_MODEL": str(tiny_model),
           "RHYMERL_LAKE": lake, "MLFLOW_TRACKING_URI": f"sqlite:///{db}",
           "PREFECT_HOME": str(tmp_path / ".prefect"), "PREFECT_API_URL": PREFECT_API_URL.value(),
           "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([str(BIN / "rhymerl"), "run", "--config", str(config)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    logs = sorted((tmp_path / "logs").glob("*/run.log"))  # engines, Ray and Prefect log here
    log = logs[0].read_text() if logs else ""
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:] + log[-6000:]
    # The console (docs/console-and-errors.md): one progress line per step and the final table;
    # Prefect's task lines and the actors' streamed logs are in the run log, not on the terminal.
    assert [line.split("]")[1].split("|")[0].strip() for line in proc.stdout.splitlines()
            if line.startswith("epoch 0 [")] == ["step 1/2", "step 2/2"], proc.stdout
    assert "Run cluster-" in proc.stdout and f"logs in logs/{logs[0].parent.name}/" in proc.stdout
    assert "Finished in state" not in proc.stdout + proc.stderr and "Finished in state" in log

    # The run went through the cluster: the rollout worker on the worker node, the trainer on the head.
    client = MlflowClient(f"sqlite:///{db}")
    (run,) = client.search_runs([client.get_experiment_by_name("rhymerl").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["ray.rollout_nodes"] == worker_node
    assert run.data.params["ray.trainer_node"] == head_node
    assert run.data.params["model.path"] == str(tiny_model)  # RHYMERL_MODEL reached the config
    # ...and every step is in the lake that RHYMERL_LAKE named: prompts_per_step x n rows each.
    rows = Lake(lake).sql("SELECT step, count(*) AS k FROM rollouts GROUP BY step ORDER BY step").to_pylist()
    assert rows == [{"step": s, "k": per_step * n} for s in range(prompts // per_step)]


def test_missing_custom_resource_fails_fast(ray_cluster, tmp_path):
    # A placement the cluster cannot satisfy stops at start with the fix, instead of queueing forever.
    env = {**_ray_env(), "RAY_ADDRESS": ray_cluster.address}
    code = textwrap.dedent("""
        import json, ray
        from rhymerl.config.run import load_config
        from workers.actors import missing_resources, placement_for
        ray.init(log_to_driver=False)
        cfg = load_config(None, ["rollout.num_workers=3", "placement.rollout_resource=rollout_node",
                                 "placement.trainer_resource=gpu_box"])
        print(json.dumps(missing_resources(placement_for(cfg, 0), 3, ray.cluster_resources())))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    rollout, trainer = json.loads(out.stdout.strip().splitlines()[-1])
    assert "1 units of custom resource 'rollout_node', the run needs 3" in rollout
    assert "0 units of custom resource 'gpu_box', the run needs 1" in trainer
