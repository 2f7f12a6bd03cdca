"""Check the simulator against a real run: replay each measured step and compare makespans.

From a run's lake rollout rows, `check_run` fits the cost model (`costmodel.calibrate`) on one
set of steps and, for every other step, rebuilds the placement that really ran (per worker, its
requests in admission order), simulates it with the true lengths (`simulator.simulate`) and
compares the simulated makespan and bubble ratio with the measured ones (`simulator.measure`).

Fit and check sets: with ``fit="even"`` the fit uses the even global steps (steps in (epoch, step)
order, numbered from 0) and the check the odd ones, so no step is checked by a model fitted on
its own timings; ``fit="all"`` fits on every step and checks every step (in-sample, for runs with
one step). `warmup` leaves the run's first global steps out of both (a freshly started engine's
first batch pays one-off start-up costs a steady-state cost model is not meant to explain); the
numbering stays that of the whole run. Admission order: a worker's requests in `gen_start` order, ties in row order (the
engine stamps one `gen_start` per call and adds requests in the order the lake stores them).

`oracle_gap` puts a measured step next to the oracle (single samples placed longest-first
knowing every true length) under the same fitted cost model: both makespans are simulated, so
the gap is what the run's placement cost, free of the model's own error.

The cost model assumes one token per engine iteration, so the run must not use speculative
decoding (accepted drafts make tokens per iteration vary). It also starts every worker at the
step's first admission: `start_skew_s` reports how much later the last worker really started.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Sequence

from rhymerl.histopipe.costmodel import Calibration, calibrate
from rhymerl.histopipe.schedule import Assignment, Demand, ScheduleRequest, Unit, schedule
from rhymerl.histopipe.simulator import SimResult, measure, simulate

ROW_KEYS = ("epoch", "step", "prompt_id", "sample_idx", "worker_id", "gen_start", "gen_end", "length")
FIT_SETS = ("even", "all")


@dataclass(frozen=True)
class StepCheck:
    """One checked step: measured vs simulated."""

    epoch: int
    step: int
    global_step: int  # position of (epoch, step) among the run's steps, from 0
    requests: int
    measured_s: float  # makespan: first admission to last finish
    simulated_s: float
    error: float  # simulated_s / measured_s - 1
    bubble_measured: float
    bubble_simulated: float
    start_skew_s: float  # latest worker's first admission - earliest (simulated as 0)
    worker_measured_s: tuple[float, ...]  # (W,) each worker's last finish from the step's start
    worker_simulated_s: tuple[float, ...]  # (W,)


@dataclass(frozen=True)
class RunCheck:
    """The fitted cost model, every checked step and the error summary."""

    calibration: Calibration
    fit: str
    fit_steps: tuple[int, ...]  # global steps the cost model was fitted on
    warmup: int  # first global steps left out of fit and check
    workers: int
    steps: tuple[StepCheck, ...]

    @property
    def mean_abs_error(self) -> float:
        return sum(abs(s.error) for s in self.steps) / len(self.steps)

    @property
    def max_abs_error(self) -> float:
        return max(abs(s.error) for s in self.steps)

    def within(self, tolerance: float) -> bool:
        """Every checked step's makespan within `tolerance` (relative) of the measured one."""
        return self.max_abs_error <= tolerance


def check_rows(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows as a list; raises naming the first column a row lacks (or holds NULL in)."""
    out = list(rows)
    if not out:
        raise ValueError("check_run: no rollout rows; pass the run's lake rows (is the run id right?)")
    for i, r in enumerate(out):
        missing = [k for k in ROW_KEYS if r.get(k) is None]
        if missing:
            raise ValueError(f"check_run: row {i} ({r.get('epoch')}/{r.get('step')}) has no {missing[0]!r} "
                             f"(missing or NULL: {missing}); rows need {', '.join(ROW_KEYS)} "
                             f"(runs written before per-request timings cannot be checked)")
    return out


def measured_assignment(rows: Sequence[Mapping[str, Any]], workers: int) -> Assignment:
    """The placement one step really ran: per worker, one-sample units in admission order
    (`gen_start`, ties in row order), each forecast at its true length."""
    placed: list[list[Mapping[str, Any]]] = [[] for _ in range(workers)]
    for r in rows:
        if not 0 <= r["worker_id"] < workers:
            raise ValueError(f"check_run: worker_id {r['worker_id']} outside 0..{workers - 1}; pass workers")
        placed[r["worker_id"]].append(r)
    units = tuple(tuple(Unit(r["prompt_id"], (int(r["sample_idx"]),), float(r["length"]), float(r["length"]))
                        for r in sorted(mine, key=lambda r: r["gen_start"]))  # stable: ties keep row order
                  for mine in placed)
    return Assignment("measured", units)


def _worker_ends(result: SimResult) -> tuple[float, ...]:
    return tuple(max((b for _, b in busy), default=0.0) for busy in result.busy)


def check_step(rows: Sequence[Mapping[str, Any]], calibration: Calibration, workers: int,
               global_step: int) -> StepCheck:
    """Simulate one measured step's placement under the fitted cost model and compare."""
    lengths: dict[tuple[str, int], int] = {}
    for r in rows:
        key = (r["prompt_id"], int(r["sample_idx"]))
        if key in lengths:
            raise ValueError(f"check_run: {key} appears twice in epoch {r['epoch']} step {r['step']}")
        lengths[key] = int(r["length"])
    real = measure(rows, workers)
    sim = simulate(measured_assignment(rows, workers), lengths, calibration.cost)
    starts = [min(r["gen_start"] for r in rows if r["worker_id"] == w)
              for w in range(workers) if any(r["worker_id"] == w for r in rows)]
    return StepCheck(
        epoch=int(rows[0]["epoch"]), step=int(rows[0]["step"]), global_step=global_step, requests=len(rows),
        measured_s=real.makespan, simulated_s=sim.makespan,
        error=sim.makespan / real.makespan - 1.0 if real.makespan > 0 else math.inf,
        bubble_measured=real.bubble_ratio, bubble_simulated=sim.bubble_ratio,
        start_skew_s=max(starts) - min(starts),
        worker_measured_s=_worker_ends(real), worker_simulated_s=_worker_ends(sim))


def check_run(rows: Iterable[Mapping[str, Any]], capacity: int = 256, workers: int | None = None,
              fit: Literal["even", "all"] = "even", warmup: int = 0) -> RunCheck:
    """Fit the cost model on some of a run's steps and check the simulator on the others.

    `rows`: lake rollout rows of one run (`ROW_KEYS`), in lake order. `capacity`: the engine's
    max_num_seqs (vLLM's default on CPU is 256). `workers`: the run's worker count (default: the
    highest worker_id + 1). `fit`: "even" or "all"; `warmup`: steps to leave out (module docstring).
    """
    if fit not in FIT_SETS:
        raise ValueError(f"check_run: fit={fit!r}; choose one of {', '.join(FIT_SETS)}")
    if warmup < 0:
        raise ValueError(f"check_run: warmup={warmup} must be >= 0")
    rows = check_rows(rows)
    workers = workers if workers is not None else 1 + max(int(r["worker_id"]) for r in rows)
    by_step: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        by_step.setdefault((int(r["epoch"]), int(r["step"])), []).append(r)
    order = sorted(by_step)
    kept = range(warmup, len(order))
    if fit == "even":
        fit_steps = tuple(g for g in kept if g % 2 == 0)
        check_steps = tuple(g for g in kept if g % 2 == 1)
    else:
        fit_steps = check_steps = tuple(kept)
    if not fit_steps or not check_steps:
        need = warmup + (2 if fit == "even" else 1)
        raise ValueError(f"check_run: fit={fit!r} with warmup={warmup} needs at least {need} steps, the run has "
                         f"{len(order)}; use fit='all' (in-sample), a smaller warmup or a longer run")
    calibration = calibrate([r for g in fit_steps for r in by_step[order[g]]], capacity)
    checks = tuple(check_step(by_step[order[g]], calibration, workers, g) for g in check_steps)
    return RunCheck(calibration, fit, fit_steps, warmup, workers, checks)


@dataclass(frozen=True)
class OracleGap:
    """One measured step's placement against the oracle's, both simulated with the same cost model."""

    epoch: int
    step: int
    placement_s: float  # simulated makespan of the placement that really ran
    oracle_s: float  # simulated makespan of the oracle placement on the same true lengths

    @property
    def gap(self) -> float:
        """placement_s / oracle_s - 1 (0 = as good as knowing every length)."""
        return self.placement_s / self.oracle_s - 1.0 if self.oracle_s > 0 else math.inf


def oracle_gap(rows: Sequence[Mapping[str, Any]], calibration: Calibration, workers: int) -> OracleGap:
    """Simulate one step's measured placement and the oracle's on its true lengths (`rows`: the
    step's rollout rows, `ROW_KEYS`; every prompt's samples numbered 0..n-1)."""
    lengths = {(r["prompt_id"], int(r["sample_idx"])): int(r["length"]) for r in rows}
    if len(lengths) != len(rows):
        raise ValueError(f"oracle_gap: a (prompt, sample) appears twice in epoch {rows[0]['epoch']} "
                         f"step {rows[0]['step']}")
    per_prompt: dict[str, list[int]] = {}
    for pid, k in sorted(lengths):
        per_prompt.setdefault(pid, []).append(k)
    demands = []
    for pid, ks in per_prompt.items():
        if ks != list(range(len(ks))):
            raise ValueError(f"oracle_gap: prompt {pid} has samples {ks}, expected 0..{len(ks) - 1}")
        demands.append(Demand(pid, tuple(float(lengths[pid, k]) for k in ks), exact=True))
    oracle = schedule("oracle", ScheduleRequest(tuple(demands), workers, calibration.cost))
    placed = simulate(measured_assignment(rows, workers), lengths, calibration.cost)
    best = simulate(oracle, lengths, calibration.cost)
    return OracleGap(int(rows[0]["epoch"]), int(rows[0]["step"]), placed.makespan, best.makespan)
