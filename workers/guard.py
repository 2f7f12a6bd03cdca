"""Rollout workers that die mid-run restart in place and never sample off-policy.

Rollout workers are Ray actors with `max_restarts` (`recovery.worker_restarts`). Ray restarts a
dead one by running its constructor again, so the new engine holds the model directory's
*initial* weights and no HistoSpec history; sampling from it would be off-policy. `WorkerGuard`
never lets a restarted worker generate before it holds the trainer's current weights (checked
by fingerprint against the trainer) and its HistoSpec bundle: `ensure_current` runs at the
start of every rollout (a worker that died between steps), `recover` when a worker dies during
one, after which the dispatcher re-runs every request planned on that worker and discards its
earlier results (`workers.stream._Driver.lost`: which samples finished before a crash depends on
their length, so keeping them would bias the step towards short responses).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError

from workers.sync import FINGERPRINT_RTOL

class WorkerLost(RuntimeError):
    """A rollout worker is gone for good (restarts used up, or it never came back in time)."""


def resume_command(run_id: str, lake_url: str) -> str:
    """The command that continues `run_id` from its last checkpoint."""
    return f"rhymerl run --resume {run_id} --lake {lake_url}"


def _info_key(info: dict) -> str:
    # A restarted actor is a new process: (node, pid) names one incarnation (Linux hands out pids
    # in sequence, so a restart never gets its predecessor's pid back in practice).
    return f"{info['node_id']}:{info['pid']}"


def wait_alive(actor, timeout_s: float, what: str, hint: str = "") -> dict:
    """`actor.info()` once the actor answers, waiting through a Ray restart (its engine starting)
    for up to `timeout_s`; `WorkerLost` (message + `hint`) when Ray gave up on it or time ran out."""
    deadline, delay = time.monotonic() + timeout_s, 0.5
    while True:
        try:
            return ray.get(actor.info.remote(), timeout=max(1.0, deadline - time.monotonic()))
        except ActorDiedError as exc:  # restarts used up (or the actor was killed for good)
            raise WorkerLost(f"{what} died and Ray will not restart it again (recovery.worker_restarts "
                             f"used up): {str(exc).splitlines()[0]}{hint}") from exc
        except (RayActorError, GetTimeoutError) as exc:  # restarting: its engine is starting up
            if time.monotonic() >= deadline:
                raise WorkerLost(f"{what} did not answer within {timeout_s:.0f} s "
                                 f"(recovery.restart_timeout_s){hint}") from exc
            time.sleep(delay)
            delay = min(2 * delay, 5.0)


@dataclass(frozen=True)
class WorkerRestart:
    """One rollout worker brought back: what it took, and the proof that it holds the policy."""

    worker: int
    old_pid: int
    new_pid: int
    wait_s: float  # until Ray's restarted actor answered (its engine start-up)
    sync_s: float  # weights and history
    engine_fingerprint: float
    trainer_fingerprint: float
    mid_rollout: bool  # it died during a rollout (else: between rollouts)


@dataclass
class WorkerGuard:
    """Keeps every rollout worker on the current policy and history across Ray restarts.

    Lives in the flow process (never crosses a process boundary). `trainer` is replaced when the
    trainer is recovered; `history[w]` is worker w's current HistoSpec bundle in Ray's object
    store (None without HistoSpec). `restarts` lists every restart of the run, in order.
    """

    workers: list
    trainer: object
    timeout_s: float = 600.0
    history: list | None = None
    incarnations: list[str] = field(default_factory=list)
    restarts: list[WorkerRestart] = field(default_factory=list)
    trainer_restarts: int = 0
    resume_hint: str = ""  # appended to WorkerLost messages: how to continue the run
    log: logging.Logger = field(default_factory=lambda: logging.getLogger(__name__))  # the run's log
    _reported: int = 0

    @classmethod
    def watch(cls, workers: list, trainer, timeout_s: float, run_id: str = "", lake_url: str = "",
              log: logging.Logger | None = None) -> WorkerGuard:
        """Start guarding freshly started (and already synced) workers of run `run_id`; restarts are
        reported to `log` (the flow passes Prefect's run logger, so they show in the UI)."""
        infos = ray.get([w.info.remote() for w in workers])
        hint = (f"; continue the run from its last checkpoint with: {resume_command(run_id, lake_url)}"
                if run_id else "")
        return cls(workers=list(workers), trainer=trainer, timeout_s=timeout_s,
                   incarnations=[_info_key(i) for i in infos], resume_hint=hint,
                   log=log or logging.getLogger(__name__))

    def share_history(self, refs) -> None:
        """Give the workers their HistoSpec bundles: `refs[w]` to worker w (one ref: the same to
        all). A worker that is down gets its bundle when it is resynced (`ensure_current` before
        the next rollout, or `recover`)."""
        self.history = list(refs) if isinstance(refs, (list, tuple)) else [refs] * len(self.workers)
        for w, worker in enumerate(self.workers):
            try:
                ray.get(worker.set_history.remote(self.history[w]))
            except RayActorError as exc:
                self.log.warning("rollout worker %d is down (%s); it gets the history when it is back",
                                 w, str(exc).splitlines()[0])

    def set_history(self, w: int, ref) -> None:
        """Record that worker w now holds bundle `ref` (a migrated request's prompt added), so a
        restart gives it that one; the caller sends it."""
        if self.history is None:
            self.history = [None] * len(self.workers)
        self.history[w] = ref

    def new_restarts(self) -> int:
        """Restarts since the last call (a step record's `worker_restarts`)."""
        n, self._reported = len(self.restarts) - self._reported, len(self.restarts)
        return n

    def ensure_current(self) -> int:
        """Before a rollout: bring every worker that restarted since it was last synced up to date
        (waiting for one Ray is still restarting); returns how many were."""
        done = 0
        for w in range(len(self.workers)):
            t0 = time.perf_counter()
            info = self._wait_alive(w)
            if _info_key(info) != self.incarnations[w]:
                self._resync(w, info, time.perf_counter() - t0, mid_rollout=False)
                done += 1
        return done

    def recover(self, w: int, cause: BaseException | None = None) -> WorkerRestart | None:
        """Worker `w` failed a call with an actor error: wait for Ray's restart and resync it.

        Returns the restart, or None if the same process answers again (a transient error).
        Raises `WorkerLost` when Ray gave up on it or it did not come back within `timeout_s`.
        """
        self.log.warning("rollout worker %d failed: %s; waiting for Ray to restart it", w,
                         str(cause).splitlines()[0] if cause else "actor error")
        t0 = time.perf_counter()
        info = self._wait_alive(w)
        if _info_key(info) == self.incarnations[w]:
            return None
        return self._resync(w, info, time.perf_counter() - t0, mid_rollout=True)

    def _wait_alive(self, w: int) -> dict:
        return wait_alive(self.workers[w], self.timeout_s, f"rollout worker {w}", self.resume_hint)

    def _resync(self, w: int, info: dict, wait_s: float, mid_rollout: bool) -> WorkerRestart:
        """The trainer's current weights (fingerprint-checked) and the history into worker `w`."""
        t0 = time.perf_counter()
        old_pid = int(self.incarnations[w].rsplit(":", 1)[1])
        engine_print = ray.get(self.workers[w].load_weights.remote(self.trainer.state_for_engine.remote()))
        trainer_print = ray.get(self.trainer.weights_fingerprint.remote())
        if not math.isclose(engine_print, trainer_print, rel_tol=FINGERPRINT_RTOL):
            raise WorkerLost(f"rollout worker {w} restarted but its weights (fingerprint {engine_print!r}) "
                             f"differ from the trainer's ({trainer_print!r}) after the sync; refusing to "
                             f"sample off-policy{self.resume_hint}")
        if self.history is not None and self.history[w] is not None:
            ray.get(self.workers[w].set_history.remote(self.history[w]))
        self.incarnations[w] = _info_key(info)
        restart = WorkerRestart(worker=w, old_pid=old_pid, new_pid=int(info["pid"]), wait_s=wait_s,
                                sync_s=time.perf_counter() - t0, engine_fingerprint=float(engine_print),
                                trainer_fingerprint=float(trainer_print), mid_rollout=mid_rollout)
        self.restarts.append(restart)
        self.log.warning(
            "rollout worker %d restarted (pid %d -> %d, back after %.1f s): trainer weights loaded "
            "(fingerprint %.6g = trainer %.6g)%s in %.1f s; restart %d of the run", w, old_pid,
            restart.new_pid, wait_s, engine_print, trainer_print,
            " and HistoSpec history" if self.history is not None else "", restart.sync_s, len(self.restarts))
        return restart


__all__ = ["WorkerGuard", "WorkerLost", "WorkerRestart", "resume_command", "wait_alive"]
