"""What `rhymerl run` checks before it starts a Prefect server, Ray or an engine.

Runs the pure checks of `rhymerl/run/preflight.py` (config, model folder, the task's data, chat
template, rewards and evaluation set, resources) and the endpoint probes of `storage/probe.py`
(lake, MLflow store, Ray address, Prefect server), the probes side by side so that several unreachable endpoints still answer within one deadline.
Imports no Prefect, Ray or vLLM: a bad input fails in seconds.
"""

from __future__ import annotations

import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Mapping
from urllib.parse import urlsplit

from rhymerl.config.run import RunConfig
from rhymerl.run.preflight import (Finding, Machine, check_config, check_dataset, check_model, check_resources,
                               local_machine, parse_ray_address)
from storage.checkpoints import checkpoint_url
from storage.fs import source_options
from storage.probe import checkpoint_problems, lake_problems, tcp_problem, tracking_problems

Check = Callable[[], list[Finding]]


def checks(cfg: RunConfig, environ: Mapping[str, str], resume: str | None = None,
           machine: Machine | None = None) -> dict[str, Check]:
    """The named checks of a run with config `cfg` in environment `environ` (continuing run
    `resume`, if given), in report order; a local run's resources are checked against `machine`
    (default: this one)."""
    ray_address = environ.get("RAY_ADDRESS", "").strip()
    return {
        "config": lambda: check_config(cfg),
        "model": lambda: check_model(cfg),
        "dataset": lambda: check_dataset(cfg, source_options),
        "lake": lambda: _lake_findings(cfg, resume),
        "tracking": lambda: [Finding("tracking", m) for m in tracking_problems(cfg.tracking.uri)],
        "ray": lambda: _ray_findings(ray_address),
        "prefect": lambda: _prefect_findings(environ.get("PREFECT_API_URL", "").strip()),
        "resources": lambda: check_resources(cfg, machine or local_machine(),
                                             cluster=ray_address not in ("", "local")),
    }


def _lake_findings(cfg: RunConfig, resume: str | None) -> list[Finding]:
    """The lake, the checkpoint store when `checkpoint.dir` moves it, then (once both answer) the
    checkpoint a resumed or warm-started run starts from."""
    found = [Finding("lake", m) for m in lake_problems(cfg.lake.url)]
    if cfg.checkpoint.dir:
        found += [Finding("lake", f"checkpoint.dir: {m}") for m in lake_problems(cfg.checkpoint.dir)]
    if found:
        return found
    store = checkpoint_url(cfg.lake.url, cfg.checkpoint.dir)
    if resume:
        found += [Finding("lake", m) for m in checkpoint_problems(store, resume, "--resume")]
    if cfg.model.init_from_run:
        found += [Finding("model", m) for m in checkpoint_problems(store, cfg.model.init_from_run,
                                                                   "model.init_from_run")]
    return found


def run_checks(cfg: RunConfig, environ: Mapping[str, str], debug: bool = False,
               resume: str | None = None, machine: Machine | None = None) -> list[Finding]:
    """Every problem with the run's inputs, in report order; [] = the run may start. `machine` is
    what a local run may use (default: this machine; a test gives the machine a config is written for).

    A check that raises reports that as its finding (with the traceback on stderr under `debug`)
    rather than letting the run start on an input nobody could check. Under `debug` each
    check's time goes to stderr.
    """
    named = checks(cfg, environ, resume, machine)
    with ThreadPoolExecutor(max_workers=len(named)) as pool:  # the probes mostly wait on sockets
        futures = {name: pool.submit(_timed, name, check, debug) for name, check in named.items()}
        results = {name: future.result() for name, future in futures.items()}
    found = []
    for name, (findings, seconds) in results.items():
        if debug:
            print(f"debug: check {name}: {len(findings)} problem(s) in {seconds:.2f} s", file=sys.stderr)
        found += findings
    return found


def _timed(name: str, check: Check, debug: bool) -> tuple[list[Finding], float]:
    t = time.perf_counter()
    try:
        found = check()
    except Exception as exc:
        if debug:
            traceback.print_exc()
        found = [Finding(name, f"could not be checked ({type(exc).__name__}: {exc}); rerun with --debug "
                               "for the traceback")]
    return found, time.perf_counter() - t


def _ray_findings(address: str) -> list[Finding]:
    if not address:
        return []
    target = parse_ray_address(address)
    if target is None or isinstance(target, Finding):
        return [target] if target else []
    host, port = target
    problem = tcp_problem(host, port, f"the Ray cluster of RAY_ADDRESS={address}",
                          "start it (ray start --head), fix RAY_ADDRESS, or unset it for a local Ray")
    return [Finding("ray", problem)] if problem else []


def _prefect_findings(api_url: str) -> list[Finding]:
    """PREFECT_API_URL, when set, must reach a server (unset = Prefect's temporary local API)."""
    if not api_url:
        return []
    parts = urlsplit(api_url)
    if parts.scheme not in ("http", "https") or parts.hostname is None:
        return [Finding("prefect", f"PREFECT_API_URL={api_url!r} is not a URL; use http://host:4200/api "
                        "or unset it for Prefect's temporary local API")]
    problem = tcp_problem(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80),
                          f"the Prefect server of PREFECT_API_URL={api_url}",
                          "start it (rhymerl ui) or unset PREFECT_API_URL for a temporary local API")
    return [Finding("prefect", problem)] if problem else []


def report(found: list[Finding]) -> str:
    """The console text for problems found: a headline, then one line per problem."""
    head = (f"error: {len(found)} problem{'s' if len(found) != 1 else ''} with this run's inputs; "
            "nothing was started:")
    return "\n".join([head, *(f"  {f}" for f in found)])
