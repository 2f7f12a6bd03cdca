"""HistoPipe in the simulator: bubble ratio and makespan per scheduling policy at W = 8..256.

    python -m bench.pipe_bench [--json] [--dist builtin,heavy] [--workers 8,16,32,64,128,256]
                               [--capacity 256,64] [--prompts-per-worker 32] [--n 8]
    python -m bench.pipe_bench --check-lake URL --check-run RUN_ID [--check-capacity 256]
                               [--check-fit even|all] [--check-warmup N] [--json]
    python -m bench.pipe_bench --real-lake URL --real-runs RUN_A,RUN_B [--real-from-epoch 1] [--json]

For each length distribution, batch capacity C and worker count W, one step of
`prompts_per_worker * W` prompts with n samples each is simulated (`rhymerl.histopipe.simulator`),
so every worker holds about prompts_per_worker * n requests (256 by default: C=256 runs them all
at once, C=64 queues them four deep). Epochs 0..H-1 are history; the forecaster
(`rhymerl.histopipe.forecast`, last epoch + damped trend) turns them into forecasts for epoch H,
whose lengths drive the simulation. Policies:

- naive: contiguous chunks in the step's prompt order (the placement before HistoPipe), arrival-order admission.
- tier1: HistoPipe tier 1 (``lpt``), whole groups, long requests admitted first.
- tier1+2: ``tier2`` placement plus straggler migration in the step's last 10% (a request moves
  once it outgrows its prompt's forecast peak; re-prefilling its prefix costs 25 us per token).
- oracle: single samples placed longest-first knowing every true length.

Length distributions (the per-epoch noise model is assumed, not measured):

- builtin: the built-in task's prompts (`builtin_problems`); a sample's length is its worked
  solution's length + EOS, times exp(N(0, 0.08)) per sample and exp(N(0, 0.05)) per prompt
  and epoch; 3% of samples run away to max_tokens = 160.
- heavy: synthetic reasoning-style heavy tail: per-prompt lognormal, median 1024 tokens,
  sigma 0.8; per prompt and epoch x exp(N(0.03 e, 0.2)) (slow lengthening); per sample
  x exp(N(0, 0.4)); clipped to [16, 8192].

The cost model is GPU-like by default (8 ms per iteration + 0.15 ms per running request); pass
`--base-ms/--per-seq-ms` (e.g. from `costmodel.calibrate` on a real run) to change it. Bubble
cut = 1 - bubble(policy) / bubble(naive); vs oracle = makespan(policy) / makespan(oracle) - 1.

Simulator check (`--check-lake/--check-run`, instead of the sweep): reads a real run's rollouts
from the lake, fits the cost model on its even global steps and replays each odd step's real
placement with its true lengths (`rhymerl.histopipe.validate`); error = simulated makespan /
measured - 1 per step. The run must have speculation off (`--set spec.enabled=false`): the cost
model has one token per iteration. `--check-capacity` is the engine's max_num_seqs (the run does
not set it; vLLM's default on CPU is 256); `--check-warmup N` leaves the first N global steps
(a freshly started engine's first batches) out of fit and check.

Real runs (`--real-lake/--real-runs`, instead of the sweep): one row per run from the lake's
steps table, steps of epochs >= `--real-from-epoch` only (epoch 0 has no forecasts): placement
policy and migration from the run's config, mean and median bubble ratio, mean makespan and
rollout seconds, migrations, and reward seconds on (`reward_s`) and off (`reward_total_s`) the
critical path, and `vs oracle`: each step's placement and the oracle's (single samples placed
longest-first knowing the true lengths) simulated on the step's true lengths with a cost model
fitted on the run's own steps (`--check-capacity` is its capacity), mean of simulated(placement) /
simulated(oracle) - 1; "-" for runs with speculation or migration, which a replay cannot stand
for. Runs must be comparable (same W, prompts, n; the table shows them).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from bench.pipe_real import check_lake, check_record, format_check, format_real, real_runs
from rhymerl.data.builtin import builtin_problems
from rhymerl.histopipe.costmodel import CostModel
from rhymerl.histopipe.forecast import ForecastSettings, build_history, epoch_means, forecast_lengths, forecast_quality
from rhymerl.histopipe.schedule import Demand, ScheduleRequest, schedule
from rhymerl.histopipe.simulator import MigrationSettings, simulate
from rhymerl.histopipe.validate import FIT_SETS
from storage.lake import LakeError

POLICIES = ("naive", "tier1", "tier1+2", "oracle")
HISTOPIPE = ("tier1", "tier1+2")
SampleLengths = dict[tuple[str, int], int]


@dataclass(frozen=True)
class Workload:
    """Prompts, their prompt lengths, and recorded sample lengths per epoch."""

    prompt_ids: tuple[str, ...]
    prompt_lengths: dict[str, int]
    epochs: tuple[SampleLengths, ...]
    max_tokens: int


def builtin_workload(prompts: int, epochs: int, n: int, seed: int) -> Workload:
    """The built-in task's length distribution with the noise model in the module docstring."""
    rng, max_tokens = random.Random(seed), 160
    problems = builtin_problems(prompts, seed)
    ids = tuple(f"b{p.index:06d}" for p in problems)
    per_epoch = []
    for _ in range(epochs):
        lengths: SampleLengths = {}
        for pid, p in zip(ids, problems):
            drift = math.exp(rng.gauss(0.0, 0.05))
            for k in range(n):
                x = (len(p.solution) + 1) * drift * math.exp(rng.gauss(0.0, 0.08))
                lengths[pid, k] = max_tokens if rng.random() < 0.03 else min(max_tokens, max(1, round(x)))
        per_epoch.append(lengths)
    return Workload(ids, {pid: len(p.question) + 1 for pid, p in zip(ids, problems)}, tuple(per_epoch), max_tokens)


def heavy_workload(prompts: int, epochs: int, n: int, seed: int) -> Workload:
    """Synthetic heavy-tailed lengths with the noise model in the module docstring."""
    rng, max_tokens = random.Random(seed), 8192
    ids = tuple(f"h{i:06d}" for i in range(prompts))
    base = {pid: rng.lognormvariate(math.log(1024), 0.8) for pid in ids}
    per_epoch = []
    for e in range(epochs):
        lengths: SampleLengths = {}
        for pid in ids:
            drift = math.exp(rng.gauss(0.03 * e, 0.2))
            for k in range(n):
                x = base[pid] * drift * math.exp(rng.gauss(0.0, 0.4))
                lengths[pid, k] = min(max_tokens, max(16, round(x)))
        per_epoch.append(lengths)
    return Workload(ids, {pid: 0 for pid in ids}, tuple(per_epoch), max_tokens)


WORKLOADS: dict[str, Callable[[int, int, int, int], Workload]] = {
    "builtin": builtin_workload, "heavy": heavy_workload}


@dataclass(frozen=True)
class BenchSettings:
    """One benchmark sweep."""

    dists: tuple[str, ...] = ("builtin", "heavy")
    workers: tuple[int, ...] = (8, 16, 32, 64, 128, 256)
    capacities: tuple[int, ...] = (256, 64)  # requests a worker runs at once (one sweep each)
    prompts_per_worker: int = 32
    n: int = 8
    history_epochs: int = 2  # epochs of history before the scheduled epoch
    seed: int = 0
    cost: CostModel = field(default_factory=lambda: CostModel(base_s=0.008, per_seq_s=1.5e-4))  # capacity swept
    # Re-prefilling a carried prefix: ~25 us per token (4k tokens in ~0.1 s on a GPU-class engine).
    migration: MigrationSettings = field(default_factory=lambda: MigrationSettings(prefill_s_per_token=25e-6))


def _records(lengths: SampleLengths, epoch: int) -> list[dict]:
    return [{"prompt_id": p, "epoch": epoch, "length": x} for (p, _), x in lengths.items()]


def run_point(spec: BenchSettings, dist: str, workers: int, capacity: int) -> dict:
    """Simulate every policy on one (distribution, W, capacity) point; returns its numbers."""
    h, cost = spec.history_epochs, replace(spec.cost, capacity=capacity)
    wl = WORKLOADS[dist](spec.prompts_per_worker * workers, h + 1, spec.n, spec.seed + workers)
    history = build_history([r for e in range(h) for r in _records(wl.epochs[e], e)])
    fspec = ForecastSettings(max_length=wl.max_tokens)
    forecasts = forecast_lengths(history, wl.prompt_ids, fspec, wl.prompt_lengths, target_epoch=h)
    truth = wl.epochs[h]
    quality = forecast_quality({p: f.mean for p, f in forecasts.items()}, epoch_means(_records(truth, h), h))
    demands = tuple(forecasts[p].demand(spec.n) for p in wl.prompt_ids)
    exact = tuple(Demand(p, tuple(float(truth[p, k]) for k in range(spec.n)), exact=True) for p in wl.prompt_ids)
    peaks = {p: f.peak for p, f in forecasts.items()}
    runs = {
        "naive": (schedule("naive", ScheduleRequest(demands, workers, cost)), None),
        "tier1": (schedule("lpt", ScheduleRequest(demands, workers, cost)), None),
        "tier1+2": (schedule("tier2", ScheduleRequest(demands, workers, cost, step=h)), spec.migration),
        "oracle": (schedule("oracle", ScheduleRequest(exact, workers, cost)), None),
    }
    out: dict = {"dist": dist, "workers": workers, "capacity": capacity, "prompts": len(wl.prompt_ids),
                 "requests": len(truth), "spearman": quality.spearman, "moved_fraction": quality.moved_fraction}
    for name, (assignment, migration) in runs.items():
        res = simulate(assignment, truth, cost, migration, peaks if migration else None)
        out[name] = {"bubble_ratio": res.bubble_ratio, "makespan_s": res.makespan, "migrations": res.migrations}
    for name in HISTOPIPE:
        naive_bubble = out["naive"]["bubble_ratio"]
        out[name]["bubble_cut"] = 1.0 - out[name]["bubble_ratio"] / naive_bubble if naive_bubble > 0 else 0.0
        out[name]["vs_oracle"] = out[name]["makespan_s"] / out["oracle"]["makespan_s"] - 1.0
    return out


def run_bench(spec: BenchSettings) -> dict:
    """Every (distribution, capacity, W) point, and per HistoPipe policy whether the issue's
    targets (bubble cut >= 50% vs naive, makespan within 10% of oracle) hold at every point."""
    points = [run_point(spec, d, w, c) for d in spec.dists for c in spec.capacities for w in spec.workers]
    targets = {name: {"bubble_cut_ge_50pct": all(p[name]["bubble_cut"] >= 0.5 for p in points),
                      "within_10pct_of_oracle": all(p[name]["vs_oracle"] <= 0.10 for p in points)}
               for name in HISTOPIPE}
    return {"spec": asdict(spec), "points": points, "targets": targets}


def format_table(result: dict) -> str:
    """Fixed-width table: bubble ratio (%) and makespan (s) per policy; HistoPipe vs naive/oracle."""
    cols = " ".join(f"{p:>15}" for p in POLICIES)
    lines = [f"{'dist':8} {'C':>4} {'W':>4} {'rho':>5} {cols}  {'bubble cut':>13}  {'vs oracle':>13}",
             f"{'':8} {'':>4} {'':>4} {'':>5} " + " ".join(f"{'bubble% makesp':>15}" for _ in POLICIES)
             + f"  {'tier1 tier1+2':>13}  {'tier1 tier1+2':>13}"]
    for pt in result["points"]:
        cells = " ".join(f"{100 * pt[p]['bubble_ratio']:6.1f} {pt[p]['makespan_s']:8.2f}" for p in POLICIES)
        cut = " ".join(f"{100 * pt[p]['bubble_cut']:5.0f}%" for p in HISTOPIPE)
        gap = " ".join(f"{100 * pt[p]['vs_oracle']:5.1f}%" for p in HISTOPIPE)
        lines.append(f"{pt['dist']:8} {pt['capacity']:>4} {pt['workers']:>4} {pt['spearman']:5.2f} {cells}  "
                     f"{cut:>13}  {gap:>13}")
    for name, t in result["targets"].items():
        lines.append(f"{name}: bubble cut >= 50% vs naive at every point: {t['bubble_cut_ge_50pct']}; "
                     f"makespan within 10% of oracle at every point: {t['within_10pct_of_oracle']}")
    return "\n".join(lines)


# No ORDER BY: the lake keeps each step's rows in the order the engine admitted them (ties in gen_start).
def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pipe_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    ap.add_argument("--dist", default="builtin,heavy", help="length distributions: builtin, heavy")
    ap.add_argument("--workers", type=_ints, default=BenchSettings.workers, help="comma-separated worker counts")
    ap.add_argument("--prompts-per-worker", type=int, default=BenchSettings.prompts_per_worker)
    ap.add_argument("--n", type=int, default=BenchSettings.n, help="samples per prompt")
    ap.add_argument("--capacity", type=_ints, default=BenchSettings.capacities,
                    help="comma-separated batch capacities (requests a worker runs at once)")
    ap.add_argument("--base-ms", type=float, default=8.0, help="ms per engine iteration")
    ap.add_argument("--per-seq-ms", type=float, default=0.15, help="extra ms per iteration per running request")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out", metavar="FILE", help="also write the JSON results to FILE")
    ap.add_argument("--check-lake", metavar="URL", help="check the simulator against a run in this lake "
                    "(instead of the sweep; needs --check-run)")
    ap.add_argument("--check-run", metavar="RUN_ID", help="run to check (made with spec.enabled=false)")
    ap.add_argument("--check-capacity", type=int, default=256,
                    help="the run's engine max_num_seqs (vLLM's CPU default: 256)")
    ap.add_argument("--check-fit", choices=FIT_SETS, default="even",
                    help="even: fit on even global steps, check odd ones; all: fit and check every step")
    ap.add_argument("--check-warmup", type=int, default=0, metavar="N",
                    help="leave the run's first N global steps out of fit and check (engine warm-up)")
    ap.add_argument("--real-lake", metavar="URL", help="summarise real runs in this lake (instead of the "
                    "sweep; needs --real-runs)")
    ap.add_argument("--real-runs", metavar="RUN_A,RUN_B", help="comma-separated run ids to summarise")
    ap.add_argument("--real-from-epoch", type=int, default=1, metavar="E", help="count steps of epochs >= E")
    args = ap.parse_args(argv)
    if bool(args.real_lake) != bool(args.real_runs):
        ap.error("--real-lake and --real-runs go together")
    if args.real_lake:
        try:
            rows = real_runs(args.real_lake, [r for r in args.real_runs.split(",") if r], args.real_from_epoch,
                             args.check_capacity)
        except (ValueError, LakeError) as exc:
            ap.exit(2, f"pipe_bench: {exc}\n")
        print(json.dumps({"real": rows}, indent=2) if args.json else format_real(rows))
        if args.json_out:
            Path(args.json_out).write_text(json.dumps({"real": rows}, indent=2))
        return 0
    if bool(args.check_lake) != bool(args.check_run):
        ap.error("--check-lake and --check-run go together")
    if args.check_lake:
        if args.check_capacity < 1 or args.check_warmup < 0:
            ap.error("--check-capacity must be >= 1 and --check-warmup >= 0")
        try:
            check = check_lake(args.check_lake, args.check_run, args.check_capacity, args.check_fit,
                               args.check_warmup)
        except (ValueError, LakeError) as exc:
            ap.exit(2, f"pipe_bench: {exc}\n")
        result = {"check": check_record(check, args.check_lake, args.check_run)}
        print(json.dumps(result, indent=2) if args.json else format_check(result["check"]))
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(result, indent=2))
        return 0
    dists = tuple(d for d in args.dist.split(",") if d)
    unknown = [d for d in dists if d not in WORKLOADS]
    if unknown:
        ap.error(f"unknown --dist {unknown}; choose from {', '.join(WORKLOADS)}")
    sizes = args.workers + args.capacity + (args.prompts_per_worker, args.n)
    if not args.workers or not args.capacity or min(sizes) < 1:
        ap.error("--workers, --capacity, --prompts-per-worker and --n need whole numbers >= 1")
    spec = BenchSettings(dists=dists, workers=args.workers, capacities=args.capacity,
                         prompts_per_worker=args.prompts_per_worker, n=args.n, seed=args.seed,
                         cost=CostModel(base_s=args.base_ms / 1e3, per_seq_s=args.per_seq_ms / 1e3))
    result = run_bench(spec)
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
