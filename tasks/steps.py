"""Prefect tasks of one RL step. Each wraps one I/O step around one core call.

Heavy work runs in Ray actors (`tasks.actors`); these tasks only dispatch it and wait, so Prefect
shows every stage with its duration and retries a failed stage. Caching is off: inputs are live
actor handles and a step must never be skipped because it looks like an earlier one.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import ray
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import task_run

from rhymerl.config import PipeConfig
from rhymerl.engine import SamplingSpec
from rhymerl.records import Prompt, Sample
from rhymerl.reward import RewardResult
from rhymerl.rollout import advantages_for, check_groups, rollout_rows
from rhymerl.trainer import TrainExample
from rhymerl.weight_sync import DEFAULT_BUCKET_BYTES
from storage.lake import LakeWriter, rows_to_table
from tasks.plan import Plan
from tasks.resume import committed_step
from tasks.stream import StreamedRollout, collect_scores, stream_rollout


@task(name="rollout", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2)
def rollout_task(workers: list, plan: Plan, spec: SamplingSpec, prompts: list[Prompt], pipe: PipeConfig,
                 guard=None) -> StreamedRollout:
    """Generate the plan's requests (per worker, in admission order), scoring finished responses
    while the rest generate; with `pipe.migrate`, stragglers move to idle workers. Exactly
    sample indices 0..n-1 of every prompt come back, once each. With `guard`
    (`tasks.recovery.WorkerGuard`), restarted workers get the current weights and history first,
    and a worker that dies mid-step re-runs every request planned on it after its restart, its
    earlier results discarded (keeping those that finished before the crash would favour short
    responses)."""
    if guard is not None:
        guard.ensure_current()
    gold = {p.prompt_id: p.answer for p in prompts}
    rule = pipe.migration_rule() if pipe.migrate else None
    out = stream_rollout(workers, plan.requests, spec, gold, rule, plan.forecast_peak, guard=guard)
    check_groups(prompts, out.samples, spec.n)
    return out


@task(name="reward", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)
def reward_task(prompts: list[Prompt], rollout: StreamedRollout) -> tuple[list[RewardResult], float]:
    """Every response's score, waiting only for scoring the rollout has
    not finished yet; also the reward compute seconds summed over all its chunks."""
    return collect_scores(rollout, {p.prompt_id: p.answer for p in prompts})


@dataclass(frozen=True)
class CommittedStep:
    """What the lake holds for a step, and so what the step trains on."""

    samples: list[Sample]
    scores: list[RewardResult]
    rows_written: int  # 0: the step was committed before this call; samples/scores are those rows


@task(name="lake-write", cache_policy=NO_CACHE, retries=3, retry_delay_seconds=2)
def lake_write_task(lake_url: str, run_id: str, epoch: int, step: int, prompts: list[Prompt],
                    samples: list[Sample], scores: list[RewardResult], policy_version: int,
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
               scores: list[RewardResult], scale: bool, eps: float) -> dict:
    """One GRPO update on the trainer actor from the step's samples and rewards."""
    adv = advantages_for(samples, [s.reward for s in scores], scale=scale, eps=eps)
    by_id = {p.prompt_id: p for p in prompts}
    batch = [TrainExample(by_id[s.prompt_id].token_ids, s.token_ids, a, s.logprobs) for s, a in zip(samples, adv)]
    return ray.get(trainer.train_step.remote(batch))


FINGERPRINT_RTOL = 1e-6  # engine and trainer sum the same weights in a different order
# Largest |engine - trainer| probe log-prob accepted, by engine dtype: float32 kernels agree to
# ~1e-5; bf16/fp16 engines round the weights and activations they were given.
PROBE_ATOL = {"float32": 1e-3, "bfloat16": 0.25, "float16": 0.1}


class WeightsMismatch(RuntimeError):
    """An engine does not hold the trainer's weights after a sync; sampling would be off-policy."""


def _on_each_worker(workers: list, call, guard) -> list:
    """`call(worker)` (an ObjectRef) on every worker, gathered; a worker whose process died goes
    through the same recovery as in a rollout (`guard.recover`: Ray's restart, then the trainer's
    current weights and the history), then is asked again. Without a guard the error propagates."""
    refs = [call(w) for w in workers]
    out = []
    for i, ref in enumerate(refs):
        try:
            out.append(ray.get(ref))
        except ray.exceptions.RayActorError as exc:
            if guard is None:
                raise
            guard.recover(i, exc)
            out.append(ray.get(call(workers[i])))
    return out


def sync_settings(cfg) -> dict:
    """`sync_task`'s checks for a run config: the engines' dtype and a probe that fits the engine."""
    return {"engine_dtype": cfg.model.dtype, "probe_len": min(32, cfg.model.max_model_len - 1),
            "bucket_bytes": cfg.train.sync_bucket_mb * 2**20}


@task(name="weight-sync", cache_policy=NO_CACHE)
def sync_task(trainer, workers: list, guard=None, engine_dtype: str = "float32", probe_len: int = 32,
              bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> dict:
    """Send the trainer's new weights to every engine in place (no engine restart), then check
    every engine against the trainer: the parameter sums both store alike (`weights_fingerprint`)
    and the log-probs of a fixed probe sequence, which depend on every weight. A mismatch raises
    `WeightsMismatch` naming the worker. With `guard` (`tasks.recovery.WorkerGuard`), a worker that
    dies during the sync is restarted and resynced as in a rollout."""
    t0 = time.perf_counter()
    # Buckets stream out of the trainer as it gathers them; each engine stages every bucket, then
    # loads them all at once. No process holds the weights in one Python object on the way.
    moved = 0
    for bucket in trainer.state_buckets.remote(bucket_bytes):
        moved += _on_each_worker(workers, lambda w: w.stage_weights.remote(bucket), guard)[0]
    prints = _on_each_worker(workers, lambda w: w.commit_weights.remote(), guard)
    moved_s = time.perf_counter() - t0
    trainer_print = ray.get(trainer.weights_fingerprint.remote())
    ids, trainer_probe = ray.get(trainer.probe.remote(probe_len))
    probes = _on_each_worker(workers, lambda w: w.probe.remote(ids), guard)
    worst = 0.0
    for w, (fingerprint, probe) in enumerate(zip(prints, probes)):
        diff = max(abs(a - b) for a, b in zip(probe, trainer_probe))
        worst = max(worst, diff)
        if not math.isclose(fingerprint, trainer_print, rel_tol=FINGERPRINT_RTOL) or \
                diff > PROBE_ATOL.get(engine_dtype, 0.25):
            raise WeightsMismatch(f"rollout worker {w} does not hold the trainer's weights after the sync "
                                  f"(fingerprint {fingerprint!r} vs {trainer_print!r}, probe log-prob difference "
                                  f"{diff:.3g}); refusing to sample off-policy")
    return {"sync_s": time.perf_counter() - t0, "sync_gb": moved / 1e9,
            "sync_s_per_gb": moved_s / max(moved / 1e9, 1e-12), "engine_fingerprint": float(prints[0]),
            "trainer_fingerprint": trainer_print, "probe_max_diff": worst}
