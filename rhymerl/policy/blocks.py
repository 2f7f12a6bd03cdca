"""A Hugging Face model's transformer blocks, and activation checkpointing over them.

Separate from the trainers so the single-process `Trainer` and the sharded one share it.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks (decoder layers): the units FSDP2 shards and checkpointing
    recomputes. Hugging Face names their classes in `_no_split_modules`."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"{type(model).__name__} names no transformer block class in _no_split_modules; "
                         "the sharded trainer needs one to shard by")
    return blocks


def checkpoint_activations(model: torch.nn.Module) -> int:
    """Recompute each block's activations in backward instead of keeping them; blocks wrapped.

    The block's `forward` is replaced on the instance (not the module tree), so parameter names
    and state dicts stay the Hugging Face ones. Non-reentrant checkpointing: it works with
    FSDP2's hooks and needs no `requires_grad` inputs. The model stays in eval mode (no
    dropout), so the recomputed activations equal the first ones."""
    blocks = transformer_blocks(model)
    for block in blocks:
        inner = block.forward
        block.forward = lambda *a, _inner=inner, **k: checkpoint(_inner, *a, use_reentrant=False, **k)
    return len(blocks)
