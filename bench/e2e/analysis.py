"""The end-to-end benchmark's numbers from runs' per-step records: time split, ratios, parity.

Pure functions over the JSON the benchmark saves per run (`bench.e2e.bench`): a run is
``{"arm", "seed", "history": [step records of flows.step.run_step], "epoch_wall_s": {epoch: s}}``.

Time split of one step (seconds, all measured by `run_step` except the remainder):

- work: rollout, reward, train, weight sync (`sync`);
- system I/O: plan (HistoPipe's DuckDB length query + placement), lake write, measure (bubble
  ratio, Gantt PNG), log (MLflow metrics + the lake's steps row), checkpoint;
- dispatch = the step's wall time minus all of the above: Prefect task start/finish, Ray round
  trips without a timing of their own (spec_stats), Python between tasks.

Per epoch on top: index build = HistoSpec's history: the epoch's history task
(`spec/history_query_s`, the DuckDB query into columns, before the steps) plus each step's
publishing of the workers' bundles (`history_s`, inside the steps; cutting them is in `plan_s`,
prepared during the previous step); and flow = the epoch's wall time minus its steps' wall times
and the history task (the Prefect subflow, the log-epoch task, the history task's own dispatch).
A step's `recorder_s` (the benchmark's CPU recording, `bench.e2e.cpu`, between its timed parts)
is taken out of its wall time and the epoch's: it is the instrument's cost, not the system's.
Records of runs before per-worker bundles carry the epoch's whole bundle in `spec/history_build_s`.
Overhead = system I/O + dispatch + flow: everything that is neither the RL work nor HistoSpec's
index; its fraction is of the epoch's wall time.
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable, Sequence

import numpy as np
from scipy import stats as sstats

from rhymerl.histospec.stats import position_labels
from rhymerl.run.report import epoch_summary

WORK = ("rollout_s", "reward_s", "train_s", "sync_s")
SYSTEM = ("plan_s", "lake_s", "measure_s", "log_s", "checkpoint_s")
SPLIT = WORK + ("index_s",) + SYSTEM + ("dispatch_s", "flow_s")  # adds up to the epoch's wall_s
OVERHEAD = SYSTEM + ("dispatch_s", "flow_s")
TIMES = ("wall_s",) + SPLIT + ("overhead_s", "tail_s")  # tail_s: inside rollout_s, not part of the split
QUALITY = ("reward_mean", "accuracy", "rollout_tokens_per_s", "accepted_len", "acceptance_rate",
           "bubble_ratio", "overhead_frac", "tokens")


def _history_task_s(rec: dict) -> float:
    """Seconds of the epoch's history task a step record carries (its epoch's first step only)."""
    if "history_s" in rec or "spec/history_query_s" in rec:  # per-worker bundles: the query alone
        return float(rec.get("spec/history_query_s", 0.0))
    return float(rec.get("spec/history_build_s", 0.0))  # before: query + the epoch's bundle + shipping


def step_split(rec: dict) -> dict[str, float]:
    """One step's seconds by part; `dispatch_s` is its wall time minus every measured part.

    Records without `wall_s` (older runs) fall back to `step_s`, which ends at weight sync."""
    parts = {k: float(rec.get(k, 0.0)) for k in WORK + SYSTEM}
    wall = float(rec.get("wall_s", rec["step_s"])) - float(rec.get("recorder_s", 0.0))  # the bench's own cost
    parts["dispatch_s"] = wall - sum(parts.values()) - float(rec.get("history_s", 0.0))  # history: index_s
    parts["wall_s"] = wall
    return parts


def epoch_rows(run: dict) -> list[dict]:
    """Per epoch of one run: the time split (sums over steps), throughput, speculation, quality."""
    walls = {int(k): float(v) for k, v in run.get("epoch_wall_s", {}).items()}
    quality = {r["epoch"]: r for r in epoch_summary(run["history"])}
    by_epoch: dict[int, list[dict]] = {}
    for rec in run["history"]:
        by_epoch.setdefault(int(rec["epoch"]), []).append(rec)
    rows = []
    for epoch, recs in sorted(by_epoch.items()):
        splits = [step_split(r) for r in recs]
        row: dict = {"epoch": epoch, "steps": len(recs)}
        for k in WORK + SYSTEM + ("dispatch_s",):
            row[k] = sum(s[k] for s in splits)
        steps_wall = sum(s["wall_s"] for s in splits)
        query_s = sum(_history_task_s(r) for r in recs)
        row["index_s"] = query_s + sum(float(r.get("history_s", 0.0)) for r in recs)
        recorder_s = sum(float(r.get("recorder_s", 0.0)) for r in recs)
        row["wall_s"] = walls[epoch] - recorder_s if epoch in walls else steps_wall + query_s
        row["flow_s"] = row["wall_s"] - steps_wall - query_s
        row["overhead_s"] = sum(row[k] for k in OVERHEAD)
        row["overhead_frac"] = row["overhead_s"] / row["wall_s"] if row["wall_s"] > 0 else 0.0
        row["tail_s"] = sum(float(r.get("tail_s", 0.0)) for r in recs)  # p90 finish -> last, per step
        row["tokens"] = sum(float(r["tokens"]) for r in recs)
        row["rollout_tokens_per_s"] = row["tokens"] / max(row["rollout_s"], 1e-9)
        spec_steps = sum(float(r.get("spec/steps", 0.0)) for r in recs)
        drafted = sum(float(r.get("spec/drafted", 0.0)) for r in recs)
        # Tokens per verification step, bonus token included (1.0 = no speculation).
        row["accepted_len"] = (sum(float(r.get("spec/tokens", 0.0)) for r in recs) / spec_steps
                               if spec_steps else 1.0)
        row["acceptance_rate"] = (sum(float(r.get("spec/accepted", 0.0)) for r in recs) / drafted
                                  if drafted else 0.0)
        spans = [float(r.get("makespan_s", 0.0)) for r in recs]  # bubble weighted by step makespan
        row["bubble_ratio"] = (sum(float(r.get("bubble_ratio", 0.0)) * m for r, m in zip(recs, spans))
                               / sum(spans) if sum(spans) > 0 else 0.0)
        row["reward_mean"] = quality[epoch]["reward_mean"]
        row["accuracy"] = quality[epoch]["accuracy"]
        rows.append(row)
    return rows


def _mean_sd(values: Sequence[float]) -> dict:
    vals = [float(v) for v in values]
    return {"mean": statistics.fmean(vals), "sd": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "min": min(vals), "max": max(vals), "n": len(vals)}


def arm_epochs(runs: Iterable[dict], arm: str) -> dict[int, dict[str, list[float]]]:
    """epoch -> metric -> one value per seed of `arm` (seed order)."""
    out: dict[int, dict[str, list[float]]] = {}
    for run in sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"]):
        for row in epoch_rows(run):
            cell = out.setdefault(row["epoch"], {})
            for k in TIMES + QUALITY:
                cell.setdefault(k, []).append(row[k])
    return out


def paired_speedups(runs: Sequence[dict], epochs: Sequence[int], key: str = "wall_s") -> list[float]:
    """Per seed that both arms finished: baseline seconds / RhymeRL seconds over `epochs`."""
    by = {(r["arm"], r["seed"]): {row["epoch"]: row for row in epoch_rows(r)} for r in runs}
    out = []
    for seed in sorted({s for a, s in by if a == "baseline"} & {s for a, s in by if a == "rhymerl"}):
        b, r = by["baseline", seed], by["rhymerl", seed]
        if all(e in b and e in r for e in epochs):  # a crashed run that stops short is left out
            out.append(sum(b[e][key] for e in epochs) / sum(r[e][key] for e in epochs))
    return out


def compare(runs: Sequence[dict]) -> dict:
    """Per epoch and overall: both arms' mean/sd over seeds and RhymeRL/baseline ratios.

    `ratio` = RhymeRL mean / baseline mean (< 1 for a time means RhymeRL is faster); `speedup`
    = baseline / RhymeRL step time. Overall covers epochs >= 2 (speculation has history from
    epoch 1, a full window from 2: the issue's "from epoch 2 on"), or every epoch of a shorter run."""
    arms = {a: arm_epochs(runs, a) for a in ("baseline", "rhymerl")}
    epochs = sorted(set(arms["baseline"]) & set(arms["rhymerl"]))
    per_epoch = []
    for e in epochs:
        row: dict = {"epoch": e}
        for k in TIMES + QUALITY:
            b, r = _mean_sd(arms["baseline"][e][k]), _mean_sd(arms["rhymerl"][e][k])
            row[k] = {"baseline": b, "rhymerl": r,
                      "ratio": r["mean"] / b["mean"] if b["mean"] else math.nan}
        seeds = paired_speedups(runs, [e])
        row["speedup"] = {"mean": statistics.fmean(seeds) if seeds else math.nan, "per_seed": seeds}
        per_epoch.append(row)
    late = [e for e in epochs if e >= 2] or epochs
    overall: dict = {"epochs": late}
    totals = {a: [t for t in (run_totals(r, late) for r in runs if r["arm"] == a) if t is not None]
              for a in ("baseline", "rhymerl")}
    if totals["baseline"] and totals["rhymerl"]:
        for k in TIMES:
            b = _mean_sd([t[k] for t in totals["baseline"]])
            r = _mean_sd([t[k] for t in totals["rhymerl"]])
            overall[k] = {"baseline": b, "rhymerl": r, "ratio": r["mean"] / b["mean"] if b["mean"] else math.nan}
        for arm in ("baseline", "rhymerl"):
            overall[f"overhead_frac_{arm}"] = overall["overhead_s"][arm]["mean"] / overall["wall_s"][arm]["mean"]
    for k in ("rollout_s", "wall_s"):
        seeds = paired_speedups(runs, late, k)
        overall[f"speedup_{k.removesuffix('_s')}"] = {
            "mean": statistics.fmean(seeds) if seeds else math.nan, "per_seed": seeds}
    return {"epochs": per_epoch, "overall": overall}


def run_totals(run: dict, epochs: Sequence[int]) -> dict[str, float] | None:
    """One run's seconds summed over `epochs`; None if the run lacks one of them (it crashed)."""
    rows = {row["epoch"]: row for row in epoch_rows(run)}
    if not all(e in rows for e in epochs):
        return None
    return {k: sum(rows[e][k] for e in epochs) for k in TIMES}


def permutation_pvalue(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided permutation test of mean(a) - mean(b), exact (every relabelling) for small
    samples: with 3 vs 3 seeds the smallest possible p is 2/20 = 0.1."""
    res = sstats.permutation_test((np.asarray(a, float), np.asarray(b, float)),
                                  lambda x, y, axis: np.mean(x, axis=axis) - np.mean(y, axis=axis),
                                  permutation_type="independent", alternative="two-sided",
                                  vectorized=True, n_resamples=100_000, random_state=0)
    return float(min(1.0, res.pvalue))


def parity(runs: Sequence[dict], key: str = "accuracy") -> dict:
    """Final-epoch `key` of both arms over seeds: difference, seed noise, permutation p-value.

    Parity = the difference is within seed noise: |mean_R - mean_B| <= 2 x its standard error
    (from the seeds' spread, sqrt(sd_B^2/n_B + sd_R^2/n_R)) and the permutation test does not
    reject at 5%. Needs >= 2 seeds per arm; None otherwise."""
    arms = {a: arm_epochs(runs, a) for a in ("baseline", "rhymerl")}
    common = set(arms["baseline"]) & set(arms["rhymerl"])
    if not common:
        return {"key": key, "parity": None, "note": "no epoch finished by both arms"}
    last = max(common)
    b, r = arms["baseline"][last][key], arms["rhymerl"][last][key]
    out = {"key": key, "epoch": last, "baseline": b, "rhymerl": r,
           "diff": statistics.fmean(r) - statistics.fmean(b)}
    if min(len(b), len(r)) < 2:
        return {**out, "parity": None, "p_value": None, "note": "needs >= 2 seeds per arm"}
    se = math.sqrt(statistics.variance(b) / len(b) + statistics.variance(r) / len(r))
    p = permutation_pvalue(r, b)
    smallest = 2.0 / math.comb(len(b) + len(r), len(b))
    return {**out, "se": se, "p_value": p, "smallest_p": smallest,
            "parity": bool(abs(out["diff"]) <= 2 * se and p >= 0.05),
            "note": f"exact permutation test; with {len(b)} vs {len(r)} seeds p cannot go below {smallest:.3f}"}


def by_position(runs: Sequence[dict], arm: str = "rhymerl") -> list[dict]:
    """Per epoch of `arm`, pooled over seeds: tokens per verification step by the response position
    the step came at (`rhymerl.histospec.stats.POSITION_EDGES`) and each bucket's share of the steps.
    Empty when no record carries position counts (runs without speculation, older runs)."""
    labels, out = position_labels(), []
    epochs = sorted({int(h["epoch"]) for r in runs if r["arm"] == arm for h in r["history"]})
    for epoch in epochs:
        recs = [h for r in runs if r["arm"] == arm for h in r["history"] if int(h["epoch"]) == epoch]
        steps = [sum(float(h.get(f"spec/steps_{b}", 0.0)) for h in recs) for b in labels]
        if not sum(steps):
            continue
        tokens = [sum(float(h.get(f"spec/tokens_{b}", 0.0)) for h in recs) for b in labels]
        out.append({"epoch": epoch, "buckets": labels, "steps": steps,
                    "tokens_per_verify": [t / n if n else math.nan for t, n in zip(tokens, steps)],
                    "step_share": [n / sum(steps) for n in steps]})
    return out


def step_curves(runs: Sequence[dict], arm: str, key: str) -> dict[int, list[float]]:
    """global_step -> one `key` value per seed of `arm` (for curves with seed bands)."""
    out: dict[int, list[float]] = {}
    for run in sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"]):
        for rec in run["history"]:
            out.setdefault(int(rec["global_step"]), []).append(float(rec[key]))
    return out
