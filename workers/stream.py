"""The driver side of a streamed rollout: workers report finished samples as they go, scoring
starts on them at once, and (HistoPipe tier 2) stragglers move to idle workers.

Each rollout worker runs its requests as a Ray streaming generator (`RolloutWorker.stream`);
`ray.wait` over the open generators hands the driver whichever worker has news. Finished samples
are scored in chunks on Ray while the tail is still generating, so only the last chunk's scoring
remains on the step's critical path. With a `MigrationRule`, the driver asks a worker to stop a
straggler (`RolloutWorker.stop`, honoured between engine steps) and starts the returned prefix
on an idle worker, after giving that worker the prompt's HistoSpec history (each worker holds only
its own prompts' history: `workers.history_bundles`); the step still uses one set of weights throughout
(strictly on-policy).

Scoring runs the run's reward functions (`Scoring`: a `rhymerl.data.rewards.RewardSet` with each
prompt's text and dataset row) in Ray tasks, never on the engines, so a slow function delays only
the step's last chunk. A function that fails raises `RewardFunctionError` from `collect_scores`
(naming the function, the prompt id and the cause); it is not scored again: it would fail the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import ray

from rhymerl.data.rewards import RewardFunctionError, RewardScore, RewardSet
from rhymerl.histopipe.migration import MigrationRule, WorkerView, select_migrations
from rhymerl.data.records import Partial, Prompt, Request, Sample
from rhymerl.vllm.engine import SamplingSettings

SCORE_CHUNK = 32  # samples per scoring task: big enough to amortise a Ray task, small enough to overlap


@dataclass(frozen=True)
class Scoring:
    """What scoring a step needs, as plain data that pickles into Ray tasks: the reward functions
    and, for each prompt id, its rendered text and dataset row."""

    rewards: RewardSet
    prompts: Mapping[str, tuple[str, Mapping[str, Any]]]  # prompt_id -> (text, row)

    @classmethod
    def of(cls, rewards: RewardSet, prompts: Sequence[Prompt]) -> Scoring:
        return cls(rewards, {p.prompt_id: (p.text, p.row) for p in prompts})

    def only(self, samples: Sequence[Sample]) -> Scoring:
        """The same, holding only these samples' prompts (what one chunk's task needs)."""
        return Scoring(self.rewards, {s.prompt_id: self.prompts[s.prompt_id] for s in samples})

    def score(self, samples: Sequence[Sample]) -> list[RewardScore]:
        """Each sample's score, in order; RewardFunctionError when a function fails."""
        out = []
        for s in samples:
            text, row = self.prompts[s.prompt_id]
            out.append(self.rewards.score(text, s.text, row, s.prompt_id))
        return out


def score_timed(scoring: Scoring, samples: Sequence[Sample]) -> tuple[list[RewardScore], float]:
    """The score of each sample, and the seconds the scoring took."""
    t0 = time.perf_counter()
    scores = scoring.score(samples)
    return scores, time.perf_counter() - t0


score_chunk = ray.remote(score_timed)  # the same, as a Ray task


def reward_error(exc: BaseException) -> RewardFunctionError | None:
    """The reward function failure behind a failed Ray task, as a plain RewardFunctionError with
    the task's error as its cause (whose text is the remote traceback, the function's own frames
    included); None when the task failed for another reason."""
    cause = getattr(exc, "cause", None)
    if not isinstance(exc, ray.exceptions.RayTaskError) or not isinstance(cause, RewardFunctionError):
        return None
    error = RewardFunctionError(str(cause))
    error.__cause__ = exc
    return error


@dataclass
class StreamedRollout:
    """A step's samples (in arrival order) and the scoring already under way for them."""

    samples: list[Sample] = field(default_factory=list)
    scoring: list[tuple[ray.ObjectRef, int, int]] = field(default_factory=list)  # (ref, first, end) sample slices
    migrations: int = 0
    scored_upto: int = 0  # samples[:scored_upto] have a scoring task
    discarded: int = 0  # finished samples thrown away because their worker died (re-run instead)

    def submit_scoring(self, scoring: Scoring, force: bool = False) -> None:
        """Start scoring the unscored samples once there are SCORE_CHUNK of them (or any, if `force`)."""
        todo = self.samples[self.scored_upto:]
        if not todo or (len(todo) < SCORE_CHUNK and not force):
            return
        ref = score_chunk.remote(scoring.only(todo), todo)
        self.scoring.append((ref, self.scored_upto, len(self.samples)))
        self.scored_upto = len(self.samples)


class _Driver:
    """State of one streamed step on W workers (see the module docstring).

    Book-keeping is per request key (prompt_id, sample_idx): `current[key]` is the stream (and
    worker) whose result for it counts; a finished sample or a stopped prefix that arrives from
    any other stream is stale and ignored. That is what lets a dead worker's requests be re-run
    without their earlier results (see `lost`).
    """

    def __init__(self, workers: list, requests: list[list[Request]], spec: SamplingSettings, scoring: Scoring,
                 rule: MigrationRule | None, forecast_peak: dict[str, float], every_s: float,
                 guard=None, history=None, feed=None) -> None:
        self.workers, self.spec, self.scoring, self.rule = workers, spec, scoring, rule
        self.feed = feed  # workers.train_feed.GroupFeed: complete groups go to the trainer (None: off)
        self.guard = guard  # workers.guard.WorkerGuard: brings a dead worker back (None: fail)
        self.history = history  # workers.history_bundles.WorkerHistory: a migrated prompt's history follows it
        self.forecast_peak, self.every_s = forecast_peak, every_s
        self.total = sum(len(r) for r in requests)
        self.out = StreamedRollout()
        self.planned = {r.key: (w, r) for w, reqs in enumerate(requests) for r in reqs}  # key -> (worker, request)
        self.current: dict[tuple[str, int], tuple[int, int, Request]] = {}  # unfinished key -> (stream, worker, request)
        self.index: dict[tuple[str, int], int] = {}  # finished key -> its position in out.samples
        # A worker may have more than one stream open (migrated requests arriving at different
        # times); its engine lock runs them one after another. Streams are keyed by an id.
        self.open: dict[int, tuple[int, object]] = {}  # stream id -> (worker, its ObjectRefGenerator)
        self.next_sid = 0
        self.running: dict[int, dict[tuple[str, int], int]] = {}  # stream id -> tokens so far per request
        self.stopping: dict[tuple[str, int], int] = {}  # key -> reserved destination worker
        self.moved: set[tuple[str, int]] = set()
        self.prompts = {r.prompt.prompt_id: r.prompt for reqs in requests for r in reqs}
        if feed is not None:
            feed.begin()
        for w, reqs in enumerate(requests):
            if reqs:
                self.start(w, reqs)

    @property
    def unfinished(self) -> list[int]:
        """Requests each worker holds that have not finished (running or queued)."""
        counts = [0] * len(self.workers)
        for _, w, _ in self.current.values():
            counts[w] += 1
        return counts

    def start(self, w: int, reqs: list[Request]) -> None:
        sid, self.next_sid = self.next_sid, self.next_sid + 1
        self.current.update({r.key: (sid, w, r) for r in reqs})
        self.open[sid] = (w, self.workers[w].stream.remote(reqs, self.spec, self.every_s, self.rule is not None))

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
            self.out.submit_scoring(self.scoring, force=not self.open)
            if self.rule is not None:
                self.migrate()
        if self.stopping or self.current:
            raise RuntimeError(f"rollout ended with {len(self.current)} request(s) unfinished and "
                               f"{len(self.stopping)} stopped, never resumed: {sorted(self.current)[:3]}")
        return self.out

    def counts(self, sid: int, key: tuple[str, int]) -> bool:
        """Whether stream `sid` holds the attempt at `key` that counts (else its news is stale)."""
        return self.current.get(key, (None,))[0] == sid

    def take(self, sid: int, w: int, event) -> None:
        for s in event.finished:
            key = (s.prompt_id, s.sample_idx)
            if self.counts(sid, key):
                del self.current[key]
                self.stopping.pop(key, None)  # finished before the stop landed
                self.index[key] = len(self.out.samples)
                self.out.samples.append(s)
                if self.feed is not None:
                    self.feed.finished(s)
        self.resume([p for p in event.partials if self.counts(sid, (p.prompt_id, p.sample_idx))])
        self.running[sid] = {k: n for k, n in event.running.items() if self.counts(sid, k)}

    def lost(self, w: int, exc: BaseException) -> None:
        """Worker `w` died mid-stream. Once the guard has restarted it on the current weights and
        history, every request *planned* on it runs there again from scratch, and its earlier
        results are discarded: the finished ones, the unfinished ones, and the ones that had
        migrated away (their attempt elsewhere is stopped and ignored). Which samples finished
        before a crash depends on their length, so keeping them would bias the step towards
        short responses. Requests that had migrated *to* `w` restart there from the prefix they
        carried (a prefix sampled by the policy plus a fresh continuation is a policy sample).
        """
        if self.guard is None:
            raise exc
        for sid in [sid for sid, (v, _) in self.open.items() if v == w]:
            del self.open[sid]
            self.running.pop(sid, None)
        self.guard.recover(w, exc)
        planned = [req for key, (v, req) in self.planned.items() if v == w]
        self.discard([r.key for r in planned if r.key in self.index])
        stale: dict[int, list[tuple[str, int]]] = {}  # worker -> its stale attempts to stop
        for r in planned:
            if r.key in self.current and self.current[r.key][1] != w:
                stale.setdefault(self.current[r.key][1], []).append(r.key)
        for v, keys in stale.items():
            self.workers[v].stop.remote(keys)
        moved_in = [req for key, (_, v, req) in self.current.items() if v == w and self.planned[key][0] != w]
        for r in planned + moved_in:
            self.stopping.pop(r.key, None)  # a stop aimed at the dead or the stale attempt
        self.start(w, planned + moved_in)

    def discard(self, keys: list[tuple[str, int]]) -> None:
        """Drop these finished samples; scoring starts over for the rest (a rare, cheap event)."""
        if not keys:
            return
        if self.feed is not None:
            self.feed.discard(keys)
        drop = {self.index.pop(k) for k in keys}
        self.out.samples = [s for i, s in enumerate(self.out.samples) if i not in drop]
        self.index = {(s.prompt_id, s.sample_idx): i for i, s in enumerate(self.out.samples)}
        self.out.scoring, self.out.scored_upto = [], 0
        self.out.discarded += len(drop)

    def resume(self, partials: Sequence[Partial]) -> None:
        """Continue stopped requests on the workers reserved for them (one stream per worker)."""
        by_dest: dict[int, list[Request]] = {}
        for p in partials:
            key = (p.prompt_id, p.sample_idx)
            dest = self.stopping.pop(key, self.current[key][1])
            by_dest.setdefault(dest, []).append(Request(self.prompts[p.prompt_id], p.sample_idx, prefix=p))
        for dest, reqs in by_dest.items():
            self.out.migrations += len(reqs)
            if self.history is not None:  # its drafter must know the prompt before the request arrives
                self.history.carry(dest, [r.prompt for r in reqs])
            self.start(dest, reqs)

    def migrate(self) -> None:
        reserved = set(self.stopping.values())
        streaming = {w for w, _ in self.open.values()}
        unfinished = self.unfinished
        views = []
        for w in range(len(self.workers)):
            running = {k: n for sid, (v, _) in self.open.items() if v == w for k, n in self.running.get(sid, {}).items()}
            views.append(WorkerView(running=running, queued=max(0, unfinished[w] - len(running)),
                                    busy=w in streaming or w in reserved))
        finished = len(self.out.samples)
        for move in select_migrations(self.rule, self.total, finished, views, self.forecast_peak,
                                      self.spec.max_tokens, self.moved | set(self.stopping)):
            self.moved.add(move.key)
            self.stopping[move.key] = move.dest
            self.workers[move.src].stop.remote([move.key])


def stream_rollout(workers: list, requests: list[list[Request]], spec: SamplingSettings, scoring: Scoring,
                   rule: MigrationRule | None = None, forecast_peak: dict[str, float] | None = None,
                   every_s: float = 0.25, guard=None, history=None, feed=None) -> StreamedRollout:
    """Run `requests[w]` on `workers[w]`, scoring finished samples while the rest generate.

    `scoring` scores the finished samples (in Ray tasks, while the rest generate). With `rule`, stragglers (judged against
    `forecast_peak[prompt_id]`) move to idle workers. With `guard` (`workers.guard.WorkerGuard`),
    a worker that dies is restarted on the current weights and re-runs every request planned on
    it, discarding its earlier results (see `_Driver.lost`: keeping them would bias the step
    towards short responses). With `history` (`workers.history_bundles.WorkerHistory`, the step's
    published HistoSpec bundles), a request that migrates takes its prompt's history to its new
    worker before it is resubmitted there. With `feed` (`workers.train_feed.GroupFeed`), each
    prompt's group goes to the trainer as soon as its n samples have finished (streamed training).
    Returns every sample once; its scoring may still be running (see `collect_scores`).
    """
    if len(requests) != len(workers):
        raise ValueError(f"stream_rollout: {len(requests)} request lists for {len(workers)} workers; "
                         "pass one list per worker (empty for an idle one)")
    return _Driver(workers, requests, spec, scoring, rule, forecast_peak or {}, every_s, guard, history, feed).run()


def collect_scores(rollout: StreamedRollout, scoring: Scoring) -> tuple[list[RewardScore], float]:
    """Scores in sample order and the summed scoring seconds; waits for scoring still running.

    A chunk whose Ray task failed is scored again here (on this process), so a lost worker costs
    time, never scores. A reward function that failed raises RewardFunctionError (not scored again).
    """
    rollout.submit_scoring(scoring, force=True)
    scores: list[RewardScore] = [None] * len(rollout.samples)  # type: ignore[list-item]
    total_s = 0.0
    for ref, first, end in rollout.scoring:
        try:
            chunk, seconds = ray.get(ref)
        except (ray.exceptions.RayError, OSError) as exc:
            error = reward_error(exc)
            if error is not None:
                raise error from exc
            chunk, seconds = score_timed(scoring, rollout.samples[first:end])
        scores[first:end] = chunk
        total_s += seconds
    return scores, total_s
