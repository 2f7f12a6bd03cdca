"""Prefect tasks that make a run resumable: write checkpoints, and pick a run up where it stopped.

`checkpoint_task` runs as the last task of a step (after lake commit, training, weight sync and
the steps row): the trainer's state goes to the checkpoint store with the run's counters and
history. `restore_task` loads the newest committed checkpoint into the trainer and the runtime
and decides where to continue (`rhymerl.resume.plan_resume`); the flow then syncs the engines
and reopens tracking with `resume_tracking_task`. Steps the lake committed after the checkpoint
are trained on their committed rows (`lake_rows_task`), never sampled again. `warm_start_task`
starts a *new* run's trainer from another run's newest checkpoint (`model.init_from_run`).
"""

from __future__ import annotations

import json
import time

import ray
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rhymerl.config import config_to_dict
from rhymerl.records import Prompt, Sample
from rhymerl.reward import RewardResult
from rhymerl.resume import ResumePlan, plan_resume, prompts_digest, same_prompts, samples_from_rows
from rhymerl.rollout import step_batches
from storage.checkpoints import Checkpoint, CheckpointStore, checkpoint_url
from storage.lake import Lake, LakeError, LakeWriter
from storage.tracking import MlflowTracker

ROWS_SQL = """SELECT prompt_id, sample_idx, response_token_ids, logprobs, response_text, finish_reason,
                     worker_id, gen_start, gen_end, reward, correct, formatted, policy_version
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


def _store(rt) -> CheckpointStore:
    return CheckpointStore(checkpoint_url(rt.cfg.lake.url, rt.cfg.checkpoint.dir))


@task(name="checkpoint", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)
def checkpoint_task(rt, record: dict) -> bool:
    """Every `checkpoint.every_steps` steps: trainer state plus counters, committed, last K kept."""
    every = rt.cfg.checkpoint.every_steps
    global_step = int(record["global_step"])
    if every == 0 or (global_step + 1) % every:
        return False
    meta = {"run_id": rt.run_id, "epoch": int(record["epoch"]), "step": int(record["step"]),
            "global_step": global_step, "policy_version": rt.policy_version,
            "mlflow_run_id": rt.mlflow_run_id, "prompts_digest": prompts_digest(rt.prompts),
            "prompts_per_step": rt.cfg.rollout.prompts_per_step, "written_at": time.time(),
            # numpy scalars and the like become plain floats; the end summary reads these records
            "history": json.loads(json.dumps(rt.history, default=float))}
    store = _store(rt)
    if rt.cfg.train.world_size == 1:
        blob = ray.get(rt.trainer.export_state.remote())
        return store.save(rt.run_id, global_step, blob, meta, keep=rt.cfg.checkpoint.keep)
    if global_step in store.steps(rt.run_id):  # never write shards into a committed checkpoint
        return False
    ray.get(rt.trainer.save_checkpoint.remote(store.sharded_url(rt.run_id, global_step), store.storage_options()))
    return store.commit_sharded(rt.run_id, global_step, meta, keep=rt.cfg.checkpoint.keep)


def _load_checkpoint(rt, store: CheckpointStore, ckpt: Checkpoint, warm: bool) -> ray.ObjectRef:
    """Start loading `ckpt` into the trainer (`warm`: as a warm start); sharded checkpoints load
    onto any train.world_size, a single trainer's bytes only onto world size 1."""
    if ckpt.sharded:
        method = rt.trainer.warm_start_checkpoint if warm else rt.trainer.load_checkpoint
        return method.remote(ckpt.trainer_url, store.storage_options())
    if rt.cfg.train.world_size > 1:
        raise ValueError(f"checkpoint {ckpt.run_id} step {ckpt.global_step} was written by a single trainer "
                         "(trainer.pt); load it with train.world_size=1 (its next checkpoint is sharded if "
                         "the run then continues with train.world_size > 1)")
    return (rt.trainer.warm_start if warm else rt.trainer.import_state).remote(ckpt.trainer_state)


@task(name="restore", cache_policy=NO_CACHE)
def restore_task(rt) -> ResumePlan:
    """Load the run's newest checkpoint into the trainer and `rt`; return where to continue."""
    store = _store(rt)
    ckpt = store.latest(rt.run_id)
    if ckpt is None:
        raise ValueError(f"run {rt.run_id} has no committed checkpoint in {store.url}; it cannot be "
                         "resumed (checkpoints are written every checkpoint.every_steps steps)")
    meta = ckpt.meta
    if not same_prompts(meta, prompts_digest(rt.prompts), rt.cfg.rollout.prompts_per_step):
        raise ValueError(f"run {rt.run_id} was checkpointed with other prompts or another "
                         "rollout.prompts_per_step; resume with the run's own data.* and rollout settings")
    version = ray.get(_load_checkpoint(rt, store, ckpt, warm=False))
    rt.policy_version = int(meta["policy_version"])
    if version != rt.policy_version:
        raise ValueError(f"checkpoint {ckpt.global_step}: trainer state is at policy version {version}, "
                         f"its counters say {rt.policy_version}")
    rt.history = list(meta["history"])
    rt.mlflow_run_id = meta["mlflow_run_id"]
    with Lake(rt.cfg.lake.url) as lake:
        committed = {(m.epoch, m.step) for m in lake.manifests() if m.run_id == rt.run_id}
    steps_per_epoch = len(step_batches(rt.prompts, rt.cfg.rollout.prompts_per_step))
    plan = plan_resume((meta["epoch"], meta["step"], ckpt.global_step), steps_per_epoch,
                       rt.cfg.epochs, committed)
    rt.reuse = plan.reuse
    get_run_logger().info(
        "run %s: resuming from the checkpoint after epoch %d step %d (global step %d); next: "
        "epoch %d step %d; %d committed step(s) trained on their lake rows", rt.run_id, meta["epoch"],
        meta["step"], ckpt.global_step, plan.epoch, plan.step, len(plan.reuse))
    return plan


@task(name="warm-start", cache_policy=NO_CACHE)
def warm_start_task(rt) -> dict:
    """Load run `model.init_from_run`'s newest checkpoint (weights, optimizer) into this new
    run's trainer at policy version 0; the flow then syncs the engines. Returns where it came from."""
    source = rt.cfg.model.init_from_run
    store = _store(rt)
    ckpt = store.latest(source)
    if ckpt is None:
        raise ValueError(f"model.init_from_run={source!r}: no committed checkpoint of that run in {store.url}; "
                         f"list the lake's runs with `rhymerl lake summary --lake {rt.cfg.lake.url}` (checkpoints "
                         "live in the lake's _checkpoints, or checkpoint.dir if the source run set it)")
    try:
        fingerprint = ray.get(_load_checkpoint(rt, store, ckpt, warm=True))
    except ray.exceptions.RayTaskError as exc:  # e.g. the checkpoint's tensors do not fit this model
        raise ValueError(f"model.init_from_run={source!r}: its checkpoint (global step {ckpt.global_step}) does "
                         f"not load into model.path={rt.cfg.model.path or 'built-in'!r}; warm-start from a "
                         f"run of the same model ({type(exc.cause).__name__}: {str(exc.cause)[:300]})") from None
    origin = {"run_id": source, "global_step": ckpt.global_step,
              "policy_version": int(ckpt.meta["policy_version"]), "trainer_fingerprint": fingerprint}
    get_run_logger().info("run %s: trainer warm-started from run %s's checkpoint at global step %d "
                          "(its policy version %d)", rt.run_id, source, ckpt.global_step, origin["policy_version"])
    return origin


@task(name="resume-tracking", cache_policy=NO_CACHE)
def resume_tracking_task(rt) -> str:
    """Reopen the run's MLflow run and mark the lake's run record 'running' again."""
    cfg = rt.cfg
    before = stored_run(cfg.lake.url, rt.run_id)
    if before["status"] == "running":
        get_run_logger().warning("run %s is recorded as running: make sure no other process still "
                                 "trains it", rt.run_id)
    rt.tracker = MlflowTracker(cfg.tracking.uri, cfg.tracking.experiment)
    rt.logged_steps = rt.tracker.resume(rt.mlflow_run_id)
    # The config it runs with now: a later resume picks up overrides given to this one.
    LakeWriter(cfg.lake.url).write_run(rt.run_id, before["name"], config_to_dict(cfg),
                                       started_at=before["started_at"])
    rt.lake_run_written = True
    return rt.mlflow_run_id


@task(name="lake-rows", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=2)
def lake_rows_task(lake_url: str, run_id: str, epoch: int, step: int, prompts: list[Prompt], n: int,
                   policy_version: int) -> tuple[list[Sample], list[RewardResult]]:
    """A step the lake committed before a crash: its rows back as samples and scores."""
    return committed_step(lake_url, run_id, epoch, step, prompts, n, policy_version)


def committed_step(lake_url: str, run_id: str, epoch: int, step: int, prompts: list[Prompt], n: int,
                   policy_version: int) -> tuple[list[Sample], list[RewardResult]]:
    """The committed rows of a step as samples and scores; ValueError unless they are n per prompt
    of `prompts`, generated by `policy_version` (see `rhymerl.resume.samples_from_rows`)."""
    with Lake(lake_url) as lake:
        rows = lake.sql(ROWS_SQL, [run_id, epoch, step]).to_pylist()
    return samples_from_rows(rows, prompts, n, policy_version)
