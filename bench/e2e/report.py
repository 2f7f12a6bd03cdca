"""The end-to-end benchmark's report: JSON (`OUT/e2e.json`), Markdown (`OUT/REPORT.md`), PNG plots.

`build_report(runs, spec, scale)` is pure (numbers only); `write_report` adds the files. Numbers
come from `bench.e2e.analysis`; the cluster-scale estimate from `bench.e2e.scale`.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Sequence

from bench.e2e.analysis import by_position, compare, parity
from bench.e2e.cpu import cpu_table
from bench.e2e.format import SPLIT_LABELS, mean_sd, num
from bench.e2e.markdown import markdown
from bench.e2e.scale import ScaleSettings, estimate, surface_settings
from rhymerl.histopipe.cost_surface import load_cost_surface
from rhymerl.histospec.stats import position_labels

# Targets: step speed-up, fixed overhead and train-time parity, and the tail shorter by a factor
# (meant for configs/long-tail.toml).
STEP_TARGET, OVERHEAD_TARGET, TRAIN_TOLERANCE, TAIL_TARGET = 2.6, 0.05, 0.05, 3.0
# The long-tail workload's own: step >= 1.6x, rollout >= 2.0x, rollout >= 70% of the baseline step.
WORKLOAD_TARGETS = {"builtin-long": {"step": 1.6, "rollout": 2.0, "rollout_share": 0.7}}


def machine() -> str:
    """CPU model and core count (the report's 'where'; the benchmark itself runs on CPU engines)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def git_commit() -> str:
    """The measured code's commit (with '+dirty' for local changes), '' outside a git checkout."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return head + ("+dirty" if head and dirty else "")


def build_report(runs: Sequence[dict], spec, scale: dict) -> dict:
    """Everything the benchmark reports, JSON-able; `spec` is the bench's E2ESettings."""
    cmp = compare(runs) if runs else {"epochs": [], "overall": {}}
    overall = cmp["overall"]
    report: dict = {
        "bench": "e2e", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
        "commit": ", ".join(sorted({r["commit"] for r in runs if r.get("commit")})) or git_commit(),
        "settings": {"seeds": list(spec.seeds), "epochs": spec.epochs, "prompts": spec.prompts,
                     "workers": spec.workers, "config": spec.config, "overrides": list(spec.overrides),
                     **_run_shape(runs)},
        "runs": [_run_row(r) for r in runs],
        "compare": cmp,
        "parity": {k: parity(runs, k) for k in ("accuracy", "reward_mean")} if runs else {},
        "by_position": by_position(runs),
    }
    cpu_epochs = overall.get("epochs") or sorted({h["epoch"] for r in runs for h in r["history"]})
    report["cpu"] = {"epochs": cpu_epochs, "arms": cpu_table(runs, cpu_epochs)}
    report["scale"] = scale_estimate(cmp, scale, report["by_position"]) if overall.get("rollout_s") else None
    report["targets"] = _targets(report)
    return report


def _run_row(run: dict) -> dict:
    """A run's identity, load and its setup seconds: run wall time minus its epochs (Prefect's
    temporary API, Ray, engine and trainer start-up, model and prompts, closing the run)."""
    row = {k: run.get(k) for k in ("arm", "seed", "run_id", "run_wall_s", "loadavg_start", "loadavg_end")}
    if run.get("run_wall_s") is not None:
        row["setup_s"] = run["run_wall_s"] - sum(float(v) for v in run.get("epoch_wall_s", {}).values())
    return row


def _run_shape(runs: Sequence[dict]) -> dict:
    """n, max_tokens, steps per epoch: from the first run's config."""
    if not runs:
        return {}
    cfg = runs[0]["config"]
    return {"n": cfg["rollout"]["n"], "max_tokens": cfg["rollout"]["max_tokens"],
            "prompts_per_step": cfg["rollout"]["prompts_per_step"],
            "history_epochs": cfg["spec"]["history_epochs"], "dataset": cfg.get("data", {}).get("dataset")}


def scale_estimate(cmp: dict, scale: dict, positions: Sequence[dict] = ()) -> dict | None:
    """The simulator estimate at `scale` with the RhymeRL arm's acceptance from the late epochs;
    `positions` (the report's `by_position`) gives the acceptance per response position, which a
    cost surface's estimate uses (`bench.e2e.scale.position_mix`)."""
    late = [row for row in cmp["epochs"] if row["epoch"] in cmp["overall"]["epochs"]]
    accepted = statistics.fmean(row["accepted_len"]["rhymerl"]["mean"] for row in late)
    base = cmp["overall"]
    share = base["rollout_s"]["baseline"]["mean"] / base["wall_s"]["baseline"]["mean"]
    if accepted <= 1.0:
        return None
    measured = _late_positions(positions, set(cmp["overall"]["epochs"]))
    settings = ScaleSettings(accepted_len=accepted, workers=scale["workers"], max_tokens=scale["max_tokens"],
                             position_accepted=tuple(measured.get(label) for label in position_labels()))
    if scale.get("cost_json"):
        rate = statistics.fmean(row["acceptance_rate"]["rhymerl"]["mean"] for row in late)
        drafted = (accepted - 1.0) / rate if rate > 0 else 0.0  # accepted drafts = accepted_len - bonus token
        surface = load_cost_surface(scale["cost_json"], scale.get("cost_model"))
        settings = surface_settings(settings, surface, drafted)
    return estimate(settings, measured_rollout_share=round(share, 3))


def _late_positions(positions: Sequence[dict], epochs: set) -> dict[str, float]:
    """Tokens per verification per response-position bucket over `epochs`, weighted by steps."""
    steps: dict[str, float] = {}
    tokens: dict[str, float] = {}
    for row in positions:
        if row["epoch"] not in epochs:
            continue
        for bucket, n, tpv in zip(row["buckets"], row["steps"], row["tokens_per_verify"]):
            if n:
                steps[bucket] = steps.get(bucket, 0.0) + n
                tokens[bucket] = tokens.get(bucket, 0.0) + n * tpv
    return {b: tokens[b] / steps[b] for b in steps}


def _targets(report: dict) -> dict:
    """The benchmark's targets, met or not, with the measured value."""
    o = report["compare"]["overall"]
    step = o.get("speedup_wall", {}).get("mean", math.nan)
    over = max(o.get("overhead_frac_baseline", math.nan), o.get("overhead_frac_rhymerl", math.nan))
    acc = report["parity"].get("accuracy", {})
    train = o.get("train_s", {}).get("ratio", math.nan)  # RhymeRL / baseline, same token counts
    tails = o.get("tail_s", {})
    tail = (tails["baseline"]["mean"] / tails["rhymerl"]["mean"]) if tails and tails["rhymerl"]["mean"] else math.nan
    share = (o["rollout_s"]["baseline"]["mean"] / o["wall_s"]["baseline"]["mean"]) if "wall_s" in o else math.nan
    # Amdahl: the step speed-up if the rollout took no time at all, the rest unchanged.
    ceiling = 1.0 / (1.0 - share) if share < 1 else math.inf
    own = WORKLOAD_TARGETS.get(report["settings"].get("dataset"), {})
    step_target = own.get("step", STEP_TARGET)
    extra = {}
    if own:
        rollout = o.get("speedup_rollout", {}).get("mean", math.nan)
        extra = {"rollout_speedup": {"target": own["rollout"], "measured": rollout,
                                     "met": bool(rollout >= own["rollout"])},
                 "rollout_share": {"target": own["rollout_share"], "measured": share,
                                   "met": bool(share >= own["rollout_share"])}}
    return {"step_speedup": {"target": step_target, "measured": step, "met": bool(step >= step_target),
                             "rollout_share_baseline": share, "ceiling_if_rollout_free": ceiling}, **extra,
            "overhead_frac": {"target": OVERHEAD_TARGET, "measured": over, "met": bool(over <= OVERHEAD_TARGET)},
            "train_ratio": {"target": TRAIN_TOLERANCE, "measured": train,
                            "met": bool(abs(train - 1.0) <= TRAIN_TOLERANCE)},
            "tail_shorter": {"target": TAIL_TARGET, "measured": tail, "met": bool(tail >= TAIL_TARGET)},
            "accuracy_parity": {"p_value": acc.get("p_value"), "diff": acc.get("diff"), "met": acc.get("parity")}}


def format_text(report: dict) -> str:
    """The readable table printed to stdout: per epoch and overall, both arms and their ratio."""
    s = report["settings"]
    lines = [f"RhymeRL vs baseline (no HistoSpec, naive placement), {report['date']}, {report['machine']}: "
             f"{len(s['seeds'])} seed(s) x {s['epochs']} epochs x {s['prompts']} prompts, {s['workers']} workers"]
    head = ("epoch", "step s B", "step s R", "speedup", "rollout B", "rollout R", "tok/s B", "tok/s R",
            "acc.len R", "bubble B", "bubble R", "acc B", "acc R", "ovh B", "ovh R")
    rows = [head]
    for e in report["compare"]["epochs"]:
        rows.append((str(e["epoch"]), num(e["wall_s"]["baseline"]["mean"]), num(e["wall_s"]["rhymerl"]["mean"]),
                     num(e["speedup"]["mean"]), num(e["rollout_s"]["baseline"]["mean"]),
                     num(e["rollout_s"]["rhymerl"]["mean"]), num(e["rollout_tokens_per_s"]["baseline"]["mean"], ".0f"),
                     num(e["rollout_tokens_per_s"]["rhymerl"]["mean"], ".0f"), num(e["accepted_len"]["rhymerl"]["mean"]),
                     num(e["bubble_ratio"]["baseline"]["mean"], ".1%"), num(e["bubble_ratio"]["rhymerl"]["mean"], ".1%"),
                     num(e["accuracy"]["baseline"]["mean"], ".3f"), num(e["accuracy"]["rhymerl"]["mean"], ".3f"),
                     num(e["overhead_frac"]["baseline"]["mean"], ".1%"), num(e["overhead_frac"]["rhymerl"]["mean"], ".1%")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows[:1]]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows[1:]]
    o = report["compare"]["overall"]
    if "wall_s" in o:
        lines.append(f"epochs {o['epochs']}: step time {num(o['wall_s']['baseline']['mean'])}s -> "
                     f"{num(o['wall_s']['rhymerl']['mean'])}s, speed-up {num(o['speedup_wall']['mean'])}x "
                     f"(rollout {num(o['speedup_rollout']['mean'])}x); overhead {num(o['overhead_frac_baseline'], '.1%')} "
                     f"/ {num(o['overhead_frac_rhymerl'], '.1%')} of step time")
    for key, p in report["parity"].items():
        lines.append(f"parity {key} (epoch {p.get('epoch')}): RhymeRL - baseline = {num(p.get('diff'), '+.3f')}, "
                     f"p = {num(p.get('p_value'), '.3f')}, parity {p.get('parity')} ({p.get('note', '')})")
    sc = report.get("scale")
    if sc:
        a = sc["arms"]["rhymerl"]
        lines.append(f"scale estimate ({sc['spec']['workers']} workers, {sc['spec']['max_tokens']}-token cap, "
                     f"{num(sc['spec']['accepted_len'])} tok/verify): rollout {num(a['rollout_speedup'])}x, "
                     f"step {num(a['step_speedup'])}x at rollout share {sc['spec']['rollout_share']}; "
                     f"{num(a.get('step_speedup_streamed'))}x with streamed training (trainer on its own GPUs, "
                     f"train share {sc['spec'].get('train_share')})")
    return "\n".join(lines)


def write_report(runs: Sequence[dict], spec, scale: dict) -> dict:
    """Build the report and write OUT/e2e.json, OUT/REPORT.md and the plots; returns the report."""
    from bench.e2e.plots import plot_all  # matplotlib only when a report is written

    out = Path(spec.out)
    report = build_report(runs, spec, scale)
    (out / "e2e.json").write_text(json.dumps(report, indent=2))
    plots = plot_all(runs, report, out) if runs else {}
    (out / "REPORT.md").write_text(markdown(report, plots))
    return report
