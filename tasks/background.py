"""Work that must not block the next step: Prefect task runs submitted to the flow's task runner.

A step's MLflow metrics, its steps-table row, its Gantt chart and the upload and commit of its
checkpoint do not decide anything the next step needs, so the run flow submits them here and goes
on to the next rollout while they run in the flow's threads. Nothing is lost: at most `limit` runs
are pending (a submit first waits for the oldest), and `flush` — at every epoch's end, before a
dead trainer is restored, and at the end of the run, failed or not — waits for all of them and
raises the first error. Each still shows in the Prefect UI as its own task run, with its retries.

Runs go to the task runner of the flow that made the `Background` (the run flow), not of the flow
that submits them: an epoch subflow's task runner cancels what has not started when the subflow
returns, so a run submitted in one epoch may finish in the next without being lost.
What orders work on an actor (a checkpoint's export before the next step's training) is issued by
the flow before it submits (`tasks.resume.begin_checkpoint`).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from prefect.context import FlowRunContext
from prefect.utilities.callables import get_call_parameters

DEFAULT_LIMIT = 8  # ~2 steps of background runs: bounded memory, errors surface within a step or two


class Background:
    """Bounded FIFO of submitted Prefect task runs, flushed explicitly. Made inside a flow, its runs
    go to that flow's task runner; made outside one, to the submitting flow's (`task.submit`)."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"Background(limit={limit}): must be >= 1")
        self.limit = limit
        self.pending: deque = deque()
        context = FlowRunContext.get()
        self.runner = context.task_runner if context is not None else None

    def submit(self, task: Any, *args: Any, after: Any = None, **kwargs: Any) -> Any:
        """Submit `task(*args, **kwargs)`; it starts after the future `after` (if given) finished.
        Returns its future."""
        while len(self.pending) >= self.limit:
            self.pending.popleft().result()  # raises the oldest run's error, if it failed
        wait_for = [after] if after is not None else None
        if self.runner is None:
            future = task.submit(*args, wait_for=wait_for, **kwargs)
        else:
            future = self.runner.submit(task, get_call_parameters(task.fn, args, kwargs), wait_for)
        self.pending.append(future)
        return future

    def flush(self) -> None:
        """Wait for every pending run; then raise the first error among them, if any."""
        first: BaseException | None = None
        while self.pending:
            try:
                self.pending.popleft().result()
            except BaseException as exc:  # keep waiting for the rest: nothing may be left running
                first = first or exc
        if first is not None:
            raise first


__all__ = ["Background", "DEFAULT_LIMIT"]
