"""HistoPipe in the run: place a step's prompt groups on workers from lake history, then measure.

`plan_task` reads the run's earlier response lengths from the lake (DuckDB), forecasts each
prompt's lengths and asks a scheduling policy for a placement; `step_measures` computes the step's
bubble ratio and forecast quality from what actually happened (a plain call: milliseconds of
arithmetic are not worth a Prefect task run's API calls and flow CPU), and `gantt_task` (off the
step's critical path) draws its Gantt chart.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from prefect import task
from prefect.cache_policies import NO_CACHE

from rhymerl.histopipe.forecast import ForecastSettings, build_history, forecast_lengths, forecast_quality
from rhymerl.histopipe.gantt import gantt_png
from rhymerl.histopipe.schedule import Assignment, ScheduleRequest, schedule
from rhymerl.config.pipe import PipeConfig
from rhymerl.histopipe.simulator import measure
from rhymerl.data.records import Prompt, Request, Sample
from storage.lake import Lake

HISTORY_SQL = "SELECT prompt_id, epoch, length FROM rollouts WHERE run_id = ? AND epoch < ?"


@dataclass(frozen=True)
class Plan:
    """A step's placement: requests per worker in admission order, and the forecasts."""

    placement: list[list[Prompt]]  # (W,) the distinct prompts each worker samples, in admission order
    forecast_mean: dict[str, float]  # prompt_id -> forecast mean length (history only)
    policy: str
    requests: list[list[Request]] = field(default_factory=list)  # (W,) one per sample, admission order
    forecast_peak: dict[str, float] = field(default_factory=dict)  # prompt_id -> longest forecast sample


def work_units(assignment: Assignment, prompts: Sequence[Prompt], n: int) -> list[list[Request]]:
    """Per worker, one `Request` per (prompt, sample index) the assignment places there, in
    admission order. Raises unless every sample of every prompt is placed exactly once (a tier2
    group split over workers keeps its exact sample indices 0..n-1)."""
    by_id = {p.prompt_id: p for p in prompts}
    unknown = {u.prompt_id for units in assignment.workers for u in units} - set(by_id)
    if unknown:
        raise ValueError(f"{assignment.policy}: placement names prompts {sorted(unknown)[:5]} that are not "
                         "in the step's batch")
    out = [[Request(by_id[pid], k) for pid, k in assignment.requests(w)] for w in range(len(assignment.workers))]
    placed = [r.key for reqs in out for r in reqs]
    want = {(p.prompt_id, k) for p in prompts for k in range(n)}
    if len(placed) != len(set(placed)) or set(placed) != want:
        raise ValueError(f"{assignment.policy}: placement covers {len(set(placed))} of {len(want)} requests "
                         f"with {len(placed) - len(set(placed))} duplicates; every (prompt, sample) must be "
                         "placed exactly once")
    return out


@task(name="plan", cache_policy=NO_CACHE, retries=1)
def plan_task(cfg: PipeConfig, lake_url: str, run_id: str, epoch: int, step: int, prompts: list[Prompt],
              workers: int, n: int, max_tokens: int) -> Plan:
    """Forecast from the lake and place the step's requests on workers (long requests first):
    whole prompt groups, or with `tier2` single samples of long groups spread over workers."""
    history = {}
    if epoch > 0:
        with Lake(lake_url) as lake:
            history = build_history(lake.sql(HISTORY_SQL, [run_id, epoch]))
    spec = ForecastSettings(trend_weight=cfg.trend_weight, max_length=float(max_tokens))
    by_id = {p.prompt_id: p for p in prompts}
    forecasts = forecast_lengths(history, list(by_id), spec,
                                 prompt_lengths={p.prompt_id: len(p.token_ids) for p in prompts},
                                 target_epoch=epoch)
    request = ScheduleRequest(demands=tuple(forecasts[pid].demand(n) for pid in by_id), workers=workers,
                              step=step)
    assignment = schedule(cfg.policy, request)
    requests = work_units(assignment, prompts, n)
    placement = [list({r.prompt.prompt_id: r.prompt for r in reqs}.values()) for reqs in requests]
    means = {pid: f.mean for pid, f in forecasts.items() if f.source == "history"}
    return Plan(placement=placement, forecast_mean=means, policy=cfg.policy, requests=requests,
                forecast_peak={pid: f.peak for pid, f in forecasts.items()})


def _rows(samples: list[Sample]) -> list[dict]:
    return [{"prompt_id": s.prompt_id, "sample_idx": s.sample_idx, "worker_id": s.worker_id,
             "gen_start": s.t_start, "gen_end": s.t_end, "length": len(s.token_ids),
             "migrated_from_worker": s.migrated_from_worker, "migrated_at": s.migrated_at} for s in samples]


def tail_seconds(ends: Sequence[float], quantile: float = 0.9) -> float:
    """The rollout's tail: seconds from the `quantile` request's finish to the last one's (the
    stretch in which a few long responses keep the engines at small batch)."""
    if len(ends) < 2:
        return 0.0
    order = sorted(ends)
    return float(order[-1] - order[max(0, math.ceil(quantile * len(order)) - 1)])


def step_measures(plan: Plan, samples: list[Sample], workers: int) -> dict[str, float]:
    """Bubble ratio, makespan and tail (`tail_seconds`) of the step; forecast quality where history
    existed."""
    result = measure(_rows(samples), workers)
    out = {"bubble_ratio": float(result.bubble_ratio), "makespan_s": float(result.makespan),
           "tail_s": tail_seconds([s.t_end for s in samples])}
    if len(plan.forecast_mean) >= 3:
        actual: dict[str, list[int]] = {}
        for s in samples:
            actual.setdefault(s.prompt_id, []).append(len(s.token_ids))
        means = {pid: sum(v) / len(v) for pid, v in actual.items() if pid in plan.forecast_mean}
        quality = forecast_quality({pid: plan.forecast_mean[pid] for pid in means}, means)
        out.update(quality.as_metrics())
    return out


@task(name="gantt", cache_policy=NO_CACHE)
def gantt_task(plan: Plan, samples: list[Sample], workers: int, tracker, global_step: int) -> None:
    """The step's Gantt chart (one lane per running request, per worker) to the MLflow run."""
    result = measure(_rows(samples), workers)
    with tempfile.TemporaryDirectory() as tmp:
        path = gantt_png(result, Path(tmp) / f"gantt_step{global_step:04d}.png",
                         title=f"step {global_step}: {plan.policy}, bubble {result.bubble_ratio:.1%}")
        tracker.log_artifact(str(path), artifact_path="gantt")
