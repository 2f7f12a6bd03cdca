"""scripts/gpu-costmodel.py on the CPU with a tiny Qwen2: the JSON it writes loads into the cost model."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest
import torch

from rhymerl.histopipe.cost_surface import load_cost_surface

ROOT = Path(__file__).resolve().parents[2]


def script():
    spec = importlib.util.spec_from_file_location("gpu_costmodel", ROOT / "scripts" / "gpu-costmodel.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, tie_word_embeddings=True)


def test_measure_tiny_model_and_load_surface(tmp_path: Path) -> None:
    g = script()
    grid = {"batch": (1, 4), "query": (1, 3), "context": (8,)}
    doc = g.run({"tiny": g.qwen2_config(TINY, vocab_size=128)}, grid, "cpu", torch.float32, budget_s=60,
                repeats=1, warmup=1)
    points = doc["models"]["tiny"]["points"]
    assert len(points) == 4 and all(p["seconds"] > 0 for p in points)  # every grid point timed
    assert doc["models"]["tiny"]["params"] > 0 and doc["format"] == "rhymerl-cost-surface/1"
    path = tmp_path / "surface.json"
    path.write_text(json.dumps(doc))
    surface = load_cost_surface(path)
    cost = surface.cost_model(context=8, capacity=4)
    assert cost.capacity == 4 and cost.step_time(4) > 0


def test_points_past_the_deadline_or_the_kv_cap_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    g = script()
    cfg = g.qwen2_config(TINY, vocab_size=128)
    out = g.measure(cfg, {"batch": (1,), "query": (1,), "context": (8,)}, "cpu", torch.float32,
                    deadline=time.monotonic() - 1)
    assert out["points"] == [] and out["skipped"][0]["why"] == "time budget"
    monkeypatch.setattr(g, "KV_BYTES_CAP", 0)
    out = g.measure(cfg, {"batch": (1,), "query": (1,), "context": (8,)}, "cpu", torch.float32,
                    deadline=time.monotonic() + 60)
    assert out["skipped"][0]["why"] == "KV cache over cap"


def test_real_shapes_have_the_advertised_sizes() -> None:
    # parameter counts of the three shapes without building them: ~0.5B, ~1.5B, ~7B
    g = script()
    for size, lo, hi in (("0.5b", 0.4e9, 0.6e9), ("1.5b", 1.4e9, 1.7e9), ("7b", 7.0e9, 7.8e9)):
        with torch.device("meta"):
            n = sum(p.numel() for p in g.Qwen2ForCausalLM(g.qwen2_config(size)).parameters())
        assert lo < n < hi, (size, n)
