"""Surviving a dead trainer mid-run: it comes back from the run's last checkpoint (rollout workers
restart in place: `workers.guard`).

The trainer has no Ray restarts: a trainer restarted behind the flow's back would train from the
initial weights. A dead trainer is replaced by a new actor loaded from the run's last checkpoint
(the same restore as `rhymerl run --resume`, with the same guarantees: steps committed to the lake
after the checkpoint train on their committed rows, no step trained twice). `flows.run` composes
the steps below and assigns what they return. When that is not possible the run fails with
`TrainerLost`, whose message gives the exact resume command.
"""

from __future__ import annotations

import logging

from prefect import get_run_logger
from prefect.exceptions import MissingContextError
from ray.exceptions import RayActorError, RayError

from rhymerl.policy.lr_schedule import run_optimizer_steps
from tasks.resume import Restored, restore_task
from tasks.setup import RunContext
from tasks.steps import sync_task
from workers.guard import WorkerGuard, resume_command
from workers.sync import WeightsMismatch, sync_settings
from workers.trainer_group import TrainerGroup, start_trainer, stop_trainer


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
    """True when `exc`, or an exception it came from, says the `trainer` actor died; for a group of
    ranks (`train.world_size` > 1), when any rank died. A dead rank other than rank 0 fails the
    step through rank 0's collective (a gloo or NCCL error naming no actor), so a group whose call
    failed is asked which of its ranks are still alive."""
    if trainer is None:
        return False
    ranks = trainer.ranks if isinstance(trainer, TrainerGroup) else [trainer]
    actor_ids = {rank._actor_id.hex() for rank in ranks}
    chain, cause = [], exc
    while cause is not None and all(cause is not c for c in chain):
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if any(isinstance(c, RayActorError) and getattr(c, "actor_id", None) in actor_ids for c in chain):
        return True
    # asked only when Ray was involved: a reward function's error, say, needs no round trip
    return isinstance(trainer, TrainerGroup) and any(isinstance(c, RayError) for c in chain) \
        and bool(trainer.dead_ranks())


def lost_message(run_id: str, lake_url: str, why: str) -> str:
    """What a run that lost its trainer for good tells the user."""
    return (f"run {run_id}: the trainer actor died and {why}. Continue the run from its last "
            f"checkpoint with:\n    {resume_command(run_id, lake_url)}")


def check_recoverable(ctx: RunContext, restarts: int, exc: BaseException) -> None:
    """Raise `TrainerLost` (from `exc`, naming the fix) when a dead trainer cannot come back in the
    run: checkpoints are off, or `restarts` in-run restarts already used up `recovery.trainer_restarts`."""
    cfg = ctx.cfg
    if cfg.checkpoint.every_steps == 0:
        raise TrainerLost(f"run {ctx.run_id}: the trainer actor died and checkpoints are off "
                          "(checkpoint.every_steps = 0), so the run cannot continue; start it again "
                          "with checkpoint.every_steps >= 1") from exc
    if restarts >= cfg.recovery.trainer_restarts:
        why = f"the run's in-run trainer restarts are used up (recovery.trainer_restarts = {cfg.recovery.trainer_restarts})"
        raise TrainerLost(lost_message(ctx.run_id, cfg.lake.url, why)) from exc


def replace_trainer(ctx: RunContext, dead, exc: BaseException):
    """A new trainer (actor or group of ranks, initial weights) in place of the `dead` one."""
    _log().warning("run %s: the trainer actor died (%s); starting a new one from the last checkpoint",
                   ctx.run_id, str(exc).splitlines()[0])
    stop_trainer(dead)  # already dead: frees its handles' resources, no effect otherwise
    return start_trainer(ctx.cfg, ctx.model_dir, run_optimizer_steps(ctx.cfg, len(ctx.prompts)))


def restore_lost(ctx: RunContext, trainer, exc: BaseException) -> Restored:
    """`restore_task` into the new `trainer`; `TrainerLost` when no checkpoint is committed yet."""
    try:
        return restore_task(ctx, trainer)
    except ValueError as err:  # no committed checkpoint yet (the trainer died in the first step)
        raise TrainerLost(f"run {ctx.run_id}: the trainer actor died and {err}; start the run again") from exc


def sync_restored(ctx: RunContext, trainer, workers: list, guard: WorkerGuard, exc: BaseException) -> dict:
    """The restored weights into every engine (checked); `TrainerLost` when an engine does not take them."""
    try:
        return sync_task(trainer, workers, guard=guard, **sync_settings(ctx.cfg))
    except WeightsMismatch as err:
        raise TrainerLost(lost_message(ctx.run_id, ctx.cfg.lake.url, f"the engines did not take the restored "
                                       f"weights ({err})")) from exc
