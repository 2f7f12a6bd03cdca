"""Keep Python's full garbage collections off a run's critical path.

A run's long-lived processes (the flow, each rollout worker, the trainer) import torch, vLLM,
Prefect and Ray: about a million Python objects that live as long as the process. CPython's
oldest-generation collection walks every tracked object, so each one stalls the process for a
noticeable fraction of a second in the middle of an epoch, longer when the cores are busy (figures:
docs/benchmarks.md). vLLM does the same in its engine core (`freeze_gc_heap`), Ray Serve in its
replicas.

`freeze_startup_heap()`, called once a process has finished starting, moves everything alive to
CPython's permanent generation (`gc.freeze`): later collections walk only what the run itself
allocates. Nothing is leaked: frozen objects are those the process keeps anyway; cycles created
afterwards are collected as before.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


def freeze_startup_heap() -> int:
    """Collect once, then exempt every object alive now from later collections; returns how many
    objects were frozen. Call it when a process has imported and built what it keeps for life."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@contextmanager
def frozen_heap() -> Iterator[int]:
    """`freeze_startup_heap` for the block only: what is alive when it starts (an engine's start-up
    heap, in a benchmark that stands in for one) leaves the collector's walks until it ends, when it
    is handed back (`gc.unfreeze`) to be collected as before. Yields how many objects were frozen.
    Not for a process that froze its heap before (a run's, `freeze_startup_heap`): the end unfreezes all."""
    try:
        yield freeze_startup_heap()
    finally:
        gc.unfreeze()
