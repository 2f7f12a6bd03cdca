"""Pure checks of a run's inputs, run before any server, Ray or engine starts (`rhymerl run`).

Each check returns `Finding`s, one per problem, each naming the fix; [] means fine. Only files
and this machine's own figures are read here: no network, no Prefect or Ray. The lake and
tracking probes that need the network are in `storage/probe.py`; `flows/preflight.py` runs both.

Resources are checked for a local run only (no RAY_ADDRESS): a cluster's resources are known
once Ray is joined, where `workers.actors.missing_resources` checks them before any actor starts.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from rhymerl.config.run import RunConfig
from rhymerl.config.spec import INSTALL_HINT, has_arctic_inference
from rhymerl.policy.check import model_problems
from rhymerl.run.task_check import OptionsOf, task_problems

AREAS = ("config", "model", "dataset", "reward", "eval", "lake", "tracking", "ray", "prefect", "resources")
_GIB = 1024 ** 3
# A trainer holds weights, gradients and two AdamW moments: about 4x the weights in memory.
_TRAINER_WEIGHT_COPIES = 4


@dataclass(frozen=True)
class Finding:
    """One problem with a run's inputs; `message` names the problem and the fix."""

    area: str  # one of AREAS: what the user has to fix
    message: str

    def __str__(self) -> str:
        return f"{self.area}: {self.message}"


@dataclass(frozen=True)
class Machine:
    """What a local run can use on this machine."""

    cpus: int
    memory_gib: float
    gpus: int


def check_config(cfg: RunConfig) -> list[Finding]:
    """Settings that are valid one by one but cannot work together."""
    found = []
    if cfg.rollout.max_tokens >= cfg.model.max_model_len:
        found.append(Finding("config", f"rollout.max_tokens={cfg.rollout.max_tokens} leaves no room for a "
                             f"prompt in model.max_model_len={cfg.model.max_model_len}; lower "
                             "rollout.max_tokens or raise model.max_model_len"))
    if cfg.spec.needs_arctic_inference and not has_arctic_inference():
        what = "spec.method='suffix'" if cfg.spec.method == "suffix" else "spec.recent_responses > 0"
        found.append(Finding("config", f"{what} needs {INSTALL_HINT}"))
    return found


def check_model(cfg: RunConfig) -> list[Finding]:
    """The model folder (`model.path`); the built-in model ("") is built on first use."""
    if not cfg.model.path:
        return []
    return [Finding("model", m) for m in model_problems(cfg.model.path, cfg.model.max_model_len)]


def check_dataset(cfg: RunConfig, options_of: OptionsOf | None = None) -> list[Finding]:
    """The task: every row of data.dataset and eval.dataset, the chat template, the reward functions
    (`rhymerl.run.task_check`); `options_of` gives a source's fsspec settings (s3:// URLs)."""
    return [Finding(area, m) for area, m in task_problems(cfg, options_of)]


def check_resources(cfg: RunConfig, machine: Machine, cluster: bool) -> list[Finding]:
    """A local run's asks against `machine`; on a Ray cluster (`cluster`) nothing is checked here."""
    if cluster:
        return []
    r, found = cfg.rollout, []
    for key, name in (("placement.rollout_resource", cfg.placement.rollout_resource),
                      ("placement.trainer_resource", cfg.placement.trainer_resource)):
        if name:
            found.append(Finding("resources", f"{key}={name!r} asks for a custom Ray resource, but without "
                                 "RAY_ADDRESS the run starts a local Ray that has none; set RAY_ADDRESS to a "
                                 f"cluster whose nodes were started with ray start --resources, or set {key}=\"\""))
    if machine.gpus == 0:
        if r.tensor_parallel_size > 1:
            found.append(Finding("resources", f"rollout.tensor_parallel_size={r.tensor_parallel_size} needs "
                                 "GPUs and this machine has none; set rollout.tensor_parallel_size=1"))
        if r.num_workers > machine.cpus:
            found.append(Finding("resources", f"rollout.num_workers={r.num_workers} engines need one CPU core "
                                 f"each and this machine has {machine.cpus}; set rollout.num_workers to at "
                                 f"most {machine.cpus}, or run on a Ray cluster (RAY_ADDRESS)"))
        found += _memory_findings(cfg, machine)
    else:
        need = 1 if cfg.placement.share_gpu else r.num_workers * r.tensor_parallel_size + 1
        if need > machine.gpus:
            found.append(Finding("resources", f"the run needs {need} GPUs (rollout.num_workers x "
                                 "rollout.tensor_parallel_size, plus 1 for the trainer) and this machine has "
                                 f"{machine.gpus}; lower rollout.num_workers, or on one GPU set "
                                 "placement.share_gpu=true"))
    return found


def _memory_findings(cfg: RunConfig, machine: Machine) -> list[Finding]:
    """CPU engines keep their KV cache in memory: the part of the run's memory known up front."""
    r = cfg.rollout
    kv = r.kv_cache_gib * r.num_workers
    weights = _weights_gib(cfg.model.path) * (r.num_workers + _TRAINER_WEIGHT_COPIES)
    if kv + weights <= machine.memory_gib:
        return []
    return [Finding("resources", f"rollout.kv_cache_gib={r.kv_cache_gib:g} x {r.num_workers} engines = {kv:.1f} "
                    f"GiB of KV cache (+ {weights:.1f} GiB of weights for the engines and the trainer) is more "
                    f"than this machine's {machine.memory_gib:.1f} GiB of memory; lower rollout.kv_cache_gib "
                    "or rollout.num_workers")]


def _weights_gib(model_path: str) -> float:
    """Size of the model's weight files (0 for the built-in model: a few MB)."""
    if not model_path:
        return 0.0
    files = [f for f in Path(model_path).glob("*") if f.suffix in (".safetensors", ".bin") and f.is_file()]
    return sum(f.stat().st_size for f in files) / _GIB


def local_machine() -> Machine:
    """CPU cores this process may use, memory (the cgroup limit if lower) and visible NVIDIA GPUs."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:  # a container's limit (cgroup v2); "max" = none
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            memory = min(memory, int(limit))
    except OSError:
        pass
    return Machine(cpus=cpus, memory_gib=memory / _GIB, gpus=_visible_gpus())


def _visible_gpus() -> int:
    """NVIDIA GPUs the driver lists, narrowed by CUDA_VISIBLE_DEVICES (as Ray and torch count them)."""
    try:
        present = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    return min(present, len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"]))


def parse_ray_address(address: str, ray_tmp: str | None = None) -> tuple[str, int] | Finding | None:
    """Where RAY_ADDRESS points: (host, port) to probe, None for a new local Ray ("local"), or a
    Finding when it is malformed or `auto` finds no cluster started on this machine."""
    address = address.strip()
    if address == "local":
        return None
    if address == "auto":
        current = Path(ray_tmp or os.environ.get("RAY_TMPDIR") or "/tmp/ray") / "ray_current_cluster"
        try:
            address = current.read_text().strip()
        except OSError:
            return Finding("ray", "RAY_ADDRESS=auto but no Ray cluster was started on this machine (no "
                           f"{current}); start one with ray start --head, set RAY_ADDRESS=host:6379, or "
                           "unset RAY_ADDRESS for a local Ray")
    m = re.fullmatch(r"(?:ray://)?(\[[0-9a-fA-F:]+\]|[^:/\s]+):(\d{1,5})/?", address)
    if m is None:
        return Finding("ray", f"RAY_ADDRESS={address!r} is not a Ray address; use host:6379 (a cluster's head "
                       "node), ray://host:10001 (Ray Client), auto, or unset it for a local Ray")
    return m.group(1).strip("[]"), int(m.group(2))
