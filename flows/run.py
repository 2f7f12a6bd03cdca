"""The training run as Prefect flows: a run flow that runs one epoch flow per epoch.

Reads like a recipe: each step (`flows.step.run_step`) is rollout -> reward -> lake write -> train ->
weight sync -> checkpoint, with the work itself in Ray actors (see `tasks/`); with `eval.dataset`, a
held-out evaluation runs before the first epoch and after the last (`tasks.evaluate`). The flow's parameters are plain
values (the config as a nested dict) so the Prefect UI can show and edit them. A resumed run
(`resume=RUN_ID`) restores the last checkpoint and continues with the step after it.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from prefect import flow, get_run_logger
from prefect.utilities.annotations import quote

from flows.step import RunState, run_step
from infra.stop import deferred, reclaim
from rhymerl.config.run import RunConfig, config_from_dict
from rhymerl.data.records import new_run_id
from rhymerl.policy.lr_schedule import run_optimizer_steps
from rhymerl.run.heap import freeze_startup_heap
from rhymerl.vllm.engine import SamplingSettings
from rhymerl.run.rollout import epoch_order, step_batches
from rhymerl.run.report import epoch_summary, format_summary
from rhymerl.run.evaluation import eval_due, opening_eval
from tasks.evaluate import Evaluation, evaluate_task, log_eval_task, prepare_eval_task
from tasks.report import log_epoch_task, plot_task
from tasks.setup import (RunContext, finish_run_task, init_ray, load_rewards_task, prepare_model_task,
                         prepare_prompts_task, quiet_subflow, start_actors_task, start_tracking_task)
from tasks.background import Background
from tasks.export import export_task
from tasks.recovery import check_recoverable, replace_trainer, restore_lost, sync_restored, trainer_lost
from tasks.ops import link_runs_task
from tasks.resume import restore_task, resume_tracking_task, warm_start_task
from tasks.spec import history_task
from tasks.steps import sync_task
from workers.guard import WorkerGuard
from workers.sync import sync_settings

# run_id -> the live run, for its epoch subflows: a subflow's parameters must stay plain values
# (the Prefect UI shows and edits them), so actor handles cannot travel as parameters.
_LIVE: dict[str, tuple[RunContext, RunState]] = {}


@flow(name="rhymerl-epoch", flow_run_name="{run_id}-epoch-{epoch}")
def epoch_flow(run_id: str, epoch: int, start_step: int = 0) -> list[dict]:
    """Every prompt once, in steps of `rollout.prompts_per_step` (from `start_step` when resuming
    mid-epoch: the order depends on seed and epoch only); returns each step's record."""
    reclaim()  # SIGTERM stops the run as Ctrl-C does, not by Prefect's handler (infra.stop)
    ctx, st = _LIVE[run_id]
    body_start = time.perf_counter()  # the subflow's own start-up (call -> here) is Prefect's
    cfg = ctx.cfg
    sampling = SamplingSettings(n=cfg.rollout.n, temperature=cfg.rollout.temperature,
                                top_p=cfg.rollout.top_p, max_tokens=cfg.rollout.max_tokens)
    order = epoch_order(list(ctx.prompts), epoch, cfg.seed)
    _epoch_history(ctx, st, epoch, start_step, order)
    batches = step_batches(order, cfg.rollout.prompts_per_step)
    records = []
    for step, batch in enumerate(batches):
        if step >= start_step:
            after = batches[step + 1] if step + 1 < len(batches) else None
            records.append(run_step(ctx, st, epoch, step, batch, sampling, after,
                                    next_epoch=after is None and epoch + 1 < cfg.epochs))
    if st.tracking is not None:  # the epoch's summary follows its steps' metrics
        rows = [dict(h) for h in st.history if h["epoch"] == epoch]
        st.mlflow_tail = st.background.submit(log_epoch_task, st.tracking, quote(rows), epoch, after=st.mlflow_tail)
    # Flushed before the next epoch's subflow starts: its creation (synchronous calls to the Prefect
    # server) stalls for seconds when it meets the background runs' writes; waiting for them first
    # costs a fraction of that.
    st.background.flush()
    st.epoch_body[epoch] = (body_start, time.perf_counter())
    return records


def _epoch_history(ctx: RunContext, st: RunState, epoch: int, start_step: int, order: list) -> None:
    """The epoch's HistoSpec history (and its first step's inputs, `st.ahead`): taken from the
    previous epoch's last step, which prepared them while it trained, else queried now.
    `spec_query_s` is what the epoch waited for it: ~0 when prepared ahead."""
    cfg, ready = ctx.cfg, st.next_epoch
    st.next_epoch = None  # taken once: a retried or recovered epoch queries its history again
    t0 = time.perf_counter()
    if ready is not None and ready[0] == epoch and start_step == 0:
        try:
            prepared = ready[1].result()
            st.spec_history, st.ahead = prepared.slicer, ((epoch, 0), prepared.first_ready())
            st.spec_query_s, st.spec_prepared_s = time.perf_counter() - t0, prepared.query_s
            return
        except Exception as exc:  # prepared off the critical path; a failure costs only time
            get_run_logger().warning("preparing epoch %d ahead failed (%s); preparing it now", epoch,
                                     str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    st.spec_history = history_task(cfg.spec, cfg.lake.url, ctx.run_id, epoch, quote(order))
    st.spec_query_s, st.spec_prepared_s = time.perf_counter() - t0, None


@flow(name="rhymerl-run", flow_run_name="{config[name]}")
def run_flow(config: dict[str, Any], run_id: str | None = None, resume: str | None = None) -> dict:
    """Train for `epochs` epochs; returns the run id, MLflow run id, lake URL and per-epoch summary.

    With `resume`, continue that run from its last checkpoint: same run id, lake rows and MLflow run.
    """
    reclaim()  # SIGTERM stops the run as Ctrl-C does, not by Prefect's handler (infra.stop)
    cfg: RunConfig = config_from_dict(config)
    log = get_run_logger()
    run_id = resume or run_id or new_run_id(cfg.name)
    rewards = load_rewards_task(cfg)  # before anything starts: a broken plug-in is bad input
    model_dir = prepare_model_task(cfg)
    prompts, skipped = prepare_prompts_task(cfg, model_dir)
    if skipped:
        log.warning("skipped %d prompts longer than the engine allows", skipped)
    evaluation = prepare_eval_task(cfg, model_dir, rewards)  # None without eval.dataset
    evals: list[dict] = []  # each evaluation's eval/* figures, with its epoch and global step
    ctx = RunContext(cfg=cfg, run_id=run_id, model_dir=model_dir, prompts=tuple(prompts), skipped=skipped,
                     rewards=rewards)
    st = RunState()
    epoch_wall_s: dict[int, float] = {}
    subflow_s: dict[int, dict] = {}  # per epoch: Prefect's subflow start-up (enter) and wind-down (exit)
    _LIVE[run_id] = (ctx, st)
    status = "failed"
    try:
        st.started_ray = init_ray(cfg.rollout.num_workers)
        st.workers, st.trainer, st.initial_fingerprint = start_actors_task(cfg, model_dir,
                                                                           run_optimizer_steps(cfg, len(prompts)))
        start_epoch, start_step = _open_run(ctx, st, resume)
        # Restarted rollout workers get the trainer's weights and the history before they sample.
        st.guard = WorkerGuard.watch(st.workers, st.trainer, cfg.recovery.restart_timeout_s, run_id,
                                     cfg.lake.url, log=log)
        link_runs_task(cfg, run_id, st.tracking)  # Prefect flow run <-> MLflow run, both ways
        freeze_startup_heap()  # full GC passes walk only what the run allocates from here (rhymerl.run.heap)
        steps_per_epoch = -(-len(prompts) // cfg.rollout.prompts_per_step)
        log.info("run %s: %d prompts x %d samples, %d steps/epoch, %d epochs; lake %s",
                 run_id, len(prompts), cfg.rollout.n, steps_per_epoch, cfg.epochs, cfg.lake.url,
                 extra={"rhymerl_start": {  # rhymerl.run.console's start lines
                     "mlflow_run_id": st.tracking.mlflow_run_id, "steps_per_epoch": steps_per_epoch}})
        _evaluate(ctx, st, evaluation, opening_eval(start_epoch, start_step), evals)
        epoch, quiet = start_epoch, quiet_subflow()
        while epoch < cfg.epochs:
            t = time.perf_counter()
            try:
                with quiet():
                    epoch_flow(run_id, epoch, start_step)
            except Exception as exc:  # a dead trainer comes back from the last checkpoint
                if not trainer_lost(st.trainer, exc):
                    raise
                epoch, start_step = _recover_trainer(ctx, st, exc)  # or TrainerLost with the resume command
                continue
            done = time.perf_counter()
            epoch_wall_s[epoch] = done - t  # steps + history + the subflow's own cost
            body = st.epoch_body.get(epoch, (t, done))
            subflow_s[epoch] = {"enter_s": body[0] - t, "exit_s": done - body[1]}
            _evaluate(ctx, st, evaluation, epoch, evals)
            epoch, start_step = epoch + 1, 0
        st.background.flush()
        plot_task(st.tracking, quote(st.history))
        exported = _export(ctx, st, log)
        status = "finished"
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (infra.stop): MLflow and the lake record it as killed
        status = "killed"
        raise
    finally:
        _LIVE.pop(run_id, None)
        with deferred():  # a stop signal now waits until the actors and Ray are stopped
            _drain(st.background, log)  # a failed or stopped run still gets what it submitted
            finish_run_task(ctx, st.tracking, st.workers + ([st.trainer] if st.trainer is not None else []),
                            st.started_ray, status)
    summary = epoch_summary(st.history)
    mlflow_run_id = st.tracking.mlflow_run_id if st.tracking is not None else ""
    log.info("\n%s", format_summary(summary, run_id, cfg.lake.url, cfg.tracking.uri, mlflow_run_id, skipped,
                                    exported))
    return {"run_id": run_id, "mlflow_run_id": mlflow_run_id, "lake": cfg.lake.url, "export": exported,
            "skipped_prompts": skipped, "initial_engine_fingerprint": st.initial_fingerprint,
            "warm_start": st.warm_start,
            "epochs": summary, "history": st.history, "epoch_wall_s": epoch_wall_s,
            "subflow_s": subflow_s, "evals": evals}


def _open_run(ctx: RunContext, st: RunState, resume: str | None) -> tuple[int, int]:
    """A new run opens tracking (after a warm start, if asked); a resumed one restores its last
    checkpoint first. Returns the (epoch, step) to start from."""
    cfg = ctx.cfg
    if resume:
        restored = restore_task(ctx, st.trainer)
        st.policy_version, st.history, st.reuse = restored.policy_version, restored.history, restored.plan.reuse
        # The engines take the restored weights; the run's "initial" weights are these now.
        st.initial_fingerprint = sync_task(st.trainer, st.workers, **sync_settings(cfg))["engine_fingerprint"]
        st.tracking = resume_tracking_task(ctx, restored.mlflow_run_id)
        return restored.plan.epoch, restored.plan.step
    if cfg.model.init_from_run:  # a new run on another run's weights (e.g. retrain, new data)
        st.warm_start = warm_start_task(ctx, st.trainer)
        st.initial_fingerprint = sync_task(st.trainer, st.workers, **sync_settings(cfg))["engine_fingerprint"]
    st.tracking = start_tracking_task(ctx, st.workers, st.trainer)
    return 0, 0


def _evaluate(ctx: RunContext, st: RunState, evaluation: Evaluation | None, after_epoch: int | None,
              evals: list[dict]) -> None:
    """The held-out evaluation after epoch `after_epoch` (-1: before the first; None: not at a
    boundary), when due: on the engines between steps, with their current weights."""
    cfg = ctx.cfg
    if evaluation is None or after_epoch is None or not eval_due(cfg.eval, after_epoch, cfg.epochs):
        return
    step = len(st.history)  # steps trained so far: the MLflow step of its figures
    metrics = evaluate_task(quote(ctx), quote(evaluation), st.workers, after_epoch, step, st.policy_version,
                            guard=st.guard)
    if metrics is not None:  # None: already in the lake (a resumed run)
        evals.append({"epoch": after_epoch, "global_step": step, **metrics})
        st.mlflow_tail = st.background.submit(log_eval_task, st.tracking, metrics, step, after=st.mlflow_tail)


def _export(ctx: RunContext, st: RunState, log) -> str:
    """The final model as a Hugging Face folder (`tasks.export`); "" with a warning when that
    fails: the training is done and committed, and any checkpoint can be exported later."""
    try:
        return export_task(quote(ctx), st.trainer, st.tracking)
    except Exception as exc:
        log.warning("exporting the final model failed (%s); export the last checkpoint with `rhymerl export "
                    "%s OUT --lake %s`", str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                    ctx.run_id, ctx.cfg.lake.url)
        return ""


def _drain(background: Background, log) -> None:
    """Wait for every background run; log (not raise) their errors: the caller is already failing
    or recovering, and its own error is the one to report."""
    try:
        background.flush()
    except Exception as exc:
        log.warning("background work failed: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


def _recover_trainer(ctx: RunContext, st: RunState, exc: BaseException) -> tuple[int, int]:
    """Replace the dead trainer with one loaded from the last checkpoint (`tasks.recovery`); returns
    the (epoch, step) to continue from. `TrainerLost` (with the resume command) when it cannot."""
    cfg, guard = ctx.cfg, st.guard
    _drain(st.background, get_run_logger())  # every checkpoint that can still commit, before restoring
    check_recoverable(ctx, guard.trainer_restarts, exc)
    st.trainer = guard.trainer = replace_trainer(ctx, st.trainer, exc)
    logged = st.tracking.logged_steps | {int(h["global_step"]) for h in st.history}
    restored = restore_lost(ctx, st.trainer, exc)
    st.policy_version, st.history, st.reuse = restored.policy_version, restored.history, restored.plan.reuse
    st.tracking = replace(st.tracking, logged_steps=frozenset(logged))  # a retrained step is not logged twice
    sync_restored(ctx, st.trainer, st.workers, guard, exc)
    guard.trainer_restarts += 1
    plan = restored.plan
    st.tracking.tracker.log_metrics({"trainer_restarts": float(guard.trainer_restarts)}, step=plan.global_step)
    get_run_logger().warning(
        "run %s: trainer restored from the checkpoint at global step %d (restart %d of %d); continuing with "
        "epoch %d step %d", ctx.run_id, plan.global_step - 1, guard.trainer_restarts, cfg.recovery.trainer_restarts,
        plan.epoch, plan.step)
    return plan.epoch, plan.step
