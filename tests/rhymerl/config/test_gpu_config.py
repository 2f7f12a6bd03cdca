"""The GPU configs and the GPU smoke script, checked on a machine without GPUs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rhymerl.config.run import load_config
from workers.actors import missing_resources, placement_for

ROOT = Path(__file__).resolve().parents[3]
GPU_CONFIGS = sorted((ROOT / "configs").glob("gpu-*.toml"))


# The GPUs each config is written for: a node of 4 for the 0.5B model, of 8 for the 7B one.
NODE_GPUS = {"gpu-qwen2.5-0.5b.toml": 4, "gpu-qwen2.5-7b.toml": 8}


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=lambda p: p.name)
def test_gpu_config_validates_and_fits_its_node(path):
    cfg = load_config(path)
    # Downloaded into the repository's models/ and data/ (docs/cluster.md), read from there as they are.
    assert cfg.model.path.startswith("models/") and cfg.data.dataset == "data/gsm8k_train.jsonl"
    assert cfg.rollout.num_workers >= 2 and cfg.model.dtype == "bfloat16" and cfg.train.dtype == "float32"
    assert cfg.model.max_model_len >= cfg.rollout.max_tokens + 128  # room for a GSM8K prompt
    gpus = NODE_GPUS[path.name]
    place = placement_for(cfg, gpus_available=gpus)
    # Each engine on its own GPU(s), each trainer rank on one more: exactly the node's GPUs.
    ranks = cfg.train.world_size
    assert place.trainer_gpus == 1
    assert missing_resources(place, cfg.rollout.num_workers, {"GPU": float(gpus)}, ranks) == []
    assert missing_resources(place, cfg.rollout.num_workers, {"GPU": gpus - 1.0}, ranks) != []


def test_gpu_config_prints_with_env_overrides(tmp_path):
    env = {**os.environ, "RHYMERL_MODEL": "/elsewhere/model", "RHYMERL_LAKE": str(tmp_path / "lake")}
    out = subprocess.run([str(Path(sys.executable).parent / "rhymerl"), "run", "--config", str(GPU_CONFIGS[0]),
                          "--print-config"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert '"path": "/elsewhere/model"' in out.stdout and str(tmp_path / "lake") in out.stdout


def test_gpu_smoke_script_parses_and_refuses_a_machine_without_gpus(tmp_path):
    script = ROOT / "scripts" / "gpu-smoke.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"}  # no nvidia-smi on this PATH
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2 and "nvidia-smi not found" in out.stderr
