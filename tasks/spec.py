"""HistoSpec in the run: each epoch's history bundle from the lake, and per-step acceptance.

`history_task` runs once per epoch, before its first step: one DuckDB query over the lake
(`prompt_history`) collects each prompt's responses from its last `spec.history_epochs` epochs,
and the serialised bundle goes to every rollout worker through Ray's object store, where the
worker writes it to the file its engine's drafter reads. No worker queries the lake.
`spec_stats_task` collects the workers' acceptance counters after a step's rollout.
"""

from __future__ import annotations

import time

import ray
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rhymerl.histospec.drafter import SpecConfig
from rhymerl.histospec.stats import SpecStats
from rhymerl.histospec.history import BundleInfo, bundle_for_epoch, merge_history, uses_bundle
from rhymerl.records import Prompt
from storage.lake import Lake


@task(name="spec-history", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2)
def history_task(spec: SpecConfig, lake_url: str, run_id: str, epoch: int, prompts: list[Prompt],
                 workers: list, guard=None) -> BundleInfo | None:
    """Build epoch `epoch`'s history bundle from the lake and hand it to every worker.

    Epoch 0 (or `history_epochs = 0`) gets a bundle of prompts without history: drafts then come
    from each group's siblings only. None when the run does not use HistoSpec. With a
    `workers.guard.WorkerGuard`, a worker that is down (or restarts later) gets the bundle too.
    """
    if not uses_bundle(spec):
        return None
    t0 = time.perf_counter()
    columns: dict = {}
    if epoch > 0 and spec.history_epochs > 0:
        with Lake(lake_url) as lake:
            columns = lake.prompt_history(run_id, epoch, spec.history_epochs).to_pydict()
    if spec.warm_start_run and spec.history_epochs > 0:
        columns = _with_warm_start(columns, spec, lake_url)
    query_s = time.perf_counter() - t0
    blob, info = bundle_for_epoch(prompts, columns)
    ref = ray.put(blob)
    if guard is not None:
        guard.share_history(ref)
    else:
        ray.get([w.set_history.remote(ref) for w in workers])
    info = BundleInfo(**{**info.__dict__, "build_s": time.perf_counter() - t0})
    get_run_logger().info(
        "HistoSpec history for epoch %d: %d/%d prompts with history, %d responses, %d tokens, "
        "%.1f KB (query %.2fs, total %.2fs)", epoch, info.prompts_with_history, info.prompts,
        info.responses, info.tokens, info.bytes / 1024, query_s, info.build_s)
    return info


@task(name="spec-stats", cache_policy=NO_CACHE)
def spec_stats_task(workers: list) -> SpecStats | None:
    """The step's speculation counters summed over workers; None when speculation is off."""
    parts = [p for p in ray.get([w.spec_stats.remote() for w in workers]) if p is not None]
    if not parts:
        return None
    total = SpecStats()
    for part in parts:
        total.merge(SpecStats(**part))
    return total


def _with_warm_start(columns: dict, spec: SpecConfig, lake_url: str) -> dict:
    """`columns` plus the warm-start run's history for prompts that have none in this run."""
    with Lake(spec.warm_start_lake or lake_url) as lake:
        warm = lake.prompt_history(spec.warm_start_run, 2**31 - 1, spec.history_epochs).to_pydict()
    if not warm.get("prompt_id"):
        get_run_logger().warning("spec.warm_start_run %r has no responses in lake %s; no warm start",
                                 spec.warm_start_run, spec.warm_start_lake or lake_url)
        return columns
    return merge_history(columns, warm)
