"""Weights by broadcast: a process group of the trainer's rank 0 and every engine worker.

The GPU path of the weight sync (`train.sync_transport = "process_group"`), the pattern of verl,
OpenRLHF and NeMo-RL: the driver hands out a rendezvous address (`GroupAddress`); the trainer's
rank 0 (group rank 0) and each engine worker process (ranks 1..) open a process group of their own
there with `open_group` — a store and a backend object made directly, so neither side's default
group (the trainer ranks' FSDP2 group, vLLM's own) is touched. NCCL where the sender has a GPU,
gloo on CPU.

Wire format, all by broadcast from rank 0, one bucket (`rhymerl.policy.weight_sync.bucketed`) at a time:
1. an int64 pair (header bytes, payload bytes); (0, 0) ends the sync;
2. the header: UTF-8 JSON, one [name, dtype, shape, offset] per tensor;
3. the payload: every tensor's bytes in one flat uint8 buffer, each at an offset aligned to
   `ALIGN` bytes so the receiver's views of it are valid for any dtype.
`WeightGroup.receive` yields (name, tensor) views into each bucket's own buffer as they arrive, so
an engine can load them in place while the next bucket is still on the wire; buffers are never
reused (a loader that keeps a view keeps its bucket alive).

Pure torch: who opens the group (Ray actors, vLLM's worker extension, test processes) is not this
module's business.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor

ALIGN = 16  # bytes: the widest element of any dtype sent, so every view of the payload is aligned
BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class GroupAddress:
    """Where a weight group meets (rank 0 hosts the store) and how many processes it has."""

    host: str
    port: int
    world_size: int  # 1 (the trainer's rank 0) + every engine worker process
    backend: str = "gloo"

    def __post_init__(self) -> None:
        if self.world_size < 2:
            raise ValueError(f"a weight group needs a sender and a receiver, got world_size {self.world_size}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")


def open_group(address: GroupAddress, rank: int, timeout_s: float = 300.0) -> "WeightGroup":
    """Join the weight group at `address` as `rank` (collective: every rank calls it).

    Stateless: the store and the backend are plain objects of this call, the process's default
    group (if any) is untouched, and another group can be opened after `close`."""
    if not 0 <= rank < address.world_size:
        raise ValueError(f"rank {rank} is outside [0, {address.world_size})")
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(address.host, address.port, address.world_size, rank == 0, timeout=timeout)
    prefixed = dist.PrefixStore(f"rhymerl-weights/{address.port}", store)
    if address.backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        pg = dist.ProcessGroupNCCL(prefixed, rank, address.world_size, options)
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        pg = dist.ProcessGroupGloo(prefixed, rank, address.world_size, timeout)
        device = torch.device("cpu")
    return WeightGroup(pg, store, rank, device)


class WeightGroup:
    """One opened weight group: rank 0 `send`s buckets, every other rank `receive`s them."""

    def __init__(self, pg, store, rank: int, device: torch.device) -> None:
        self.pg, self.store, self.rank, self.device = pg, store, rank, device

    def _broadcast(self, tensor: Tensor) -> Tensor:
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = 0, 0
        self.pg.broadcast([tensor], options).wait()
        return tensor

    def send(self, buckets: Iterable[dict[str, Tensor]]) -> int:
        """Broadcast every bucket, then the end marker (rank 0 only); the payload bytes sent.

        Each bucket is packed into one buffer on the group's device and sent before the next is
        taken from `buckets`, so a sender gathering tensors lazily holds one bucket at a time."""
        if self.rank != 0:
            raise RuntimeError("only rank 0 of a weight group sends")
        sent = 0
        for bucket in buckets:
            header, payload = pack(bucket, self.device)
            self._broadcast(torch.tensor([header.numel(), payload.numel()], dtype=torch.int64, device=self.device))
            self._broadcast(header)
            self._broadcast(payload)
            sent += payload.numel()
        self._broadcast(torch.zeros(2, dtype=torch.int64, device=self.device))
        return sent

    def receive(self) -> Iterator[tuple[str, Tensor]]:
        """(name, tensor) in the sender's order until its end marker (ranks > 0); each tensor a
        view into its bucket's fresh buffer on the group's device."""
        if self.rank == 0:
            raise RuntimeError("rank 0 of a weight group sends; it does not receive")
        while True:
            sizes = self._broadcast(torch.empty(2, dtype=torch.int64, device=self.device)).tolist()
            if sizes == [0, 0]:
                return
            header = self._broadcast(torch.empty(sizes[0], dtype=torch.uint8, device=self.device))
            payload = self._broadcast(torch.empty(sizes[1], dtype=torch.uint8, device=self.device))
            yield from unpack(header, payload)

    def close(self) -> None:
        """Drop the backend and the store (rank 0's store stops serving)."""
        shutdown = getattr(self.pg, "shutdown", None)
        if shutdown is not None and self.device.type == "cuda":
            shutdown()  # NCCL communicators hold GPU memory until shut down
        self.pg = self.store = None


def pack(bucket: dict[str, Tensor], device: torch.device) -> tuple[Tensor, Tensor]:
    """A bucket as (JSON header, flat payload), both uint8 tensors on `device` (see the module)."""
    entries, offset = [], 0
    for name, tensor in bucket.items():
        entries.append([name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset])
        offset += _aligned(tensor.numel() * tensor.element_size())
    payload = torch.empty(offset, dtype=torch.uint8, device=device)
    for (_, _, _, start), tensor in zip(entries, bucket.values()):
        raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        payload[start:start + raw.numel()].copy_(raw)
    header = torch.frombuffer(bytearray(json.dumps(entries).encode()), dtype=torch.uint8).to(device)
    return header, payload


def unpack(header: Tensor, payload: Tensor) -> Iterator[tuple[str, Tensor]]:
    """The (name, tensor) pairs `pack` put in, as views into `payload`."""
    for name, dtype_name, shape, start in json.loads(header.cpu().numpy().tobytes().decode()):
        dtype = getattr(torch, dtype_name)
        nbytes = _numel(shape) * torch.empty((), dtype=dtype).element_size()
        yield name, payload[start:start + nbytes].view(dtype).view(shape)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


__all__ = ["ALIGN", "BACKENDS", "GroupAddress", "WeightGroup", "open_group", "pack", "unpack"]
