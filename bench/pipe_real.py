"""`rhymerl bench pipe --check` / `--real`: HistoPipe's simulator checked against runs in a lake.

`check_lake` fits the cost model on a run's even global steps and replays each odd step's real
requests through the simulator (`rhymerl.histopipe.validate`); `real_runs` compares real runs'
bubble ratios with the oracle placement's. Split from `bench/pipe_bench.py` (the synthetic sweep).
"""

from __future__ import annotations

import json
from dataclasses import asdict

from rhymerl.histopipe.costmodel import calibrate
from rhymerl.histopipe.validate import RunCheck, check_rows, check_run, oracle_gap
from storage.lake import Lake


CHECK_ROWS_SQL = ("SELECT epoch, step, prompt_id, sample_idx, worker_id, gen_start, gen_end, length "
                  "FROM rollouts WHERE run_id = ?")
CHECK_SPEC_SQL = ("SELECT count(*) AS steps, any_value(spec_method) AS method FROM steps "
                  "WHERE run_id = ? AND spec_method IS NOT NULL")
CHECK_CONFIG_SQL = "SELECT config_json FROM runs WHERE run_id = ?"


def check_lake(url: str, run_id: str, capacity: int = 256, fit: str = "even", warmup: int = 0) -> RunCheck:
    """The simulator check of one run in the lake at `url` (see `rhymerl.histopipe.validate`)."""
    with Lake(url) as lake:
        rows = lake.sql(CHECK_ROWS_SQL, [run_id]).to_pylist()
        spec = lake.sql(CHECK_SPEC_SQL, [run_id]).to_pylist()[0]
        config = lake.sql(CHECK_CONFIG_SQL, [run_id]).to_pylist()
    if not rows:
        raise ValueError(f"no rollouts of run {run_id!r} in lake {url}; list its runs with "
                         f"`rhymerl lake summary --lake {url}`")
    cfg = json.loads(config[0]["config_json"]) if config else {}
    # steps.spec_method is NULL in lakes written before it existed, so the run's config counts too
    if spec["steps"] or cfg.get("spec", {}).get("enabled"):
        used = f"{spec['method']} on {spec['steps']} steps" if spec["steps"] else "spec.enabled=true in its config"
        raise ValueError(f"run {run_id} used speculative decoding ({used}); the cost model has one token per "
                         f"engine iteration, so check a run made with --set spec.enabled=false")
    if cfg.get("pipe", {}).get("migrate"):
        raise ValueError(f"run {run_id} used straggler migration (pipe.migrate=true): the check replays each "
                         "worker's requests where they started, so check a run made without pipe.migrate")
    workers = cfg["rollout"]["num_workers"] if "rollout" in cfg else None
    return check_run(rows, capacity=capacity, workers=workers, fit=fit, warmup=warmup)


def check_record(check: RunCheck, url: str, run_id: str) -> dict:
    """JSON-ready record of a check: the fitted cost model, every step and the summary."""
    cal = check.calibration
    return {"lake": url, "run_id": run_id, "workers": check.workers, "fit": check.fit,
            "fit_steps": list(check.fit_steps), "warmup": check.warmup,
            "calibration": {**asdict(cal.cost), "requests": cal.requests, "groups": cal.groups,
                            "rms_s": cal.rms_s, "r2": cal.r2},
            "steps": [asdict(s) for s in check.steps],
            "mean_abs_error": check.mean_abs_error, "max_abs_error": check.max_abs_error,
            "within_15pct": check.within(0.15)}


def format_check(rec: dict) -> str:
    """Per-step table of measured vs simulated makespan and bubble ratio, then the summary."""
    c = rec["calibration"]
    lines = [f"simulator check: run {rec['run_id']} (W={rec['workers']}, capacity {c['capacity']}); cost model "
             f"fitted on global steps {','.join(map(str, rec['fit_steps']))} "
             f"(first {rec['warmup']} left out; {c['requests']} requests, "
             f"R2 {c['r2']:.3f}, rms {c['rms_s']:.2f} s): {1e3 * c['base_s']:.2f} ms/iteration + "
             f"{1e3 * c['per_seq_s']:.4f} ms/running request, startup {c['startup_s']:.2f} s",
             f"{'epoch':>5} {'step':>4} {'g':>3} {'reqs':>5} {'measured s':>10} {'simulated s':>11} {'error':>7} "
             f"{'bubble meas':>11} {'bubble sim':>10} {'start skew s':>12}"]
    for s in rec["steps"]:
        lines.append(f"{s['epoch']:>5} {s['step']:>4} {s['global_step']:>3} {s['requests']:>5} "
                     f"{s['measured_s']:>10.2f} {s['simulated_s']:>11.2f} {100 * s['error']:>6.1f}% "
                     f"{100 * s['bubble_measured']:>10.1f}% {100 * s['bubble_simulated']:>9.1f}% "
                     f"{s['start_skew_s']:>12.2f}")
    lines.append(f"makespan error: mean |error| {100 * rec['mean_abs_error']:.1f}%, max |error| "
                 f"{100 * rec['max_abs_error']:.1f}%; every checked step within 15%: {rec['within_15pct']}")
    return "\n".join(lines)


REAL_STEPS_SQL = ("SELECT count(*) AS steps, avg(bubble_ratio) AS bubble_mean, median(bubble_ratio) AS bubble_median, "
                  "avg(makespan_s) AS makespan_mean_s, avg(rollout_s) AS rollout_mean_s, "
                  "CAST(sum(coalesce(migrations, 0)) AS BIGINT) AS migrations, avg(reward_s) AS reward_mean_s, "
                  "avg(reward_total_s) AS reward_total_mean_s, avg(tokens) AS tokens_mean "
                  "FROM steps WHERE run_id = ? AND epoch >= ?")


def _real_oracle(lake: Lake, run_id: str, cfg: dict, from_epoch: int, capacity: int) -> float | None:
    """Mean over the run's steps (epochs >= from_epoch) of simulated(its placement) /
    simulated(oracle) - 1, with the cost model fitted on those steps; None where a replay cannot
    stand for the run (speculation changes tokens per iteration; migration moves requests)."""
    if cfg.get("spec", {}).get("enabled") or cfg.get("pipe", {}).get("migrate"):
        return None
    rows = [r for r in lake.sql(CHECK_ROWS_SQL, [run_id]).to_pylist() if r["epoch"] >= from_epoch]
    if not rows:  # a steps table without rollouts (nothing to replay)
        return None
    rows = check_rows(rows)
    by_step: dict[tuple[int, int], list] = {}
    for r in rows:
        by_step.setdefault((int(r["epoch"]), int(r["step"])), []).append(r)
    cal = calibrate(rows, capacity)
    gaps = [oracle_gap(by_step[k], cal, cfg["rollout"]["num_workers"]).gap for k in sorted(by_step)]
    return sum(gaps) / len(gaps)


def real_runs(url: str, run_ids: list[str], from_epoch: int = 1, capacity: int = 256) -> list[dict]:
    """One summary row per run (see the module docstring), from the lake at `url`."""
    out = []
    with Lake(url) as lake:
        for run_id in run_ids:
            config = lake.sql(CHECK_CONFIG_SQL, [run_id]).to_pylist()
            row = lake.sql(REAL_STEPS_SQL, [run_id, from_epoch]).to_pylist()[0]
            if not config or not row["steps"]:
                raise ValueError(f"run {run_id!r} has no config or no steps from epoch {from_epoch} in lake {url}; "
                                 f"list its runs with `rhymerl lake summary --lake {url}`")
            cfg = json.loads(config[0]["config_json"])
            pipe, rollout = cfg.get("pipe", {}), cfg["rollout"]
            out.append({"run_id": run_id, "policy": pipe.get("policy", "lpt"), "migrate": bool(pipe.get("migrate")),
                        "workers": rollout["num_workers"], "prompts_per_step": rollout["prompts_per_step"],
                        "n": rollout["n"], "spec": bool(cfg.get("spec", {}).get("enabled")),
                        "from_epoch": from_epoch, **row,
                        "vs_oracle_sim": _real_oracle(lake, run_id, cfg, from_epoch, capacity)})
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def format_real(rows: list[dict]) -> str:
    """The real-run rows as a table."""
    width = max([3] + [len(r["run_id"]) for r in rows])
    head = (f"{'run':<{width}} {'policy':<11} {'migrate':<7} {'W':>2} {'steps':>5} {'bubble mean':>11} "
            f"{'bubble med':>10} {'makespan s':>10} {'rollout s':>9} {'moved':>5} {'reward s':>8} {'reward tot s':>12} "
            f"{'vs oracle':>9}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['run_id']:<{width}} {r['policy']:<11} {str(r['migrate']).lower():<7} {r['workers']:>2} "
                     f"{r['steps']:>5} {100 * r['bubble_mean']:>10.1f}% {100 * r['bubble_median']:>9.1f}% "
                     f"{r['makespan_mean_s']:>10.2f} {r['rollout_mean_s']:>9.2f} {int(r['migrations']):>5} "
                     f"{r['reward_mean_s']:>8.3f} {(r['reward_total_mean_s'] or 0):>12.4f} "
                     f"{_pct(r['vs_oracle_sim']):>9}")
    return "\n".join(lines)
