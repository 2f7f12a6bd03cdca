"""Surviving a dead trainer mid-run: it comes back from the run's last checkpoint (rollout workers
restart in place: `workers.guard`).

The trainer has no Ray restarts: a trainer restarted behind the flow's back would train from the
initial weights. A dead trainer is replaced by a new actor loaded from the run's last checkpoint
(`recover_trainer`, the same restore as `rhymerl run --resume`, with the same guarantees: steps
committed to the lake after the checkpoint train on their committed rows, no step trained
twice). When that is not possible the run fails with `TrainerLost`, whose message gives the
exact resume command.
"""

from __future__ import annotations

import logging

from prefect import get_run_logger
from prefect.exceptions import MissingContextError
from ray.exceptions import RayActorError

from rhymerl.resume import ResumePlan
from tasks.steps import sync_task
from workers.guard import WorkerGuard, resume_command
from workers.sync import WeightsMismatch, sync_settings
from workers.trainer_group import start_trainer, stop_trainer


def _log() -> logging.Logger:
    """The Prefect run logger inside a flow or task (the run's log), else this module's logger."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


class TrainerLost(RuntimeError):
    """The trainer died and the run could not bring it back itself; the message says how to resume."""


# ---------------------------------------------------------------- the trainer


def trainer_lost(trainer, exc: BaseException) -> bool:
    """True when `exc`, or an exception it came from, says the `trainer` actor died."""
    actor_id = trainer._actor_id.hex() if trainer is not None else None
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, RayActorError) and getattr(exc, "actor_id", None) == actor_id:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def lost_message(run_id: str, lake_url: str, why: str) -> str:
    """What a run that lost its trainer for good tells the user."""
    return (f"run {run_id}: the trainer actor died and {why}. Continue the run from its last "
            f"checkpoint with:\n    {resume_command(run_id, lake_url)}")


def recover_trainer(rt, guard: WorkerGuard, exc: BaseException) -> ResumePlan:
    """Replace the dead trainer with one loaded from the last checkpoint; returns where to continue.

    Runs in the run flow (its tasks show in Prefect). Raises `TrainerLost` (from `exc`) when
    checkpoints are off, none is committed yet, or `recovery.trainer_restarts` are used up.
    """
    from tasks.resume import restore_task

    cfg = rt.cfg
    if cfg.checkpoint.every_steps == 0:
        raise TrainerLost(f"run {rt.run_id}: the trainer actor died and checkpoints are off "
                          "(checkpoint.every_steps = 0), so the run cannot continue; start it again "
                          "with checkpoint.every_steps >= 1") from exc
    if guard.trainer_restarts >= cfg.recovery.trainer_restarts:
        why = f"the run's in-run trainer restarts are used up (recovery.trainer_restarts = {cfg.recovery.trainer_restarts})"
        raise TrainerLost(lost_message(rt.run_id, cfg.lake.url, why)) from exc
    log = _log()
    log.warning("run %s: the trainer actor died (%s); starting a new one from the last checkpoint",
                rt.run_id, str(exc).splitlines()[0])
    stop_trainer(rt.trainer)  # already dead: frees its handle's resources, no effect otherwise
    rt.trainer = guard.trainer = start_trainer(cfg, rt.model_dir)
    logged = set(rt.logged_steps) | {int(h["global_step"]) for h in rt.history}
    try:
        plan = restore_task(rt)
    except ValueError as err:  # no committed checkpoint yet (the trainer died in the first step)
        raise TrainerLost(f"run {rt.run_id}: the trainer actor died and {err}; start the run again") from exc
    rt.logged_steps = logged  # MLflow already has these steps: a retrained step is not logged twice
    try:
        sync_task(rt.trainer, rt.workers, guard=guard, **sync_settings(cfg))
    except WeightsMismatch as err:
        raise TrainerLost(lost_message(rt.run_id, cfg.lake.url, f"the engines did not take the restored "
                                       f"weights ({err})")) from exc
    guard.trainer_restarts += 1
    if rt.tracker is not None:
        rt.tracker.log_metrics({"trainer_restarts": float(guard.trainer_restarts)}, step=plan.global_step)
    log.warning("run %s: trainer restored from the checkpoint at global step %d (restart %d of %d); "
                "continuing with epoch %d step %d", rt.run_id, plan.global_step - 1, guard.trainer_restarts,
                cfg.recovery.trainer_restarts, plan.epoch, plan.step)
    return plan
