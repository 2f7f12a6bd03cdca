"""The roofline surface: its formula on a hand-computed point, verification's cost at a large batch,
and the committed file is what the code writes and loads like a measured surface."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rhymerl.histopipe.cost_surface import load_cost_surface
from rhymerl.histopipe.roofline import (DEVICES, SHAPES, Device, RooflineSettings, Shape, anchor_comparison,
                                        step_terms, surface_doc)

ROOT = Path(__file__).resolve().parents[3]
TINY = Shape(hidden=4, intermediate=8, layers=1, heads=2, kv_heads=1, vocab=10, tied=True)


def test_a_hand_computed_point_follows_the_formula() -> None:
    # matrices: q, o 4x4; k, v 4x2; MLP 3 x 4x8; output 10x4 -> 32 + 16 + 96 + 40 = 184 weights;
    # q/k/v biases 4 + 2 + 2, two norms of 4 and the final one: 204 weights, 408 bytes streamed.
    # KV per token: K and V x 1 layer x 1 head x dim 2 x 2 bytes = 8 bytes; 3 sequences x (10 + 2) tokens.
    assert TINY.matrix_params() == 184 and TINY.params() == 204 and TINY.weight_bytes_read() == 408
    settings = RooflineSettings(overhead_s=5e-4)
    slow_memory = Device("x", peak_flops=1e12, hbm_bytes_per_s=1e9, memory_bytes=1e9, source="test")
    t = step_terms(TINY, slow_memory, batch=3, query=2, context=10, settings=settings)
    # bytes 408 + 3 x 12 x 8 = 696; FLOPs 2 x 184 x 6 tokens + 4 x 1 x 2 x 2 x 6 x 12 attended = 3360
    assert (t["bytes"], t["flops"], t["bound"]) == (696, 3360, "memory")
    assert t["seconds"] == pytest.approx(696 / 1e9 + 5e-4)
    slow_compute = Device("y", peak_flops=1e9, hbm_bytes_per_s=1e12, memory_bytes=1e9, source="test")
    t = step_terms(TINY, slow_compute, batch=3, query=2, context=10, settings=settings)
    assert t["bound"] == "compute" and t["seconds"] == pytest.approx(3360 / 1e9 + 5e-4)
    # an untied input embedding is looked up, not streamed: more weights, the same bytes
    untied = Shape(hidden=4, intermediate=8, layers=1, heads=2, kv_heads=1, vocab=10, tied=False)
    assert untied.params() == 244 and untied.weight_bytes_read() == 408


@pytest.mark.parametrize("device", ["h100", "h200"])
def test_verifying_17_tokens_costs_more_than_1_at_a_large_batch(device: str) -> None:
    shape, dev = SHAPES["qwen2-7b"], DEVICES[device]
    one = step_terms(shape, dev, batch=128, query=1, context=1024)
    seventeen = step_terms(shape, dev, batch=128, query=17, context=1024)
    assert one["bound"] == "memory" and seventeen["bound"] == "compute"
    assert seventeen["seconds"] / one["seconds"] > 2.0
    # one sequence: both are streaming the weights, and the 16 extra tokens are nearly free
    alone = step_terms(shape, dev, batch=1, query=17, context=1024)["seconds"]
    assert alone / step_terms(shape, dev, batch=1, query=1, context=1024)["seconds"] < 1.01


def test_the_roofline_is_below_the_published_engine_step() -> None:
    ms = anchor_comparison()["roofline_ms"]
    assert ms["batch 1, context 256"] < 8.2 and ms["batch 64, context 256"] < 8.8
    assert ms["batch 64, context 4096"] > ms["batch 64, context 256"]  # the cache read grows with context


def test_the_committed_surface_is_the_codes_and_loads_per_device() -> None:
    path = ROOT / "bench" / "results" / "cost-surface-roofline.json"
    assert json.loads(path.read_text()) == json.loads(json.dumps(surface_doc())), \
        "bench/results/cost-surface-roofline.json is stale: rerun scripts/roofline-surface.py"
    h100, h200 = load_cost_surface(path, "qwen2-7b@h100"), load_cost_surface(path, "qwen2-7b@h200")
    assert (h100.device, h200.device) == ("NVIDIA H100 SXM (roofline)", "NVIDIA H200 SXM (roofline)")
    assert h200.step_time(64, 1, 1024) < h100.step_time(64, 1, 1024)  # more bandwidth, same compute
    with pytest.raises(ValueError, match="qwen2-7b@h200"):
        load_cost_surface(path)  # six entries: the error names the choices


def test_points_that_do_not_fit_the_device_are_skipped() -> None:
    doc = surface_doc()
    skipped = {(p["batch"], p["context"]) for p in doc["models"]["qwen2-7b@h100"]["skipped"]}
    assert (512, 8192) in skipped and (1, 256) not in skipped
    assert len(doc["models"]["qwen2-7b@h200"]["skipped"]) < len(doc["models"]["qwen2-7b@h100"]["skipped"])
