"""scripts/gpu-check.sh at its tiny size on the CPU: the sharded trainer's path, its report and its check.

The script must run where only torch and transformers exist, so it runs here with the project's
other heavy dependencies blocked (None in sys.modules makes their import fail).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("vllm", "prefect", "ray", "mlflow", "duckdb", "pyarrow", "arctic_inference")


def script():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up while they are made
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def blocked_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python cannot import BLOCKED (a sitecustomize on PYTHONPATH)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import sys\nfor name in {BLOCKED!r}:\n    sys.modules[name] = None\n")
    return {**os.environ, "PYTHONPATH": str(site), "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}


def test_the_blocker_blocks(blocked_env: dict[str, str]) -> None:
    # Rule: the environment below really lacks the modules, or the next test proves nothing.
    done = subprocess.run([sys.executable, "-c", "import ray"], env=blocked_env, capture_output=True, text=True)
    assert done.returncode != 0 and "ray" in done.stderr


def test_tiny_check_runs_with_only_torch_and_transformers(blocked_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "gpu-check.json"
    done = subprocess.run([str(ROOT / "scripts" / "gpu-check.sh"), "--tiny", "--steps", "2", "--out", str(out)],
                          env=blocked_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["ok"] is True and report["device_type"] == "cpu"
    assert report["shape"]["name"] == "tiny" and report["shape"]["sequences"] == 4
    trainer = report["trainer"]
    assert trainer["world_size"] == 1 and trainer["fsdp2"] and trainer["activation_checkpointing"]
    assert trainer["micro_batch_size"] == 4  # --tiny: the whole batch in one pass
    training = report["training"]
    assert training["steps"] == 2 and training["tokens_per_s"] > training["response_tokens_per_s"] > 0
    assert report["peak_memory_bytes"] > 2**20 and report["peak_memory_kind"] == "peak RSS of the process"
    check = report["sync_check"]
    # float32 on both sides: the same weights give the same log-probs up to summation order
    assert check["compute_dtype"] == "float32" and check["logprob_max_abs_diff"] < 1e-4
    assert check["tokens"] == 4 * 48 and check["logprob_max_abs_change"] > check["logprob_tolerance"]


def test_stale_weights_fail_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Rule: weights handed out that are not the trained ones (a stale sync) fail the check, exit 1.
    g = script()
    initial: dict = {}
    build = g.build_model

    def remember(*args):
        weights, count = build(*args)
        initial.update(weights)
        return weights, count

    monkeypatch.setattr(g, "build_model", remember)
    monkeypatch.setattr(g.ShardedTrainer, "state_dict_for_engine", lambda self: dict(initial))
    out = tmp_path / "gpu-check.json"
    assert g.main(["--tiny", "--steps", "1", "--out", str(out)]) == 1
    check = json.loads(out.read_text())["sync_check"]
    assert check["logprob_max_abs_diff"] > check["logprob_tolerance"]


def test_failures_name_each_problem() -> None:
    g = script()
    report = {"training": {"last_step": {"loss": 0.1, "grad_norm": float("nan")}},
              "sync_check": {"finite": True, "logprob_max_abs_diff": 0.2, "logprob_tolerance": 0.05,
                             "logprob_max_abs_change": 0.01}}
    found = g.failures(report)
    assert len(found) == 3  # diverged, trainer and plain forward disagree, training too small to tell
    assert "not finite" in found[0] and "state_dict_for_engine" in found[1] and "--steps" in found[2]
    report["training"]["last_step"]["grad_norm"] = 1.0
    report["sync_check"].update(logprob_max_abs_diff=0.0, logprob_max_abs_change=0.5)
    assert g.failures(report) == []
