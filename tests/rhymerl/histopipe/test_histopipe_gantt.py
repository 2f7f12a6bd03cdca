"""HistoPipe Gantt chart: lane packing and the PNG it writes."""

from __future__ import annotations

from pathlib import Path

from rhymerl.histopipe.costmodel import CostModel
from rhymerl.histopipe.gantt import gantt_png, lanes
from rhymerl.histopipe.schedule import Assignment, Unit
from rhymerl.histopipe.simulator import MigrationSettings, RequestSpan, simulate


def test_gantt_lanes_and_png(tmp_path: Path) -> None:
    # [0,3] lane 0; [1,2] overlaps -> lane 1; [2,4] reuses lane 1 (free from 2), not lane 0 (busy to 3)
    spans = [RequestSpan("a", 0, 0, 0.0, 3.0, 3), RequestSpan("b", 0, 0, 1.0, 2.0, 1),
             RequestSpan("c", 0, 0, 2.0, 4.0, 2), RequestSpan("d", 0, 1, 1.0, 2.0, 1)]
    # lanes are per worker: d on worker 1 starts its own lane 0
    assert lanes(spans) == [0, 1, 1, 0]
    # a migrated step: four spans on two workers, one drawn as a continuation
    units = ((Unit("x", (0,), 2.0, 2.0),), (Unit("y", (0,), 2.0, 2.0), Unit("z", (0,), 2.0, 2.0)))
    r = simulate(Assignment("handmade", units), {("x", 0): 2, ("y", 0): 8, ("z", 0): 8},
                 CostModel(base_s=1.0, per_seq_s=1.0, capacity=4),
                 MigrationSettings(tail_fraction=1.0, threshold=1.0), {"x": 2, "y": 2, "z": 100})
    assert r.migrations == 1
    out = gantt_png(r, tmp_path / "charts" / "step0.png", title="step 0")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 2000
