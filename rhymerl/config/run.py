"""Typed, frozen run configuration: one dataclass per component, composed into `RunConfig`.

Configs come from TOML files (layered: later files override earlier ones key by key), the
environment and `key.sub=value` overrides. Every value is checked at construction; errors name the
offending key (and the file that set it) and what it accepts, so a typo never silently falls back
to a default.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from rhymerl.config.environment import env_layer, merge
from rhymerl.config.fields import apply_overrides, build, check, flatten
from rhymerl.config.options import option
from rhymerl.errors import ConfigError
from rhymerl.config.pipe import PipeConfig
from rhymerl.config.spec import SpecConfig
from rhymerl.config.task import DataConfig, EvalConfig, RewardConfig


@dataclass(frozen=True)
class ModelConfig:
    """Policy model. An empty `path` means the built-in tiny model (built on first use)."""

    path: str = option("", 'local Hugging Face causal-LM directory; "" = the built-in tiny model')
    dtype: Literal["float32", "bfloat16", "float16"] = option(
        "float32", "dtype of the engines' weights, and of the trainer's unless train.dtype is set")
    max_model_len: int = option(512, "prompt + response tokens an engine accepts", ">= 16")
    # The source run's checkpoints are in this run's checkpoint store (lake.url/_checkpoints or
    # checkpoint.dir) and its model.path must be this run's; the new run may train on other data.
    init_from_run: str = option("", "warm start: a run id whose newest checkpoint the trainer starts from "
                                '(a new run); "" = off', 'a run id or ""')

    def __post_init__(self) -> None:
        check(self.max_model_len >= 16, "model.max_model_len", "must be >= 16")
        check(not self.init_from_run or re.fullmatch(r"[A-Za-z0-9._-]+", self.init_from_run) is not None,
              "model.init_from_run", f"{self.init_from_run!r} is not a run id (letters, digits, '.', '_', '-')")


@dataclass(frozen=True)
class RolloutConfig:
    """Sampling and the rollout workers (one vLLM engine each)."""

    num_workers: int = option(2, "rollout workers: Ray actors, one vLLM engine each", ">= 1")
    prompts_per_step: int = option(32, "prompts per training step", ">= 1")
    n: int = option(8, "samples per prompt (the GRPO group size)", ">= 2")
    # The trainer's log-probs are those of this sampling distribution (logits / temperature, then
    # the nucleus renormalised as vLLM's sampler does it): see rhymerl/policy/sampling.py.
    temperature: float = option(1.0, "sampling temperature", "> 0")
    top_p: float = option(1.0, "nucleus sampling: keep the likeliest tokens up to this probability mass",
                          "(0, 1]")
    max_tokens: int = option(160, "most tokens per response", ">= 1")
    kv_cache_gib: float = option(0.5, "KV cache per engine on CPU in GiB (VLLM_CPU_KVCACHE_SPACE, rounded up to 1)",
                                 "> 0")
    gpu_memory_utilization: float = option(0.85, "share of its GPU memory an engine may take (GPUs only)", "(0, 1]")
    tensor_parallel_size: int = option(1, "GPUs per engine (vLLM tensor parallelism; GPUs only)", ">= 1")
    enforce_eager: bool = option(True, "vLLM's enforce_eager: no CUDA graphs (set false on GPUs for speed)")

    def __post_init__(self) -> None:
        check(self.num_workers >= 1, "rollout.num_workers", "must be >= 1")
        check(self.prompts_per_step >= 1, "rollout.prompts_per_step", "must be >= 1")
        check(self.n >= 2, "rollout.n", "must be >= 2 (GRPO needs a group to normalise over)")
        # Greedy sampling makes every sample of a group identical: all advantages 0, no learning.
        check(self.temperature > 0.0, "rollout.temperature",
              f"got {self.temperature}; training samples must be random (> 0, e.g. 1.0): at 0 every "
              "sample of a group is the same greedy answer, every advantage is 0 and nothing is learned")
        check(0.0 < self.top_p <= 1.0, "rollout.top_p", "must be in (0, 1]")
        check(self.max_tokens >= 1, "rollout.max_tokens", "must be >= 1")
        check(self.kv_cache_gib > 0, "rollout.kv_cache_gib", "must be > 0")
        check(0.0 < self.gpu_memory_utilization <= 1.0, "rollout.gpu_memory_utilization",
              "must be in (0, 1]")
        check(self.tensor_parallel_size >= 1, "rollout.tensor_parallel_size", "must be >= 1")


@dataclass(frozen=True)
class TrainConfig:
    """GRPO trainer hyperparameters."""

    lr: float = option(3e-4, "AdamW learning rate (the peak, with a schedule)", "> 0")
    lr_schedule: Literal["constant", "linear", "cosine"] = option(
        "constant", "the learning rate over the run's optimizer steps after warm-up: constant, or decayed to 0 "
        "linearly or along a half cosine")
    warmup_steps: int = option(0, "optimizer steps of linear warm-up from lr/warmup_steps to lr; 0 = none", ">= 0")
    weight_decay: float = option(0.0, "AdamW (decoupled) weight decay")
    betas: tuple[float, float] = option((0.9, 0.99), "AdamW betas")
    max_grad_norm: float = option(1.0, "gradient clipping: largest global gradient norm", "> 0")
    micro_batch_size: int = option(64, "sequences per forward/backward (gradient accumulation)", ">= 1")
    updates_per_step: int = option(1, "optimizer steps per rollout batch (> 1 makes ratio clipping matter)",
                                   ">= 1")
    clip_low: float = option(0.2, "PPO ratio clip below 1 (the ratio is clipped at 1 - clip_low)", "> 0")
    clip_high: float = option(0.28, "PPO ratio clip above 1 (DAPO's asymmetric clip-higher)", "> 0")
    loss_agg: Literal["token", "sequence"] = option(
        "token", "loss aggregation: mean over every token of the batch (DAPO) or per sequence first")
    kl_coef: float = option(0.0, "> 0 adds a k3 KL penalty to a frozen reference policy (model.path)", ">= 0")
    adv_eps: float = option(1e-6, "added to the group's reward std before advantages are divided by it")
    scale_rewards: bool = option(True, "divide advantages by the group's reward std")
    # float32 keeps small updates that bfloat16 weights would round away; the engines take the
    # weights cast to model.dtype.
    dtype: Literal["", "float32", "bfloat16", "float16"] = option(
        "", 'the trainer\'s weights and optimizer state; "" = model.dtype')
    world_size: int = option(1, "trainer ranks (Ray actors, one process group); > 1 shards the policy, its "
                             "optimizer state and each step's batch over them with FSDP2", ">= 1")
    bf16_compute: bool = option(True, "sharded trainer on GPUs: forward/backward in bfloat16, gradients reduced "
                                "and weights kept in train.dtype (FSDP2 mixed precision); no effect on CPU")
    activation_checkpointing: bool = option(False, "recompute each transformer block's activations in backward "
                                            "(less memory, ~1/3 more compute)")
    sync_bucket_mb: int = option(256, "weight sync trainer -> engines: MiB of weights per bucket (each bucket "
                                 "travels on its own while the next is gathered)", ">= 1")
    sync_transport: Literal["object_store", "process_group"] = option(
        "object_store", "how weights reach the engines: each bucket a Ray object the engines stage and load "
        "at the end (object_store), or broadcast by the trainer's rank 0 over a process group with every "
        "engine worker and loaded in place as it arrives (process_group: NCCL on GPUs, gloo on CPU)")
    cpu_offload: bool = option(False, "sharded trainer on GPUs: keep parameter shards, gradients and optimizer "
                               "state in CPU memory between uses (FSDP2 CPU offload; the optimizer steps on CPU)")
    # Off by default: on a few CPU cores the trainer's forward/backward takes cores from the engines
    # and the step gets no faster; it pays when the trainer has devices of its own (README, "Streamed
    # training"; figures in docs/benchmarks.md).
    stream: bool = option(False, "train while the rollout's tail generates: each prompt group's forward/backward "
                          "runs as soon as its samples are scored, the one optimizer step after the last group "
                          "(the same update; needs train.updates_per_step = 1 and train.world_size = 1)")

    def __post_init__(self) -> None:
        check(self.world_size >= 1, "train.world_size", "must be >= 1")
        check(self.sync_bucket_mb >= 1, "train.sync_bucket_mb", "must be >= 1")
        check(self.lr > 0, "train.lr", "must be > 0")
        check(self.warmup_steps >= 0, "train.warmup_steps", "must be >= 0 (0: no warm-up)")
        check(self.micro_batch_size >= 1, "train.micro_batch_size", "must be >= 1")
        check(self.updates_per_step >= 1, "train.updates_per_step", "must be >= 1")
        check(self.clip_low > 0 and self.clip_high > 0, "train.clip_low/clip_high", "must be > 0")
        check(self.kl_coef >= 0, "train.kl_coef", "must be >= 0")
        check(self.max_grad_norm > 0, "train.max_grad_norm", "must be > 0")
        # Only a step's first update can stream (later ones need its weights); the sharded trainer
        # splits the batch over ranks when it arrives, which a stream of groups does not do.
        check(not self.stream or self.updates_per_step == 1, "train.stream",
              f"needs train.updates_per_step = 1 (got {self.updates_per_step}): the later updates of a step "
              "need the first one's weights; set train.updates_per_step=1 or train.stream=false")
        check(not self.stream or self.world_size == 1, "train.stream",
              f"needs train.world_size = 1 (got {self.world_size}): the sharded trainer takes the whole batch "
              "at once; set train.world_size=1 or train.stream=false")


_BUILTIN_RAY_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


@dataclass(frozen=True)
class PlacementConfig:
    """Which Ray nodes the actors may use, by custom resource (`ray start --resources '{"NAME": K}'`).

    Each rollout worker (trainer) then asks for one unit of the named resource as well as its
    CPU/GPU, so it lands only on nodes started with it; "" = any node with room.
    """

    rollout_resource: str = option("", 'custom Ray resource each rollout worker asks one unit of; "" = any node',
                                   "a custom resource name, no spaces")
    trainer_resource: str = option("", 'custom Ray resource the trainer asks one unit of; "" = any node',
                                   "a custom resource name, no spaces")
    share_gpu: bool = option(False, "one GPU for one engine and the trainer (half each), for 1-GPU machines: "
                             "needs rollout.num_workers = 1, rollout.tensor_parallel_size = 1 and "
                             "rollout.gpu_memory_utilization <= 0.5")

    def __post_init__(self) -> None:
        for key, name in (("placement.rollout_resource", self.rollout_resource),
                          ("placement.trainer_resource", self.trainer_resource)):
            check(name == name.strip() and " " not in name, key, f"{name!r} must not contain spaces")
            check(name not in _BUILTIN_RAY_RESOURCES, key,
                  f"{name!r} is a built-in Ray resource; name a custom one (e.g. rollout_node) and "
                  "start the nodes with ray start --resources '{\"rollout_node\": K}'")


@dataclass(frozen=True)
class LakeConfig:
    """Where responses are written: a local folder or any fsspec URL (s3://bucket/prefix)."""

    url: str = option("lake", "the lake: a local folder or an fsspec URL (s3://bucket/prefix)")


@dataclass(frozen=True)
class TrackingConfig:
    """MLflow tracking."""

    uri: str = option("sqlite:///mlflow.db", "MLflow tracking URI: a store or a server (http://host:5000)")
    experiment: str = option("rhymerl", "MLflow experiment")


@dataclass(frozen=True)
class CheckpointConfig:
    """Resumable runs: trainer state and counters written after steps, the last few kept."""

    every_steps: int = option(1, "write a checkpoint after every N-th step; 0 = off (no resume possible)", ">= 0")
    keep: int = option(2, "committed checkpoints kept per run (older ones are deleted after each commit)", ">= 1")
    dir: str = option("", 'where checkpoints go: any fsspec URL; "" = <lake.url>/_checkpoints')

    def __post_init__(self) -> None:
        check(self.every_steps >= 0, "checkpoint.every_steps", "must be >= 0 (0 turns checkpoints off)")
        check(self.keep >= 1, "checkpoint.keep", "must be >= 1")


@dataclass(frozen=True)
class RecoveryConfig:
    """Surviving dead actors: rollout workers restart in place, the trainer comes back from its
    last checkpoint (see workers/guard.py and tasks/recovery.py)."""

    worker_restarts: int = option(3, "Ray restarts per rollout worker over the run; 0 = a dead worker fails "
                                  "the run", ">= 0")
    trainer_restarts: int = option(1, "in-run trainer replacements from the last checkpoint; 0 = fail with the "
                                   "resume command", ">= 0")
    restart_timeout_s: float = option(600.0, "seconds to wait for a worker's engine to come up (at start, after a "
                                      "restart)", "> 0")

    def __post_init__(self) -> None:
        check(self.worker_restarts >= 0, "recovery.worker_restarts", "must be >= 0")
        check(self.trainer_restarts >= 0, "recovery.trainer_restarts", "must be >= 0")
        check(self.restart_timeout_s > 0, "recovery.restart_timeout_s", "must be > 0 seconds")


@dataclass(frozen=True)
class RunConfig:
    """A whole training run."""

    name: str = option("rhymerl", "run name: the prefix of the run id")
    seed: int = option(0, "seed of the trainer, the engines' sampling (+ worker index) and each epoch's prompt order")
    epochs: int = option(10, "passes over the prompts", ">= 1")
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    pipe: PipeConfig = field(default_factory=PipeConfig)
    lake: LakeConfig = field(default_factory=LakeConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    spec: SpecConfig = field(default_factory=SpecConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)

    def __post_init__(self) -> None:
        check(self.epochs >= 1, "epochs", "must be >= 1")
        if self.placement.share_gpu:
            check(self.rollout.num_workers == 1 and self.rollout.tensor_parallel_size == 1,
                  "placement.share_gpu", "needs rollout.num_workers = 1 and rollout.tensor_parallel_size = 1")
            check(self.rollout.gpu_memory_utilization <= 0.5, "placement.share_gpu",
                  "needs rollout.gpu_memory_utilization <= 0.5 (the trainer uses the rest of the GPU)")
        groups = min(self.rollout.prompts_per_step, self.data.num_prompts or self.rollout.prompts_per_step)
        check(self.train.world_size <= groups, "train.world_size",
              f"is {self.train.world_size} but a step trains on at most {groups} prompt groups "
              "(rollout.prompts_per_step, data.num_prompts); a rank needs at least one group")
        check(self.train.world_size == 1 or not self.placement.share_gpu, "train.world_size",
              "must be 1 with placement.share_gpu (one GPU holds one trainer rank)")
        # NCCL cannot put two ranks of one group on one GPU; a shared GPU syncs through Ray
        check(self.train.sync_transport == "object_store" or not self.placement.share_gpu,
              "train.sync_transport",
              "must be object_store with placement.share_gpu (trainer and engine share its GPU)")

    def steps_per_epoch(self, prompts: int) -> int:
        """Steps needed to cover `prompts` prompts once (the last step may be smaller)."""
        return -(-prompts // self.rollout.prompts_per_step)


# ---------------------------------------------------------------- loading


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Build and validate a RunConfig from nested dicts (the TOML layout)."""
    return build(RunConfig, data)


def resolve_config(data: dict[str, Any], overrides: list[str] | None = None,
                   env: Mapping[str, str] | None = None) -> RunConfig:
    """Build a RunConfig from file-layout `data`, the environment's settings (`rhymerl.config.environment`:
    RHYMERL_LAKE, MLFLOW_TRACKING_URI, ...) on top, then `key=value` overrides on top of both."""
    layered = merge(data, env_layer(env)) if env is not None else data
    return config_from_dict(apply_overrides(layered, overrides or []))


ConfigPaths = str | Path | Sequence[str | Path] | None  # one TOML file, several (layers), or none


def read_config_file(path: str | Path) -> dict[str, Any]:
    """One TOML config file as nested dicts; a ConfigError naming the file if it is missing or not TOML."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist; pass an existing TOML file to --config")
    try:
        return tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {p} is not valid TOML: {exc}") from exc


def load_config(paths: ConfigPaths = None, overrides: list[str] | None = None,
                env: Mapping[str, str] | None = None) -> RunConfig:
    """Load TOML config files (optional), then the environment's settings if `env` is given (the
    CLI passes os.environ; None = ignore the environment), then `key=value` overrides.

    Several files are layers, in order: each later file overrides the earlier ones key by key
    (tables merged at every depth; a value or list replaced whole), so a small file such as
    configs/cluster.toml can move a run onto a cluster. A bad key or value that a file set is
    reported with that file's name.
    """
    files = [paths] if isinstance(paths, (str, Path)) else list(paths or [])
    layers = [(Path(f), read_config_file(f)) for f in files]
    data: dict[str, Any] = {}
    for _, layer in layers:
        data = merge(data, layer)
    try:
        return resolve_config(data, overrides, env)
    except ConfigError as exc:
        source = _file_that_set(exc.key, layers, overrides or [], env)
        if source is None:
            raise
        raise ConfigError(f"{source}: {exc}", key=exc.key) from None


def _file_that_set(key: str, layers: list[tuple[Path, dict[str, Any]]], overrides: list[str],
                   env: Mapping[str, str] | None) -> Path | None:
    """The last of `layers` that set `key` (or keys under it: an unknown section); None when no file
    did, or when --set or the environment set it over the files."""
    if not key:
        return None
    base = key.split("[", 1)[0]  # reward.functions[1] -> reward.functions

    def sets(keys) -> bool:
        return any(k == base or k.startswith(base + ".") for k in keys)

    if sets(o.split("=", 1)[0].strip() for o in overrides) or sets(flatten(env_layer(env or {}))):
        return None
    return next((path for path, layer in reversed(layers) if sets(flatten(layer))), None)


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Nested plain dict of a config (for logging and saving)."""
    return dataclasses.asdict(cfg)
