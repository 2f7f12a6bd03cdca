"""The console of `rhymerl run`: what a person watches, while every log line goes to a file.

`capture_output` points the process's stdout and stderr (file descriptors 1 and 2, so Ray's
streamed actor logs, vLLM, Prefect and child processes follow) at the run log file, and returns
streams on the terminal. `RunConsole`, a logging handler, writes to that stream only:

- the start lines: the MLflow run, and the Prefect UI link when a Prefect server is used
  (from the run flow's start record, `extra={"rhymerl_start": {...}}`);
- one progress line per step (from `extra={"rhymerl_step": record}` on the step's log line):
  a bar of the epoch, reward, accuracy, tokens per verification, how many of the step's prompts
  came with HistoSpec history from earlier epochs ("hist 12/16": the step's bundles, summed over
  workers; none in epoch 0, where drafts come from siblings and the cross-prompt tree), tok/s
  and the ETA; then one line per finished epoch, followed by the held-out evaluation's figures
  when one ran after it (and before the first epoch), from `extra={"rhymerl_eval": {"epoch": ...,
  "line": ...}}`;
- warnings from RhymeRL's own code and its flow and task runs (a skipped prompt, a restarted
  worker, speculation refused by the guard), first line only.

Prefect's UI and MLflow get every record as before: this handler only adds a sink.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Mapping, TextIO

from rhymerl.run.report import accuracy_part, epoch_summary

# Loggers whose warnings matter to a person running training: RhymeRL's own modules, and the
# Prefect run loggers that flow and task code (`get_run_logger()`) write through.
_OWN_LOGGERS = ("rhymerl", "tasks", "flows", "storage", "prefect.flow_runs", "prefect.task_runs")
_RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")  # Prefect's engines report each run's end there
_BAR = 12  # characters of the per-epoch progress bar


def capture_output(log_file: Path) -> tuple[TextIO, TextIO]:
    """Send this process's stdout and stderr, and its future child processes', to `log_file`
    (appended); return line-buffered streams on the terminal's former stdout and stderr."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    err = os.fdopen(os.dup(2), "w", buffering=1)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)
    return out, err


def duration(seconds: float) -> str:
    """12s, 4m05s, 1h02m: a human-sized duration."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def prefect_ui_link(api_url: str, flow_run_id: str) -> str:
    """The Prefect UI page of a flow run, from the server's API URL (http://host:4200/api)."""
    base = api_url.rstrip("/")
    base = base[: -len("/api")] if base.endswith("/api") else base
    return f"{base}/runs/flow-run/{flow_run_id}"


class RunConsole(logging.Handler):
    """A logging sink that writes a run's progress, start lines and warnings to `stream`.

    `total_steps` is the run's step count (epochs x steps per epoch) and `steps_per_epoch` the
    epoch's; `environ` gives PREFECT_API_URL (and PREFECT_UI_URL) for the UI link.
    """

    def __init__(self, stream: TextIO, total_steps: int, steps_per_epoch: int,
                 environ: Mapping[str, str]) -> None:
        super().__init__(level=logging.INFO)
        self.stream = stream
        self.total_steps = total_steps
        self.steps_per_epoch = steps_per_epoch
        self.ui = environ.get("PREFECT_UI_URL") or environ.get("PREFECT_API_URL") or ""
        self.started = time.monotonic()  # reset when training starts (engines up)
        self.seen = 0  # steps this process ran (a resumed run starts past 0)
        self.epoch_records: list[dict] = []
        self.epoch_started = self.started
        self.stopping = False  # a stop signal came (`stop()`)

    def stop(self) -> None:
        """The run is stopping on a signal: Prefect's engines now report every flow and task run it
        cuts short as crashed, at error level; those lines stay in the log, the stop's own lines say it."""
        self.stopping = True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            lines = self.lines(record)
        except Exception:  # a console line must never fail the run
            self.handleError(record)
            return
        for line in lines:
            self.stream.write(line + "\n")

    def lines(self, record: logging.LogRecord) -> list[str]:
        """What `record` shows on the console (usually nothing)."""
        step = getattr(record, "rhymerl_step", None)
        if step is not None:
            return self._step(step)
        start = getattr(record, "rhymerl_start", None)
        if start is not None:
            return self._start(start, record)
        evaluation = getattr(record, "rhymerl_eval", None)
        if evaluation is not None:  # after its epoch's line (or before the first step's)
            return [f"  {evaluation['line']}"]
        if self.stopping and record.levelno >= logging.ERROR and record.name.startswith(_RUN_LOGGERS):
            return []
        if record.levelno >= logging.WARNING and record.name.startswith(_OWN_LOGGERS):
            first = record.getMessage().strip().splitlines()[0] if record.getMessage().strip() else ""
            return [f"{record.levelname.lower()}: {first}"]
        return []

    def _start(self, start: Mapping, record: logging.LogRecord) -> list[str]:
        self.started = self.epoch_started = time.monotonic()
        if start.get("steps_per_epoch"):  # prompts skipped as too long make epochs shorter
            epochs = self.total_steps // self.steps_per_epoch
            self.steps_per_epoch = int(start["steps_per_epoch"])
            self.total_steps = epochs * self.steps_per_epoch
        lines = [f"  MLflow    run {start.get('mlflow_run_id', '')}"]
        flow_run_id = getattr(record, "flow_run_id", None)
        if self.ui and flow_run_id:
            lines.append(f"  Prefect   {prefect_ui_link(self.ui, str(flow_run_id))}")
        lines.append(f"training: {record.getMessage()}")
        return lines

    def _step(self, rec: Mapping) -> list[str]:
        self.seen += 1
        now = time.monotonic()
        epoch, step = int(rec["epoch"]), int(rec["step"])
        remaining = max(self.total_steps - int(rec["global_step"]) - 1, 0)
        eta = (now - self.started) / self.seen * remaining
        done = step + 1
        bar = "#" * round(_BAR * done / self.steps_per_epoch)
        spec = f" | {rec['spec/mean_accepted_length']:.2f} tok/verify" if "spec/mean_accepted_length" in rec else ""
        if "spec/history_prompts" in rec:  # HistoSpec's bundles were made (not for ngram/suffix or a reused step)
            spec += f" | hist {rec['spec/history_prompts_with_history']:.0f}/{rec['spec/history_prompts']:.0f}"
        lines = [f"epoch {epoch} [{bar:<{_BAR}}] step {done}/{self.steps_per_epoch} | reward "
                 f"{rec['reward_mean']:.3f}{accuracy_part(rec)}{spec} | "
                 f"{rec['rollout_tokens_per_s']:.0f} tok/s | step {rec['step_s']:.1f}s | ETA {duration(eta)}"]
        self.epoch_records.append(dict(rec))
        if done == self.steps_per_epoch:
            lines.append(self._epoch_line(now))
        return lines

    def _epoch_line(self, now: float) -> str:
        (row,) = epoch_summary(self.epoch_records)
        spec = f", {row['spec_accepted_len']:.2f} tok/verify" if "spec_accepted_len" in row else ""
        line = (f"epoch {row['epoch']} done in {duration(now - self.epoch_started)}: reward "
                f"{row['reward_mean']:.3f}{accuracy_part(row, ', accuracy ')}{spec}")
        self.epoch_records, self.epoch_started = [], now
        return line
