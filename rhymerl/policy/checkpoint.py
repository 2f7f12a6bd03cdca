"""Trainer checkpoints with torch.distributed.checkpoint (DCP): sharded, and any world size back.

Each rank writes only its own shards of the weights and of the AdamW state, in parallel, to one
folder (a local path or any fsspec URL: `s3://...`); nobody ever holds the whole state. A
checkpoint written by N ranks loads onto M ranks, or onto the single-process `Trainer` (no
process group at all), because DCP stores each tensor's global shape and reshards on load.

What is stored: the policy's weights ("model"), AdamW's state ("optim"), the policy version, the
learning-rate schedule's step ("lr_step", the optimizer steps taken) and rank 0's torch RNG state (the trainer keeps dropout off, so the ranks' RNG streams are not
used in a step; one state restored on every rank is enough). The frozen KL reference is not
stored: it is the model at `model.path`, rebuilt at start.

Committing (a marker written last) is the caller's job: see `storage.checkpoints`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from rhymerl.policy.trainer import Trainer

# DCP's metadata file: present once a write finished on every rank (DCP writes it last)
METADATA_FILE = ".metadata"


def _state(trainer: Trainer) -> dict[str, Any]:
    """The trainer's state as DCP state dicts: sharded DTensors under FSDP2, plain tensors otherwise."""
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
    return {
        "model": model_sd,
        "optim": optim_sd,
        # plain tensors are replicated: DCP writes them once and gives every rank the whole
        "policy_version": torch.tensor(trainer.policy_version, dtype=torch.int64),
        "lr_step": torch.tensor(trainer.lr_step, dtype=torch.int64),
        "torch_rng": torch.get_rng_state(),
    }


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def save_trainer(trainer: Trainer, url: str, **storage_options: Any) -> None:
    """Write the trainer's state under `url` (a folder). Collective when the trainer is sharded:
    every rank calls it with the same url. `storage_options` go to fsspec (s3fs credentials)."""
    writer = FsspecWriter(url, **storage_options)
    dcp.save(_state(trainer), storage_writer=writer, no_dist=not _distributed())


def load_trainer(trainer: Trainer, url: str, **storage_options: Any) -> int:
    """Restore what `save_trainer` wrote at `url`, from any world size; returns the policy version.

    Collective when sharded. The optimizer's state is loaded even before its first step (DCP
    fills the state that `get_state_dict` initialises). A checkpoint without "lr_step" (written
    before schedules were stored) resumes the schedule at policy version x updates_per_step."""
    state = _state(trainer)
    reader = FsspecReader(url, **storage_options)
    if "lr_step" not in reader.read_metadata().state_dict_metadata:  # every other key must be there
        del state["lr_step"]
    dcp.load(state, storage_reader=reader, no_dist=not _distributed())
    set_state_dict(trainer.model, trainer.optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    trainer.policy_version = int(state["policy_version"])
    lr_step = state.get("lr_step", trainer.policy_version * trainer.cfg.updates_per_step)
    trainer.set_lr_step(int(lr_step))
    torch.set_rng_state(state["torch_rng"])
    return trainer.policy_version
