"""`python -m bench.pipe_bench` end to end on a tiny sweep."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_pipe_bench_json_smoke() -> None:
    # the benchmark entry point runs end to end on a tiny sweep and prints parseable JSON
    cmd = [sys.executable, "-m", "bench.pipe_bench", "--json", "--workers", "2,3", "--prompts-per-worker", "2",
           "--capacity", "4"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=True).stdout
    result = json.loads(out)
    assert [(p["dist"], p["workers"]) for p in result["points"]] == [("builtin", 2), ("builtin", 3),
                                                                      ("heavy", 2), ("heavy", 3)]
    for p in result["points"]:
        assert set(p) >= {"naive", "tier1", "tier1+2", "oracle", "spearman"}
        assert p["requests"] == p["prompts"] * 8 == p["workers"] * 16
    assert set(result["targets"]) == {"tier1", "tier1+2"}
