"""Discrete-event simulator of one rollout step on W continuous-batching workers, and its metrics.

Each worker follows `costmodel.CostModel`: up to `capacity` requests run at once, an iteration
gives every running request one token and takes ``base_s + per_seq_s * running`` seconds, and
queued requests are admitted in the assignment's order as slots free. Time jumps from one request
completion to the next (no per-token loop), so a step of 65k requests replays in a few seconds.
Any `StepCost` will do: `rhymerl.histopipe.spec_pace.PacedCost` gives the seconds per token of a
worker whose requests gain several tokens per step (speculative decoding).

Straggler migration (optional, `MigrationSettings`): once the step is in its tail (at most
`tail_fraction` of its requests unfinished), whenever a worker is idle it takes the most overdue
running request of another worker: one whose generated tokens reached `threshold` x its prompt's
forecast peak (checked at every completion and at every such threshold crossing). The request
carries its prefix and decodes again after `MigrationSettings.delay` (the re-prefill). The same
weights generate both parts, so the sample stays on-policy. A request migrates at most once, and
only off a worker that keeps other work (moving a lone request gains nothing).

Metrics are defined once here and shared by simulated and measured steps: a worker is busy while
it has a running request; bubble ratio = idle worker-seconds / (W x makespan), with the step
starting at time 0 on every worker.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Protocol, Sequence

from rhymerl.histopipe.schedule import Assignment

_EPS = 1e-9  # tokens: float slack when comparing virtual token clocks


class StepCost(Protocol):
    """What the simulator reads of a worker's cost (`CostModel` is one)."""

    capacity: int  # most requests running at once
    startup_s: float  # seconds before the first step

    def step_time(self, running: float) -> float:
        """Seconds until each of `running` requests has one more token."""


@dataclass(frozen=True)
class MigrationSettings:
    """When running stragglers move to idle workers."""

    tail_fraction: float = 0.10  # migrate only once at most this fraction of requests is unfinished
    threshold: float = 1.0  # straggler: generated tokens > threshold x forecast peak of its prompt
    resume_s: float = 0.0  # fixed seconds to resume on the new worker
    prefill_s_per_token: float = 0.0  # plus this per carried prefix token (its re-prefill)

    def __post_init__(self) -> None:
        if not 0.0 < self.tail_fraction <= 1.0:
            raise ValueError(f"MigrationSettings.tail_fraction={self.tail_fraction}: must be in (0, 1]")
        if min(self.threshold, self.resume_s, self.prefill_s_per_token) < 0:
            raise ValueError(f"MigrationSettings: threshold={self.threshold}, resume_s={self.resume_s} and "
                             f"prefill_s_per_token={self.prefill_s_per_token} must be >= 0")

    def delay(self, prefix_tokens: int) -> float:
        """Seconds before a migrated request with this many generated tokens decodes again."""
        return self.resume_s + self.prefill_s_per_token * prefix_tokens


@dataclass(frozen=True)
class RequestSpan:
    """A request's time on one worker (a migrated request has two spans)."""

    prompt_id: str
    sample_idx: int
    worker: int
    start: float  # seconds from the step's start
    end: float
    tokens: int  # tokens generated in this span
    migrated: bool = False  # this span continues a request moved from another worker


@dataclass(frozen=True)
class SimResult:
    """One step's timeline: spans, per-worker busy intervals and the summary metrics."""

    workers: int
    makespan: float
    busy: tuple[tuple[tuple[float, float], ...], ...]  # (W,) merged busy intervals per worker
    spans: tuple[RequestSpan, ...]
    migrations: int
    bubble_ratio: float


def busy_intervals(spans: Iterable[RequestSpan], workers: int) -> tuple[tuple[tuple[float, float], ...], ...]:
    """Per worker, the union of its spans as sorted disjoint (start, end) intervals."""
    per: list[list[tuple[float, float]]] = [[] for _ in range(workers)]
    for s in spans:
        if not 0 <= s.worker < workers:
            raise ValueError(f"span of {s.prompt_id}/{s.sample_idx} is on worker {s.worker}, "
                             f"outside 0..{workers - 1}; pass the step's worker count")
        per[s.worker].append((s.start, s.end))
    out = []
    for intervals in per:
        merged: list[tuple[float, float]] = []
        for a, b in sorted(intervals):
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        out.append(tuple(merged))
    return tuple(out)


def bubble_ratio(busy: Sequence[Sequence[tuple[float, float]]], makespan: float) -> float:
    """Idle worker-seconds / (W x makespan); 0 for an empty step."""
    if makespan <= 0:
        return 0.0
    worked = sum(b - a for intervals in busy for a, b in intervals)
    return 1.0 - worked / (len(busy) * makespan)


def summarize(spans: Sequence[RequestSpan], workers: int, migrations: int = 0) -> SimResult:
    """SimResult of spans whose times count from the step's start."""
    busy = busy_intervals(spans, workers)
    makespan = max((s.end for s in spans), default=0.0)
    return SimResult(workers, makespan, busy, tuple(sorted(spans, key=lambda s: (s.worker, s.start))),
                     migrations, bubble_ratio(busy, makespan))


def measure(records: Iterable[Mapping[str, Any]], workers: int) -> SimResult:
    """The same metrics for a measured step: lake rows with prompt_id, sample_idx, worker_id,
    gen_start, gen_end, length, and optionally migrated_from_worker / migrated_at (a migrated
    request is two spans: on its first worker until it moved, then on worker_id; the first span's
    token count is not recorded and reads 0). Times count from the earliest gen_start."""
    rows = list(records)
    if not rows:
        return summarize([], workers)
    t0 = min(r["gen_start"] for r in rows)
    spans, moves = [], 0
    for r in rows:
        src, at = r.get("migrated_from_worker"), r.get("migrated_at")
        if src is None or at is None:
            spans.append(RequestSpan(r["prompt_id"], r["sample_idx"], r["worker_id"], r["gen_start"] - t0,
                                     r["gen_end"] - t0, r["length"]))
            continue
        moves += 1
        spans.append(RequestSpan(r["prompt_id"], r["sample_idx"], src, r["gen_start"] - t0, at - t0, 0))
        spans.append(RequestSpan(r["prompt_id"], r["sample_idx"], r["worker_id"], at - t0, r["gen_end"] - t0,
                                 r["length"], migrated=True))
    return summarize(spans, workers, moves)


class _Worker:
    """One worker's state; `v` is its virtual token clock (tokens each running request gained)."""

    def __init__(self, index: int, queue: Iterable[int]) -> None:
        self.index = index
        self.queue = deque(queue)
        self.running: list[tuple[float, int]] = []  # (finish v, request) heap, lazily pruned
        self.triggers: list[tuple[float, int]] = []  # (straggler v, request) heap of future stragglers
        self.overdue: deque[int] = deque()  # requests past their straggler v, most overdue first
        self.members: set[int] = set()  # requests running here now
        self.v = 0.0
        self.t = 0.0  # time at which `v` is exact
        self.version = 0  # bumped on every change so stale events are skipped

    def advance(self, t: float, cost: StepCost) -> None:
        if self.members:
            self.v += (t - self.t) / cost.step_time(len(self.members))
        self.t = t
        while self.triggers and self.triggers[0][0] <= self.v + _EPS:
            self.overdue.append(heapq.heappop(self.triggers)[1])

    def next_finish(self) -> float:
        while self.running and self.running[0][1] not in self.members:
            heapq.heappop(self.running)
        return self.running[0][0] if self.running else math.inf

    def busy(self) -> bool:
        return bool(self.members or self.queue)

    def can_give(self) -> bool:
        """Moving one running request away leaves this worker other work."""
        return len(self.members) + len(self.queue) >= 2


class _Step:
    """Event loop over all workers of one step. Events are (time, version, worker index); index -1
    is a migration check at a straggler's threshold crossing."""

    def __init__(self, assignment: Assignment, lengths: Mapping[tuple[str, int], int], cost: StepCost,
                 migration: MigrationSettings | None, forecasts: Mapping[str, float] | None) -> None:
        self.cost, self.migration = cost, migration
        self.keys = [r for w in range(len(assignment.workers)) for r in assignment.requests(w)]
        missing = [k for k in self.keys if k not in lengths]
        if missing:
            raise ValueError(f"simulate: no recorded length for {missing[:5]}; pass lengths for every request")
        if migration is not None and (forecasts is None or any(p not in forecasts for p, _ in self.keys)):
            raise ValueError("simulate: migration needs forecasts[prompt_id] (forecast peak) for every prompt")
        self.remaining = [max(1.0, float(lengths[k])) for k in self.keys]
        self.trigger_len = [migration.threshold * forecasts[p] if migration else math.inf for p, _ in self.keys]
        self.admit_v, self.start = [0.0] * len(self.keys), [0.0] * len(self.keys)
        self.carried = [0] * len(self.keys)  # prefix tokens brought by a migration
        self.moved = [False] * len(self.keys)
        self.spans: list[RequestSpan] = []
        self.done, self.migrations, self.check_version = 0, 0, 0
        self.workers, first = [], 0  # request ids are contiguous per worker, in admission order
        for w in range(len(assignment.workers)):
            count = len(assignment.requests(w))
            self.workers.append(_Worker(w, range(first, first + count)))
            first += count
        self.events: list[tuple[float, int, int]] = []

    def admit(self, w: _Worker, t: float, rid: int, extra_v: float = 0.0) -> None:
        self.admit_v[rid], self.start[rid] = w.v + extra_v, t
        w.members.add(rid)
        heapq.heappush(w.running, (w.v + extra_v + self.remaining[rid], rid))
        if not self.moved[rid] and math.isfinite(self.trigger_len[rid]):
            heapq.heappush(w.triggers, (w.v + self.trigger_len[rid], rid))

    def fill(self, w: _Worker, t: float) -> None:
        while w.queue and len(w.members) < self.cost.capacity:
            self.admit(w, t, w.queue.popleft())

    def schedule(self, w: _Worker) -> None:
        w.version += 1
        finish = w.next_finish()
        if finish < math.inf:
            t = w.t + (finish - w.v) * self.cost.step_time(len(w.members))
            heapq.heappush(self.events, (t, w.version, w.index))

    def close(self, w: _Worker, rid: int, t: float, tokens: int) -> None:
        p, k = self.keys[rid]
        self.spans.append(RequestSpan(p, k, w.index, self.start[rid], t, tokens, self.moved[rid]))
        w.members.discard(rid)

    def complete(self, w: _Worker, t: float) -> None:
        w.advance(t, self.cost)
        w.v = max(w.v, w.next_finish())  # snap away float error: this event is that finish
        while w.running and w.running[0][0] <= w.v + _EPS:
            _, rid = heapq.heappop(w.running)
            if rid in w.members:
                self.close(w, rid, t, int(round(self.remaining[rid])))
                self.done += 1
        self.fill(w, t)
        self.schedule(w)

    def in_tail(self) -> bool:
        return self.migration is not None and \
            self.done >= (1.0 - self.migration.tail_fraction) * len(self.keys)

    def run(self) -> SimResult:
        for w in self.workers:
            w.t = self.cost.startup_s
            self.fill(w, 0.0)
            self.schedule(w)
        while self.events:
            t, version, index = heapq.heappop(self.events)
            if index >= 0:
                if version != self.workers[index].version:
                    continue
                self.complete(self.workers[index], t)
            elif version != self.check_version:
                continue
            if self.in_tail():
                self.migrate(t)
                self.plan_check(t)
        return summarize(self.spans, len(self.workers), self.migrations)

    def straggler(self, w: _Worker, t: float) -> tuple[float, int] | None:
        """(tokens overdue, request) of `w`'s most overdue straggler, if `w` can give one."""
        if not w.can_give():
            return None
        w.advance(t, self.cost)
        while w.overdue and w.overdue[0] not in w.members:
            w.overdue.popleft()
        if not w.overdue:
            return None
        rid = w.overdue[0]
        return w.v - self.admit_v[rid] - self.trigger_len[rid], rid

    def migrate(self, t: float) -> None:
        """Each idle worker takes the most overdue straggler of a different source worker."""
        idle = [w for w in self.workers if not w.busy()]
        if not idle:
            return
        found = [(c, w) for w in self.workers if (c := self.straggler(w, t)) is not None]
        found.sort(key=lambda cw: (-cw[0][0], cw[1].index))
        for dest, ((_, rid), src) in zip(idle, found):
            src.overdue.popleft()
            generated = int(math.floor(src.v - self.admit_v[rid] + _EPS))
            self.close(src, rid, t, generated)
            self.remaining[rid] -= generated
            self.carried[rid] += generated
            self.moved[rid] = True
            self.migrations += 1
            self.fill(src, t)
            self.schedule(src)
            dest.advance(t, self.cost)
            delay = self.migration.delay(self.carried[rid])
            self.admit(dest, t, rid, extra_v=delay / self.cost.step_time(1))
            self.schedule(dest)

    def plan_check(self, t: float) -> None:
        """While a worker idles, check again when the next running request becomes a straggler."""
        self.check_version += 1
        if all(w.busy() for w in self.workers):
            return
        soonest = math.inf
        for w in self.workers:
            if w.can_give():
                w.advance(t, self.cost)
                while w.triggers and w.triggers[0][1] not in w.members:
                    heapq.heappop(w.triggers)
                if w.triggers:
                    crossing = t + (w.triggers[0][0] - w.v) * self.cost.step_time(len(w.members))
                    soonest = min(soonest, crossing)
        if soonest < math.inf:
            heapq.heappush(self.events, (soonest, self.check_version, -1))


def simulate(assignment: Assignment, lengths: Mapping[tuple[str, int], int], cost: StepCost,
             migration: MigrationSettings | None = None, forecasts: Mapping[str, float] | None = None) -> SimResult:
    """Replay one step: `assignment` places requests, `lengths[(prompt_id, sample_idx)]` are their
    true lengths. With `migration`, `forecasts[prompt_id]` (the forecast peak length) decides who
    is a straggler. Deterministic: ties go to the lower worker index."""
    return _Step(assignment, lengths, cost, migration, forecasts).run()
