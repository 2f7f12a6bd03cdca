"""`rhymerl` command line: run training, build the built-in model, query the lake, export a model,
replay HistoSpec.

Heavy imports (Prefect, Ray, vLLM, torch) happen inside the subcommands so `rhymerl --help`
answers at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from cli.export import register as register_export
from cli.lake import register as register_lake
from cli.spec_replay import register as register_spec
from cli.ui import register as register_ui
from cli.version import VersionAction
from infra.environment import project_env
from infra.stop import EXIT_CODES, Stop, deferred, exit_now

DEFAULT_CONFIG = "configs/default.toml"
# Exit codes of `rhymerl run` (docs/console-and-errors.md): 0 done, 1 an unexpected error mid-run,
# 2 bad input found by the checks before anything started, 3 an actor lost for good (resume),
# 4 a reward function failed mid-run (fix it, resume), 130 Ctrl-C (SIGINT) and 143 SIGTERM (resume).
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_RUN_LOST = 3
EXIT_REWARD_FAILED = 4
EXIT_INTERRUPTED = EXIT_CODES[signal.SIGINT]  # 130, the shells' convention for Ctrl-C
EXIT_TERMINATED = EXIT_CODES[signal.SIGTERM]  # 143


def _default_config() -> str | None:
    return DEFAULT_CONFIG if Path(DEFAULT_CONFIG).is_file() else None


def _resume_config(args: argparse.Namespace, overrides: list[str]):
    """A resumed run's config: the one stored in the lake's runs table, then --set/--lake on top.

    The lake to look in is --lake, else $RHYMERL_LAKE, else the lake.url of the default config.
    The environment's settings apply over the stored config as over a config file.
    """
    from rhymerl.config.run import load_config, resolve_config
    from tasks.resume import stored_config

    lake_url = args.lake or load_config(_default_config(), env=os.environ).lake.url
    return resolve_config(stored_config(lake_url, args.resume), overrides, os.environ)


def _print_env_sources(overrides: list[str]) -> None:
    """Say on stderr which keys came from the environment (and which of those --set/--lake beat)."""
    from rhymerl.config.environment import env_sources

    set_keys = {o.split("=", 1)[0].strip() for o in overrides}
    for key, name in env_sources(os.environ).items():
        note = " (overridden by --set/--lake)" if key in set_keys else ""
        print(f"note: {key} from ${name}{note}", file=sys.stderr)


def _bad_input(exc: Exception, debug: bool) -> int:
    """One line naming the problem (and its traceback under --debug); the bad-input exit code."""
    if debug:
        traceback.print_exception(exc)
    print(f"error: {exc}", file=sys.stderr)
    return EXIT_BAD_INPUT


def cmd_run(args: argparse.Namespace) -> int:
    from rhymerl.config.run import config_to_dict, load_config
    from rhymerl.errors import ConfigError
    from storage.lake import LakeError

    overrides = list(args.set or [])
    if args.lake:
        overrides.append(f'lake.url="{args.lake}"')
    try:
        if args.resume and args.config is None:
            project_env()  # before tasks.resume imports Prefect
            cfg = _resume_config(args, overrides)
        else:
            cfg = load_config(args.config or _default_config(), overrides, env=os.environ)
    except (ConfigError, LakeError) as exc:
        return _bad_input(exc, args.debug)
    if args.print_config:
        print(json.dumps(config_to_dict(cfg), indent=2))
        _print_env_sources(overrides)
        return 0
    from flows.preflight import report, run_checks

    found = run_checks(cfg, os.environ, debug=args.debug, resume=args.resume)
    if found:
        print(report(found), file=sys.stderr)
        return EXIT_BAD_INPUT
    project_env()
    return _train(cfg, args)


def _train(cfg, args: argparse.Namespace) -> int:
    """Run the flow with the console of docs/console-and-errors.md: without --verbose, every log
    line (engines, Ray, libraries, Prefect) goes to logs/<run_id>/run.log and the terminal shows
    the start lines, one line per step, warnings that matter and the final table. From the banner
    on, SIGTERM and Ctrl-C stop the run the same way (`infra.stop`). Returns the exit code."""
    from rhymerl.data.records import new_run_id

    run_id = args.resume or new_run_id(cfg.name)
    log_file = Path("logs") / run_id / "run.log"
    out, err = _open_console(cfg, run_id, log_file, args.verbose)
    stop = Stop(note_fd=_fileno(err))
    t0 = time.perf_counter()
    try:
        with stop.installed():
            result = _run_flow(cfg, args, run_id, out, stop)
    except BaseException as exc:  # every way a started run can end early has its exit code and lines
        return _stopped(exc, stop, run_id, cfg.lake.url, err,
                        "see above" if args.verbose else f"the log: {log_file}", args.debug and not args.verbose)
    from rhymerl.run.report import format_summary

    if not args.verbose:  # the flow logged the table to the log file; a person wants it here
        print(format_summary(result["epochs"], run_id, cfg.lake.url, cfg.tracking.uri, result["mlflow_run_id"],
                             result["skipped_prompts"], result.get("export", "")), file=out)
    logs = "" if args.verbose else f"; logs in {log_file.parent}/"
    print(f"run {run_id} done in {time.perf_counter() - t0:.0f}s wall time{logs}", file=out)
    return 0


def _run_flow(cfg, args: argparse.Namespace, run_id: str, out, stop: Stop) -> dict:
    """The run flow's result, run in Prefect's temporary API (with short retry waits,
    infra/local_api.py); without --verbose the console handler shows its progress on `out`."""
    # A stop signal raised inside a C extension's import (torch, vLLM) can crash the interpreter:
    # one that comes during the imports is raised once they are done.
    with deferred():
        from flows.run import run_flow  # Prefect, Ray and vLLM: their import-time chatter goes to the log
        from infra.local_api import local_api
        from rhymerl.config.run import config_to_dict
        from rhymerl.run.console import RunConsole
    if not args.verbose:  # after Prefect's import: its logging setup replaces the root's handlers
        # an estimate until the run's start line gives the real count (skipped prompts, num_prompts = 0)
        per_epoch = cfg.steps_per_epoch(cfg.data.num_prompts or cfg.rollout.prompts_per_step)
        console = RunConsole(out, cfg.epochs * per_epoch, per_epoch, os.environ)
        logging.getLogger().addHandler(console)
        stop.on_first = console.stop
    with local_api():
        return run_flow(config=config_to_dict(cfg), run_id=run_id, resume=args.resume)


def _stopped(exc: BaseException, stop: Stop, run_id: str, lake_url: str, err, see: str, debug: bool) -> int:
    """The lines on the console and the exit code of a run that ended with `exc` after it started.

    Bad input is the input checks' (exit 2, before anything started); whatever is raised once the
    run started is one of: a reward function that failed (4), an actor lost for good (3), a stop
    signal (130 for Ctrl-C, 143 for SIGTERM: `stop` knows which), else an unexpected error (1),
    whatever its type (a ValueError from torch, vLLM or RhymeRL included), its traceback in the log.
    """
    from rhymerl.data.rewards import RewardFunctionError
    from tasks.recovery import TrainerLost
    from workers.guard import WorkerLost, resume_command

    resume = resume_command(run_id, lake_url)
    if isinstance(exc, RewardFunctionError):  # the user's code failed: the step wrote nothing to the lake
        print(f"error: {str(exc).strip().splitlines()[0]}\nfix the reward function, then continue the run "
              f"with: {resume}\n(traceback: {see})", file=err)
        return EXIT_REWARD_FAILED
    if isinstance(exc, (TrainerLost, WorkerLost)):  # the message says how to resume
        print(f"error: {exc}\n({see})", file=err)
        return EXIT_RUN_LOST
    if isinstance(exc, KeyboardInterrupt) or stop.signum is not None:  # the type may not tell which signal
        print(f"interrupted ({stop.name}); continue with: {resume}", file=err)
        return stop.exit_code
    if not isinstance(exc, Exception):  # SystemExit and the like: not ours to translate
        raise exc
    traceback.print_exception(exc)  # to the log (stderr is the log file without --verbose)
    if debug:
        traceback.print_exception(exc, file=err)
    print(f"error: {type(exc).__name__}: {exc}\n(traceback: {see}; --debug prints it here)", file=err)
    return EXIT_FAILED


def _fileno(stream) -> int | None:
    """The stream's file descriptor, or None when it has none (a test's captured stream)."""
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last two
        return None


def _open_console(cfg, run_id: str, log_file: Path, verbose: bool):
    """The terminal's (out, err) streams, after the banner; without `verbose` everything else
    this process and its children write goes to `log_file`."""
    from rhymerl.run.console import capture_output

    out, err = (sys.stdout, sys.stderr) if verbose else capture_output(log_file)
    print(_banner(cfg, run_id, log_file, verbose), file=out, flush=True)
    return out, err


def _banner(cfg, run_id: str, log_file: Path, verbose: bool) -> str:
    """The first lines of a run: what it is, where its data and logs go."""
    logs = (f"{log_file}  (engines, Ray, Prefect and libraries; --verbose shows them here)"
            if not verbose else "on this console (--verbose)")
    return "\n".join([
        f"rhymerl run {run_id}",
        f"  lake      {cfg.lake.url}",
        f"  tracking  {cfg.tracking.uri}  (experiment {cfg.tracking.experiment})",
        f"  logs      {logs}",
        f"starting Prefect, Ray and {cfg.rollout.num_workers} engine(s); the first step follows once "
        "they are up (a minute or more on a small machine)",
    ])


def cmd_model_build(args: argparse.Namespace) -> int:
    from rhymerl.policy.long_build import build_settings_for
    from rhymerl.policy.build import ensure_builtin_model

    path = ensure_builtin_model(Path(args.cache_dir), spec=build_settings_for(args.dataset))
    print(f"built-in model ready: {path}")
    return 0


BENCHES = {"spec": "spec_bench", "pipe": "pipe_bench", "lake": "lake_bench", "e2e": "e2e.bench",
           "sharded": "sharded_bench", "spec-scale": "spec_scale_bench", "history-bytes": "history_bytes_bench",
           "steps": "step_table"}  # `rhymerl bench NAME` -> its entry module under bench/


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    project_env()
    try:
        entry = importlib.import_module(f"bench.{BENCHES[args.which]}")
    except ModuleNotFoundError as exc:
        if exc.name != "bench":  # a benchmark's own import failing is its error, shown as it is
            raise
        print("error: the benchmarks are not in this install (the images leave bench/ out); "
              "run them from a source checkout with `make bench`", file=sys.stderr)
        return EXIT_BAD_INPUT
    return int(entry.main(args.options) or 0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rhymerl",
        description="RL training for language models with history-drafted rollouts. "
                    "Start with `rhymerl run` (the built-in tiny model and task).",
    )
    parser.add_argument("--version", action=VersionAction,
                        help="print RhymeRL's version and its stack's (torch, vLLM, Ray, Prefect, DuckDB, MLflow, "
                             "Transformers) and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run RL training (a Prefect flow; rollouts and training on Ray)",
                         description="Run GRPO training. Settings come from TOML files, the environment "
                                     "(RHYMERL_LAKE, RHYMERL_MODEL, RHYMERL_DATASET, MLFLOW_TRACKING_URI, "
                                     "MLFLOW_EXPERIMENT_NAME) and --set overrides, in rising precedence; "
                                     "RAY_ADDRESS and PREFECT_API_URL pick the Ray cluster and Prefect server.")
    run.add_argument("--config", action="append", metavar="FILE",
                     help=f"TOML config file (default: {DEFAULT_CONFIG} if present, else built-in defaults; with "
                          "--resume, the run's stored config); repeat it to layer files: each later file overrides "
                          "the earlier ones key by key, e.g. --config configs/gpu-qwen2.5-7b.toml "
                          "--config configs/cluster.toml")
    run.add_argument("--set", action="extend", nargs="+", metavar="KEY=VALUE",
                     help="override settings, e.g. --set rollout.n=8 train.lr=1e-4 (repeatable)")
    run.add_argument("--lake", help="lake URL (local folder or s3://bucket/prefix); same as --set lake.url=...")
    run.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    run.add_argument("--resume", metavar="RUN_ID",
                     help="continue RUN_ID after its last checkpoint (same lake rows and MLflow run); "
                          "its config comes from the lake's runs table unless --config is given")
    run.add_argument("--verbose", action="store_true",
                     help="show every log line here (engines, Ray, Prefect, libraries) instead of only the "
                          "progress; by default they go to logs/<run_id>/run.log")
    run.add_argument("--debug", action="store_true",
                     help="on bad input, print the traceback and each input check's time as well")
    run.set_defaults(func=cmd_run)

    model = sub.add_parser("model", help="the built-in tiny model")
    msub = model.add_subparsers(dest="model_command", required=True)
    build = msub.add_parser("build", help="build (or reuse the cached) built-in model")
    build.add_argument("--cache-dir", default=".cache/rhymerl", help="where built models are cached")
    build.add_argument("--dataset", default="builtin", choices=("builtin", "builtin-long"),
                       help="whose model: the built-in task's (default) or the long-tail task's "
                            "(configs/long-tail.toml)")
    build.set_defaults(func=cmd_model_build)

    register_lake(sub)
    register_export(sub)
    register_spec(sub)
    register_ui(sub)
    bench = sub.add_parser("bench", help="benchmarks (readable table; --json for machines)",
                           description="Run one benchmark; its own options follow its name, "
                                       "e.g. `rhymerl bench spec --help`.")
    bench.add_argument("which", choices=sorted(BENCHES), help="which benchmark")
    bench.add_argument("options", nargs=argparse.REMAINDER, help="the benchmark's own options")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The exit code of the command in `argv` (the process's arguments when None)."""
    args = build_parser().parse_args(argv)
    return args.func(args)


def entry() -> None:
    """The `rhymerl` program: `main`'s exit code as the process's exit status. A run stopped by a
    signal ends through `infra.stop.exit_now`, so a further signal while the process exits is a note
    on the console, never a death by that signal."""
    code = main()
    if code in (EXIT_INTERRUPTED, EXIT_TERMINATED):
        exit_now(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
