"""Placement of a step's prompt groups on rollout workers: one interface, policies by name.

A policy is a pure function ``ScheduleRequest -> Assignment``: from each group's forecast sample
lengths, the worker count and a worker cost model to the units of work each worker generates, in
the order it should admit them. Every policy is strictly on-policy: it only decides where and in
which order the step's requests run, never which weights generate them.

Policies (`POLICIES`, pick with `schedule(name, request)`):

- ``naive``: contiguous chunks of groups in the given order, the placement before HistoPipe.
- ``round_robin``: group i on worker i mod W, in the given order.
- ``lpt`` (HistoPipe tier 1): longest-processing-time-first greedy on the cost model's load
  estimate, whole groups; each worker admits its longest requests first.
- ``tier2`` (HistoPipe tier 2 placement): as ``lpt``, but groups too big for one worker's share
  are split into single samples so they spread over more workers (and more are split while
  workers would otherwise sit empty), and the worker visiting order alternates between even and
  odd steps, so no worker always takes the heaviest load (on identical workers, strictly
  on-policy, this only permutes workers; it matters once workers differ or under opt-in
  staleness). Straggler migration, the other half of tier 2, happens while the step runs
  (see `simulator.MigrationSettings`).
- ``oracle``: ``lpt`` over single samples; meant for demands with `exact` true lengths.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from rhymerl.histopipe.costmodel import CostModel


@dataclass(frozen=True)
class Demand:
    """One prompt group to generate: n samples and the forecast length of each.

    With `exact=False` (a forecast) the samples are exchangeable: `lengths` describes the group's
    spread, not which sample will be long. With `exact=True` `lengths[k]` is sample k's true length.
    """

    prompt_id: str
    lengths: tuple[float, ...]  # (n,) forecast tokens per sample
    exact: bool = False

    def __post_init__(self) -> None:
        if not self.lengths:
            raise ValueError(f"Demand {self.prompt_id}: lengths is empty; give one forecast per sample (n)")
        if any(not math.isfinite(x) or x < 0 for x in self.lengths):
            raise ValueError(f"Demand {self.prompt_id}: lengths must be finite and >= 0, got {self.lengths}")

    @property
    def n(self) -> int:
        return len(self.lengths)


@dataclass(frozen=True)
class Unit:
    """Some samples of one prompt group that run on one worker, with their load forecast."""

    prompt_id: str
    samples: tuple[int, ...]  # sample indices 0..n-1 of the group in this unit
    est_total: float  # forecast tokens of all its samples
    est_peak: float  # forecast length of its longest sample


@dataclass(frozen=True)
class ScheduleRequest:
    """Everything a policy may look at."""

    demands: tuple[Demand, ...]  # the step's groups, in the step's prompt order
    workers: int
    cost: CostModel = field(default_factory=CostModel)
    step: int = 0  # training step (tier2 alternates its worker order on odd steps)
    split_share: float = 0.25  # tier2: groups above this share of a worker's fair load run as single samples

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"ScheduleRequest.workers={self.workers}: must be >= 1 (rollout.num_workers)")
        if self.split_share <= 0:
            raise ValueError(f"ScheduleRequest.split_share={self.split_share}: must be > 0")
        seen: set[str] = set()
        for d in self.demands:
            if d.prompt_id in seen:
                raise ValueError(f"ScheduleRequest: prompt {d.prompt_id} appears twice; pass each group once")
            seen.add(d.prompt_id)


@dataclass(frozen=True)
class Assignment:
    """Per worker, the units it generates in admission order."""

    policy: str
    workers: tuple[tuple[Unit, ...], ...]  # (W,) each in admission order

    def requests(self, worker: int) -> list[tuple[str, int]]:
        """(prompt_id, sample_idx) of every request on `worker`, in admission order."""
        return [(u.prompt_id, k) for u in self.workers[worker] for k in u.samples]

    def estimates(self, cost: CostModel) -> list[float]:
        """Forecast seconds of each worker under `cost` (the load the policy balanced)."""
        return [cost.estimate(sum(u.est_total for u in us), max((u.est_peak for u in us), default=0.0))
                for us in self.workers]

    def check_covers(self, demands: Sequence[Demand]) -> None:
        """Raise unless every sample of every demand is placed exactly once (and nothing else)."""
        want = {(d.prompt_id, k) for d in demands for k in range(d.n)}
        got = [r for w in range(len(self.workers)) for r in self.requests(w)]
        dup = len(got) - len(set(got))
        if dup or set(got) != want:
            raise ValueError(f"{self.policy}: assignment places {len(got)} requests ({dup} duplicated), "
                             f"missing {sorted(want - set(got))[:5]}, unexpected {sorted(set(got) - want)[:5]}")


def whole_unit(d: Demand) -> Unit:
    """The whole group as one unit."""
    return Unit(d.prompt_id, tuple(range(d.n)), float(sum(d.lengths)), float(max(d.lengths)))


def single_units(d: Demand) -> list[Unit]:
    """The group as n one-sample units: exact lengths if known, else each gets the group mean."""
    if d.exact:
        return [Unit(d.prompt_id, (k,), float(x), float(x)) for k, x in enumerate(d.lengths)]
    mean = sum(d.lengths) / d.n
    return [Unit(d.prompt_id, (k,), mean, mean) for k in range(d.n)]


def _long_first(units: Sequence[Unit]) -> tuple[Unit, ...]:
    """Admission order: longest forecast request first (stable, so ties keep placement order)."""
    return tuple(sorted(units, key=lambda u: -u.est_peak))


def lpt_place(units: Sequence[Unit], workers: int, cost: CostModel, reverse_workers: bool = False
              ) -> tuple[tuple[Unit, ...], ...]:
    """Greedy longest-processing-time-first: each unit, costliest first, to the least-loaded worker.

    Load is `cost.estimate` of the worker's units. Ties go to the lowest worker index (the
    highest with `reverse_workers`) and keep the units' given order, so results are reproducible.
    """
    ranked = sorted(range(len(units)), key=lambda i: -cost.estimate(units[i].est_total, units[i].est_peak))
    sign = -1 if reverse_workers else 1
    heap = [(0.0, sign * w, w) for w in range(workers)]
    heapq.heapify(heap)
    totals, peaks = [0.0] * workers, [0.0] * workers
    placed: list[list[Unit]] = [[] for _ in range(workers)]
    for i in ranked:
        _, key, w = heapq.heappop(heap)
        u = units[i]
        placed[w].append(u)
        totals[w] += u.est_total
        peaks[w] = max(peaks[w], u.est_peak)
        heapq.heappush(heap, (cost.estimate(totals[w], peaks[w]), key, w))
    return tuple(_long_first(p) for p in placed)


Policy = Callable[[ScheduleRequest], Assignment]
POLICIES: dict[str, Policy] = {}


def register_policy(name: str) -> Callable[[Policy], Policy]:
    """Decorator adding a policy to `POLICIES` under `name` (names are unique)."""
    def add(fn: Policy) -> Policy:
        if name in POLICIES:
            raise ValueError(f"scheduling policy {name!r} is already registered")
        POLICIES[name] = fn
        return fn
    return add


def schedule(policy: str, request: ScheduleRequest) -> Assignment:
    """Run the policy named `policy` on `request` (see the module docstring for the names)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown scheduling policy {policy!r}; choose one of {', '.join(sorted(POLICIES))}")
    return POLICIES[policy](request)


@register_policy("naive")
def naive(req: ScheduleRequest) -> Assignment:
    """Contiguous chunks of whole groups whose sizes differ by at most one (the placement before HistoPipe)."""
    base, extra = divmod(len(req.demands), req.workers)
    chunks, start = [], 0
    for w in range(req.workers):
        size = base + (1 if w < extra else 0)
        chunks.append(tuple(whole_unit(d) for d in req.demands[start:start + size]))
        start += size
    return Assignment("naive", tuple(chunks))


@register_policy("round_robin")
def round_robin(req: ScheduleRequest) -> Assignment:
    """Whole group i on worker i mod W, admitted in the given order."""
    chunks: list[list[Unit]] = [[] for _ in range(req.workers)]
    for i, d in enumerate(req.demands):
        chunks[i % req.workers].append(whole_unit(d))
    return Assignment("round_robin", tuple(tuple(c) for c in chunks))


@register_policy("lpt")
def lpt(req: ScheduleRequest) -> Assignment:
    """HistoPipe tier 1: whole groups placed longest-first on the least-loaded worker."""
    return Assignment("lpt", lpt_place([whole_unit(d) for d in req.demands], req.workers, req.cost))


def split_groups(req: ScheduleRequest) -> set[str]:
    """Prompt ids of the groups tier2 runs as single samples.

    A group is split when its forecast tokens exceed `split_share` of a worker's fair share
    (all forecast tokens / W): one worker could not absorb it without being the step's straggler.
    Then more groups, longest first, while there are fewer units than workers, so no worker is
    left without work when samples could be spread.
    """
    fair = sum(sum(d.lengths) for d in req.demands) / req.workers
    split = {d.prompt_id for d in req.demands if sum(d.lengths) > req.split_share * fair}
    units = sum(d.n if d.prompt_id in split else 1 for d in req.demands)
    for d in sorted(req.demands, key=lambda d: -max(d.lengths)):
        if units >= req.workers:
            break
        if d.prompt_id not in split:
            split.add(d.prompt_id)
            units += d.n - 1
    return split


@register_policy("tier2")
def tier2(req: ScheduleRequest) -> Assignment:
    """HistoPipe tier 2 placement: long groups spread as single samples, worker order alternating."""
    split = split_groups(req)
    units: list[Unit] = []
    for d in req.demands:
        units.extend(single_units(d) if d.prompt_id in split else [whole_unit(d)])
    return Assignment("tier2", lpt_place(units, req.workers, req.cost, reverse_workers=req.step % 2 == 1))


@register_policy("oracle")
def oracle(req: ScheduleRequest) -> Assignment:
    """Single samples placed longest-first; with exact lengths this knows every request's cost."""
    units = [u for d in req.demands for u in single_units(d)]
    return Assignment("oracle", lpt_place(units, req.workers, req.cost))
