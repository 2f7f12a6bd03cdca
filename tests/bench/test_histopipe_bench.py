"""`python -m bench.pipe_bench` end to end on a tiny sweep, and its simulator check on a written lake."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.pipe_bench import main
from rhymerl.histopipe.costmodel import CostModel
from storage.lake import LakeWriter, rows_to_table

ROOT = Path(__file__).resolve().parents[2]


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


def _write_run(url: str, run_id: str, spec_method: str | None = None, spec_enabled: bool = False,
               migrate: bool = False) -> None:
    """A 2-step, 2-worker run whose timings follow one cost model exactly, written as the flow does:
    one file per step, each worker's rows in admission order under one gen_start."""
    cost = CostModel(base_s=0.02, per_seq_s=0.001, startup_s=0.3, capacity=4)
    writer = LakeWriter(url)
    writer.write_run(run_id, "check", {"rollout": {"num_workers": 2, "prompts_per_step": 10, "n": 2},
                                       "spec": {"enabled": spec_enabled},
                                       "pipe": {"migrate": migrate}})
    for step in range(2):
        rows = []
        for w in range(2):
            lengths = [5 + 7 * ((i * 5 + 3 * w + step) % 9) for i in range(10)]  # queued: 10 > 4 slots
            start = 1000.0 + 50.0 * step
            for i, (x, end) in enumerate(zip(lengths, cost.request_times(lengths))):
                rows.append({"run_id": run_id, "epoch": 0, "step": step, "prompt_id": f"w{w}p{i // 2}",
                             "sample_idx": i % 2, "length": x, "worker_id": w, "gen_start": start,
                             "gen_end": start + end})
        path = writer.write_rollouts(run_id, 0, step, worker=0, attempt=1, table=rows_to_table(rows))
        writer.commit_step(run_id, 0, step, files=[path])
        writer.write_steps_row(run_id, 0, step, {"spec_method": spec_method})


def test_pipe_bench_checks_a_lake_run(tmp_path: Path, capsys) -> None:
    # a run that follows the cost model: fit on step 0, replay step 1, zero error
    url = str(tmp_path / "lake")
    _write_run(url, "r1")
    assert main(["--check-lake", url, "--check-run", "r1", "--check-capacity", "4", "--json"]) == 0
    check = json.loads(capsys.readouterr().out)["check"]
    assert check["workers"] == 2 and check["fit_steps"] == [0]
    assert [(s["step"], s["requests"]) for s in check["steps"]] == [(1, 20)]
    assert abs(check["max_abs_error"]) < 1e-9 and check["within_15pct"]
    assert abs(check["calibration"]["base_s"] - 0.02) < 1e-9
    assert main(["--check-lake", url, "--check-run", "r1", "--check-capacity", "4"]) == 0
    table = capsys.readouterr().out
    assert "simulator check: run r1 (W=2, capacity 4)" in table and "max |error| 0.0%" in table


def test_pipe_bench_check_refuses_speculative_and_unknown_runs(tmp_path: Path, capsys) -> None:
    url = str(tmp_path / "lake")
    _write_run(url, "spec", spec_method="histospec")
    with pytest.raises(SystemExit):
        main(["--check-lake", url, "--check-run", "spec"])
    assert "spec.enabled=false" in capsys.readouterr().err
    # a lake from before steps.spec_method: the run's config says speculation was on
    _write_run(url, "old", spec_enabled=True)
    with pytest.raises(SystemExit):
        main(["--check-lake", url, "--check-run", "old"])
    assert "spec.enabled=true in its config" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--check-lake", url, "--check-run", "nope"])
    assert "no rollouts of run 'nope'" in capsys.readouterr().err


def test_real_runs_summarise_the_steps_table_from_an_epoch(tmp_path, capsys) -> None:
    # Run A (lpt): epoch 0 bubble 0.5 (left out), epochs 1-2 bubbles 0.1 and 0.3 -> mean 0.2.
    # Run B (tier2 + migrate): 0.05 and 0.15 -> mean 0.1, 3 migrations; its config names the policy.
    url = str(tmp_path / "lake")
    writer = LakeWriter(url)
    runs = {"A": ({"policy": "lpt"}, [0.5, 0.1, 0.3], [0, 0, 0]),
            "B": ({"policy": "tier2", "migrate": True}, [0.5, 0.05, 0.15], [2, 1, 2])}
    for run_id, (pipe, bubbles, moved) in runs.items():
        writer.write_run(run_id, run_id, {"pipe": pipe, "spec": {"enabled": False},
                                          "rollout": {"num_workers": 2, "prompts_per_step": 4, "n": 2}})
        for epoch, (b, m) in enumerate(zip(bubbles, moved)):
            writer.write_steps_row(run_id, epoch, 0, {"bubble_ratio": b, "makespan_s": 2.0 + epoch, "rollout_s": 3.0,
                                                      "migrations": m, "reward_s": 0.1, "reward_total_s": 0.4,
                                                      "tokens": 100})
    assert main(["--real-lake", url, "--real-runs", "A,B", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["real"]
    assert [(r["run_id"], r["policy"], r["migrate"], r["steps"]) for r in rows] == [("A", "lpt", False, 2),
                                                                                    ("B", "tier2", True, 2)]
    assert [r["bubble_mean"] for r in rows] == pytest.approx([0.2, 0.1])
    assert [r["makespan_mean_s"] for r in rows] == pytest.approx([3.5, 3.5])
    assert [r["migrations"] for r in rows] == [0, 3]
    assert [r["vs_oracle_sim"] for r in rows] == [None, None]  # A: no rollouts to replay; B: migrated
    assert main(["--real-lake", url, "--real-runs", "A", "--real-from-epoch", "0"]) == 0
    assert "lpt" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--real-lake", url, "--real-runs", "C"])
    assert "no config or no steps" in capsys.readouterr().err


def test_real_runs_put_a_replayable_run_next_to_the_oracle(tmp_path, capsys) -> None:
    # r1 follows one cost model; its placement and the oracle's are replayed with the fitted model
    # (the arithmetic is tests/rhymerl/histopipe/test_histopipe_validate.py's); speculation or migration: no replay.
    url = str(tmp_path / "lake")
    _write_run(url, "r1")
    _write_run(url, "spec", spec_enabled=True)
    _write_run(url, "moved", migrate=True)
    assert main(["--real-lake", url, "--real-runs", "r1,spec,moved", "--real-from-epoch", "0",
                 "--check-capacity", "4", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["real"]
    gap = rows[0]["vs_oracle_sim"]
    assert isinstance(gap, float) and -0.5 < gap < 1.0 and gap != 0.0
    assert [r["vs_oracle_sim"] for r in rows[1:]] == [None, None]


def test_pipe_bench_check_refuses_a_run_with_migration(tmp_path: Path, capsys) -> None:
    # a migrated request ran on two workers: replaying it where it started would be wrong
    url = str(tmp_path / "lake")
    _write_run(url, "moved", migrate=True)
    with pytest.raises(SystemExit):
        main(["--check-lake", url, "--check-run", "moved"])
    assert "without pipe.migrate" in capsys.readouterr().err
