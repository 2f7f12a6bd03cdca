"""The streamed rollout driver (`workers/stream.py`) on Ray with small real fake workers: every
sample comes back once, scores line up, and forced migrations join prefix and continuation.

A fake worker "generates" one token per request every tick; token i of every response is i and
its log-prob -i/100, so a correctly joined migrated response is exactly 0..L-1 with matching
log-probs, and a lost, repeated or misplaced token shows."""

import time

import pytest

from rhymerl.vllm.engine import SamplingSettings, StreamEvent
from rhymerl.histopipe.migration import MigrationRule, join_prefix
from rhymerl.data.records import Partial, Prompt, Request, Sample
from helpers.feed import FakeTrainer

ray = pytest.importorskip("ray")

TICK_S = 0.01


def true_length(prompt_id: str, sample_idx: int) -> int:
    return 100 if prompt_id == "long" else 4 + sample_idx  # "long" samples are the stragglers


@ray.remote(max_concurrency=3)
class FakeWorker:
    """Runs `RolloutWorker.stream`'s protocol over a token clock instead of an engine."""

    def __init__(self, worker_id: int, die_flag: str = "") -> None:
        import os
        import threading

        self.worker_id, self.stops, self.lock = worker_id, set(), threading.Lock()
        self.engine = threading.Lock()  # one stream at a time, as RolloutWorker's engine lock
        self.die_flag, self.pid, self.stopped_at = die_flag, os.getpid(), None
        self.bundle: list[tuple] = []  # the prompts (token ids) of the last HistoSpec bundle it was given
        self.streams: list[tuple[list, list]] = []  # per stream: (bundle prompts, its requests' prompts)

    def info(self):
        return {"pid": self.pid}

    def set_history(self, blob):
        from rhymerl.histospec.bundle import HistoryBundle

        fb = HistoryBundle.from_bytes(bytes(memoryview(blob)))
        self.bundle = [tuple(fb.prompt(k).tolist()) for k in range(len(fb))]
        return len(blob)

    def log(self):
        return self.streams

    def stop(self, keys):
        with self.lock:
            self.stops.update(keys)

    def stream(self, requests, spec, every_s, track):
        with self.engine:
            self.streams.append((list(self.bundle), [r.prompt.token_ids for r in requests]))
            t0, live, last = time.time(), {r.key: r for r in requests}, time.monotonic()
            done_tokens = {r.key: len(r.prefix.token_ids) if r.prefix else 0 for r in requests}
            while live:
                time.sleep(TICK_S)
                self._maybe_die()
                finished, partials = [], []
                for key, req in list(live.items()):
                    done_tokens[key] += 1
                    if done_tokens[key] >= true_length(*key):
                        finished.append(self._sample(req, done_tokens[key], t0))
                        del live[key]
                with self.lock:
                    stops, self.stops = self.stops, set()
                for key in stops & set(live) if track else ():
                    req = live.pop(key)
                    n = done_tokens[key]
                    first = req.prefix.text if req.prefix else ""
                    partials.append(Partial(key[0], key[1], tuple(range(n)), tuple(-i / 100 for i in range(n)),
                                            first + f"[{self.pid}]" + "x" * (n - len(first)), self.worker_id,
                                            t0, time.time()))
                    self.stopped_at = self.stopped_at or time.monotonic()
                running = {k: done_tokens[k] for k in live} if track else {}
                if finished or partials or (track and time.monotonic() - last >= every_s):
                    yield StreamEvent(tuple(finished), tuple(partials), running)
                    last = time.monotonic()

    def _sample(self, req: Request, n: int, t0: float) -> Sample:
        start = len(req.prefix.token_ids) if req.prefix else 0
        s = Sample(req.prompt.prompt_id, req.sample_idx, tuple(range(start, n)),
                   tuple(-i / 100 for i in range(start, n)), f"[{self.pid}]" + "x" * (n - start), "stop",
                   self.worker_id, t0, time.time())
        return join_prefix(req.prefix, s) if req.prefix else s


    def _maybe_die(self) -> None:
        """With a die flag: the process exits 5 ticks after its first migration stop, once."""
        import os

        if self.die_flag and self.stopped_at and time.monotonic() - self.stopped_at > 5 * TICK_S \
                and os.path.exists(self.die_flag):
            os.unlink(self.die_flag)
            os._exit(1)


@pytest.fixture(scope="module")
def ray_local(local_ray):
    import sys

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import tests/


def prompt(pid: str) -> Prompt:
    return Prompt(pid, 0, pid, (1, 2), answer="7", row={"question": pid, "answer": "7"})


class RestartGuard:
    """The part of `workers.guard.WorkerGuard` the driver calls: wait for Ray's restart."""

    def __init__(self, workers) -> None:
        self.workers, self.pids = workers, [ray.get(w.info.remote())["pid"] for w in workers]
        self.restarts: list[tuple[int, int, int]] = []  # (worker, old pid, new pid)

    def recover(self, w, exc):
        for _ in range(600):
            try:
                pid = ray.get(self.workers[w].info.remote(), timeout=5)["pid"]
                break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                time.sleep(0.1)
        self.restarts.append((w, self.pids[w], pid))
        self.pids[w] = pid


def run(requests, rule, workers=None, guard=None, feed=None):
    from rhymerl.data.rewards import load_reward_set
    from workers.stream import Scoring, collect_scores, stream_rollout

    workers = workers or [FakeWorker.remote(w) for w in range(len(requests))]
    scoring = Scoring.of(load_reward_set(["gsm8k"]), [r.prompt for reqs in requests for r in reqs])
    out = stream_rollout(workers, requests, SamplingSettings(n=4, max_tokens=100), scoring, rule,
                         {pid: 1.0 for pid in scoring.prompts}, every_s=0.02, guard=guard, feed=feed)
    scores, total_s = collect_scores(out, scoring)
    return out, scores, total_s


def test_forced_migration_returns_every_sample_once_joined(ray_local):
    # Worker 0: the four 100-token "long" samples and two short groups; worker 1: one short group,
    # idle after ~7 ticks. Threshold 0 and the whole step as tail: worker 1 takes up to 2 stragglers
    # at a time (both in one stop: they come back in one event and must become one stream, not two).
    w0 = [Request(prompt("long"), k) for k in range(4)] + [Request(prompt(p), k) for p in ("a", "b") for k in range(4)]
    w1 = [Request(prompt("c"), k) for k in range(4)]
    out, scores, total_s = run([w0, w1], MigrationRule(tail_fraction=1.0, threshold=0.0, per_worker=2))
    keys = sorted((s.prompt_id, s.sample_idx) for s in out.samples)
    assert keys == sorted((p, k) for p in ("long", "a", "b", "c") for k in range(4))
    for s in out.samples:  # every response is exactly tokens 0..L-1, one log-prob each
        assert s.token_ids == tuple(range(true_length(s.prompt_id, s.sample_idx)))
        assert s.logprobs == tuple(-i / 100 for i in range(len(s.token_ids)))
    moved = [s for s in out.samples if s.migrated_from_worker is not None]
    assert out.migrations == len(moved) >= 2
    assert all(s.migrated_from_worker != s.worker_id for s in moved)
    assert any(s.prompt_id == "long" for s in moved)  # the most overdue (most tokens) move first
    assert len(scores) == len(out.samples) and total_s >= 0
    assert all(s.correct is False and s.values == {"gsm8k": 0.0} for s in scores)  # "xxx" has no "#### 7": wrong


def test_a_migrated_request_takes_its_prompts_history_along(ray_local):
    # Rule: each worker starts with only its own prompts' bundle; before a migrated request starts
    # on its new worker, that worker's bundle gains the prompt, history and all.
    from rhymerl.histospec.bundle import HistoryColumns, HistorySlicer
    from rhymerl.data.rewards import load_reward_set
    from workers.history_bundles import WorkerHistory, cut_for_workers
    from workers.stream import Scoring, stream_rollout

    long_, c = (Prompt(pid, 0, pid, ids, answer="7", row={"answer": "7"}) for pid, ids in (("long", (7, 7)), ("c", (8,))))
    requests = [[Request(long_, k) for k in range(2)], [Request(c, k) for k in range(2)]]
    slicer = HistorySlicer(HistoryColumns.from_lists({"prompt_id": ["long", "c"], "response_token_ids": [[1] * 50, [2]],
                                                      "reward": [1.0, 0.0]}))
    workers = [FakeWorker.remote(w) for w in range(2)]
    history = WorkerHistory(workers, slicer, cut_for_workers(slicer, [[long_], [c]]))
    history.publish()
    out = stream_rollout(workers, requests, SamplingSettings(n=2, max_tokens=100),
                         Scoring.of(load_reward_set(["gsm8k"]), [long_, c]),
                         MigrationRule(tail_fraction=1.0, threshold=0.0, per_worker=1), {"long": 1.0, "c": 1.0},
                         every_s=0.02, history=history)
    assert out.migrations >= 1
    logs = ray.get([w.log.remote() for w in workers])
    assert logs[0][0] == ([(7, 7)], [(7, 7), (7, 7)]) and logs[1][0] == ([(8,)], [(8,), (8,)])
    for bundle, prompts in logs[0] + logs[1]:  # every stream's prompts were in its worker's bundle
        assert set(prompts) <= set(bundle)
    assert any((7, 7) in prompts for _, prompts in logs[1][1:])  # "long" did move to worker 1
    assert [p.prompt_id for p in history.held[1]] == ["c", "long"]
    assert history.sent[1] > history.bundles.blobs[1].nbytes  # the re-cut bundle was sent too


def test_without_a_rule_nothing_moves(ray_local):
    w0 = [Request(prompt("long"), k) for k in range(2)]
    w1 = [Request(prompt("c"), k) for k in range(2)]
    out, scores, _ = run([w0, w1], None)
    assert out.migrations == 0 and len(out.samples) == len(scores) == 4
    assert all(s.migrated_from_worker is None for s in out.samples)


def feed_for(trainer, requests):
    from rhymerl.data.rewards import load_reward_set
    from workers.stream import Scoring
    from workers.train_feed import GroupFeed

    prompts = list({r.prompt.prompt_id: r.prompt for reqs in requests for r in reqs}.values())
    return GroupFeed(trainer, prompts, n=4, scale=True, eps=1e-6, scoring=Scoring.of(load_reward_set(["gsm8k"]), prompts))


def test_each_complete_group_goes_to_the_trainer_once_with_the_steps_scores(ray_local):
    # Rule (streamed training): a group is handed over once its n samples have finished, before
    # the step's tail ("long", 100 tokens) does, with the rewards the step then trains on.
    w0 = [Request(prompt("long"), k) for k in range(4)] + [Request(prompt("a"), k) for k in range(4)]
    w1 = [Request(prompt("c"), k) for k in range(4)]
    trainer = FakeTrainer()
    feed = feed_for(trainer, [w0, w1])
    out, scores, _ = run([w0, w1], MigrationRule(tail_fraction=1.0, threshold=0.0, per_worker=2), feed=feed)
    groups = trainer.added()
    assert sorted(len(g) for g in groups) == [4, 4, 4]
    assert len(groups[-1][0].response_ids) == 100  # the straggling group came last
    by_key = {(s.prompt_id, s.sample_idx): (s.token_ids, r.total) for s, r in zip(out.samples, scores)}
    assert feed.handed() == by_key  # every sample once, with the step's score
    assert feed.finish(out.samples, scores) == {"loss": 0.5}
    assert trainer.names() == ["begin", "add", "add", "add", "finish"]


def test_a_dead_worker_reruns_every_planned_request_migrated_ones_too(ray_local, tmp_path):
    # Worker 0 holds the four "long" stragglers and two short groups; worker 1 one short group.
    # After the first migration (two longs move to worker 1), worker 0's process dies. Rule
    # (unbiased recovery): everything planned on worker 0 runs again on its new process from
    # scratch: the short samples that had finished are discarded, and the longs that had moved
    # away are stopped on worker 1 and ignored there. Worker 1's own group is kept.
    flag = tmp_path / "die-once"
    flag.write_text("")
    workers = [FakeWorker.options(max_restarts=1).remote(0, str(flag)), FakeWorker.remote(1)]
    guard = RestartGuard(workers)
    w0 = [Request(prompt("long"), k) for k in range(4)] + [Request(prompt(p), k) for p in ("a", "b") for k in range(4)]
    w1 = [Request(prompt("c"), k) for k in range(4)]
    trainer = FakeTrainer()
    feed = feed_for(trainer, [w0, w1])
    out, scores, _ = run([w0, w1], MigrationRule(tail_fraction=1.0, threshold=0.0, per_worker=2), workers, guard,
                         feed)
    [(worker, old_pid, new_pid)] = guard.restarts
    assert worker == 0 and old_pid != new_pid
    keys = sorted((s.prompt_id, s.sample_idx) for s in out.samples)
    assert keys == sorted((p, k) for p in ("long", "a", "b", "c") for k in range(4))
    for s in out.samples:  # every response is whole: tokens 0..L-1, even after stops and the rerun
        assert s.token_ids == tuple(range(true_length(s.prompt_id, s.sample_idx)))
        if s.prompt_id != "c":  # planned on worker 0: started by its new process, no trace of the old
            assert s.text.startswith(f"[{new_pid}]") and f"[{old_pid}]" not in s.text
    assert out.discarded >= 8  # groups a and b had finished before the crash
    assert len(scores) == len(out.samples)
    # Streamed training: groups a and b had gone to the trainer; the step trains the batch instead.
    assert "discarded" in feed.broken and feed.finish(out.samples, scores) is None
    assert trainer.names()[-1] == "abort" and "finish" not in trainer.names()
