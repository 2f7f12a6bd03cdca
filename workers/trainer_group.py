"""The trainer as a group of Ray actors: `train.world_size` ranks of one FSDP2 process group.

`TrainerGroup` answers the calls the flow makes on the single `TrainerWorker` actor
(`group.train_step.remote(batch)`, `ray.get(...)`) so tasks need not know which one they hold:
each call goes to every rank in the same order (the ranks' collectives must line up) and the
returned ObjectRef is rank 0's result. With `train.world_size = 1` the run keeps the single
`TrainerWorker` (`launch_trainer`), which behaves exactly as before.

Checkpoints of a group are sharded (`rhymerl.policy.checkpoint`): each rank writes its own files
where `storage.checkpoints.CheckpointStore.sharded_url` says; the flow commits them.
"""

from __future__ import annotations

import os
from typing import Any

import ray
from ray.exceptions import RayActorError

from rhymerl.config.run import RunConfig
from workers.actors import Placement, ShardedCheckpoints, TrainerWorker, placement_for
from workers.sync_group import WeightSender


@ray.remote
class TrainerRank(ShardedCheckpoints, WeightSender):
    """One rank: a `rhymerl.policy.sharded.ShardedTrainer`, built by `setup` once every rank exists."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.trainer = None

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0's address and a free port on its node: where the group meets."""
        from rhymerl.policy.sharded import free_port

        return ray.util.get_node_ip_address(), free_port()

    def setup(self, model_dir: str, cfg: RunConfig, addr: str, port: int, threads: int | None,
              total_steps: int = 0) -> int:
        """Join the process group and load this rank's shard of the policy (collective);
        `total_steps`: the run's optimizer steps (the learning-rate schedule's length)."""
        from rhymerl.policy.sharded import DistSpec, ShardedTrainer

        spec = DistSpec(self.rank, cfg.train.world_size, addr, port)
        self.trainer = ShardedTrainer(model_dir, cfg.train, spec, seed=cfg.seed,
                                      dtype=cfg.train.dtype or cfg.model.dtype, threads=threads,
                                      temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                      total_steps=total_steps)
        return self.rank

    def train_step(self, batch: list) -> dict:
        return self.trainer.train_step(batch)

    def state_for_engine(self) -> dict | None:
        """The whole weights on rank 0 (every rank takes part in gathering them); None elsewhere."""
        state = self.trainer.state_dict_for_engine()
        return state if self.rank == 0 else None

    def state_buckets(self, bucket_bytes: int):
        """Ray streaming generator: rank 0 yields the weight buckets (`rhymerl.policy.weight_sync`); every
        rank takes part in gathering each tensor and yields nothing."""
        from rhymerl.policy.weight_sync import bucketed

        if self.rank == 0:
            yield from bucketed(self.trainer.engine_tensors(), bucket_bytes)
        else:
            for _ in self.trainer.engine_tensors():  # the same gathers, in the same order
                pass

    def policy_version(self) -> int:
        return self.trainer.policy_version

    def held_bytes(self) -> int:
        """Parameters + optimizer state held by this actor (see `Trainer.held_bytes`)."""
        return self.trainer.held_bytes()

    def weights_fingerprint(self) -> float:
        """As `TrainerWorker.weights_fingerprint`, over the whole (gathered) parameters."""
        from rhymerl.vllm.worker_ext import weights_fingerprint

        model = self.trainer.model
        whole = ((name, p.full_tensor()) for name, p in model.named_parameters())
        return weights_fingerprint(whole)

    def probe(self, length: int) -> tuple[list[int], list[float]]:
        from rhymerl.policy.trainer import probe_ids

        ids = probe_ids(self.trainer.vocab_size, length)
        return ids, self.trainer.probe_logprobs(ids)

    def save(self, out_dir: str) -> str:
        """A loadable Hugging Face folder of the whole weights, written by rank 0."""
        state = self.trainer.state_dict_for_engine()
        if self.rank == 0:
            self.trainer.save(out_dir, state_dict=state)
        return out_dir

    def info(self) -> dict:
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(), "rank": self.rank}


class _Collective:
    """`group.<method>.remote(...)`: the call on every rank, in order; rank 0's ObjectRef back."""

    def __init__(self, group: "TrainerGroup", name: str) -> None:
        self.group, self.name = group, name

    def remote(self, *args: Any, **kwargs: Any) -> ray.ObjectRef:
        refs = [getattr(rank, self.name).remote(*args, **kwargs) for rank in self.group.ranks]
        # Rank 0's result stands for all: a rank that fails leaves rank 0 waiting in a collective
        # until the process group's timeout, which then fails rank 0's call too.
        return refs[0]


class TrainerGroup:
    """Driver-side handle of the ranks; the same methods as a `TrainerWorker` handle, plus
    `save_checkpoint`/`load_checkpoint`/`warm_start_checkpoint` (sharded) in place of
    `export_state`/`import_state`/`warm_start` (bytes)."""

    METHODS = ("train_step", "state_for_engine", "state_buckets", "policy_version", "held_bytes",
               "weights_fingerprint", "probe", "save_checkpoint", "load_checkpoint", "warm_start_checkpoint",
               "save", "export_files", "info", "weight_rendezvous", "broadcast_weights")

    def __init__(self, ranks: list) -> None:
        self.ranks = ranks
        for name in self.METHODS:
            setattr(self, name, _Collective(self, name))

    @property
    def _actor_id(self):  # what tasks.recovery's trainer_lost names the trainer by
        return self.ranks[0]._actor_id

    def kill(self) -> None:
        for rank in self.ranks:
            ray.kill(rank)

    def dead_ranks(self, timeout_s: float = 30.0) -> list[int]:
        """The ranks Ray reports dead, asked all at once and waited for up to `timeout_s`. A rank that
        dies leaves the others failing (or, on NCCL, waiting) in a collective, with an error that
        names no actor: this is how the flow tells a lost rank from any other failure of a step. A
        rank still busy when the time is up (blocked in a collective) counts as alive."""
        refs = [rank.info.remote() for rank in self.ranks]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        dead = []
        for index, ref in enumerate(refs):
            if ref not in ready:
                continue
            try:
                ray.get(ref)
            except RayActorError:
                dead.append(index)
        return dead


def launch_trainer(model_dir: str, cfg: RunConfig, place: Placement, threads: int, total_steps: int = 0) -> Any:
    """The run's trainer: a `TrainerWorker` actor for world size 1, else a started `TrainerGroup`;
    its learning-rate schedule runs over `total_steps` optimizer steps (`run_optimizer_steps`).

    Each actor gets the placement's trainer CPUs, GPUs and custom resources;
    ranks sharing a host without GPUs divide its `threads`."""
    options = dict(num_cpus=place.trainer_cpus, num_gpus=place.trainer_gpus, resources=place.trainer_resources)
    world = cfg.train.world_size
    if world == 1:
        return TrainerWorker.options(**options).remote(model_dir, cfg, threads=threads, total_steps=total_steps)
    ranks = [TrainerRank.options(**options).remote(rank) for rank in range(world)]
    addr, port = ray.get(ranks[0].rendezvous.remote())
    per_rank = threads if place.trainer_gpus else max(1, threads // world)
    ray.get([r.setup.remote(model_dir, cfg, addr, port, per_rank, total_steps) for r in ranks])
    return TrainerGroup(ranks)


def start_trainer(cfg: RunConfig, model_dir: str, total_steps: int = 0) -> Any:
    """A new trainer (initial weights), placed like the run's first one: in-run recovery's."""
    place = placement_for(cfg, ray.cluster_resources().get("GPU", 0))
    return launch_trainer(model_dir, cfg, place, threads=os.cpu_count() or 1, total_steps=total_steps)


def stop_trainer(trainer: Any) -> None:
    """Kill the trainer's actor(s)."""
    if isinstance(trainer, TrainerGroup):
        trainer.kill()
    else:
        ray.kill(trainer)
