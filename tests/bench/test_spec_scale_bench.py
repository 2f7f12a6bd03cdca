"""`rhymerl bench spec-scale --quick` end to end: every arm and point reported, parseable JSON."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from bench.rhyming import CHANGE, SAMPLES, Forward, rhyming_group
from bench.spec_scale_bench import UNBUILT

ROOT = Path(__file__).resolve().parents[2]


def test_generator_is_seeded_and_rhymes():
    # same seed, same histories; each response differs from the others in about 2 x 5% of its tokens
    a = rhyming_group(np.random.default_rng(3), 2000, 4)
    b = rhyming_group(np.random.default_rng(3), 2000, 4)
    assert all((x == y).all() for x, y in zip(a, b))
    rows = a[1]
    assert rows.shape == (4 + SAMPLES, 2000)
    assert abs((rows[0] != rows[1]).mean() - 2 * CHANGE) < 0.03


def test_forward_pass_spins_or_sleeps():
    # busy keeps the drafting thread on its core (CPU time accrues), idle lets it sleep; both last the pass
    for busy in (True, False):
        w0, c0 = time.perf_counter(), time.thread_time()
        Forward(seconds=0.1, busy=busy).wait()
        wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
        assert wall >= 0.1
        assert (cpu > 0.02) if busy else (cpu < 0.02)


@pytest.mark.bench  # a numba-compiling subprocess (~40 s): `make bench` runs it
def test_spec_scale_bench_quick_json(tmp_path):
    out = tmp_path / "scale.json"
    cmd = [sys.executable, "-m", "bench.spec_scale_bench", "--quick", "--spec", "engine", "--json", "--json-out",
           str(out)]
    printed = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=True).stdout
    result = json.loads(printed)
    assert json.loads(out.read_text()) == result
    assert {"new_py", "new"} <= set(result["arms"])
    for b in result["builds"]:
        for arm in set(result["arms"]) - set(UNBUILT):
            assert b[arm]["bytes_per_token"] > 0 and b[arm]["build_tokens_per_s"] > 0
    for d in result["drafts"]:
        for arm in result["arms"]:
            assert d[arm]["us_per_request"] > 0 and d[arm]["stall_ms"] >= 0
        # steps accept what the rows continue (some drafts pass)
        assert 0 < d["new"]["acceptance_rate"] <= 1
    assert result["epochs"] and result["targets"]["bytes_per_token"] == 16
    assert result["forward"] == {"ms": 10.0, "busy": True}
