"""Prefect tasks that make a run resumable: write checkpoints, and pick a run up where it stopped.

At the end of a step (after lake commit, training and weight sync) `begin_checkpoint` queues the
trainer's export on its actor, and `checkpoint_task` (in the background, `tasks.background`) stores
it with the run's counters and history, committed marker-last: a step is resumable once its
checkpoint is committed. `restore_task` loads the newest committed checkpoint into the trainer and
returns the counters and history it held and where to continue (`rhymerl.run.resume.plan_resume`); the
flow then syncs the engines and reopens tracking with `resume_tracking_task`. Steps the lake
committed after the checkpoint are trained on their committed rows (`lake_rows_task`), never
sampled again. `warm_start_task`
starts a *new* run's trainer from another run's newest checkpoint (`model.init_from_run`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import ray
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rhymerl.config.run import RunConfig, config_to_dict
from rhymerl.data.rewards import RewardScore
from rhymerl.data.records import Prompt, Sample
from rhymerl.run.resume import ResumePlan, plan_resume, prompts_digest, same_prompts, samples_from_rows
from rhymerl.run.rollout import step_batches
from storage.checkpoints import Checkpoint, CheckpointStore, checkpoint_url
from storage.lake import Lake, LakeError, LakeWriter
from storage.tracking import MlflowTracker
from tasks.setup import RunContext, Tracking

ROWS_SQL = """SELECT prompt_id, sample_idx, response_token_ids, logprobs, response_text, finish_reason,
                     worker_id, gen_start, gen_end, reward, correct, reward_values, policy_version
              FROM rollouts WHERE run_id = ? AND epoch = ? AND step = ?"""


def stored_run(lake_url: str, run_id: str) -> dict:
    """The run's latest runs row (name, config_json, started_at, status); LakeError if absent."""
    with Lake(lake_url) as lake:
        rows = lake.sql("SELECT name, config_json, started_at, status FROM runs WHERE run_id = ?",
                        [run_id]).to_pylist()
    if not rows:
        raise LakeError(f"lake {lake_url} has no run {run_id!r}; list runs with "
                        f"`rhymerl lake sql \"SELECT run_id, status FROM runs\" --lake {lake_url}`")
    return rows[0]


def stored_config(lake_url: str, run_id: str) -> dict:
    """The config (nested dict) the run was started with, from the lake's runs table."""
    return json.loads(stored_run(lake_url, run_id)["config_json"])


def _store(cfg: RunConfig) -> CheckpointStore:
    return CheckpointStore(checkpoint_url(cfg.lake.url, cfg.checkpoint.dir))


@dataclass(frozen=True)
class Restored:
    """What a checkpoint gives back beside the trainer's state: the run's counters and where to go on."""

    plan: ResumePlan
    policy_version: int
    history: list[dict]
    mlflow_run_id: str


@dataclass(frozen=True)
class PendingCheckpoint:
    """A checkpoint whose trainer side has been asked for (`begin_checkpoint`) but not yet stored."""

    global_step: int
    state: Any  # ObjectRef: the trainer's state bytes (one trainer) or its ranks' shards written (a group)
    sharded: bool


def begin_checkpoint(ctx: RunContext, trainer, global_step: int) -> PendingCheckpoint | None:
    """Ask the trainer for step `global_step`'s checkpoint if one is due (every
    `checkpoint.every_steps` steps), without waiting: the call is queued on the trainer actor now,
    before the next step's training, so it captures exactly this step's weights even while
    `checkpoint_task` stores it in the background. None when none is due."""
    cfg = ctx.cfg
    every = cfg.checkpoint.every_steps
    if every == 0 or (global_step + 1) % every:
        return None
    if cfg.train.world_size == 1:
        return PendingCheckpoint(global_step, trainer.export_state.remote(), sharded=False)
    store = _store(cfg)
    if global_step in store.steps(ctx.run_id):  # never write shards into a committed checkpoint
        return None
    ref = trainer.save_checkpoint.remote(store.sharded_url(ctx.run_id, global_step), store.storage_options())
    return PendingCheckpoint(global_step, ref, sharded=True)


@task(name="checkpoint", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)
def checkpoint_task(ctx: RunContext, pending: PendingCheckpoint, history: list[dict], policy_version: int,
                    mlflow_run_id: str) -> bool:
    """Store `pending` with the run's counters and history (through the last record, which is its
    step), committed marker-last; the last `checkpoint.keep` kept. True once committed."""
    cfg, record = ctx.cfg, history[-1]
    if int(record["global_step"]) != pending.global_step:
        raise ValueError(f"checkpoint of global step {pending.global_step} given the history up to step "
                         f"{record['global_step']}")
    meta = {"run_id": ctx.run_id, "epoch": int(record["epoch"]), "step": int(record["step"]),
            "global_step": pending.global_step, "policy_version": policy_version,
            "mlflow_run_id": mlflow_run_id, "prompts_digest": prompts_digest(ctx.prompts),
            "prompts_per_step": cfg.rollout.prompts_per_step, "written_at": time.time(),
            # numpy scalars and the like become plain floats; the end summary reads these records
            "history": json.loads(json.dumps(history, default=float))}
    store = _store(cfg)
    if not pending.sharded:
        return store.save(ctx.run_id, pending.global_step, ray.get(pending.state), meta, keep=cfg.checkpoint.keep)
    ray.get(pending.state)  # every rank's shards are written
    return store.commit_sharded(ctx.run_id, pending.global_step, meta, keep=cfg.checkpoint.keep)


def _load_checkpoint(cfg: RunConfig, trainer, store: CheckpointStore, ckpt: Checkpoint,
                     warm: bool) -> ray.ObjectRef:
    """Start loading `ckpt` into `trainer` (`warm`: as a warm start); sharded checkpoints load
    onto any train.world_size, a single trainer's bytes only onto world size 1."""
    if ckpt.sharded:
        method = trainer.warm_start_checkpoint if warm else trainer.load_checkpoint
        return method.remote(ckpt.trainer_url, store.storage_options())
    if cfg.train.world_size > 1:
        raise ValueError(f"checkpoint {ckpt.run_id} step {ckpt.global_step} was written by a single trainer "
                         "(trainer.pt); load it with train.world_size=1 (its next checkpoint is sharded if "
                         "the run then continues with train.world_size > 1)")
    return (trainer.warm_start if warm else trainer.import_state).remote(ckpt.trainer_state)


@task(name="restore", cache_policy=NO_CACHE)
def restore_task(ctx: RunContext, trainer) -> Restored:
    """Load the run's newest checkpoint into `trainer`; return its counters and where to continue."""
    cfg, store = ctx.cfg, _store(ctx.cfg)
    ckpt = store.latest(ctx.run_id)
    if ckpt is None:
        raise ValueError(f"run {ctx.run_id} has no committed checkpoint in {store.url}; it cannot be "
                         "resumed (checkpoints are written every checkpoint.every_steps steps)")
    meta = ckpt.meta
    if not same_prompts(meta, prompts_digest(ctx.prompts), cfg.rollout.prompts_per_step):
        raise ValueError(f"run {ctx.run_id} was checkpointed with other prompts or another "
                         "rollout.prompts_per_step; resume with the run's own data.* and rollout settings")
    version = ray.get(_load_checkpoint(cfg, trainer, store, ckpt, warm=False))
    if version != int(meta["policy_version"]):
        raise ValueError(f"checkpoint {ckpt.global_step}: trainer state is at policy version {version}, "
                         f"its counters say {meta['policy_version']}")
    with Lake(cfg.lake.url) as lake:
        committed = {(m.epoch, m.step) for m in lake.manifests() if m.run_id == ctx.run_id}
    steps_per_epoch = len(step_batches(ctx.prompts, cfg.rollout.prompts_per_step))
    plan = plan_resume((meta["epoch"], meta["step"], ckpt.global_step), steps_per_epoch, cfg.epochs, committed)
    get_run_logger().info(
        "run %s: resuming from the checkpoint after epoch %d step %d (global step %d); next: "
        "epoch %d step %d; %d committed step(s) trained on their lake rows", ctx.run_id, meta["epoch"],
        meta["step"], ckpt.global_step, plan.epoch, plan.step, len(plan.reuse))
    return Restored(plan, version, list(meta["history"]), meta["mlflow_run_id"])


@task(name="warm-start", cache_policy=NO_CACHE)
def warm_start_task(ctx: RunContext, trainer) -> dict:
    """Load run `model.init_from_run`'s newest checkpoint (weights, optimizer) into this new
    run's `trainer` at policy version 0; the flow then syncs the engines. Returns where it came from."""
    cfg = ctx.cfg
    source = cfg.model.init_from_run
    store = _store(cfg)
    ckpt = store.latest(source)
    if ckpt is None:
        raise ValueError(f"model.init_from_run={source!r}: no committed checkpoint of that run in {store.url}; "
                         f"list the lake's runs with `rhymerl lake summary --lake {cfg.lake.url}` (checkpoints "
                         "live in the lake's _checkpoints, or checkpoint.dir if the source run set it)")
    try:
        fingerprint = ray.get(_load_checkpoint(cfg, trainer, store, ckpt, warm=True))
    except ray.exceptions.RayTaskError as exc:  # e.g. the checkpoint's tensors do not fit this model
        raise ValueError(f"model.init_from_run={source!r}: its checkpoint (global step {ckpt.global_step}) does "
                         f"not load into model.path={cfg.model.path or 'built-in'!r}; warm-start from a "
                         f"run of the same model ({type(exc.cause).__name__}: {str(exc.cause)[:300]})") from None
    origin = {"run_id": source, "global_step": ckpt.global_step,
              "policy_version": int(ckpt.meta["policy_version"]), "trainer_fingerprint": fingerprint}
    get_run_logger().info("run %s: trainer warm-started from run %s's checkpoint at global step %d "
                          "(its policy version %d)", ctx.run_id, source, ckpt.global_step, origin["policy_version"])
    return origin


@task(name="resume-tracking", cache_policy=NO_CACHE)
def resume_tracking_task(ctx: RunContext, mlflow_run_id: str) -> Tracking:
    """Reopen the run's MLflow run (and learn which steps it has) and mark the lake's run record
    'running' again."""
    cfg = ctx.cfg
    before = stored_run(cfg.lake.url, ctx.run_id)
    if before["status"] == "running":
        get_run_logger().warning("run %s is recorded as running: make sure no other process still "
                                 "trains it", ctx.run_id)
    tracker = MlflowTracker(cfg.tracking.uri, cfg.tracking.experiment)
    logged = tracker.resume(mlflow_run_id)
    try:  # the config it runs with now: a later resume picks up overrides given to this one
        LakeWriter(cfg.lake.url).write_run(ctx.run_id, before["name"], config_to_dict(cfg),
                                           started_at=before["started_at"])
    except BaseException:
        tracker.finish("failed")  # the flow gets no Tracking to close
        raise
    return Tracking(tracker, mlflow_run_id, logged_steps=frozenset(logged))


@task(name="lake-rows", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2)
def lake_rows_task(lake_url: str, run_id: str, epoch: int, step: int, prompts: list[Prompt], n: int,
                   policy_version: int) -> tuple[list[Sample], list[RewardScore]]:
    """A step the lake committed before a crash: its rows back as samples and scores."""
    return committed_step(lake_url, run_id, epoch, step, prompts, n, policy_version)


def committed_step(lake_url: str, run_id: str, epoch: int, step: int, prompts: list[Prompt], n: int,
                   policy_version: int) -> tuple[list[Sample], list[RewardScore]]:
    """The committed rows of a step as samples and scores; ValueError unless they are n per prompt
    of `prompts`, generated by `policy_version` (see `rhymerl.run.resume.samples_from_rows`)."""
    with Lake(lake_url) as lake:
        rows = lake.sql(ROWS_SQL, [run_id, epoch, step]).to_pylist()
    return samples_from_rows(rows, prompts, n, policy_version)
