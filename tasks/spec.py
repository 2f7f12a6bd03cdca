"""HistoSpec in the run: the epoch's history from the lake, each worker's share of it per step.

`history_task` runs once per epoch, before its first step (`prepare_epoch_task` runs it, with the
first step's plan, during the previous epoch's last training step): one DuckDB query over the lake
(`prompt_history`) collects each prompt's responses from its last `spec.history_epochs` epochs as
Arrow, kept on the driver as flat numpy columns (`rhymerl.histospec.bundle`: no Python object per
token). Each step, once HistoPipe's plan has placed the step's requests, `cut_for_workers` cuts one
bundle per worker holding only the prompts it serves (`prepare_step_task` does it, with the plan,
for the next step while the current one runs), and `publish_history_task` sends each worker its own
through Ray's object store; the worker writes it to the file its engine's drafter re-reads. A
migrated request's prompt follows it (`workers.history_bundles.WorkerHistory.carry`). No worker queries the
lake. `spec_stats` collects the workers' acceptance counters after a step's rollout (a plain call:
one Ray round trip is not worth a Prefect task run's API calls and flow CPU).
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass

import ray
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rhymerl.config.pipe import PipeConfig
from rhymerl.histospec.bundle import HistoryColumns, HistorySlicer, uses_bundle
from rhymerl.config.spec import SpecConfig
from rhymerl.histospec.stats import SpecStats
from rhymerl.data.records import Prompt
from storage.lake import Lake
from tasks.plan import Plan, plan_task
from workers.history_bundles import StepBundles, WorkerHistory, cut_for_workers


@task(name="spec-history", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2)
def history_task(spec: SpecConfig, lake_url: str, run_id: str, epoch: int,
                 prompts: list[Prompt]) -> HistorySlicer | None:
    """Epoch `epoch`'s history from the lake, ready to cut into per-worker bundles each step.

    Epoch 0 (or `history_epochs = 0`) has no history: bundles then hold prompts only, and drafts
    come from each group's siblings. None when the run does not use HistoSpec.
    """
    if not uses_bundle(spec):
        return None
    t0 = time.perf_counter()
    columns = HistoryColumns.empty()
    if epoch > 0 and spec.history_epochs > 0:
        with Lake(lake_url) as lake:
            columns = HistoryColumns.from_arrow(lake.prompt_history(run_id, epoch, spec.history_epochs))
    if spec.warm_start_run and spec.history_epochs > 0:
        columns = _with_warm_start(columns, spec, lake_url)
    slicer = HistorySlicer(columns)
    get_run_logger().info(
        "HistoSpec history for epoch %d: %d/%d prompts with history, %d responses, %d tokens, %.1f KB of "
        "arrays (%.2fs); each worker gets its own prompts' share per step", epoch,
        sum(1 for p in prompts if p.prompt_id in slicer.rows), len(prompts), len(columns), len(columns.tokens),
        (columns.tokens.nbytes + columns.offsets.nbytes + columns.rewards.nbytes) / 1024,
        time.perf_counter() - t0)
    return slicer


@dataclass(frozen=True)
class StepInputs:
    """What a step needs before its rollout: the plan and each worker's bundle (None: no HistoSpec)."""

    plan: Plan
    bundles: StepBundles | None


@task(name="prepare-step", cache_policy=NO_CACHE, retries=1)
def prepare_step_task(pipe: PipeConfig, lake_url: str, run_id: str, epoch: int, step: int, prompts: list[Prompt],
                      workers: int, n: int, max_tokens: int, slicer: HistorySlicer | None) -> StepInputs:
    """HistoPipe's plan for a step (`plan_task`) and the bundle each worker gets under it. Depends only
    on the lake's earlier epochs, so the run computes it for step s + 1 while step s runs."""
    plan = plan_task.fn(pipe, lake_url, run_id, epoch, step, prompts, workers, n, max_tokens)
    return StepInputs(plan, cut_for_workers(slicer, plan.placement) if slicer is not None else None)


@dataclass(frozen=True)
class EpochInputs:
    """What an epoch needs before its first step: its history (None: no HistoSpec), the seconds the
    history query took, and the first step's inputs."""

    slicer: HistorySlicer | None
    query_s: float
    first: StepInputs

    def first_ready(self) -> Future:
        """The first step's inputs as a done future, the form the run holds a prepared step in."""
        done: Future = Future()
        done.set_result(self.first)
        return done


@task(name="prepare-epoch", cache_policy=NO_CACHE, retries=1)
def prepare_epoch_task(spec: SpecConfig, pipe: PipeConfig, lake_url: str, run_id: str, epoch: int,
                       order: list[Prompt], first: list[Prompt], workers: int, n: int,
                       max_tokens: int) -> EpochInputs:
    """Epoch `epoch`'s history and its first step's plan and bundles. Both read only the rows of
    earlier epochs, so the run computes them once the previous epoch's last step is in the lake,
    while that step trains, instead of at the epoch's start."""
    t0 = time.perf_counter()
    slicer = history_task.fn(spec, lake_url, run_id, epoch, order)
    query_s = time.perf_counter() - t0
    return EpochInputs(slicer, query_s, prepare_step_task.fn(pipe, lake_url, run_id, epoch, 0, first, workers, n,
                                                             max_tokens, slicer))


@task(name="spec-publish", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2)
def publish_history_task(workers: list, slicer: HistorySlicer, bundles: StepBundles, guard=None) -> WorkerHistory:
    """Send each worker its bundle for the step (`workers.history_bundles`); the handle carries migrated
    requests' prompts to their new worker during the rollout."""
    history = WorkerHistory(workers, slicer, bundles, guard)
    history.publish()
    return history


def spec_stats(workers: list) -> SpecStats | None:
    """The step's speculation counters summed over workers; None when speculation is off."""
    parts = [p for p in ray.get([w.spec_stats.remote() for w in workers]) if p is not None]
    if not parts:
        return None
    total = SpecStats()
    for part in parts:
        total.merge(SpecStats(**part))
    return total


def _with_warm_start(columns: HistoryColumns, spec: SpecConfig, lake_url: str) -> HistoryColumns:
    """`columns` plus the warm-start run's history for prompts that have none in this run."""
    with Lake(spec.warm_start_lake or lake_url) as lake:
        warm = HistoryColumns.from_arrow(lake.prompt_history(spec.warm_start_run, 2**31 - 1, spec.history_epochs))
    if not len(warm):
        get_run_logger().warning("spec.warm_start_run %r has no responses in lake %s; no warm start",
                                 spec.warm_start_run, spec.warm_start_lake or lake_url)
        return columns
    return columns.merged(warm)
