"""The training run as Prefect flows: a run flow that runs one epoch flow per epoch.

Reads like a recipe: each step is rollout -> reward -> lake write -> train -> weight sync ->
checkpoint, with the work itself in Ray actors (see `tasks/`). The flow's parameters are plain
values (the config as a nested dict) so the Prefect UI can show and edit them. A resumed run
(`resume=RUN_ID`) restores the last checkpoint and continues with the step after it.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.utilities.annotations import quote

from rhymerl.config import RunConfig, config_from_dict
from rhymerl.vllm.engine import SamplingSpec
from rhymerl.rollout import epoch_order, step_batches, step_stats
from rhymerl.timing import Stopwatch
from rhymerl.report import epoch_summary, format_summary
from tasks.report import lake_step_task, log_epoch_task, log_step_task, plot_task
from tasks.setup import (Runtime, finish_run_task, init_ray, new_run_id, prepare_model_task,
                         prepare_prompts_task, start_actors_task, start_tracking_task)
from tasks.plan import measure_task, plan_task
from tasks.recovery import recover_trainer, trainer_lost
from tasks.ops import link_runs_task
from tasks.resume import checkpoint_task, lake_rows_task, restore_task, resume_tracking_task, warm_start_task
from tasks.spec import history_task, spec_stats_task
from tasks.steps import lake_write_task, reward_task, rollout_task, sync_task, train_task
from workers.guard import WorkerGuard
from workers.sync import sync_settings

# Engine vs trainer mean |log-prob| difference above which a step warns. float32 CPU engines agree
# to ~1e-6; bf16 GPU engines round to ~1e-2; a stale engine after a real update is off by more.
LOGPROB_DIFF_WARN = 0.05
_RUNTIMES: dict[str, Runtime] = {}  # run_id -> live state, for the epoch subflows


@flow(name="rhymerl-epoch", flow_run_name="{run_id}-epoch-{epoch}")
def epoch_flow(run_id: str, epoch: int, start_step: int = 0) -> list[dict]:
    """Every prompt once, in steps of `rollout.prompts_per_step` (from `start_step` when resuming
    mid-epoch: the order depends on seed and epoch only); returns each step's record."""
    rt = _RUNTIMES[run_id]
    cfg = rt.cfg
    spec = SamplingSpec(n=cfg.rollout.n, temperature=cfg.rollout.temperature,
                        top_p=cfg.rollout.top_p, max_tokens=cfg.rollout.max_tokens)
    order = epoch_order(rt.prompts, epoch, cfg.seed)
    rt.spec_history = history_task(cfg.spec, cfg.lake.url, rt.run_id, epoch, order, rt.workers, rt.guard)
    records = []
    for step, batch in enumerate(step_batches(order, cfg.rollout.prompts_per_step)):
        if step >= start_step:
            records.append(run_step(rt, epoch, step, batch, spec))
    log_epoch_task(rt, epoch)
    return records


def run_step(rt: Runtime, epoch: int, step: int, batch, spec: SamplingSpec) -> dict:
    """One on-policy step: every sample comes from the weights after the previous step.

    A step the lake committed before a crash (after the last checkpoint) trains on its
    committed rows instead of sampling again, so it is neither lost nor duplicated.
    """
    cfg, watch = rt.cfg, Stopwatch()
    with watch("plan_s"):
        plan = plan_task(cfg.pipe, cfg.lake.url, rt.run_id, epoch, step, batch, len(rt.workers), spec.n,
                         spec.max_tokens)
    samples, scores, speculation, migrations = _sample(rt, epoch, step, batch, spec, plan, watch)
    # Prefect walks every element of a task's arguments looking for futures (~0.3-0.5 s per call
    # for a step's samples on 2 cores); quote() hands them over as they are.
    with watch("lake_s"):
        committed = lake_write_task(cfg.lake.url, rt.run_id, epoch, step, batch, quote(samples), quote(scores),
                                    rt.policy_version, spec.n)
    if not committed.rows_written and (epoch, step) not in rt.reuse:
        get_run_logger().warning("step %d of epoch %d was committed to the lake before this rollout's rows; "
                                 "training on the committed rows", step, epoch)
    samples, scores = committed.samples, committed.scores
    with watch("train_s"):
        train = train_task(rt.trainer, batch, quote(samples), quote(scores), cfg.train.scale_rewards,
                           cfg.train.adv_eps)
    _warn_logprob_diff(train, epoch, step)
    sync = sync_task(rt.trainer, rt.workers, guard=rt.guard, **sync_settings(cfg))
    rt.policy_version += 1
    watch.seconds.update(sync_s=sync["sync_s"], step_s=watch.total())
    with watch("measure_s"):
        pipe = measure_task(plan, quote(samples), len(rt.workers), rt.tracker, len(rt.history), cfg.pipe.gantt)
    record = _record(rt, epoch, step, step_stats(samples, scores), dict(watch.seconds), pipe, sync, train)
    record["migrations"] = float(migrations)
    if speculation is not None:
        record.update(speculation.as_metrics("spec/"))
    rt.history.append(record)
    with watch("log_s"):
        log_step_task(rt, record)
        lake_step_task(cfg.lake.url, rt.run_id, record, cfg.spec.method if speculation is not None else None)
    with watch("checkpoint_s"):
        checkpoint_task(rt, record)
    # Known only once the step's record is logged: kept in the run's history (the returned
    # records; `rhymerl bench e2e` splits wall_s from them), not in MLflow or the lake.
    record.update(log_s=watch.seconds["log_s"], checkpoint_s=watch.seconds["checkpoint_s"], wall_s=watch.total())
    return record


def _sample(rt: Runtime, epoch: int, step: int, batch, spec: SamplingSpec, plan, watch: Stopwatch):
    """The step's samples, scores, speculation counters and migrations: generated (scoring starts on
    finished responses while the rollout's tail still generates), or read back from the lake for a
    step committed before a crash (`rollout_s` is then the lake read)."""
    cfg = rt.cfg
    if (epoch, step) in rt.reuse:
        with watch("rollout_s"):
            samples, scores = lake_rows_task(cfg.lake.url, rt.run_id, epoch, step, batch, spec.n, rt.policy_version)
        watch.seconds.update(reward_s=0.0, reward_total_s=0.0)
        return samples, scores, None, 0  # the original rollout's counters died with it
    with watch("rollout_s"):
        rollout = rollout_task(rt.workers, plan, spec, batch, cfg.pipe, guard=rt.guard)
    speculation = spec_stats_task(rt.workers)
    with watch("reward_s"):  # what scoring still added after the rollout
        scores, watch.seconds["reward_total_s"] = reward_task(batch, quote(rollout))
    return rollout.samples, scores, speculation, rollout.migrations


def _record(rt: Runtime, epoch: int, step: int, stats, timings: dict, pipe: dict, sync: dict, train: dict) -> dict:
    """The step's record: what MLflow, the lake's steps table and the end-of-run table read."""
    record = {"epoch": epoch, "step": step, "global_step": len(rt.history),
              "policy_version": rt.policy_version, **stats.as_metrics(), **timings, **pipe,
              "rollout_tokens_per_s": stats.tokens / max(timings["rollout_s"], 1e-9),
              "engine_fingerprint": sync["engine_fingerprint"],
              "trainer_fingerprint": sync["trainer_fingerprint"],
              "sync_probe_max_diff": sync["probe_max_diff"], "sync_s_per_gb": sync["sync_s_per_gb"],
              **{f"train_{k}": v for k, v in train.items()}}
    record["worker_restarts"] = float(rt.guard.new_restarts()) if rt.guard is not None else 0.0
    if (epoch, step) in rt.reuse:  # rollout_s is the lake read, not a rollout
        record["reused_lake_rows"] = 1.0
    if step == 0 and rt.spec_history is not None:  # the epoch's bundle, reported once
        record.update(rt.spec_history.as_metrics("spec/history_"))
    return record


def _warn_logprob_diff(train: dict, epoch: int, step: int) -> None:
    if train.get("logprob_abs_diff", 0.0) > LOGPROB_DIFF_WARN:
        get_run_logger().warning(
            "engine and trainer log-probs differ by %.3g on average in step %d of epoch %d (~1e-6 when they hold "
            "the same weights and sampling settings): a stale engine or a sampling setting the trainer does "
            "not apply", train["logprob_abs_diff"], step, epoch)


@flow(name="rhymerl-run", flow_run_name="{config[name]}")
def run_flow(config: dict[str, Any], run_id: str | None = None, resume: str | None = None) -> dict:
    """Train for `epochs` epochs; returns the run id, MLflow run id, lake URL and per-epoch summary.

    With `resume`, continue that run from its last checkpoint: same run id, lake rows and MLflow run.
    """
    cfg: RunConfig = config_from_dict(config)
    log = get_run_logger()
    run_id = resume or run_id or new_run_id(cfg.name)
    model_dir = prepare_model_task(cfg)
    prompts, skipped = prepare_prompts_task(cfg, model_dir)
    if skipped:
        log.warning("skipped %d prompts longer than the engine allows", skipped)
    rt = Runtime(cfg=cfg, run_id=run_id, model_dir=model_dir, prompts=prompts, skipped=skipped)
    epoch_wall_s: dict[int, float] = {}
    _RUNTIMES[run_id] = rt
    status = "failed"
    try:
        rt.started_ray = init_ray(cfg.rollout.num_workers)
        rt.workers, rt.trainer, rt.initial_fingerprint = start_actors_task(cfg, model_dir)
        start_epoch, start_step = 0, 0
        if resume:
            start = restore_task(rt)
            # The engines take the restored weights; the run's "initial" weights are these now.
            rt.initial_fingerprint = sync_task(rt.trainer, rt.workers, **sync_settings(cfg))["engine_fingerprint"]
            resume_tracking_task(rt)
            start_epoch, start_step = start.epoch, start.step
        else:
            if cfg.model.init_from_run:  # a new run on another run's weights (e.g. retrain, new data)
                rt.warm_start = warm_start_task(rt)
                rt.initial_fingerprint = sync_task(rt.trainer, rt.workers, **sync_settings(cfg))["engine_fingerprint"]
            start_tracking_task(rt)
        # Restarted rollout workers get the trainer's weights and the history before they sample.
        rt.guard = WorkerGuard.watch(rt.workers, rt.trainer, cfg.recovery.restart_timeout_s, run_id,
                                     cfg.lake.url, log=log)
        link_runs_task(rt)  # Prefect flow run <-> MLflow run, both ways
        log.info("run %s: %d prompts x %d samples, %d steps/epoch, %d epochs; lake %s",
                 run_id, len(prompts), cfg.rollout.n, -(-len(prompts) // cfg.rollout.prompts_per_step),
                 cfg.epochs, cfg.lake.url, extra={"rhymerl_start": {  # rhymerl.console's start lines
                     "mlflow_run_id": rt.mlflow_run_id,
                     "steps_per_epoch": -(-len(prompts) // cfg.rollout.prompts_per_step)}})
        epoch = start_epoch
        while epoch < cfg.epochs:
            t = time.perf_counter()
            try:
                epoch_flow(run_id, epoch, start_step)
            except Exception as exc:  # a dead trainer comes back from the last checkpoint
                if not trainer_lost(rt.trainer, exc):
                    raise
                plan = recover_trainer(rt, rt.guard, exc)  # or TrainerLost with the resume command
                epoch, start_step = plan.epoch, plan.step
                continue
            epoch_wall_s[epoch] = time.perf_counter() - t  # steps + history + the subflow's own cost
            epoch, start_step = epoch + 1, 0
        plot_task(rt)
        status = "finished"
    finally:
        finish_run_task(rt, status)
        _RUNTIMES.pop(run_id, None)
    summary = epoch_summary(rt.history)
    log.info("\n%s", format_summary(summary, run_id, cfg.lake.url, cfg.tracking.uri,
                                      rt.mlflow_run_id, skipped))
    return {"run_id": run_id, "mlflow_run_id": rt.mlflow_run_id, "lake": cfg.lake.url,
            "skipped_prompts": skipped, "initial_engine_fingerprint": rt.initial_fingerprint,
            "warm_start": rt.warm_start,
            "epochs": summary, "history": rt.history, "epoch_wall_s": epoch_wall_s}
