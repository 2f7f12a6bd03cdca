"""Prefect tasks that start and stop a run: model, prompts, Ray actors, lake and MLflow.

`RunContext` is what a run is, fixed for its life (config, run id, model, prompts); `Tracking` is an
open MLflow run. Tasks take these as plain arguments and return what they create; the run flow
(`flows/run.py`) holds everything that changes and is the only place that assigns it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import ray
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.context import SettingsContext, get_settings_context
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY

from infra.stop import reclaim
from rhymerl.config.run import RunConfig, config_to_dict
from rhymerl.config.task import Source
from rhymerl.config.fields import flatten
from rhymerl.data.datasets import load_problems
from rhymerl.data.prompts import load_tokenizer, prompt_renderer, render_prompts
from rhymerl.vllm.engine import EngineSettings
from rhymerl.histospec.bundle import counted_by_vllm
from rhymerl.policy.build import ensure_builtin_model, validate_model_dir
from rhymerl.policy.long_build import build_settings_for
from rhymerl.vllm.speculation import engine_speculation
from rhymerl.data.records import Prompt
from storage.fs import source_options
from rhymerl.data.rewards import RewardSet, load_reward_set
from storage.lake import LakeWriter
from storage.tracking import MlflowTracker
from workers.actors import RolloutWorker, missing_resources, placement_for
from workers.guard import wait_alive
from workers.trainer_group import TrainerGroup, launch_trainer, stop_trainer


@dataclass(frozen=True)
class RunContext:
    """What a run is, fixed for its life: the flow builds it once, before any actor starts."""

    cfg: RunConfig
    run_id: str
    model_dir: str
    prompts: tuple[Prompt, ...]
    skipped: int  # prompts left out as too long for the engine
    rewards: RewardSet | None = None  # reward.functions and weights, loaded once at the run's start (flows.run)


@dataclass(frozen=True)
class Tracking:
    """An open MLflow run, and the run's record in the lake opened with it."""

    tracker: MlflowTracker
    mlflow_run_id: str
    logged_steps: frozenset[int] = frozenset()  # global steps MLflow already has (a resumed run)
    speculation: dict = field(default_factory=dict)  # what the engines run (verifier, message)


@task(name="prepare-model", cache_policy=NO_CACHE)
def prepare_model_task(cfg: RunConfig) -> str:
    """The policy's HF directory: the user's checkpoint (validated) or the built-in model of the
    run's task (the long-tail task has its own)."""
    if cfg.model.path:
        validate_model_dir(cfg.model.path)
        return str(Path(cfg.model.path).absolute())
    return str(ensure_builtin_model(spec=build_settings_for(cfg.data.dataset)).absolute())


@task(name="prepare-prompts", cache_policy=NO_CACHE)
def prepare_prompts_task(cfg: RunConfig, model_dir: str) -> tuple[list[Prompt], int]:
    """The training prompts (`data.*`): see `load_prompts`."""
    return load_prompts(cfg, model_dir)


def load_prompts(cfg: RunConfig, model_dir: str, source: Source | None = None, num_prompts: int | None = None,
                 key: str = "data.dataset", max_tokens: int | None = None) -> tuple[list[Prompt], int]:
    """Load a source's rows (`data.dataset`, or `source` with `num_prompts`, named `key` in errors, such
    as the eval set; S3 URLs with the lake's S3 settings), render them with the model's tokenizer (its
    chat template where the data needs one) and tokenize them with `data`'s keys and template; prompts
    too long for the engine (`max_tokens`, default rollout.max_tokens, of room) are skipped or rejected.
    Returns the prompts and how many were skipped."""
    source = cfg.data.dataset if source is None else source
    problems = load_problems(cfg.data, cfg.reward, source=source, num_prompts=num_prompts,
                             storage_options=source_options(source), key=key)
    budget = cfg.model.max_model_len - (cfg.rollout.max_tokens if max_tokens is None else max_tokens)
    prompts, skipped = render_prompts(problems, prompt_renderer(cfg.data), load_tokenizer(model_dir),
                                      max_prompt_tokens=budget, on_long=cfg.data.on_long_prompt)
    if not prompts:
        raise ValueError(f"no prompt of {key} fits the engine: all {len(problems)} exceed {budget} tokens "
                         "(model.max_model_len - the response's max_tokens); raise model.max_model_len")
    return prompts, len(skipped)


@task(name="load-rewards", cache_policy=NO_CACHE)
def load_rewards_task(cfg: RunConfig) -> RewardSet:
    """The run's reward functions and weights (`reward.*`), resolved once: a file plug-in's text is
    read now (relative paths from the current directory) and travels with the set to every scorer,
    so the whole run scores with the code checked here; ConfigError naming the key if one is wrong."""
    return load_reward_set(cfg.reward.functions, cfg.reward.weight_list, answer_key=cfg.data.answer_key)


def init_ray(num_workers: int) -> bool:
    """Join RAY_ADDRESS's cluster if set, else start a local Ray; True if we started it. `ray.init`
    installs a SIGTERM handler of its own (`sys.exit`): the run's stop handler takes it back
    (`infra.stop`; nothing when no run installed one)."""
    if ray.is_initialized():
        return False
    _start_ray(num_workers)
    reclaim()
    return True


def shutdown_ray() -> None:
    """`ray.shutdown()`, with the run's stop handler back the moment Ray's driver has shut down.
    That step resets SIGTERM to the default action (Ray's C++ logging removes the failure handlers
    it installed, SIGTERM among them) before Ray spends a second or more stopping its processes;
    a SIGTERM then would kill the stopping run outright (no exit 143, no resume line)."""
    worker = ray._private.worker.global_worker
    core = getattr(worker, "core_worker", None)
    if core is not None:  # what ray.shutdown calls shutdown_driver on; its `del` drops the wrapper
        worker.core_worker = _ReclaimAfterShutdown(core)
    try:
        ray.shutdown()
    finally:
        reclaim()


class _ReclaimAfterShutdown:
    """The driver's core worker, unchanged but for `shutdown_driver`, which reclaims the stop
    signals (`infra.stop.reclaim`) right after it."""

    def __init__(self, core: object) -> None:
        self._core = core

    def __getattr__(self, name: str) -> object:
        return getattr(self._core, name)

    def shutdown_driver(self) -> None:
        try:
            self._core.shutdown_driver()
        finally:
            reclaim()


def _start_ray(num_workers: int) -> None:
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
        return
    # Logical CPUs: one per engine plus one for reward tasks; the trainer takes none
    # (see workers.actors.placement_for). Without the spare CPU reward tasks never schedule.
    for _ in range(2):
        try:
            ray.init(num_cpus=num_workers + 1, include_dashboard=False, log_to_driver=True)
            return
        except Exception as exc:  # Ray raises a bare Exception when its raylet misses a fixed 30 s
            if "timed out during startup" not in str(exc):
                raise
            shutdown_ray()  # a loaded machine: try again rather than fail the run
    ray.init(num_cpus=num_workers + 1, include_dashboard=False, log_to_driver=True)


@task(name="start-actors", cache_policy=NO_CACHE)
def start_actors_task(cfg: RunConfig, model_dir: str, total_steps: int = 0) -> tuple[list, object, float]:
    """Start the trainer (its learning-rate schedule over `total_steps` optimizer steps) and one
    engine per rollout worker, wait until all are up; also returns the first engine's initial
    weight fingerprint (to show later that weight sync reached it)."""
    cluster = ray.cluster_resources()
    place = placement_for(cfg, cluster.get("GPU", 0))
    missing = missing_resources(place, cfg.rollout.num_workers, cluster, cfg.train.world_size)
    if missing:
        raise ValueError("; ".join(missing))
    cores = os.cpu_count() or 1
    trainer = launch_trainer(model_dir, cfg, place, threads=cores, total_steps=total_steps)
    workers = []
    for w in range(cfg.rollout.num_workers):
        spec = EngineSettings(
            model_dir=model_dir, dtype=cfg.model.dtype, max_model_len=cfg.model.max_model_len,
            seed=cfg.seed + w, enforce_eager=cfg.rollout.enforce_eager,
            kv_cache_gib=cfg.rollout.kv_cache_gib, gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
            tensor_parallel_size=cfg.rollout.tensor_parallel_size,
            cpu_core=w % cores, cache_dir=str(Path(".cache").absolute()),
            speculation=engine_speculation(cfg.spec),
            # vLLM's counters are the only acceptance figures for its own n-gram drafter.
            log_stats=counted_by_vllm(cfg.spec),
        )
        # Ray restarts a dead worker with these arguments (initial weights): tasks.recovery resyncs it.
        workers.append(RolloutWorker.options(num_cpus=place.worker_cpus, num_gpus=place.worker_gpus,
                                             resources=place.worker_resources,
                                             max_restarts=cfg.recovery.worker_restarts).remote(w, spec))
    # A worker killed while its engine starts (Ray's OOM killer, say) is restarted by Ray: wait for it.
    infos = [wait_alive(w, cfg.recovery.restart_timeout_s, f"rollout worker {i}")
             for i, w in enumerate(workers)]
    infos.append(ray.get(trainer.info.remote()))
    for info in infos[:-1]:
        get_run_logger().info("rollout worker %d: Ray node %s, pid %d", info["worker_id"], info["node_id"],
                              info["pid"])
    get_run_logger().info("trainer: Ray node %s, pid %d", infos[-1]["node_id"], infos[-1]["pid"])
    return workers, trainer, ray.get(workers[0].weights_fingerprint.remote())


@task(name="start-tracking", cache_policy=NO_CACHE)
def start_tracking_task(ctx: RunContext, workers: list, trainer) -> Tracking:
    """Open the MLflow run (whole config as params) and record the run in the lake."""
    cfg = ctx.cfg
    params = flatten(config_to_dict(cfg))
    speculation: dict = {}
    if workers:  # what the engines really run: the guard may have refused speculation
        speculation = ray.get(workers[0].speculation.remote())
        if cfg.spec.enabled and not speculation["active"]:
            get_run_logger().warning("speculation is off: %s", speculation["message"])
        # where the actors run (on a cluster: which nodes took the engines)
        params["ray.rollout_nodes"] = ",".join(i["node_id"] for i in ray.get([w.info.remote() for w in workers]))
        params["ray.trainer_node"] = ray.get(trainer.info.remote())["node_id"]
    params.update({"run_id": ctx.run_id, "model_dir": ctx.model_dir, "prompts": len(ctx.prompts),
                   "prompts_skipped": ctx.skipped,
                   **{f"speculation.{k}": v for k, v in speculation.items() if k != "message"}})
    tracker = MlflowTracker(cfg.tracking.uri, cfg.tracking.experiment)
    mlflow_run_id = tracker.start(ctx.run_id, params, tags={"rhymerl.run_id": ctx.run_id,
                                                            "rhymerl.lake": cfg.lake.url})
    try:
        tracker.log_dict(config_to_dict(cfg), "config.json")
        LakeWriter(cfg.lake.url).write_run(ctx.run_id, cfg.name, json.dumps(config_to_dict(cfg)))
    except BaseException:
        tracker.finish("failed")  # the flow gets no Tracking to close
        raise
    return Tracking(tracker, mlflow_run_id, speculation=speculation)


@task(name="finish-run", cache_policy=NO_CACHE)
def finish_run_task(ctx: RunContext, tracking: Tracking | None, actors: list, started_ray: bool,
                    status: str) -> None:
    """Close the MLflow run and the lake's run record (if opened); stop the actors (and Ray, if the
    run started it)."""
    if tracking is not None:
        tracking.tracker.finish(status)
        LakeWriter(ctx.cfg.lake.url).finish_run(ctx.run_id, status)
    for actor in actors:
        if isinstance(actor, TrainerGroup):  # several actors behind one handle
            stop_trainer(actor)
        else:
            ray.kill(actor)
    if started_ray:
        shutdown_ray()


def quiet_subflow() -> Callable[[], SettingsContext]:
    """Settings for the run's epoch subflows: no heartbeat thread of their own. Prefect's flow
    engine joins that thread on exit while it sleeps out its current second, which costs every
    epoch up to a second. The run flow's
    heartbeat still marks the process alive; the epochs run inside it. The settings are copied
    once per run (a copy validates every setting again, which is slow); each call of
    the result is a context to enter around one epoch."""
    current = get_settings_context()
    quiet = current.settings.copy_with_update(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})
    return lambda: SettingsContext(profile=current.profile, settings=quiet)
