"""Weights from the trainer to the engines in buckets, never the whole model in one object.

The trainer yields (HF name, whole CPU tensor) pairs one at a time (a sharded trainer gathers each
from its ranks as it goes); `bucketed` groups them into dicts of about `bucket_bytes`, each of
which travels on its own (through Ray's object store on CPU) while the next is being gathered.
An engine stages the buckets and loads them in place once the last has arrived.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from torch import Tensor

DEFAULT_BUCKET_BYTES = 256 * 2**20


def bucketed(named: Iterable[tuple[str, Tensor]],
             bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Iterator[dict[str, Tensor]]:
    """Consecutive (name, tensor) pairs as dicts of at most `bucket_bytes` each; a tensor larger
    than that is a bucket of its own. Names keep their order; every pair lands in one bucket."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    bucket: dict[str, Tensor] = {}
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = {}, 0
        bucket[name] = tensor
        size += nbytes
    if bucket:
        yield bucket


def bucket_bytes_of(bucket: dict[str, Tensor]) -> int:
    """Bytes of the tensors in a bucket (what a sync moves)."""
    return sum(t.numel() * t.element_size() for t in bucket.values())
