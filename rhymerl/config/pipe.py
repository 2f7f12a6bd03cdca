"""HistoPipe's settings (`pipe.*` in a run config); `rhymerl.config.run.RunConfig` composes them.

Plain fields only: the migration rule they describe is built by
`rhymerl.histopipe.migration.MigrationRule.from_settings`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rhymerl.config.options import option
from rhymerl.errors import ConfigError


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"config key '{key}': {msg}", key=key)


@dataclass(frozen=True)
class PipeConfig:
    """HistoPipe: how a step's requests are placed on rollout workers and moved while they run.

    Strictly on-policy, always: placement, streaming and migration never change which weights
    generate a sample; every sample of step t comes from the weights after step t-1. Bounded
    staleness (letting step t+1 start before step t's update) is not offered.

    `tier2` places single samples of long groups on several workers (exact sample indices kept)
    and alternates the worker order between steps. `migrate` (tier 2's other half): in a step's
    last `migrate_tail` of requests, a request whose generated tokens reached `migrate_threshold`
    x its prompt's forecast peak is stopped and continued from its prefix on an idle worker.
    """

    policy: Literal["naive", "round_robin", "lpt", "tier2"] = option(
        "lpt", "placement of a step's requests: lpt = HistoPipe tier 1 (forecast lengths, longest first), "
        "tier2 = lpt with long groups split over workers, naive = contiguous chunks, round_robin")
    trend_weight: float = option(0.5, "share of a prompt's last epoch-to-epoch length change carried into "
                                 "its forecast", "[0, 1]")
    gantt: bool = option(True, "attach a Gantt chart of every step to the MLflow run")
    migrate: bool = option(False, "move stragglers to idle workers in a step's tail (HistoPipe migration)")
    migrate_tail: float = option(0.10, "migrate once at most this share of the step's requests is unfinished",
                                 "(0, 1]")
    migrate_threshold: float = option(1.0, "a straggler has generated >= this x its prompt's forecast peak "
                                      "(0 = any running request in the tail)", ">= 0")
    migrate_per_worker: int = option(1, "stragglers an idle worker takes at a time", ">= 1")

    def __post_init__(self) -> None:
        _check(0.0 <= self.trend_weight <= 1.0, "pipe.trend_weight", "must be in [0, 1]")
        _check(0.0 < self.migrate_tail <= 1.0, "pipe.migrate_tail", "must be in (0, 1]")
        _check(self.migrate_threshold >= 0, "pipe.migrate_threshold", "must be >= 0 (0 moves any running "
               "request in the tail)")
        _check(self.migrate_per_worker >= 1, "pipe.migrate_per_worker", "must be >= 1")


__all__ = ["PipeConfig"]
