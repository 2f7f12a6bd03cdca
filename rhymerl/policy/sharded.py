"""Sharded data-parallel training: one `Trainer` per rank, the policy sharded with FSDP2.

Pure torch: the ranks' process group is made here from a `DistSpec`; who starts the ranks (Ray
actors in `tasks/`, spawned processes in the tests) is not this module's business.

One step on N ranks is the step on one rank, up to float summation order:
- every rank receives the whole batch and takes its share (`split_by_tokens`, the same answer on
  every rank); its old log-probs and KL-reference log-probs are computed on that share;
- the loss normaliser is the whole batch's (its token or sequence count summed over ranks), and
  the gradients are summed over ranks, not averaged (FSDP2's divide factor is set to 1);
- every rank makes the same number of forward/backward passes (FSDP2 all-gathers in each one),
  so a rank with fewer micro-batches runs padding ones that contribute nothing;
- metrics are summed over ranks before they are reported.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

from rhymerl.config.run import TrainConfig
from rhymerl.policy.blocks import transformer_blocks
from rhymerl.policy.trainer import Trainer, TrainExample, _pad, _Padded


@dataclass(frozen=True)
class DistSpec:
    """Where this rank sits in the trainer group and how the group meets (a TCP rendezvous)."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside [0, {self.world_size})")


def init_group(spec: DistSpec, timeout_s: float = 300.0) -> str:
    """Join the default process group (NCCL when this process has a GPU, else gloo); its backend.

    Idempotent for the same spec: an actor that already joined keeps its group."""
    if dist.is_initialized():
        return dist.get_backend()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{spec.master_addr}:{spec.master_port}",
                            rank=spec.rank, world_size=spec.world_size, timeout=timedelta(seconds=timeout_s))
    return backend


def split_by_tokens(lengths: list[int], world_size: int) -> list[list[int]]:
    """Indices of each rank's examples, balanced by token count; deterministic.

    Longest first, each to the rank with the fewest tokens so far (ties: lowest rank), the
    classic LPT rule: no rank gets more than 4/3 of the optimum. Each rank's indices stay in
    batch order. With more ranks than examples some ranks get none (they run padding passes).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    heap = [(0, rank) for rank in range(world_size)]
    shares: list[list[int]] = [[] for _ in range(world_size)]
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        load, rank = heapq.heappop(heap)
        shares[rank].append(index)
        heapq.heappush(heap, (load + lengths[index], rank))
    return [sorted(share) for share in shares]


def example_tokens(ex: TrainExample) -> int:
    """What a forward/backward pass costs for one example: its prompt and response tokens."""
    return len(ex.prompt_ids) + len(ex.response_ids)


def shard_model(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> None:
    """FSDP2 in place: each block, then the root (embeddings, norm and a tied or untied head).

    Gradients are summed over ranks (divide factor 1): the loss each rank computes is already its
    share of the whole batch's loss. On GPUs with `train.bf16_compute` the blocks compute in
    bfloat16 and reduce gradients in float32; the stored weights keep their dtype. With
    `train.cpu_offload` (GPUs only) shards, gradients and the optimizer step live on the CPU."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    kwargs: dict = {"mesh": mesh}
    if device.type == "cuda" and cfg.bf16_compute:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if device.type == "cuda" and cfg.cpu_offload:  # on CPU everything is in CPU memory already
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for block in transformer_blocks(model):
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            # plain SUM collectives: gloo has no PREMUL_SUM, and a factor of 1 needs no scaling
            module.set_force_sum_reduction_for_comms(True)


class ShardedTrainer(Trainer):
    """A `Trainer` that is rank `spec.rank` of `spec.world_size`: same contract, sharded state.

    Every public method is collective: all ranks call it, in the same order, with the same
    arguments (the whole batch to `train_step`). Results are the group's on every rank:
    `sequence_logprobs` (inherited) runs the whole batch on every rank, so their passes line up.
    """

    def __init__(self, model_dir: str, cfg: TrainConfig, spec: DistSpec, **kwargs) -> None:
        if cfg.world_size != spec.world_size:
            raise ValueError(f"train.world_size is {cfg.world_size} but the group has {spec.world_size} ranks")
        init_group(spec)
        self.rank, self.world_size = spec.rank, spec.world_size
        super().__init__(model_dir, cfg, **kwargs)
        if self.ref_model is not None:  # frozen: sharded too, else each rank holds a full copy
            shard_model(self.ref_model, cfg, self.device)
        shard_model(self.model, cfg, self.device)
        # FSDP2 swapped the parameters for sharded ones: the optimizer (and its schedule) must hold those
        self._make_optimizer()
        self._passes = 0

    def train_step(self, batch: list[TrainExample]) -> dict[str, float]:
        """`Trainer.train_step` over the whole `batch`, this rank computing its share."""
        if not batch:
            raise ValueError("train_step got an empty batch; pass at least one TrainExample")
        shares = split_by_tokens([example_tokens(ex) for ex in batch], self.world_size)
        self._passes = max(math.ceil(len(s) / self.cfg.micro_batch_size) for s in shares)
        return self._step([batch[i] for i in shares[self.rank]])

    def _all_sum(self, values: list[float]) -> list[float]:
        summed = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(summed)
        return summed.tolist()

    def _padding(self, n_micro: int) -> list[_Padded]:
        # an empty response: all-zero mask, so no loss and no gradient, but a full forward/backward
        filler = TrainExample(prompt_ids=(0,), response_ids=(), advantage=0.0)
        return [_pad([filler], self.vocab_size, self.device) for _ in range(self._passes - n_micro)]

    def _clip_and_step(self) -> float:
        # clip_grad_norm_ reduces the sharded gradients' norm over the group (a DTensor)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        self._optimizer_step()
        return float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)

    @torch.no_grad()
    def engine_tensors(self, device: str | torch.device = "cpu") -> Iterable[tuple[str, torch.Tensor]]:
        """(HF name, whole tensor on `device`) per parameter and buffer, gathered one at a time:
        every rank gets each; only one whole tensor beyond the shards is alive at a time per rank."""
        for name, tensor in self.model.state_dict().items():
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            yield name, full.detach().to(device, copy=True).contiguous()

    @torch.no_grad()
    def state_dict_for_engine(self) -> dict[str, torch.Tensor]:
        """The whole weights on every rank (see `Trainer.state_dict_for_engine`); tied names
        share one tensor as there."""
        out = dict(self.engine_tensors())
        tied = getattr(self.model.config, "tie_word_embeddings", False)
        if tied and "lm_head.weight" in out and "model.embed_tokens.weight" in out:
            out["lm_head.weight"] = out["model.embed_tokens.weight"]
        return out

    def state(self):
        raise NotImplementedError("a sharded trainer checkpoints with rhymerl.policy.checkpoint, not bytes")

    def load_state(self, state) -> None:
        raise NotImplementedError("a sharded trainer resumes with rhymerl.policy.checkpoint, not bytes")


def free_port() -> int:
    """A TCP port free on this host now (for rank 0's rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])
