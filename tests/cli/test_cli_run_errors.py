"""`rhymerl run`'s answer to a failure mid-run: the exit code and the lines on the console."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path


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
