"""Each rollout worker's HistoSpec history for one step: the prompts it serves, and no more.

HistoPipe's plan says before the rollout which worker samples which prompts (`Plan.placement`;
every policy, the baselines too, places whole prompts or samples of them), so each worker gets a
bundle of only those prompts (`cut_for_workers`, on the driver, from the epoch's history columns)
instead of the epoch's every prompt. The bundle is a numpy uint8 array: `ray.put` stores it
once and the worker's `ray.get` maps it from the object store without a copy
(`RolloutWorker.set_history` writes it to the file its engine's drafter re-reads).

A request that migrates (`workers.stream._Driver.resume`) takes its prompt's history along:
`WorkerHistory.carry` re-cuts the destination's bundle with that prompt added and publishes it
before the request is resubmitted there. The destination is idle when a migration picks it (no open
stream), so its drafter's reload loses no request's state; only when stragglers stopped together
come back in separate events (`pipe.migrate_per_worker` > 1) does a later one's bundle reach a
destination already running the first, whose drafting state then starts over (speed, not
correctness: drafts are verified exactly). A worker restarted by the guard gets
the bundle it held last (`WorkerGuard.share_history` keeps one per worker).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import ray
from ray.exceptions import RayActorError

from rhymerl.histospec.bundle import BundleInfo, HistorySlicer, total_info
from rhymerl.data.records import Prompt

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepBundles:
    """A step's bundles, one per worker (built on the driver; nothing sent yet)."""

    blobs: list[np.ndarray]  # (W,) uint8: `HistoryBundle.to_bytes` layout
    held: list[list[Prompt]]  # (W,) the prompts each bundle holds, in order
    infos: list[BundleInfo]  # (W,)

    def metrics(self, prefix: str = "spec/history_") -> dict[str, float]:
        """What the step's bundles hold, summed over workers, and the largest one's bytes."""
        out = total_info(self.infos).as_metrics(prefix)
        out[f"{prefix}bytes_max_worker"] = float(max((i.bytes for i in self.infos), default=0))
        return out


def cut_for_workers(slicer: HistorySlicer, placement: Sequence[Sequence[Prompt]]) -> StepBundles:
    """One bundle per worker holding the prompts `placement[w]` places there (each once, in order).

    `placement` is `tasks.plan.Plan.placement`; without a plan, pass the prompts each worker is given.
    """
    held = [list({p.prompt_id: p for p in prompts}.values()) for prompts in placement]
    cuts = [slicer.bundle(prompts) for prompts in held]
    return StepBundles([b for b, _ in cuts], held, [i for _, i in cuts])


class WorkerHistory:
    """Which prompts each worker's bundle holds this step; publishes bundles and carries a migrated
    request's prompt to its new worker. Lives in the flow process."""

    def __init__(self, workers: list, slicer: HistorySlicer, bundles: StepBundles, guard=None) -> None:
        self.workers, self.slicer, self.guard = workers, slicer, guard
        self.bundles = bundles
        self.held = [list(h) for h in bundles.held]
        self.refs: list = [None] * len(workers)
        self.sent = [0] * len(workers)  # bytes sent to each worker this step (migrations included)

    def publish(self) -> None:
        """Send every worker its bundle (a worker that is down gets it when the guard resyncs it)."""
        self.refs = [ray.put(b) for b in self.bundles.blobs]
        self.sent = [int(b.nbytes) for b in self.bundles.blobs]
        if self.guard is not None:
            self.guard.share_history(self.refs)
        else:
            ray.get([w.set_history.remote(ref) for w, ref in zip(self.workers, self.refs)])

    def carry(self, dest: int, prompts: Sequence[Prompt]) -> int:
        """Add `prompts` to worker `dest`'s bundle (those it lacks) and publish it there, before
        their requests start on it; returns the bytes sent (0: it held them all already)."""
        have = {p.prompt_id for p in self.held[dest]}
        new = list({p.prompt_id: p for p in prompts if p.prompt_id not in have}.values())
        if not new:
            return 0
        self.held[dest] += new
        blob, _ = self.slicer.bundle(self.held[dest])
        self.refs[dest] = ref = ray.put(blob)
        self.sent[dest] += int(blob.nbytes)
        if self.guard is not None:
            self.guard.set_history(dest, ref)
        try:
            ray.get(self.workers[dest].set_history.remote(ref))
        except RayActorError as exc:  # the stream's own call will find it dead and recover it
            log.warning("rollout worker %d is down (%s); it gets the history when it is back", dest,
                        str(exc).splitlines()[0])
        return int(blob.nbytes)

    def sent_metrics(self, prefix: str = "spec/history_") -> dict[str, float]:
        """Bytes sent to the workers this step (migrations' re-cut bundles included): in all, and to
        the worker that got the most."""
        return {f"{prefix}sent_bytes": float(sum(self.sent)),
                f"{prefix}sent_bytes_max_worker": float(max(self.sent, default=0))}


__all__ = ["StepBundles", "WorkerHistory", "cut_for_workers"]
