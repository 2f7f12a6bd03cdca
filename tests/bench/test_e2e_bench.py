"""End-to-end benchmark: time split, ratios, parity test, report files, run plan (and one slow smoke run)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from bench.e2e.analysis import SPLIT, by_position, compare, epoch_rows, parity, permutation_pvalue, step_split
from bench.e2e.bench import ARMS, E2ESettings, _stop, load_runs, run_order, run_overrides
from bench.e2e.report import build_report, format_text, write_report
from bench.e2e.scale import ScaleSettings, amdahl, estimate, simulate_arms, streamed_step_speedup, surface_settings

ROOT = Path(__file__).resolve().parents[2]


def record(epoch: int, step: int, gstep: int, rollout: float, acc: float = 0.5, spec: bool = False) -> dict:
    """A step record as run_step writes it: 10 samples of 20 tokens; parts add to rollout + 3.0 s."""
    rec = {"epoch": epoch, "step": step, "global_step": gstep, "tokens": 200.0, "length_mean": 20.0,
           "reward_mean": acc, "accuracy": acc, "plan_s": 0.1, "rollout_s": rollout, "reward_s": 0.2,
           "lake_s": 0.1, "train_s": 2.0, "sync_s": 0.1, "measure_s": 0.2, "log_s": 0.05,
           "checkpoint_s": 0.15, "step_s": rollout + 2.5, "wall_s": rollout + 3.0,  # 0.1 s unaccounted
           "bubble_ratio": 0.1 if step == 0 else 0.3, "makespan_s": 3.0 if step == 0 else 1.0}
    if spec:
        rec.update({"spec/steps": 50.0, "spec/tokens": 200.0, "spec/drafted": 300.0, "spec/accepted": 150.0})
        if step == 0:
            rec["spec/history_build_s"] = 0.5
    return rec


def run(arm: str, seed: int, rollouts: list[float], acc: float = 0.5, steps: int = 2) -> dict:
    """A saved run: one epoch per entry of `rollouts` (each step that long), epoch wall = steps + 1 s."""
    history, walls = [], {}
    for e, r in enumerate(rollouts):
        recs = [record(e, s, e * steps + s, r, acc, spec=arm == "rhymerl") for s in range(steps)]
        history += recs
        walls[str(e)] = sum(x["wall_s"] for x in recs) + recs[0].get("spec/history_build_s", 0.0) + 1.0
    return {"arm": arm, "seed": seed, "history": history, "epoch_wall_s": walls, "run_id": f"{arm}-{seed}",
            "config": {"rollout": {"n": 10, "max_tokens": 40, "prompts_per_step": 1}, "spec": {"history_epochs": 4}},
            "loadavg_start": [1.0, 1.0, 1.0]}


def test_step_split_dispatch_is_wall_minus_every_timed_part() -> None:
    # parts: 0.1+4+0.2+0.1+2+0.1+0.2+0.05+0.15 = 6.9 of a 7.0 s wall -> 0.1 s dispatch
    s = step_split(record(0, 0, 0, rollout=4.0))
    assert s["dispatch_s"] == pytest.approx(0.1) and s["wall_s"] == 7.0


def test_the_benchmarks_own_recording_leaves_step_and_epoch_wall_time() -> None:
    # Rule: recorder_s (the CPU recording between a step's timed parts) is the instrument's cost:
    # out of the step's wall (so out of dispatch) and out of the epoch's wall (so out of the flow).
    r = run("baseline", 0, [4.0])
    plain = epoch_rows(r)[0]
    for rec in r["history"]:
        rec["recorder_s"], rec["wall_s"] = 0.1, rec["wall_s"] + 0.1
    r["epoch_wall_s"]["0"] += 0.2
    row = epoch_rows(r)[0]
    assert step_split(r["history"][0])["dispatch_s"] == pytest.approx(0.1)
    assert row["wall_s"] == pytest.approx(plain["wall_s"]) and row["flow_s"] == pytest.approx(plain["flow_s"])
    assert row["overhead_s"] == pytest.approx(plain["overhead_s"])


def test_per_worker_history_counts_the_query_once_and_each_steps_publishing() -> None:
    # Records with per-worker bundles: the epoch's query (0.3 s, before the steps) and each step's
    # publishing (history_s 0.05 s, inside the step) are the index; the rest of the split is unchanged.
    r = run("rhymerl", 0, [4.0])
    for rec in r["history"]:
        rec.pop("spec/history_build_s", None)
        rec["history_s"], rec["wall_s"] = 0.05, rec["wall_s"] + 0.05
        rec["spec/history_build_s"] = 0.01  # cutting the bundles: inside plan_s, not counted again
    r["history"][0]["spec/history_query_s"] = 0.3
    r["epoch_wall_s"]["0"] = sum(x["wall_s"] for x in r["history"]) + 0.3 + 1.0
    row = epoch_rows(r)[0]
    assert row["index_s"] == pytest.approx(0.3 + 2 * 0.05) and row["flow_s"] == pytest.approx(1.0)
    assert step_split(r["history"][1])["dispatch_s"] == pytest.approx(0.1)
    assert sum(row[k] for k in SPLIT) == pytest.approx(row["wall_s"])


def test_epoch_rows_flow_overhead_acceptance_bubble() -> None:
    row = epoch_rows(run("rhymerl", 0, [4.0]))[0]
    # epoch wall 2 x 7 + 0.5 index + 1.0 -> flow 1.0; overhead = 2 x (0.1+0.1+0.2+0.05+0.15+0.1) + 1.0
    assert row["wall_s"] == pytest.approx(15.5) and row["flow_s"] == pytest.approx(1.0)
    assert row["index_s"] == 0.5 and row["overhead_s"] == pytest.approx(2.4)
    assert row["overhead_frac"] == pytest.approx(2.4 / 15.5)
    assert row["accepted_len"] == 4.0 and row["acceptance_rate"] == 0.5  # 400/100 steps; 300/600 drafted
    assert row["bubble_ratio"] == pytest.approx((0.1 * 3 + 0.3 * 1) / 4)  # makespan-weighted
    assert row["rollout_tokens_per_s"] == pytest.approx(400 / 8.0)
    assert epoch_rows(run("baseline", 0, [4.0]))[0]["accepted_len"] == 1.0  # no speculation


def test_compare_speedups_and_ratios_per_epoch_and_from_epoch_2() -> None:
    runs = [run("baseline", s, [8.0, 8.0, 8.0]) for s in (0, 1)] + \
           [run("rhymerl", s, [8.0, 4.0, 2.0]) for s in (0, 1)]
    cmp = compare(runs)
    e2 = cmp["epochs"][2]
    # epoch 2 wall: baseline 2 x 11 + 1 = 23; RhymeRL 2 x 5 + 0.5 + 1 = 11.5
    assert e2["speedup"]["per_seed"] == pytest.approx([2.0, 2.0])
    assert e2["rollout_s"]["ratio"] == pytest.approx(0.25)
    assert cmp["overall"]["epochs"] == [2]
    assert cmp["overall"]["speedup_rollout"]["mean"] == pytest.approx(4.0)
    assert cmp["overall"]["wall_s"]["ratio"] == pytest.approx(0.5)
    # a crashed run (epoch 2 missing) is left out of the overall totals, kept per epoch
    partial = runs + [run("rhymerl", 2, [8.0, 4.0])]
    assert compare(partial)["overall"]["wall_s"]["rhymerl"]["n"] == 2
    assert compare(partial)["epochs"][1]["wall_s"]["rhymerl"]["n"] == 3


def test_permutation_test_is_exact_for_three_seeds() -> None:
    # fully separated 3 vs 3: 2 of the C(6,3) = 20 relabellings are as extreme -> p = 0.1
    assert permutation_pvalue([0.0, 0.0, 0.0], [1.0, 1.0, 1.0]) == pytest.approx(0.1)
    assert permutation_pvalue([0.1, 0.2, 0.3], [0.1, 0.2, 0.3]) == pytest.approx(1.0)
    # larger samples reject: 8 vs 8 separated -> 2 / C(16,8) ~ 1.6e-4
    assert permutation_pvalue([0.0] * 8, [1.0] * 8) < 0.001


def test_parity_within_and_outside_seed_noise() -> None:
    base = [run("baseline", s, [4.0], acc=a) for s, a in enumerate((0.50, 0.52, 0.48))]
    close = [run("rhymerl", s, [2.0], acc=a) for s, a in enumerate((0.51, 0.49, 0.50))]
    far = [run("rhymerl", s, [2.0], acc=a) for s, a in enumerate((0.70, 0.71, 0.69))]
    p = parity(base + close)
    assert p["parity"] is True and p["p_value"] >= 0.05 and p["smallest_p"] == pytest.approx(0.1)
    q = parity(base + far)
    assert q["parity"] is False and q["diff"] == pytest.approx(0.2)  # 0.2 > 2 SE (~0.025)
    assert parity(base[:1] + close[:1])["parity"] is None  # one seed: no test


def test_scale_estimate_rules() -> None:
    assert amdahl(2.0, 0.5) == pytest.approx(1 / 0.75)
    # no accepted drafts and free verification: speculation changes nothing
    arms = simulate_arms(ScaleSettings(accepted_len=1.0, workers=4, prompts_per_worker=4, verify_overhead=0.0))
    assert arms["histospec"]["makespan_s"] == pytest.approx(arms["baseline"]["makespan_s"])
    faster = simulate_arms(ScaleSettings(accepted_len=3.0, workers=4, prompts_per_worker=4))
    assert faster["rhymerl"]["makespan_s"] < faster["histopipe"]["makespan_s"] < faster["baseline"]["makespan_s"]


def test_scale_estimate_with_a_surface_runs_the_goodput_rule() -> None:
    from rhymerl.histopipe.cost_surface import CostSurface

    def surface(base_s: float, token_s: float) -> CostSurface:
        return CostSurface(model="m", device="d", base_s=base_s, token_s=token_s, kv_s=0.0, attn_s=0.0,
                           points=4, r2=1.0, max_rel_err=0.0)

    spec = ScaleSettings(accepted_len=3.0, workers=4, prompts_per_worker=4, position_accepted=(5.0, None, 2.0, None))
    # verification free: every draft kept at every batch, the same as fixed drafts, and faster than plain
    free = estimate(surface_settings(spec, surface(0.01, 0.0), 6.0))
    assert all(r["draft_len"] == 6 for r in free["controller"]["rows"])
    assert free["arms"]["rhymerl"]["makespan_s"] == pytest.approx(free["arms"]["rhymerl_fixed"]["makespan_s"])
    assert free["arms"]["histospec"]["rollout_speedup"] > 2.0
    # each token as dear as a one-request step: speculation off everywhere, plain decoding's time
    # exactly, where verifying every draft is slower than plain
    dear = estimate(surface_settings(spec, surface(0.0, 1e-3), 6.0))
    assert all(r["off"] for r in dear["controller"]["rows"] + dear["controller"]["by_position"]["pos0_100"]["rows"])
    assert dear["arms"]["histospec"]["makespan_s"] == pytest.approx(dear["arms"]["baseline"]["makespan_s"])
    assert dear["arms"]["rhymerl_fixed"]["makespan_s"] > dear["arms"]["histopipe"]["makespan_s"]
    assert sorted(dear["controller"]["by_position"]) == ["pos0_100", "pos300_1000"]  # the measured buckets
    with pytest.raises(ValueError, match="drafted"):
        replace(spec, surface=surface(0.01, 0.0))


def test_position_mix_weighs_buckets_by_their_verification_steps() -> None:
    from bench.e2e.scale import position_mix

    spec = ScaleSettings(accepted_len=3.0, drafted=4.0, position_accepted=(5.0, None, 2.0, None))
    q, weights = position_mix(spec, [1200])
    # 100 / 200 / 700 / 200 tokens at 5, 5 (the bucket before), 2, 2 (the bucket before) per verification
    assert weights.tolist() == pytest.approx([20.0, 40.0, 350.0, 100.0])
    assert q.shape == (4, 4) and q[0].sum() == pytest.approx(4.0) and q[2].sum() == pytest.approx(1.0)
    pooled, one = position_mix(replace(spec, position_accepted=()), [1200])
    assert one.tolist() == [1.0] and pooled[0].sum() == pytest.approx(2.0)  # no positions: the pooled means


def test_streamed_training_estimate_rules() -> None:
    spec = ScaleSettings(accepted_len=3.0, workers=4, prompts_per_worker=4)
    arms = simulate_arms(spec)
    base = arms["baseline"]
    # training is train_share of the baseline step (batch path); streaming leaves only a tail of it
    assert base["train_batch_s"] == pytest.approx(spec.train_share * base["makespan_s"] / spec.rollout_share)
    for arm in arms.values():
        assert 0.0 <= arm["train_tail_s"] < arm["train_batch_s"]
        assert streamed_step_speedup(arm, base["makespan_s"], spec) > amdahl(
            base["makespan_s"] / arm["makespan_s"], spec.rollout_share)
    # nothing to train: streaming changes nothing
    free = replace(spec, train_share=0.0)
    row = simulate_arms(free)["rhymerl"]
    assert streamed_step_speedup(row, base["makespan_s"], free) == pytest.approx(
        amdahl(base["makespan_s"] / row["makespan_s"], free.rollout_share))
    with pytest.raises(ValueError, match="train_share"):
        ScaleSettings(accepted_len=2.0, rollout_share=0.95, train_share=0.1)


def spec_for(out: Path, seeds: int = 3) -> E2ESettings:
    return E2ESettings(config="configs/default.toml", seeds=tuple(range(seeds)), epochs=3, prompts=8, workers=2,
                       overrides=("rollout.n=4",), out=str(out))


def test_report_files_from_synthetic_runs(tmp_path: Path) -> None:
    runs = [run("baseline", s, [8.0, 8.0, 8.0], acc=0.5 + 0.01 * s) for s in range(3)] + \
           [run("rhymerl", s, [8.0, 4.0, 2.0], acc=0.51 - 0.01 * s) for s in range(3)]
    report = write_report(runs, spec_for(tmp_path), {"workers": 4, "max_tokens": 8192})
    md = (tmp_path / "REPORT.md").read_text()
    for png in ("speedup.png", "time_split.png", "acceptance.png", "bubble.png", "reward_curves.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG" and f"({png})" in md
    assert "Step-time speed-up 2.00x" in md and "permutation p" in md and "Cluster-scale estimate" in md
    assert "## CPU seconds per process and part of the step" in md  # runs without CPU records say so
    saved = json.loads((tmp_path / "e2e.json").read_text())
    assert saved["targets"]["step_speedup"]["met"] is False  # 2.0 < 2.6
    assert saved["targets"]["train_ratio"]["met"] is True  # same train time in both arms
    assert saved["targets"]["tail_shorter"]["met"] is False  # no tail recorded: nan
    assert "train time RhymeRL / baseline within ±5%" in md
    # baseline epoch 2: 16 s of rollout in a 23 s epoch -> a free rollout gives at most 23 / 7
    assert saved["targets"]["step_speedup"]["ceiling_if_rollout_free"] == pytest.approx(23 / 7)
    assert saved["scale"]["spec"]["accepted_len"] == 4.0
    assert "speed-up 2.00x" in format_text(report)
    assert build_report([], spec_for(tmp_path), {})["runs"] == []  # nothing finished yet: still a report
    assert "No position counts in these runs" in md  # synthetic records carry none


def test_tokens_per_verification_by_response_position_pools_seeds(tmp_path: Path) -> None:
    runs = [run("baseline", s, [8.0, 8.0]) for s in range(2)] + [run("rhymerl", s, [8.0, 4.0]) for s in range(2)]
    for r in runs[2:]:
        for rec in r["history"]:
            if rec["epoch"] == 1:  # per step: 30 steps under 100 tokens (60 tokens), 10 past 1,000 (70)
                rec.update({"spec/steps_pos0_100": 30.0, "spec/tokens_pos0_100": 60.0,
                            "spec/steps_pos1000_inf": 10.0, "spec/tokens_pos1000_inf": 70.0})
    rows = by_position(runs)
    assert [r["epoch"] for r in rows] == [1]  # epoch 0 recorded no positions
    assert rows[0]["steps"] == [120.0, 0.0, 0.0, 40.0]  # 2 seeds x 2 steps
    tpv = rows[0]["tokens_per_verify"]
    assert tpv[0] == pytest.approx(2.0) and tpv[3] == pytest.approx(7.0)
    assert math.isnan(tpv[1]) and rows[0]["step_share"][3] == pytest.approx(0.25)
    write_report(runs, spec_for(tmp_path), {"workers": 4, "max_tokens": 8192})
    md = (tmp_path / "REPORT.md").read_text()
    assert "| 1 | 2.00 (75%) | n/a | n/a | 7.00 (25%) |" in md


def test_run_plan_alternates_arms_and_resume_keeps_matching_runs(tmp_path: Path) -> None:
    assert run_order((0, 1)) == [(0, "baseline"), (0, "rhymerl"), (1, "rhymerl"), (1, "baseline")]
    sets = run_overrides(spec_for(tmp_path), "baseline", 1)
    assert sets[-2:] == list(ARMS["baseline"]) and "seed=1" in sets and "rollout.n=4" in sets
    spec = spec_for(tmp_path, seeds=1)
    (tmp_path / "runs").mkdir()
    saved = run("baseline", 0, [4.0])
    (tmp_path / "runs" / "baseline-s0.json").write_text(json.dumps({**saved, "settings": spec.settings()}))
    other = {**saved, "arm": "rhymerl", "settings": {**spec.settings(), "epochs": 99}}
    (tmp_path / "runs" / "rhymerl-s0.json").write_text(json.dumps(other))
    assert [r["arm"] for r in load_runs(spec)] == ["baseline"]  # other settings: not reused


def _started(setup: str) -> subprocess.Popen:
    """A Python child that sleeps inside try/finally, once it has printed 'up'."""
    code = (f"{setup}\ntry:\n    print('up', flush=True)\n    time.sleep(60)\n"
            f"finally:\n    print('cleaned up', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


def test_stop_interrupts_then_terminates_then_kills() -> None:
    # SIGINT: KeyboardInterrupt, the finally block runs, then Python exits by SIGINT (-2)
    # (explicit handler: a child started from a background shell inherits SIGINT ignored, and
    # Python then installs no KeyboardInterrupt handler: a real run then gets SIGTERM after the grace)
    polite = _started("import signal, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)")
    _stop(polite, grace_s=30)
    assert polite.returncode == -2 and polite.stdout.read().strip() == "cleaned up"
    deaf = _started("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)")
    _stop(deaf, grace_s=0.5)
    assert deaf.returncode == -15 and deaf.stdout.read() == ""  # SIGTERM after the grace period
    stubborn = _started("import signal, time\nfor s in (signal.SIGINT, signal.SIGTERM): signal.signal(s, signal.SIG_IGN)")
    _stop(stubborn, grace_s=0.5)
    assert stubborn.returncode == -9  # SIGKILL last


@pytest.mark.slow
@pytest.mark.bench  # ~3 min: `make bench` runs it, `make test` does not
def test_bench_e2e_quick_smoke(tmp_path: Path, tiny_model: Path) -> None:
    """Both arms for real (vLLM, Ray, Prefect), tiny: 2 epochs x 8 prompts x n=4, one seed.

    The session's barely trained test model stands in for the built-in one (whose build would
    cost minutes here): its responses rhyme little, so epoch 1 only has to show speculation on and
    accepting some drafts in the rhymerl arm; the acceptance the real model reaches is the
    benchmark's business (README, bench/results)."""
    out = tmp_path / "e2e"
    cmd = [sys.executable, "-m", "cli.main", "bench", "e2e", "--quick", "--epochs", "2", "--prompts", "8",
           "--out", str(out), "--json", "--scale-workers", "4",
           "--set", "rollout.n=4", "rollout.prompts_per_step=8", "rollout.max_tokens=64", "pipe.gantt=false",
           f'model.path="{tiny_model}"']
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    (tmp_path / "bench.stderr").write_text(res.stderr)  # progress, and a failed run's last log lines
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    assert sorted(r["arm"] for r in report["runs"]) == ["baseline", "rhymerl"]
    epochs = report["compare"]["epochs"]
    assert [e["epoch"] for e in epochs] == [0, 1]
    assert epochs[1]["accepted_len"]["baseline"]["mean"] == 1.0  # no speculation in the baseline
    assert epochs[1]["accepted_len"]["rhymerl"]["mean"] > 1.0  # epoch 1 drafts from epoch 0's responses
    for e in epochs:  # every part measured, dispatch small and the split adds up to the wall time
        for arm in ("baseline", "rhymerl"):
            assert e["rollout_s"][arm]["mean"] > 0 and e["train_s"][arm]["mean"] > 0
            assert 0 < e["overhead_frac"][arm]["mean"] < 1
    assert (out / "REPORT.md").is_file() and (out / "runs" / "rhymerl-s0.json").is_file()
    # CPU per process and part: every process kind of the run is found and spends CPU
    for arm in ("baseline", "rhymerl"):
        cpu = report["cpu"]["arms"][arm]["cpu"]
        for name in ("flow", "rollout worker 0", "rollout worker 1", "engine core 0", "engine core 1", "trainer"):
            assert sum(cpu[name].values()) > 0, (arm, name, sorted(cpu))
        assert cpu["trainer"]["train"] > 0 and cpu["engine core 0"]["rollout"] > 0
    assert "## CPU seconds per process and part of the step" in (out / "REPORT.md").read_text()


def test_scale_estimate_takes_a_measured_cost_surface(tmp_path: Path) -> None:
    from rhymerl.histopipe.cost_surface import FORMAT

    # seconds = 10 ms + 0.1 ms per new token, no attention term: cost 10 ms + 0.1 ms per request
    points = [{"batch": b, "query": q, "context": c, "seconds": 0.01 + 1e-4 * b * q}
              for b in (1, 64) for q in (1, 4) for c in (256, 1024)]
    path = tmp_path / "surface.json"
    path.write_text(json.dumps({"format": FORMAT, "device": "GPU X", "models": {"m": {"points": points}}}))
    runs = [run("baseline", 0, [8.0, 8.0, 8.0]), run("rhymerl", 0, [8.0, 4.0, 2.0])]
    scale = {"workers": 4, "max_tokens": 8192, "cost_json": str(path)}
    report = write_report(runs, spec_for(tmp_path, seeds=1), scale)
    s = report["scale"]["spec"]
    assert s["cost_source"] == "m on GPU X" and s["cost"]["per_seq_s"] == pytest.approx(1e-4)
    # 4 tokens per step at acceptance 0.5 -> 6 drafted -> 7 tokens per sequence at batch 128:
    # (0.01 + 0.0896) / (0.01 + 0.0128) - 1
    assert s["verify_overhead"] == pytest.approx(0.0996 / 0.0228 - 1, abs=1e-3)
    assert "measured decode-step surface of m on GPU X" in (tmp_path / "REPORT.md").read_text()


def test_prefect_client_retries_are_kept_and_its_other_debug_records_dropped() -> None:
    import logging

    from bench.e2e.bench import PrefectRetries

    client = logging.getLogger("prefect.client")
    level = client.level
    retries = PrefectRetries().install()
    try:
        client.debug("Encountered retryable exception during request. Another attempt will be made in 2.1s.")
        client.debug("Connecting to API at http://127.0.0.1:1234/api/")
        assert [r["message"][:33] for r in retries.seen] == ["Encountered retryable exception d"]
        assert retries.filter(logging.makeLogRecord({"levelno": logging.DEBUG, "msg": "other"})) is False
        assert retries.filter(logging.makeLogRecord({"levelno": logging.WARNING, "msg": "x"})) is True
    finally:
        client.removeFilter(retries)
        client.setLevel(level)


def test_the_long_tail_task_is_held_to_its_own_targets(tmp_path: Path) -> None:
    # Rule (issue 19): on builtin-long, step >= 1.6x, rollout >= 2.0x, rollout >= 70% of the baseline step.
    runs = [run("baseline", s, [8.0, 8.0, 8.0]) for s in range(2)] + [run("rhymerl", s, [8.0, 4.0, 3.0]) for s in range(2)]
    for r in runs:
        r["config"]["data"] = {"dataset": "builtin-long"}
    report = write_report(runs, spec_for(tmp_path, seeds=2), {"workers": 4, "max_tokens": 8192})
    t = report["targets"]
    # epoch 2: baseline 8 + 8 s rollout in a 23 s epoch, RhymeRL 3 + 3 s in 13.5 s (its 0.5 s history)
    assert t["step_speedup"]["target"] == 1.6 and t["step_speedup"]["measured"] == pytest.approx(23 / 13.5)
    assert t["step_speedup"]["met"] is True
    assert t["rollout_speedup"] == {"target": 2.0, "measured": pytest.approx(8 / 3), "met": True}
    assert t["rollout_share"]["measured"] == pytest.approx(16 / 23) and t["rollout_share"]["met"] is False
    md = (tmp_path / "REPORT.md").read_text()
    assert "| rollout >= 70% of the baseline's step | 70% | **no** |" in md and "rollout >= 2.0x" in md
    default = write_report(runs[:1] + runs[2:3], spec_for(tmp_path, seeds=1), {"workers": 4, "max_tokens": 8192})
    assert default["targets"]["step_speedup"]["target"] == 1.6  # the runs' dataset decides, not the file name
