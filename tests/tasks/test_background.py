"""tasks/background.py: submitted Prefect task runs, bounded, flushed with their first error."""

from __future__ import annotations

import threading
import time

import pytest
from prefect import flow, task

from tasks.background import Background

_lock = threading.Lock()


@task
def _record(out: list, value: int, delay: float = 0.0) -> int:
    time.sleep(delay)
    with _lock:
        out.append(value)
    return value


@task
def _fail(message: str) -> None:
    raise RuntimeError(message)


def test_runs_in_the_background_bounded_and_flushed(prefect_harness):
    # Rule: submit returns before the run finishes; never more than `limit` pending; flush waits for all.
    @flow
    def run() -> tuple[int, int, list]:
        out: list = []
        bg = Background(limit=2)
        first = bg.submit(_record, out, 0, delay=0.5)
        right_after = len(out)  # the flow did not wait for it
        bg.submit(_record, out, 1, after=first)  # ordered after the first
        bg.submit(_record, out, 2)  # the window was full: waited for the oldest first
        most = len(bg.pending)
        bg.flush()
        return right_after, most, out

    right_after, most, out = run()
    assert right_after == 0 and most == 2
    assert sorted(out) == [0, 1, 2] and out.index(0) < out.index(1)


def test_flush_waits_for_everything_and_raises_the_first_error(prefect_harness):
    @flow
    def run() -> list:
        out: list = []
        bg = Background(limit=4)
        bg.submit(_fail, "first")
        bg.submit(_record, out, 7, delay=0.3)
        with pytest.raises(RuntimeError, match="first"):
            bg.flush()
        assert not bg.pending
        return out

    assert run() == [7]  # the run after the failed one still finished


def test_limit_is_checked():
    with pytest.raises(ValueError, match="limit"):
        Background(limit=0)


def test_runs_submitted_in_a_subflow_outlive_it(prefect_harness):
    # Rule: runs go to the task runner of the flow that made the Background, so a subflow (an
    # epoch) returns without waiting for them and they are not cancelled when it ends.
    out: list = []  # shared through the closure: a subflow's parameters are copies
    made: list = []

    @flow
    def epoch() -> None:
        first = made[0].submit(_record, out, 1, delay=1.0)
        made[0].submit(_record, out, 2, after=first)  # not started when the subflow returns

    @flow
    def run() -> list:
        made.append(Background(limit=4))
        epoch()
        made[0].flush()
        return list(out)

    # On the subflow's own task runner the second, not yet started run is cancelled when the
    # subflow returns, and flush raises CancelledError.
    done = run()
    assert done == [1, 2]
