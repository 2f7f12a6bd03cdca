"""Cost surface: the fit recovers a known surface, becomes a CostModel, and loads from the script's JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rhymerl.histopipe.cost_surface import FORMAT, fit_surface, load_cost_surface


def grid_points(base: float = 0.01, token: float = 1e-5, kv: float = 2e-8, attn: float = 1e-9) -> list[dict]:
    """Exact points of seconds = base + token * b * q + kv * b * ctx + attn * b * q * ctx on a small grid."""
    return [{"batch": b, "query": q, "context": c,
             "seconds": base + token * b * q + kv * b * c + attn * b * q * c}
            for b in (1, 16, 64) for q in (1, 4, 9) for c in (256, 4096)]


def test_fit_recovers_an_exact_surface() -> None:
    s = fit_surface(grid_points(), model="m", device="d")
    assert s.base_s == pytest.approx(0.01) and s.token_s == pytest.approx(1e-5)
    assert s.kv_s == pytest.approx(2e-8, rel=1e-4) and s.attn_s == pytest.approx(1e-9, rel=1e-4)
    assert s.r2 == pytest.approx(1.0) and s.max_rel_err < 1e-6 and s.points == 18


def test_cost_model_and_verify_overhead() -> None:
    s = fit_surface(grid_points(base=0.01, token=1e-4, kv=0.0, attn=0.0))
    # at query 1 a running request costs token_s; at query 5 five times that
    assert s.cost_model(1024).per_seq_s == pytest.approx(1e-4)
    assert s.cost_model(1024, query=5, capacity=8).per_seq_s == pytest.approx(5e-4)
    assert s.cost_model(1024, capacity=8).capacity == 8 and s.cost_model(1024).base_s == pytest.approx(0.01)
    # batch 100: 0.01 + 0.01 = 0.02 s plain, 0.01 + 0.05 = 0.06 s with 5 tokens each -> +200%
    assert s.verify_overhead(5, 100, 1024) == pytest.approx(2.0)


def test_reading_the_cache_is_paid_once_per_step_not_per_query_token() -> None:
    # a memory-bound GPU: attention costs what reading the cache costs, whatever the query length
    s = fit_surface(grid_points(base=0.005, token=1e-6, kv=1e-7, attn=0.0))
    assert s.kv_s == pytest.approx(1e-7, rel=1e-4) and s.attn_s == pytest.approx(0.0, abs=1e-12)
    # batch 64 x 4096 cached: 0.005 + 0.000064 + 0.0262 plain; 5 query tokens add only 4 x 64 us
    assert s.verify_overhead(5, 64, 4096) == pytest.approx(4 * 64e-6 / (0.005 + 64e-6 + 0.0262144), rel=1e-3)
    assert s.cost_model(4096, query=5).per_seq_s == pytest.approx(5e-6 + 4096e-7)


def test_fit_rejects_too_few_or_zero_points() -> None:
    with pytest.raises(ValueError, match="need >= 4"):
        fit_surface(grid_points()[:3])
    with pytest.raises(ValueError, match="seconds <= 0"):
        fit_surface([{**p, "seconds": 0.0} for p in grid_points()])


def test_load_picks_the_model_and_names_the_choices(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"format": FORMAT, "device": "X", "models": {"a": {"points": grid_points()}}}))
    assert load_cost_surface(path).model == "a" and load_cost_surface(path).device == "X"
    path.write_text(json.dumps({"format": FORMAT, "models": {"a": {"points": grid_points()},
                                                            "b": {"points": grid_points()}}}))
    with pytest.raises(ValueError, match=r"\['a', 'b'\]"):
        load_cost_surface(path)
    path.write_text(json.dumps({"models": {}}))
    with pytest.raises(ValueError, match="not a cost surface"):
        load_cost_surface(path)
