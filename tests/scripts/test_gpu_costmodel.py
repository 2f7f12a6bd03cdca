"""scripts/gpu-costmodel.py on the CPU with a tiny Qwen2: every timed point's logits equal a plain
transformers forward's, a broken cache write is caught, and the JSON it writes loads into the cost model."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest
import torch

from rhymerl.histopipe.cost_surface import load_cost_surface
from rhymerl.histopipe.roofline import SHAPES

ROOT = Path(__file__).resolve().parents[2]


def script():
    spec = importlib.util.spec_from_file_location("gpu_costmodel", ROOT / "scripts" / "gpu-costmodel.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, tie_word_embeddings=True)
GRID = {"batch": (1, 3), "query": (1, 3), "context": (8,)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_timed_point_matches_the_reference_forward(tmp_path: Path, dtype: torch.dtype) -> None:
    g = script()
    torch.manual_seed(0)
    doc = g.run({"tiny": g.qwen2_config(TINY, vocab_size=128)}, GRID, "cpu", dtype, budget_s=60,
                repeats=1, warmup=1)
    points = doc["models"]["tiny"]["points"]
    assert len(points) == 4 and all(p["seconds"] > 0 and p["timing"] == "eager" for p in points)
    assert all(p["logits_ok"] for p in points), [p["logits_max_rel_diff"] for p in points]
    assert max(p["logits_max_rel_diff"] for p in points) <= g.TOLERANCE[dtype]
    assert doc["models"]["tiny"]["params"] > 0 and doc["format"] == "rhymerl-cost-surface/1"
    # the file loads into the cost model (CPU timings of a tiny model are noise: fit known seconds instead)
    for p in points:
        p["seconds"] = 1e-3 + 1e-5 * p["batch"] * p["query"]
    path = tmp_path / "surface.json"
    path.write_text(json.dumps(doc))
    cost = load_cost_surface(path).cost_model(context=8, capacity=4)
    assert cost.capacity == 4 and cost.base_s == pytest.approx(1e-3, rel=1e-6)


def test_a_broken_cache_write_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    g = script()
    torch.manual_seed(0)
    right = g.write_kv

    def one_slot_early(k_cache, v_cache, k, v, start):  # overwrites the last cached token instead
        right(k_cache, v_cache, k, v, start - 1)

    monkeypatch.setattr(g, "write_kv", one_slot_early)
    cfg = g.qwen2_config(TINY, vocab_size=128)
    out = g.measure(cfg, GRID, "cpu", torch.float32, deadline=time.monotonic() + 60, repeats=1, warmup=1)
    assert len(out["points"]) == 4
    assert not any(p["logits_ok"] for p in out["points"])
    assert min(p["logits_max_rel_diff"] for p in out["points"]) > 100 * g.TOLERANCE[torch.float32]


def test_the_step_writes_the_cache_in_place_and_keeps_its_context() -> None:
    g = script()
    model = g.build_model(g.qwen2_config(TINY, vocab_size=128), "cpu", torch.float32)
    with torch.inference_mode():
        step = g.EngineStep(model, batch=2, query=3, context=5, device="cpu", dtype=torch.float32)
        before = [k.data_ptr() for k in step.k]
        cached = step.k[0][:, :, :5].clone()
        first, second = step.forward(), step.forward()
    assert [k.data_ptr() for k in step.k] == before and step.k[0].shape[2] == 8  # no new or grown cache
    assert torch.equal(step.k[0][:, :, :5], cached)  # the context is left as it was
    assert torch.equal(first, second) and first.shape == (2, 3, 128)  # repeats see the same context


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


def test_real_shapes_have_the_advertised_sizes_and_match_the_roofline() -> None:
    # parameter counts of the three shapes without building them: ~0.5B, ~1.5B, ~7B; the roofline
    # counts the same weights for the same shape
    g = script()
    for size, lo, hi in (("0.5b", 0.4e9, 0.6e9), ("1.5b", 1.4e9, 1.7e9), ("7b", 7.0e9, 7.8e9)):
        with torch.device("meta"):
            n = sum(p.numel() for p in g.Qwen2ForCausalLM(g.qwen2_config(size)).parameters())
        assert lo < n < hi, (size, n)
        assert SHAPES[f"qwen2-{size}"].params() == n, size
