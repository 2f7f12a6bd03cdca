"""Every run config the project ships passes `rhymerl run`'s input checks (`flows.preflight.run_checks`:
config, model, data, rewards, lake, MLflow, Ray, Prefect, resources), with no Prefect, Ray, MLflow or
engine started: each run config of configs/ and examples/*/config.toml as it is, from the repository
root, and each again with the cluster layer configs/cluster.toml on top.

What stands in for what this machine lacks, each outside the configs:

- The GPU configs' model and data (models/Qwen2.5-*-Instruct, data/gsm8k_train.jsonl: downloads, not
  in the repository) are a folder with the real model's config.json fields the checks read
  (architecture, positions, vocabulary size), one tensor and a tokenizer, and as many GSM8K-format
  rows as the config takes, given as RHYMERL_MODEL and RHYMERL_DATASET, the documented overrides;
  `test_in_a_container_...` puts them at the config's own paths instead, as the containers' mounts
  do. `test_without_its_download_...` shows that these two checks are the only ones they stand in for.
- The machine: the resources check judges each config against the machine it is written for (a
  GPU config against its node of 4 or 8 GPUs, the rest against a 2-core CPU box with no GPU);
  `test_on_a_cpu_machine_...` shows the GPU configs fail there on resources alone.
- The cluster's services: the S3 lake is moto's S3 server (tests/conftest.py) holding the layer's
  bucket, reached through AWS_ENDPOINT_URL as on the cluster, and probed as for real (the bucket
  answers, a put and a delete). MLflow, Ray and Prefect are one stub HTTP server on a free port: it
  answers GET /health with OK, which is all the MLflow probe asks of a server, and accepts the TCP
  connects that are all the Ray and Prefect probes make. The stub is given as MLFLOW_TRACKING_URI
  (over the layer's http://127.0.0.1:5000, a port a test machine may have taken; compose overrides
  it the same way), RAY_ADDRESS and PREFECT_API_URL. On a cluster the resources are Ray's, checked
  when it is joined, not here.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np
import pytest
from safetensors.numpy import save_file
from tokenizers import Tokenizer, models

from flows.preflight import run_checks
from rhymerl.config.run import RunConfig, load_config
from rhymerl.errors import ConfigError
from rhymerl.run.preflight import Machine

ROOT = Path(__file__).resolve().parents[3]
CLUSTER = ROOT / "configs" / "cluster.toml"
RUNS = sorted(p for p in ROOT.glob("configs/*.toml") if p != CLUSTER) + sorted(ROOT.glob("examples/*/config.toml"))
CPU_BOX = Machine(cpus=2, memory_gib=8.0, gpus=0)  # the README's machine: 2 cores, no GPU
NODE_GPUS = {"gpu-qwen2.5-0.5b.toml": 4, "gpu-qwen2.5-7b.toml": 8}  # what each GPU config is written for
# The config.json fields of the real downloads (Qwen/Qwen2.5-*-Instruct) that the model check reads.
DOWNLOADS = {"models/Qwen2.5-0.5B-Instruct": {"vocab_size": 151936, "max_position_embeddings": 32768},
             "models/Qwen2.5-7B-Instruct": {"vocab_size": 152064, "max_position_embeddings": 32768}}
# Everything a shell may carry that would change which inputs a run sees or where it runs.
SWITCHBOARD = ("RHYMERL_LAKE", "RHYMERL_MODEL", "RHYMERL_DATASET", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME",
               "RAY_ADDRESS", "PREFECT_API_URL")


def machine_for(path: Path) -> Machine:
    gpus = NODE_GPUS.get(path.name)
    return Machine(cpus=16, memory_gib=128.0, gpus=gpus) if gpus else CPU_BOX


def input_problems(files: list[Path], env: Mapping[str, str], machine: Machine) -> list[str]:
    """What `rhymerl run --config F1 --config F2 ...` in environment `env` reports before starting
    anything (ConfigError for a config that does not even build)."""
    cfg = load_config(files, env=env)
    return [str(f) for f in run_checks(cfg, env, machine=machine)]


def write_download(config: RunConfig, folder: Path, own_paths: bool = False) -> dict[str, str]:
    """The stand-ins of a config's downloads (module docstring) in `folder`, and RHYMERL_MODEL and
    RHYMERL_DATASET naming them; {} for a config that downloads nothing. With `own_paths`, at the
    config's own relative paths under `folder`, and {}: nothing to override."""
    env: dict[str, str] = {}
    if config.model.path in DOWNLOADS:
        model = folder / (config.model.path if own_paths else "model")
        model.mkdir(parents=True)
        fields = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **DOWNLOADS[config.model.path]}
        (model / "config.json").write_text(json.dumps(fields))
        save_file({"embed": np.zeros((2, 2), np.float32)}, str(model / "model.safetensors"))
        Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>")).save(str(model / "tokenizer.json"))
        env["RHYMERL_MODEL"] = str(model)
    if config.data.dataset.startswith("data/"):
        rows = [{"question": f"Tom has {i} apples and buys 2 more. How many now?", "answer": f"{i} + 2 = {i + 2}\n"
                 f"#### {i + 2}"} for i in range(config.data.num_prompts)]
        data = folder / (config.data.dataset if own_paths else "gsm8k_train.jsonl")
        data.parent.mkdir(parents=True, exist_ok=True)
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        env["RHYMERL_DATASET"] = str(data)
    return {} if own_paths else env


class _Stub(BaseHTTPRequestHandler):
    """MLflow's health endpoint; the Ray and Prefect probes only connect."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        ok = self.path.rstrip("/").endswith("/health")
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(b"OK" if ok else b"")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def stub_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture
def local_env(monkeypatch) -> dict[str, str]:
    """The environment of a bare machine: none of the switchboard's variables set."""
    monkeypatch.chdir(ROOT)  # where a run starts: the examples' paths are relative to it
    for name in SWITCHBOARD:
        monkeypatch.delenv(name, raising=False)
    return {k: v for k, v in os.environ.items() if k not in SWITCHBOARD}


@pytest.fixture
def cluster_env(local_env, s3_url, s3_server, stub_port) -> dict[str, str]:
    """The environment of a cluster's container: S3 (moto, with the layer's bucket), MLflow, Ray and
    Prefect at the stub (module docstring)."""
    import boto3

    bucket = load_config(CLUSTER).lake.url.split("://", 1)[1].split("/", 1)[0]
    s3 = boto3.client("s3", endpoint_url=s3_server.url, region_name="us-east-1")
    if bucket not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket=bucket)
    return {**os.environ, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{stub_port}",
            "RAY_ADDRESS": f"127.0.0.1:{stub_port}", "PREFECT_API_URL": f"http://127.0.0.1:{stub_port}/api"}


def test_every_config_is_checked():
    assert {p.name for p in RUNS if p.parent.name == "configs"} >= {"default.toml", "long-tail.toml", *NODE_GPUS}
    assert {p.parent.name for p in RUNS if p.name == "config.toml"} >= {"math-boxed", "chat-reward"}


@pytest.mark.parametrize("path", RUNS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_run_config_starts_on_its_machine_as_it_is(path, local_env, tmp_path):
    cfg = load_config(path)
    # Rule: a shipped run needs no server: a lake folder, MLflow in SQLite, a local Ray.
    assert "://" not in cfg.lake.url and cfg.tracking.uri.startswith("sqlite:///"), path
    env = {**local_env, **write_download(cfg, tmp_path)}
    assert input_problems([path], env, machine_for(path)) == []


@pytest.mark.parametrize("path", RUNS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_run_config_starts_on_the_cluster_with_its_layer(path, cluster_env, tmp_path):
    layered = load_config([path, CLUSTER])
    # Rule: the layer moves where rows and metrics go, and nothing else.
    assert layered.lake.url == "s3://rhymerl/lake" and layered.tracking.uri.startswith("http://")
    assert layered.model == load_config(path).model and layered.train == load_config(path).train
    env = {**cluster_env, **write_download(layered, tmp_path)}
    assert input_problems([path, CLUSTER], env, CPU_BOX) == []  # a cluster's resources are Ray's


@pytest.mark.parametrize("name", sorted(NODE_GPUS))
def test_in_a_container_a_gpu_config_reads_its_own_model_and_data(name, cluster_env, tmp_path, monkeypatch):
    # A container of infra/compose.yaml or infra/k8s: the images' working folder with models/ and
    # data/ mounted in it, and no RHYMERL_MODEL or RHYMERL_DATASET: the config's own paths are read.
    path = ROOT / "configs" / name
    assert write_download(load_config(path), tmp_path, own_paths=True) == {}
    monkeypatch.chdir(tmp_path)
    assert not {"RHYMERL_MODEL", "RHYMERL_DATASET"} & set(cluster_env)
    assert input_problems([path, CLUSTER], cluster_env, CPU_BOX) == []


@pytest.mark.parametrize("name", sorted(NODE_GPUS))
def test_on_a_cpu_machine_a_gpu_config_fails_on_resources_alone(name, local_env, tmp_path):
    path = ROOT / "configs" / name
    env = {**local_env, **write_download(load_config(path), tmp_path)}
    found = input_problems([path], env, CPU_BOX)
    assert found and all(f.startswith("resources: ") for f in found), found
    assert any("GPUs" in f or "CPU core" in f for f in found)


@pytest.mark.parametrize("name", sorted(NODE_GPUS))
def test_without_its_download_a_gpu_config_fails_on_model_and_data_alone(name, local_env, tmp_path,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)  # a machine without ./models and ./data
    path = ROOT / "configs" / name
    found = input_problems([path], local_env, machine_for(path))
    assert [f.split(":", 1)[0] for f in found] == ["model", "dataset"], found
    assert "does not exist" in found[0] and "models/Qwen2.5-" in found[0]


def test_a_typo_in_a_config_or_its_layer_fails_naming_the_file_and_key(tmp_path, local_env):
    run = tmp_path / "run.toml"
    run.write_text((ROOT / "configs" / "long-tail.toml").read_text().replace("prompts_per_step", "prompt_per_step"))
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(run))}: unknown config key 'rollout.prompt_per_step'"):
        input_problems([run], local_env, CPU_BOX)
    layer = tmp_path / "layer.toml"
    layer.write_text("[lake]\nurl = 'lake'\n[trackng]\nuri = 'sqlite:///m.db'\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(layer))}: unknown config key 'trackng'"):
        input_problems([ROOT / "configs" / "default.toml", layer], local_env, CPU_BOX)


def test_a_config_pointing_at_servers_that_are_not_there_fails_on_them(tmp_path, local_env, monkeypatch):
    # What the GPU configs once held: an S3 lake and an MLflow server, neither running on a bare
    # machine (here: nothing listens on the ports named).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed}")
    run = tmp_path / "servers.toml"
    run.write_text(f"[lake]\nurl = 's3://rhymerl/lake'\n[tracking]\nuri = 'http://127.0.0.1:{closed}'\n")
    found = input_problems([run], local_env, CPU_BOX)
    assert [f.split(":", 1)[0] for f in found] == ["lake", "tracking"], found
    assert all("is not reachable" in f for f in found)
