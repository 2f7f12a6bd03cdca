"""HistoPipe: forecast response lengths from history and place rollouts so no worker idles.

- `forecast`: per-prompt length forecasts from lake records, priors for unseen prompts, quality.
- `costmodel`: one worker under continuous batching, calibrated from measured timings.
- `schedule`: policies (naive, round_robin, lpt, tier2, oracle) from forecasts to an assignment.
- `simulator`: discrete-event replay of a step on W workers, straggler migration, bubble ratio.
- `migration`: straggler migration in the real run: who moves, and joining prefix and continuation.
- `gantt`: a PNG of a step's per-worker timeline.
- `validate`: the simulator checked against a measured run (fit on some steps, replay the others).

Everything here is pure (plain records in, dataclasses out); the lake query lives in `storage/`.
"""

from rhymerl.histopipe.costmodel import Calibration, CostModel, calibrate
from rhymerl.histopipe.forecast import (Forecast, ForecastQuality, ForecastSettings, build_history, epoch_means,
                                        forecast_lengths, forecast_quality, history_from_summary)
from rhymerl.histopipe.migration import MigrationRule, Move, WorkerView, join_prefix, select_migrations
from rhymerl.histopipe.schedule import POLICIES, Assignment, Demand, ScheduleRequest, Unit, schedule
from rhymerl.histopipe.simulator import MigrationSettings, RequestSpan, SimResult, measure, simulate
from rhymerl.histopipe.validate import RunCheck, StepCheck, check_run

__all__ = [
    "Assignment", "Calibration", "CostModel", "Demand", "Forecast", "ForecastQuality", "ForecastSettings",
    "MigrationRule", "MigrationSettings", "Move", "POLICIES", "RequestSpan", "RunCheck", "ScheduleRequest",
    "SimResult", "StepCheck", "Unit", "WorkerView",
    "build_history", "calibrate", "check_run", "epoch_means", "forecast_lengths", "forecast_quality",
    "history_from_summary", "join_prefix", "measure", "schedule", "select_migrations", "simulate",
]
