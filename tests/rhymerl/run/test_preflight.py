"""rhymerl/run/preflight.py and storage/probe.py on hand-made cases (the CLI sweep is test_cli_preflight.py)."""

from __future__ import annotations

import json
import socket

from rhymerl.run.preflight import Finding, Machine, check_resources, parse_ray_address
from rhymerl.config.run import load_config
from rhymerl.config.task import DataConfig, RewardConfig
from rhymerl.data.datasets import dataset_errors
from storage.probe import lake_problems, tcp_problem, tracking_problems


def test_ray_addresses(tmp_path):
    assert parse_ray_address("local") is None  # a new local Ray: nothing to reach
    assert parse_ray_address("10.0.0.5:6379") == ("10.0.0.5", 6379)
    assert parse_ray_address("ray://head:10001") == ("head", 10001)
    assert parse_ray_address("[::1]:6379") == ("::1", 6379)
    assert isinstance(parse_ray_address("head"), Finding)  # no port
    # `auto` means the cluster `ray start` recorded on this machine, else a finding naming the fix.
    none_started = parse_ray_address("auto", str(tmp_path))
    assert isinstance(none_started, Finding) and "ray start --head" in none_started.message
    (tmp_path / "ray_current_cluster").write_text("127.0.0.1:6380\n")
    assert parse_ray_address("auto", str(tmp_path)) == ("127.0.0.1", 6380)


def test_resources_on_a_gpu_machine_count_engines_times_tp_plus_trainer():
    cfg = load_config(None, ["rollout.num_workers=3", "rollout.tensor_parallel_size=2"])
    (short,) = check_resources(cfg, Machine(cpus=16, memory_gib=128, gpus=4), cluster=False)
    assert "needs 7 GPUs" in short.message and "has 4" in short.message  # 3 x 2 + 1
    assert check_resources(cfg, Machine(16, 128, 8), cluster=False) == []
    assert check_resources(cfg, Machine(16, 128, 0), cluster=True) == []  # a cluster is checked once joined


def test_resources_on_cpu_count_cores_and_memory():
    cfg = load_config(None, ["rollout.num_workers=3", "rollout.kv_cache_gib=4"])
    areas = [f.message.split(" ")[0] for f in check_resources(cfg, Machine(cpus=2, memory_gib=10, gpus=0), False)]
    assert areas == ["rollout.num_workers=3", "rollout.kv_cache_gib=4"]  # 3 > 2 cores; 3 x 4 GiB > 10 GiB
    assert check_resources(cfg, Machine(cpus=4, memory_gib=16, gpus=0), False) == []


def test_dataset_errors_list_every_bad_row_up_to_a_limit(tmp_path):
    good = json.dumps({"question": "q", "answer": "#### 1"})
    bad = json.dumps({"question": "q", "answer": "no number"})
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join([good] + [bad] * 25 + [good]) + "\n")
    errors = dataset_errors(DataConfig(dataset=str(path), num_prompts=1), RewardConfig(), limit=20)
    assert len(errors) == 21 and "row 1 (0-based)" in errors[0] and "row 20 (0-based)" in errors[19]
    assert errors[20].endswith("5 more bad rows not shown")
    assert dataset_errors(DataConfig(dataset=str(tmp_path / "nope.jsonl")), RewardConfig()) == [
        f"data.dataset: {tmp_path / 'nope.jsonl'} does not exist; fix the path or URL"]


def test_tcp_probe_and_local_stores(tmp_path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert tcp_problem("127.0.0.1", port, "x", "fix") is None
    assert "not reachable" in tcp_problem("127.0.0.1", port, "the thing", "start it")
    # Nothing is created by the checks: a lake or database in a folder yet to exist is fine.
    assert lake_problems(str(tmp_path / "a" / "lake")) == [] and not (tmp_path / "a").exists()
    assert tracking_problems(f"sqlite:///{tmp_path / 'b' / 'm.db'}") == [] and not (tmp_path / "b").exists()
    assert "names no database file" in tracking_problems("sqlite:///")[0]
