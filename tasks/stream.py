"""The driver side of a streamed rollout: workers report finished samples as they go, scoring
starts on them at once, and (HistoPipe tier 2) stragglers move to idle workers.

Each rollout worker runs its requests as a Ray streaming generator (`RolloutWorker.stream`);
`ray.wait` over the open generators hands the driver whichever worker has news. Finished samples
are scored in chunks on Ray while the tail is still generating, so only the last chunk's scoring
remains on the step's critical path. With a `MigrationRule`, the driver asks a worker to stop a
straggler (`RolloutWorker.stop`, honoured between engine steps) and starts the returned prefix
on an idle worker; the step still uses one set of weights throughout (strictly on-policy).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import ray

from rhymerl.engine import SamplingSpec
from rhymerl.histopipe.migration import MigrationRule, WorkerView, select_migrations
from rhymerl.records import Partial, Request, Sample

SCORE_CHUNK = 32  # samples per scoring task: big enough to amortise a Ray task, small enough to overlap


def score_timed(texts: list[str], golds: list[str]) -> tuple[list[tuple[float, bool, bool]], float]:
    """(reward, correct, formatted) per response, and the seconds the scoring took."""
    from rhymerl.reward import score_batch

    t0 = time.perf_counter()
    scores = [(r.reward, r.correct, r.formatted) for r in score_batch(texts, golds)]
    return scores, time.perf_counter() - t0


score_chunk = ray.remote(score_timed)  # the same, as a Ray task


@dataclass
class StreamedRollout:
    """A step's samples (in arrival order) and the scoring already under way for them."""

    samples: list[Sample] = field(default_factory=list)
    scoring: list[tuple[ray.ObjectRef, int, int]] = field(default_factory=list)  # (ref, first, end) sample slices
    migrations: int = 0
    scored_upto: int = 0  # samples[:scored_upto] have a scoring task

    def submit_scoring(self, gold: dict[str, str], force: bool = False) -> None:
        """Start scoring the unscored samples once there are SCORE_CHUNK of them (or any, if `force`)."""
        todo = self.samples[self.scored_upto:]
        if not todo or (len(todo) < SCORE_CHUNK and not force):
            return
        ref = score_chunk.remote([s.text for s in todo], [gold[s.prompt_id] for s in todo])
        self.scoring.append((ref, self.scored_upto, len(self.samples)))
        self.scored_upto = len(self.samples)


class _Driver:
    """State of one streamed step on W workers (see the module docstring)."""

    def __init__(self, workers: list, requests: list[list[Request]], spec: SamplingSpec, gold: dict[str, str],
                 rule: MigrationRule | None, forecast_peak: dict[str, float], every_s: float,
                 guard=None) -> None:
        self.workers, self.spec, self.gold, self.rule = workers, spec, gold, rule
        self.guard = guard  # tasks.recovery.WorkerGuard: brings a dead worker back (None: fail)
        self.assigned: list[dict[tuple[str, int], Request]] = [{} for _ in workers]  # not yet finished
        self.forecast_peak, self.every_s = forecast_peak, every_s
        self.total = sum(len(r) for r in requests)
        self.out = StreamedRollout()
        # A worker may have more than one stream open (migrated requests arriving at different
        # times); its engine lock runs them one after another. Streams are keyed by an id.
        self.open: dict[int, tuple[int, object]] = {}  # stream id -> (worker, its ObjectRefGenerator)
        self.next_sid = 0
        self.unfinished = [len(r) for r in requests]
        self.running: dict[int, dict[tuple[str, int], int]] = {}  # stream id -> tokens so far per request
        self.stopping: dict[tuple[str, int], int] = {}  # key -> reserved destination worker
        self.moved: set[tuple[str, int]] = set()
        self.prompts = {r.prompt.prompt_id: r.prompt for reqs in requests for r in reqs}
        for w, reqs in enumerate(requests):
            if reqs:
                self.start(w, reqs)

    def start(self, w: int, reqs: list[Request]) -> None:
        self.assigned[w].update({(r.prompt.prompt_id, r.sample_idx): r for r in reqs})
        self.open[self.next_sid] = (w, self.workers[w].stream.remote(reqs, self.spec, self.every_s,
                                                                     self.rule is not None))
        self.next_sid += 1

    def run(self) -> StreamedRollout:
        while self.open:
            ready, _ = ray.wait([g for _, g in self.open.values()], num_returns=1, timeout=self.every_s)
            for gen in ready:
                sid = next((k for k, (_, g) in self.open.items() if g is gen), None)
                if sid is None:  # closed meanwhile (its worker was lost)
                    continue
                w = self.open[sid][0]
                try:
                    event = ray.get(next(gen))
                except StopIteration:
                    del self.open[sid]
                    self.running.pop(sid, None)
                    continue
                except ray.exceptions.RayActorError as exc:  # the worker's process died
                    self.lost(w, exc)
                    continue
                self.take(sid, w, event)
            self.out.submit_scoring(self.gold, force=not self.open)
            if self.rule is not None:
                self.migrate()
        if self.stopping:
            raise RuntimeError(f"rollout ended with {len(self.stopping)} stopped request(s) never resumed: "
                               f"{sorted(self.stopping)[:3]}")
        return self.out

    def take(self, sid: int, w: int, event) -> None:
        for s in event.finished:
            self.assigned[w].pop((s.prompt_id, s.sample_idx), None)
            self.out.samples.append(s)
            self.unfinished[w] -= 1
            self.stopping.pop((s.prompt_id, s.sample_idx), None)  # finished before the stop landed
        for p in event.partials:
            self.assigned[w].pop((p.prompt_id, p.sample_idx), None)
            self.unfinished[w] -= 1
        self.resume(event.partials)
        self.running[sid] = dict(event.running)

    def lost(self, w: int, exc: BaseException) -> None:
        """Worker `w` died mid-stream: once the guard has its restart on the current weights and
        history, run the requests it had not finished again there (its finished samples stay)."""
        if self.guard is None:
            raise exc
        for sid in [sid for sid, (v, _) in self.open.items() if v == w]:
            del self.open[sid]
            self.running.pop(sid, None)
        for key in [k for k in self.stopping if k in self.assigned[w]]:
            del self.stopping[key]  # its stop died with the worker: it re-runs there from scratch
        self.guard.recover(w, exc)
        if self.assigned[w]:
            self.start(w, list(self.assigned[w].values()))

    def resume(self, partials: Sequence[Partial]) -> None:
        """Continue stopped requests on the workers reserved for them (one stream per worker)."""
        by_dest: dict[int, list[Request]] = {}
        for p in partials:
            dest = self.stopping.pop((p.prompt_id, p.sample_idx))
            by_dest.setdefault(dest, []).append(Request(self.prompts[p.prompt_id], p.sample_idx, prefix=p))
        for dest, reqs in by_dest.items():
            self.unfinished[dest] += len(reqs)
            self.out.migrations += len(reqs)
            self.start(dest, reqs)

    def migrate(self) -> None:
        reserved = set(self.stopping.values())
        streaming = {w for w, _ in self.open.values()}
        views = []
        for w in range(len(self.workers)):
            running = {k: n for sid, (v, _) in self.open.items() if v == w for k, n in self.running.get(sid, {}).items()}
            views.append(WorkerView(running=running, queued=max(0, self.unfinished[w] - len(running)),
                                    busy=w in streaming or w in reserved))
        finished = len(self.out.samples)
        for move in select_migrations(self.rule, self.total, finished, views, self.forecast_peak,
                                      self.spec.max_tokens, self.moved | set(self.stopping)):
            self.moved.add(move.key)
            self.stopping[move.key] = move.dest
            self.workers[move.src].stop.remote([move.key])


def stream_rollout(workers: list, requests: list[list[Request]], spec: SamplingSpec, gold: dict[str, str],
                   rule: MigrationRule | None = None, forecast_peak: dict[str, float] | None = None,
                   every_s: float = 0.25, guard=None) -> StreamedRollout:
    """Run `requests[w]` on `workers[w]`, scoring finished samples while the rest generate.

    `gold[prompt_id]` is the answer the reward checks. With `rule`, stragglers (judged against
    `forecast_peak[prompt_id]`) move to idle workers. With `guard` (`tasks.recovery.WorkerGuard`),
    a worker that dies is restarted on the current weights and re-runs its unfinished requests.
    Returns every sample once; its scoring may still be running (see `collect_scores`).
    """
    if len(requests) != len(workers):
        raise ValueError(f"stream_rollout: {len(requests)} request lists for {len(workers)} workers; "
                         "pass one list per worker (empty for an idle one)")
    return _Driver(workers, requests, spec, gold, rule, forecast_peak or {}, every_s, guard).run()


def collect_scores(rollout: StreamedRollout, gold: dict[str, str]) -> tuple[list[tuple[float, bool, bool]], float]:
    """Scores in sample order and the summed scoring seconds; waits for scoring still running.

    A chunk whose Ray task failed is scored again here (on this process), so a lost worker costs
    time, never scores.
    """
    rollout.submit_scoring(gold, force=True)
    scores: list[tuple[float, bool, bool]] = [None] * len(rollout.samples)  # type: ignore[list-item]
    total_s = 0.0
    for ref, first, end in rollout.scoring:
        try:
            chunk, seconds = ray.get(ref)
        except (ray.exceptions.RayError, OSError):
            chunk, seconds = score_timed([s.text for s in rollout.samples[first:end]],
                                                   [gold[s.prompt_id] for s in rollout.samples[first:end]])
        scores[first:end] = chunk
        total_s += seconds
    return scores, total_s
