"""rhymerl/run/console.py: what a person sees on the terminal during `rhymerl run`, and the log capture."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import textwrap

from rhymerl.run.console import RunConsole, duration, prefect_ui_link


def _record(name: str, level: int, msg: str, **extra) -> logging.LogRecord:
    rec = logging.LogRecord(name, level, __file__, 1, msg, None, None)
    rec.__dict__.update(extra)
    return rec


def _step(epoch: int, step: int, global_step: int, **over) -> dict:
    rec = {"epoch": epoch, "step": step, "global_step": global_step, "reward_mean": 0.5, "accuracy": 0.25,
           "rollout_tokens_per_s": 1234.0, "step_s": 4.2, "tokens": 800.0, "length_mean": 100.0,
           "spec/steps": 100.0, "spec/tokens": 300.0, "spec/mean_accepted_length": 3.0}
    return {**rec, **over}


def test_start_lines_name_mlflow_run_and_prefect_ui_when_a_server_is_used():
    out = io.StringIO()
    console = RunConsole(out, total_steps=4, steps_per_epoch=2, environ={"PREFECT_API_URL": "http://h:4200/api"})
    console.handle(_record("prefect.flow_runs", logging.INFO, "run r: 16 prompts", flow_run_id="abc",
                           rhymerl_start={"mlflow_run_id": "m1", "steps_per_epoch": 2}))
    assert out.getvalue().splitlines() == ["  MLflow    run m1", "  Prefect   http://h:4200/runs/flow-run/abc",
                                           "training: run r: 16 prompts"]
    # Prefect's temporary local API has no UI to link to.
    quiet = io.StringIO()
    RunConsole(quiet, 4, 2, {}).handle(_record("prefect.flow_runs", logging.INFO, "x", flow_run_id="abc",
                                               rhymerl_start={"mlflow_run_id": "m1"}))
    assert "Prefect" not in quiet.getvalue()


def test_one_line_per_step_then_an_epoch_line():
    out = io.StringIO()
    console = RunConsole(out, total_steps=4, steps_per_epoch=2, environ={})
    console.handle(_record("prefect.task_runs", logging.INFO, "raw", rhymerl_step=_step(0, 0, 0)))
    console.handle(_record("prefect.task_runs", logging.INFO, "raw", rhymerl_step=_step(0, 1, 1, reward_mean=1.0)))
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert lines[0].startswith("epoch 0 [######      ] step 1/2 | reward 0.500 acc 0.250 | 3.00 tok/verify")
    assert "1234 tok/s" in lines[0] and "ETA" in lines[0]
    assert lines[1].startswith("epoch 0 [############] step 2/2")
    # The epoch line weighs steps by samples (equal here): reward (0.5 + 1.0) / 2; tokens per verification 300/100.
    assert lines[2].startswith("epoch 0 done in") and "reward 0.750, accuracy 0.250, 3.00 tok/verify" in lines[2]


def test_without_a_verdict_the_lines_show_no_accuracy():
    # Rule: when no reward function judges correctness the record has no accuracy; the lines leave
    # it out rather than show 0.
    out = io.StringIO()
    console = RunConsole(out, total_steps=1, steps_per_epoch=1, environ={})
    step = _step(0, 0, 0)
    del step["accuracy"]
    console.handle(_record("prefect.task_runs", logging.INFO, "raw", rhymerl_step=step))
    lines = out.getvalue().splitlines()
    assert "reward 0.500 | 3.00 tok/verify" in lines[0] and "reward 0.500, 3.00 tok/verify" in lines[1]
    assert "acc" not in out.getvalue()


def test_only_warnings_of_rhymerl_and_its_runs_reach_the_console():
    out = io.StringIO()
    console = RunConsole(out, 4, 2, {})
    for rec in (_record("vllm.engine", logging.WARNING, "deprecated argument"),  # a library: the log file only
                _record("prefect.task_runs", logging.INFO, "Finished in state Completed()"),
                _record("tasks.recovery", logging.WARNING, "rollout worker 1 restarted\nmore detail"),
                _record("prefect.flow_runs", logging.WARNING, "skipped 3 prompts longer than the engine allows")):
        console.handle(rec)
    assert out.getvalue().splitlines() == ["warning: rollout worker 1 restarted",
                                           "warning: skipped 3 prompts longer than the engine allows"]


def test_a_stopping_run_leaves_the_engines_crash_reports_to_the_log():
    # Rule: after a stop signal, Prefect's "crashed" errors for every run it cut short are not shown
    # (the stop's own lines say what happened); RhymeRL's warnings still are.
    out = io.StringIO()
    console = RunConsole(out, 4, 2, {})
    crash = _record("prefect.flow_runs", logging.ERROR, "Crash detected! Execution was aborted by an interrupt signal.")
    console.handle(crash)
    console.stop()
    for rec in (crash, _record("prefect.task_runs", logging.ERROR, "Finished in state Crashed('...')"),
                _record("prefect.flow_runs", logging.WARNING, "background work failed: lake unreachable")):
        console.handle(rec)
    assert out.getvalue().splitlines() == ["error: Crash detected! Execution was aborted by an interrupt signal.",
                                           "warning: background work failed: lake unreachable"]


def test_helpers():
    assert (duration(12.4), duration(245), duration(3720)) == ("12s", "4m05s", "1h02m")
    assert prefect_ui_link("http://127.0.0.1:4200/api/", "f") == "http://127.0.0.1:4200/runs/flow-run/f"


def test_capture_sends_child_output_to_the_log_and_keeps_the_terminal(tmp_path):
    # Rule: after capture, the process's and its children's stdout/stderr land in the log file;
    # only what is written to the returned streams reaches the terminal.
    code = textwrap.dedent(f"""
        import subprocess, sys
        from pathlib import Path
        from rhymerl.run.console import capture_output
        out, err = capture_output(Path({str(tmp_path / "logs" / "run.log")!r}))
        print("library noise"); sys.stdout.flush()
        subprocess.run(["sh", "-c", "echo child noise >&2"])
        print("progress", file=out)
        print("problem", file=err)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "progress\n", "problem\n")
    assert (tmp_path / "logs" / "run.log").read_text().splitlines() == ["library noise", "child noise"]


def test_an_evaluation_shows_its_line_after_the_epoch_line():
    out = io.StringIO()
    console = RunConsole(out, total_steps=1, steps_per_epoch=1, environ={})
    console.handle(_record("prefect.task_runs", logging.INFO, "raw", rhymerl_step=_step(0, 0, 0)))
    console.handle(_record("prefect.task_runs", logging.INFO, "eval after epoch 0: ...",
                           rhymerl_eval={"epoch": 0, "line": "eval after epoch 0 (3 prompts x 1): reward 0.333"}))
    lines = out.getvalue().splitlines()
    assert lines[1].startswith("epoch 0 done") and lines[2] == "  eval after epoch 0 (3 prompts x 1): reward 0.333"


def test_the_step_line_says_how_many_prompts_had_history_when_histospec_made_bundles():
    # Rule: "hist W/P" = the step's prompts with earlier epochs' responses / its prompts; only when
    # HistoSpec's bundles were made (no such fields with ngram, suffix or speculation off).
    out = io.StringIO()
    console = RunConsole(out, total_steps=4, steps_per_epoch=2, environ={})
    bundles = {"spec/history_prompts": 16.0, "spec/history_prompts_with_history": 12.0}
    console.handle(_record("prefect.task_runs", logging.INFO, "raw", rhymerl_step=_step(1, 0, 2, **bundles)))
    console.handle(_record("prefect.task_runs", logging.INFO, "raw", rhymerl_step=_step(1, 1, 3)))
    lines = out.getvalue().splitlines()
    assert "| 3.00 tok/verify | hist 12/16 | 1234 tok/s" in lines[0], lines[0]
    assert "hist" not in lines[1] and "hist" not in lines[2]
