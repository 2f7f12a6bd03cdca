"""`rhymerl run`'s answer to a failure mid-run: the exit code and the lines on the console."""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
import time
from pathlib import Path

import pytest


def test_a_failing_reward_function_gives_one_line_and_the_resume_command(monkeypatch, capsys, tmp_path):
    # Rule: a reward function that fails mid-run is neither bad input (exit 2: found before anything
    # started) nor an unexpected error (exit 1, a traceback): exit 4, the error's first line, and the
    # command that continues the run once the function is fixed.
    import flows.run
    import infra.local_api
    from cli.main import EXIT_REWARD_FAILED, _train
    from rhymerl.config.run import load_config
    from rhymerl.data.rewards import RewardFunctionError

    def failing_flow(**kwargs):
        raise RewardFunctionError("reward function 'f' (f.py:f) raised on prompt 0a1b: ValueError: bad\nmore")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(flows.run, "run_flow", failing_flow)
    monkeypatch.setattr(infra.local_api, "local_api", contextlib.nullcontext)
    cfg = load_config(None, [f'lake.url="{tmp_path / "lake"}"'])
    args = argparse.Namespace(resume="run-7", verbose=True, debug=False)
    assert EXIT_REWARD_FAILED == 4
    assert _train(cfg, args) == EXIT_REWARD_FAILED
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "error: reward function 'f' (f.py:f) raised on prompt 0a1b: ValueError: bad"
    assert err[1] == f"fix the reward function, then continue the run with: rhymerl run --resume run-7 --lake {tmp_path / 'lake'}"
    assert "Traceback" not in "\n".join(err)


def test_the_reward_exit_code_is_documented():
    from cli.main import EXIT_REWARD_FAILED

    text = (Path(__file__).resolve().parents[2] / "docs" / "console-and-errors.md").read_text()
    assert f"| {EXIT_REWARD_FAILED} | a reward function failed during the run" in text


def test_the_docs_table_lists_exactly_the_exit_codes():
    import re

    import cli.main

    codes = {v for name, v in vars(cli.main).items() if name.startswith("EXIT_") and isinstance(v, int)}
    text = (Path(__file__).resolve().parents[2] / "docs" / "console-and-errors.md").read_text()
    table = text[text.index("## Exit codes"):text.index("## Stopping a run")]
    assert {int(c) for c in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)} == codes | {0}
    assert codes == {1, 2, 3, 4, 130, 143}


def _train_with(flow, monkeypatch, tmp_path):
    """`rhymerl run`'s `_train` (verbose: the log is stderr) with `flow` as the run flow, no server."""
    import flows.run
    import infra.local_api
    from cli.main import _train
    from rhymerl.config.run import load_config

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(flows.run, "run_flow", flow)
    monkeypatch.setattr(infra.local_api, "local_api", contextlib.nullcontext)
    cfg = load_config(None, [f'lake.url="{tmp_path / "lake"}"'])
    return _train(cfg, argparse.Namespace(resume="run-7", verbose=True, debug=False))


def _raised(kind: str) -> BaseException:
    """What a started run may raise, by name."""
    from rhymerl.data.datasets import DatasetError
    from tasks.recovery import TrainerLost, lost_message
    from workers.guard import WorkerLost

    return {
        "value": ValueError("shapes (2, 3) and (4,) do not match"),  # as torch would say it
        "dataset": DatasetError("eval.dataset row 3: no answer"),
        "missing file": FileNotFoundError("lake/_checkpoints/x"),
        "trainer lost": TrainerLost(lost_message("run-7", "lake", "the run's in-run trainer restarts are used up")),
        "worker lost": WorkerLost("rollout worker 1 died and Ray will not restart it again"),
        "ctrl-c": KeyboardInterrupt(),
    }[kind]


@pytest.mark.parametrize("kind, code, line", [
    ("value", 1, "error: ValueError: shapes (2, 3) and (4,) do not match"),
    ("dataset", 1, "error: DatasetError: eval.dataset row 3: no answer"),
    ("missing file", 1, "error: FileNotFoundError: lake/_checkpoints/x"),
    ("trainer lost", 3, "error: run run-7: the trainer actor died and the run's in-run trainer restarts"),
    ("worker lost", 3, "error: rollout worker 1 died"),
    ("ctrl-c", 130, "interrupted (SIGINT); continue with: rhymerl run --resume run-7 --lake "),
])
def test_what_a_started_run_raises_decides_its_exit_code(kind, code, line, monkeypatch, capsys, tmp_path):
    # Rule: once the run started, exit 2 (bad input) is never given: an error of any type that is
    # not a lost actor (3), a reward function (4) or a stop (130/143) is unexpected (1, traceback in the log).
    def flow(**kwargs):
        raise _raised(kind)

    assert _train_with(flow, monkeypatch, tmp_path) == code
    err = capsys.readouterr().err
    assert any(got.startswith(line) for got in err.splitlines()), err
    assert ("Traceback" in err) == (code == 1)  # stderr is the log file without --verbose
    if kind == "trainer lost":
        assert "rhymerl run --resume run-7 --lake lake" in err


@pytest.fixture
def flow_raising_in_a_task():
    """A real Prefect flow whose task raises a ValueError from deep inside, as torch or vLLM would."""
    from prefect import flow, task

    @task(name="deep")
    def deep_task(x: int) -> int:
        raise ValueError(f"expected a tensor of rank 2, got rank {x}")

    @flow(name="raising")
    def raising(**kwargs) -> dict:
        return {"value": deep_task(3)}

    return raising


def test_a_value_error_raised_in_a_task_mid_run_exits_1(flow_raising_in_a_task, prefect_harness, monkeypatch,
                                                         capsys, tmp_path):
    assert _train_with(flow_raising_in_a_task, monkeypatch, tmp_path) == 1
    err = capsys.readouterr().err
    assert "error: ValueError: expected a tensor of rank 2, got rank 3" in err
    assert "Traceback" in err and "in deep_task" in err  # the task's own frame, in the log


def test_sigterm_mid_run_stops_like_ctrl_c_with_exit_143(prefect_harness, local_ray, monkeypatch, capfd, tmp_path):
    # A real flow and subflow (each with Prefect's own SIGTERM handler installed around it) waits in
    # ray.get when SIGTERM comes. Rule: it stops at once the way Ctrl-C does (a KeyboardInterrupt out
    # of ray.get, not its 60 s wait), exit 143; the flow's cleanup runs to its end through a second SIGTERM,
    # and the resume command is printed.
    import signal as signals

    import ray
    from prefect import flow

    from infra.stop import deferred, reclaim

    before = {sig: signals.getsignal(sig) for sig in (signals.SIGTERM, signals.SIGINT)}
    cleaned, refs, out_of_ray_get = [], [], []

    @ray.remote(num_cpus=0)
    def slow() -> str:
        time.sleep(60)
        return "finished"

    def send_sigterm(after_s: float = 0.0) -> None:
        assert signals.getsignal(signals.SIGTERM) not in (signals.SIG_DFL, None)  # never end pytest itself
        threading.Timer(after_s, os.kill, (os.getpid(), signals.SIGTERM)).start()

    @flow(name="epoch")
    def epoch() -> str:
        reclaim()
        refs.append(slow.remote())
        send_sigterm(after_s=1.0)  # while the main thread waits in ray.get
        try:
            return ray.get(refs[0])
        except BaseException as exc:  # Prefect's TerminationSignal would come out after 60 s as a SystemError
            out_of_ray_get.append(type(exc))
            raise

    @flow(name="run")
    def run(**kwargs) -> dict:
        reclaim()
        try:
            return {"epoch": epoch()}
        finally:
            with deferred():
                send_sigterm()  # a second SIGTERM during the cleanup
                time.sleep(0.5)
                cleaned.append("actors stopped")

    try:
        assert _train_with(run, monkeypatch, tmp_path) == 143
        assert signals.getsignal(signals.SIGTERM) != before[signals.SIGTERM]  # the run's until its exit
    finally:
        for sig, handler in before.items():
            signals.signal(sig, handler)
        for ref in refs:
            ray.cancel(ref, force=True)
    assert out_of_ray_get == [KeyboardInterrupt] and cleaned == ["actors stopped"]
    err = capfd.readouterr().err  # the notes are written to the terminal's file descriptor
    assert f"interrupted (SIGTERM); continue with: rhymerl run --resume run-7 --lake {tmp_path / 'lake'}" in err
    assert "SIGTERM again: already stopping" in err
