"""Prefect tasks of one RL step. Each wraps one I/O step around one core call.

Heavy work runs in Ray actors (`workers.actors`); these tasks only dispatch it and wait, so Prefect
shows every stage with its duration and retries a failed stage. Caching is off: inputs are live
actor handles and a step must never be skipped because it looks like an earlier one.
"""

from __future__ import annotations

from dataclasses import dataclass

import ray
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import task_run

from rhymerl.data.rewards import RewardFunctionError, RewardScore, RewardSet
from rhymerl.config.pipe import PipeConfig
from rhymerl.histopipe.migration import MigrationRule
from rhymerl.policy.weight_sync import DEFAULT_BUCKET_BYTES
from rhymerl.data.records import Prompt, Sample
from rhymerl.run.rollout import check_groups, rollout_rows, train_examples
from rhymerl.vllm.engine import SamplingSettings
from storage.lake import LakeWriter, rows_to_table
from tasks.plan import Plan
from tasks.resume import committed_step
from workers.stream import Scoring, StreamedRollout, collect_scores, stream_rollout
from workers.sync import sync_weights
from workers.train_feed import GroupFeed


def retry_unless_reward_error(task, task_run, state) -> bool:
    """Prefect's retry condition: retry a failed attempt unless a reward function failed (it would
    fail the same way on the same responses; the run stops and is resumed once it is fixed)."""
    try:
        state.result()
    except RewardFunctionError:
        return False
    except BaseException:
        return True
    return True


@task(name="rollout", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2)
def rollout_task(workers: list, plan: Plan, spec: SamplingSettings, prompts: list[Prompt], pipe: PipeConfig,
                 rewards: RewardSet, guard=None, history=None, feed=None) -> StreamedRollout:
    """Generate the plan's requests (per worker, in admission order), scoring finished responses
    while the rest generate; with `pipe.migrate`, stragglers move to idle workers. Exactly
    sample indices 0..n-1 of every prompt come back, once each. With `guard`
    (`workers.guard.WorkerGuard`), restarted workers get the current weights and history first,
    and a worker that dies mid-step re-runs every request planned on it after its restart, its
    earlier results discarded (keeping those that finished before the crash would favour short
    responses). With `history` (`workers.history_bundles.WorkerHistory`), a migrated request's prompt
    history goes to its new worker first. With `feed` (`workers.train_feed.GroupFeed`, train.stream),
    each complete group goes to the trainer while the rest generate; a retry spoils the feed.
    `rewards` scores the responses (in Ray tasks; `reward_task` collects the scores)."""
    if guard is not None:
        guard.ensure_current()
    rule = MigrationRule.from_settings(pipe) if pipe.migrate else None
    out = stream_rollout(workers, plan.requests, spec, Scoring.of(rewards, prompts), rule, plan.forecast_peak,
                         guard=guard, history=history, feed=feed)
    check_groups(prompts, out.samples, spec.n)
    return out


@task(name="reward", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1,
      retry_condition_fn=retry_unless_reward_error)
def reward_task(rewards: RewardSet, prompts: list[Prompt], rollout: StreamedRollout) -> tuple[list[RewardScore], float]:
    """Every response's score, waiting only for scoring the rollout has not finished yet; also the
    reward compute seconds summed over all its chunks. A reward function that raises or returns a
    non-finite value raises RewardFunctionError naming it, the prompt id and the cause (no retry):
    nothing of the step reaches the lake."""
    return collect_scores(rollout, Scoring.of(rewards, prompts))


@dataclass(frozen=True)
class CommittedStep:
    """What the lake holds for a step, and so what the step trains on."""

    samples: list[Sample]
    scores: list[RewardScore]
    rows_written: int  # 0: the step was committed before this call; samples/scores are those rows


@task(name="lake-write", cache_policy=NO_CACHE, retries=3, retry_delay_seconds=2)
def lake_write_task(lake_url: str, run_id: str, epoch: int, step: int, prompts: list[Prompt],
                    samples: list[Sample], scores: list[RewardScore], policy_version: int,
                    n: int) -> CommittedStep:
    """Write the step's responses and commit them; a retried attempt never duplicates rows.

    Returns the rows the lake holds for the step: these samples when this call committed them,
    else the rows committed first (by an earlier attempt of this task, or by another process),
    read back. A step must never train on rows the lake does not hold; committed rows that are
    not n per prompt from `policy_version` raise instead (the run stops rather than train on them).
    """
    writer = LakeWriter(lake_url)
    if not writer.is_committed(run_id, epoch, step):
        rows = rollout_rows(run_id, epoch, step, prompts, samples, scores, policy_version)
        attempt = task_run.run_count or 1
        path = writer.write_rollouts(run_id, epoch, step, worker=0, attempt=attempt, table=rows_to_table(rows))
        if writer.commit_step(run_id, epoch, step, files=[path], stats={"rows": len(rows)}):
            return CommittedStep(samples, scores, len(rows))
    held = committed_step(lake_url, run_id, epoch, step, prompts, n, policy_version)
    return CommittedStep(*held, rows_written=0)


@task(name="train", cache_policy=NO_CACHE)
def train_task(trainer, prompts: list[Prompt], samples: list[Sample],
               scores: list[RewardScore], scale: bool, eps: float, feed: GroupFeed | None = None) -> dict:
    """One GRPO update on the trainer actor from the step's samples and rewards.

    With `feed` (train.stream), the update the trainer accumulated group by group during the
    rollout, when it holds exactly these samples and rewards (`GroupFeed.finish`); else (and
    then with a warning) the batch path on them. `streamed` (1 or 0) says which, with a feed."""
    if feed is not None:
        out = feed.finish(samples, scores)
        if out is not None:
            return {**out, "streamed": 1.0}
        get_run_logger().warning("streamed training aborted, training the batch instead: %s", feed.broken)
    batch = train_examples(prompts, samples, [s.total for s in scores], scale, eps)
    out = ray.get(trainer.train_step.remote(batch))
    return out if feed is None else {**out, "streamed": 0.0}


@task(name="weight-sync", cache_policy=NO_CACHE)
def sync_task(trainer, workers: list, guard=None, engine_dtype: str = "float32", probe_len: int = 32,
              bucket_bytes: int = DEFAULT_BUCKET_BYTES, transport: str = "object_store",
              ranks_per_engine: int = 1) -> dict:
    """`workers.sync.sync_weights` as a step of the flow (see there for the checks)."""
    return sync_weights(trainer, workers, guard, engine_dtype, probe_len, bucket_bytes, transport, ranks_per_engine)
