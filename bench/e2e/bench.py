"""RhymeRL against the same system without HistoSpec and HistoPipe: the end-to-end benchmark.

    rhymerl bench e2e [--json] [--quick] [--seeds 3] [--epochs 4] [--prompts 128] [--workers 2]
                      [--config configs/default.toml] [--set KEY=VALUE ...] [--out bench/out/e2e]
                      [--resume] [--report-only] [--scale-workers 64] [--scale-max-tokens 8192]
                      [--cost-json SURFACE.json [--cost-model qwen2-7b@h200]]

Two arms, the same config, seeds and prompts, run in one invocation:

- baseline: `spec.enabled=false`, `pipe.policy="naive"` (plain sampling, contiguous placement);
- rhymerl: `spec.enabled=true`, `pipe.policy="lpt"` (HistoSpec + HistoPipe tier 1).

Every (seed, arm) is one real training run (`flows.run.run_flow`: Prefect + Ray + vLLM + lake +
MLflow) in its own child process, so each arm starts from a fresh Ray, fresh engines and a fresh
Python heap, a crash takes one run down and not the benchmark, and the order of runs cannot leak
state (caches, warmed allocators) from one arm into the other. Seeds alternate which arm goes
first (ABBA) so a machine that slows down over the hour does not favour one arm. The child writes
the run's per-step records (`run_flow`'s history: stage seconds, the step's full wall time,
speculation counters, bubble ratio, reward, accuracy; and `bench.e2e.cpu`'s CPU seconds of every
process of the run per part of each step) to `OUT/runs/<arm>-s<seed>.json` the moment
the run ends; after every run the aggregate `OUT/e2e.json`, `OUT/REPORT.md` and its PNG plots are
regenerated, so an interrupted benchmark keeps and reports every finished run. `--resume` skips
runs whose result file exists with the same settings; `--report-only` rebuilds the report.

Runs write to their own lake (`OUT/lake`), MLflow store (`OUT/mlflow.db`) and Prefect home
(`OUT/.prefect`, unless PREFECT_API_URL points at a server), never the project's `./lake`.
`--quick` (what `make bench` runs) is 1 seed x 3 epochs x 32 prompts: a smoke check of the
figures, not the headline; `make bench-e2e` is the full default (5 seeds x 5 epochs x 128 prompts
per arm, 40-60 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ARMS: dict[str, tuple[str, ...]] = {
    "baseline": ("spec.enabled=false", 'pipe.policy="naive"'),
    "rhymerl": ("spec.enabled=true", 'pipe.policy="lpt"'),
}
FULL = {"seeds": 5, "epochs": 5, "prompts": 128}  # 5 vs 5 seeds: an exact permutation p can reach 0.008
QUICK = {"seeds": 1, "epochs": 3, "prompts": 32}
_PROGRESS = ("epoch ", "HistoSpec history", "Traceback", "Error", "error:")  # child lines worth a look


@dataclass(frozen=True)
class E2ESettings:
    """One benchmark invocation: what every run shares, and where results go."""

    config: str
    seeds: tuple[int, ...]
    epochs: int
    prompts: int
    workers: int
    overrides: tuple[str, ...]  # the user's --set, applied to both arms before the arm's own keys
    out: str

    def settings(self) -> dict:
        """What must match for a saved run to be reused by --resume."""
        return {"config": self.config, "epochs": self.epochs, "prompts": self.prompts,
                "workers": self.workers, "overrides": list(self.overrides)}


def run_order(seeds: tuple[int, ...]) -> list[tuple[int, str]]:
    """(seed, arm) pairs, alternating which arm goes first per seed (ABBA)."""
    arms = list(ARMS)
    return [(s, a) for i, s in enumerate(seeds) for a in (arms if i % 2 == 0 else arms[::-1])]


def run_overrides(spec: E2ESettings, arm: str, seed: int) -> list[str]:
    """The `--set` list of one run: shared sizes, this seed, the bench's own stores, the arm."""
    out = Path(spec.out).absolute()
    return [f"epochs={spec.epochs}", f"data.num_prompts={spec.prompts}",
            f"rollout.num_workers={spec.workers}", f"seed={seed}", f'name="e2e-{arm}-s{seed}"',
            f'lake.url="{out / "lake"}"', f'tracking.uri="sqlite:///{out / "mlflow.db"}"',
            *spec.overrides, *ARMS[arm]]


def result_path(spec: E2ESettings, arm: str, seed: int) -> Path:
    return Path(spec.out) / "runs" / f"{arm}-s{seed}.json"


def load_runs(spec: E2ESettings) -> list[dict]:
    """The finished runs of this spec found in OUT/runs (any seed of the spec, same settings)."""
    runs = []
    for seed, arm in run_order(spec.seeds):
        path = result_path(spec, arm, seed)
        if path.is_file():
            run = json.loads(path.read_text())
            if run.get("settings") == spec.settings():
                runs.append(run)
    return runs


class PrefectRetries(logging.Filter):
    """Keeps every retry Prefect's HTTP client logs (at DEBUG: "...retryable... Another attempt will be
    made in Ns"), with when it happened, and drops the client's other DEBUG records. An epoch subflow
    that once in a while takes ~2 s to start may be such a retry (2 s +- 20% is its first wait)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG:
            return True
        message = record.getMessage()
        if "retryable" not in message:
            return False
        self.seen.append({"time": record.created, "message": message[:300]})
        return True

    def install(self) -> "PrefectRetries":
        client = logging.getLogger("prefect.client")
        client.setLevel(logging.DEBUG)
        client.addFilter(self)
        return self


def child_main(result: str, config: str, overrides: list[str], arm: str, seed: int, settings: str) -> int:
    """Run one training run in this process and write its records to `result` (atomically)."""
    from infra.environment import project_env

    project_env()
    from bench.e2e.report import git_commit
    from flows.run import run_flow
    from infra.local_api import local_api
    from rhymerl.config.run import config_to_dict, load_config

    from bench.e2e.cpu import PhaseCpu

    cfg = load_config(config, overrides)
    load_before, started = os.getloadavg(), time.time()
    t0 = time.perf_counter()
    cpu = PhaseCpu().install()  # CPU seconds per process and part of each step (bench.e2e.cpu)
    retries = PrefectRetries().install()
    with local_api():  # as `rhymerl run`: Prefect's temporary API with short retry waits
        out = run_flow(config=config_to_dict(cfg))
    recorded = cpu.result()
    for rec, step in zip(out["history"], recorded["steps"]):  # the same steps, in the same order
        rec["recorder_s"] = step.get("recorder_s", 0.0)
    payload = {"arm": arm, "seed": seed, "settings": json.loads(settings), "run_id": out["run_id"],
               "config": config_to_dict(cfg), "history": out["history"],
               "epoch_wall_s": {str(k): v for k, v in out["epoch_wall_s"].items()},
               "subflow_s": {str(k): v for k, v in out.get("subflow_s", {}).items()},
               "prefect_retries": retries.seen,
               "run_wall_s": time.perf_counter() - t0, "started": started, "finished": time.time(),
               "loadavg_start": list(load_before), "loadavg_end": list(os.getloadavg()), "commit": git_commit(),
               "cpu": recorded}
    path = Path(result)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, default=float))
    tmp.replace(path)
    return 0


def _stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """Stop a run that outlived its time limit: SIGINT (the flow's `finally` stops its Ray cluster
    and closes the MLflow run), then SIGTERM (seen to take the run's Ray processes down with it when
    a blocked main thread ignored SIGINT), then SIGKILL, each after `grace_s`."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        proc.send_signal(sig)
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            pass
    proc.kill()
    proc.wait()


def launch(spec: E2ESettings, arm: str, seed: int, env: dict[str, str], timeout_s: float) -> bool:
    """Run one (arm, seed) as a child process; stream its progress lines; True if it finished.
    A run still going after `timeout_s` is stopped and counts as failed (a hung engine must not
    hold the whole benchmark)."""
    path = result_path(spec, arm, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    log = path.with_suffix(".log")
    cmd = [sys.executable, "-m", "bench.e2e", "--run-one", str(path), "--arm", arm,
           "--seed", str(seed), "--config", spec.config, "--settings-json", json.dumps(spec.settings()),
           "--set", *run_overrides(spec, arm, seed)]
    with open(log, "w") as fh, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                text=True, env=env) as proc:
        watchdog = threading.Timer(timeout_s, _stop, args=(proc,))
        watchdog.daemon = True
        watchdog.start()
        for line in proc.stdout:
            fh.write(line)
            if any(k in line for k in _PROGRESS):
                text = line.rstrip().split(" - ", 1)[-1]  # drop Prefect's time/level/task-run prefix
                print(f"  [{arm} s{seed}] {text[:200]}", file=sys.stderr, flush=True)
        rc = proc.wait()
        watchdog.cancel()
    if rc != 0 or not path.is_file():
        tail = log.read_text().splitlines()[-30:]
        print(f"  [{arm} s{seed}] FAILED (exit {rc}); last lines of {log}:\n    " + "\n    ".join(tail),
              file=sys.stderr)
        return False
    return True


def child_env(spec: E2ESettings) -> dict[str, str]:
    """The children's environment: the project's settings, the bench's own Prefect home."""
    env = dict(os.environ)
    if not env.get("PREFECT_API_URL"):  # the temporary local API keeps its database here
        env["PREFECT_HOME"] = str((Path(spec.out) / ".prefect").absolute())
    env.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    env["PYTHONUNBUFFERED"] = "1"  # progress lines as they happen, not when a pipe buffer fills
    return env


def run_all(spec: E2ESettings, resume: bool, scale: dict, timeout_s: float) -> dict:
    """Every (seed, arm) run not already done; rebuilds the report after each. Returns the report."""
    from bench.e2e.report import write_report

    order = run_order(spec.seeds)
    env = child_env(spec)
    for i, (seed, arm) in enumerate(order, 1):
        path = result_path(spec, arm, seed)
        if resume and path.is_file() and json.loads(path.read_text()).get("settings") == spec.settings():
            print(f"[{i}/{len(order)}] {arm} seed {seed}: done before, kept ({path})", file=sys.stderr)
            continue
        path.unlink(missing_ok=True)
        print(f"[{i}/{len(order)}] {arm} seed {seed}: {spec.epochs} epochs x {spec.prompts} prompts, "
              f"{spec.workers} workers; load average {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        ok = launch(spec, arm, seed, env, timeout_s)
        print(f"[{i}/{len(order)}] {arm} seed {seed}: {'finished' if ok else 'FAILED'} in "
              f"{time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
        write_report(load_runs(spec), spec, scale)
    return write_report(load_runs(spec), spec, scale)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rhymerl bench e2e", formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="\n\n".join(__doc__.split("\n\n")[i] for i in (0, 2, 3)),
                                epilog="Full: 5 seeds x 5 epochs x 128 prompts per arm, 40-60 min on 2 cores "
                                       "(make bench-e2e). --quick: 1 seed x 3 epochs x 32 prompts.")
    p.add_argument("--json", action="store_true", help="print the aggregate report as JSON instead of a table")
    p.add_argument("--json-out", help="also write the aggregate JSON here (it is always in OUT/e2e.json)")
    p.add_argument("--quick", action="store_true", help="1 seed x 3 epochs x 32 prompts unless given")
    p.add_argument("--seeds", type=int, help=f"seeds per arm (default {FULL['seeds']}; run seeds 0..N-1)")
    p.add_argument("--epochs", type=int, help=f"epochs per run (default {FULL['epochs']})")
    p.add_argument("--prompts", type=int, help=f"prompts per epoch (default {FULL['prompts']})")
    p.add_argument("--workers", type=int, default=2, help="rollout workers (default 2)")
    p.add_argument("--config", default="configs/default.toml", help="base config of both arms")
    p.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                   help="extra overrides for both arms (the arms' spec.enabled/pipe.policy win)")
    p.add_argument("--out", default="bench/out/e2e", help="results, logs, lake, report (default bench/out/e2e)")
    p.add_argument("--resume", action="store_true", help="keep runs already finished with the same settings")
    p.add_argument("--report-only", action="store_true", help="rebuild the report from saved runs; run nothing")
    p.add_argument("--run-timeout", type=float, default=3600.0,
                   help="seconds one run may take before it is stopped and counted as failed (default 3600)")
    p.add_argument("--scale-workers", type=int, default=64, help="scale estimate: workers (default 64)")
    p.add_argument("--scale-max-tokens", type=int, default=8192,
                   help="scale estimate: response token cap (default 8192)")
    p.add_argument("--cost-json", help="scale estimate: a cost surface, measured (scripts/gpu-costmodel.py) or "
                                       "roofline (bench/results/cost-surface-roofline.json), instead of the "
                                       "assumed GPU-like cost model")
    p.add_argument("--cost-model", help="scale estimate: which model of --cost-json (needed if it holds several)")
    p.add_argument("--run-one", help=argparse.SUPPRESS)  # child mode: one run, its records to this file
    p.add_argument("--arm", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    p.add_argument("--settings-json", help=argparse.SUPPRESS)
    return p


def spec_from_args(args: argparse.Namespace) -> E2ESettings:
    sizes = QUICK if args.quick else FULL
    pick = lambda name: getattr(args, name) if getattr(args, name) is not None else sizes[name]  # noqa: E731
    return E2ESettings(config=args.config, seeds=tuple(range(pick("seeds"))), epochs=pick("epochs"),
                       prompts=pick("prompts"), workers=args.workers, overrides=tuple(args.set), out=args.out)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.run_one:
        return child_main(args.run_one, args.config, args.set, args.arm, args.seed, args.settings_json)
    spec = spec_from_args(args)
    if min(spec.epochs, spec.prompts, spec.workers, len(spec.seeds)) < 1:
        print("rhymerl bench e2e: --seeds, --epochs, --prompts and --workers must be >= 1", file=sys.stderr)
        return 2
    scale = {"workers": args.scale_workers, "max_tokens": args.scale_max_tokens,
             "cost_json": args.cost_json, "cost_model": args.cost_model}
    Path(spec.out).mkdir(parents=True, exist_ok=True)
    if args.report_only:
        from bench.e2e.report import write_report
        report = write_report(load_runs(spec), spec, scale)
    else:
        report = run_all(spec, args.resume, scale, args.run_timeout)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=2))
    from bench.e2e.report import format_text

    print(json.dumps(report, indent=2) if args.json else format_text(report))
    print(f"report: {Path(spec.out) / 'REPORT.md'}", file=sys.stderr)
    planned = len(run_order(spec.seeds))
    if len(report["runs"]) < planned:  # the report covers what finished; the exit status says it is partial
        print(f"rhymerl bench e2e: {len(report['runs'])} of {planned} runs finished; see OUT/runs/*.log, "
              "then run again with --resume to do the rest", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
