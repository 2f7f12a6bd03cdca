"""The goodput controller on drafters that are not RhymeRL's own (vLLM's `suffix` and `ngram`).

HistoSpec's drafter runs the controller inside its step (`rhymerl.histospec.engine.step_drafter`);
vLLM's stock drafters give only tokens, so `install_gate` wraps the worker's model runner's
`propose_draft_token_ids`: whatever the drafter proposed passes through a `GoodputGate`, which
sees the batch's request ids, what each sampled in the step that ran and where each is in its
response, and keeps the draft tokens that raise expected tokens per second. The arms of a
comparison are so judged under the same rule. Trimming only shortens drafts: the sampled
distribution is untouched.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from rhymerl.config.spec import COST_MEMORY_STEPS
from rhymerl.histospec.goodput import (STARVED_STEPS, CostByRows, PositionTable, RequestRecord, adjust, bucket_of,
                                      keep_lengths, within)
from rhymerl.histospec.stats import POSITION_BUCKETS, SpecStats, Tally
from rhymerl.vllm.switch import SpecSwitch

GATE_ATTR = "_rhymerl_goodput_gate"
RECHECK_STEPS = STARVED_STEPS + 4  # the starved position's old record has faded 16-fold by then
RECHECK_SHARE = 8  # one row in this many verifies its whole draft on a re-check step


class GoodputGate:
    """The controller for drafters that give tokens alone (vLLM's `suffix` and `ngram`), by request id.

    Call `gate` once per engine step, right after the drafter proposed: it closes the step that ran
    (each request's accepted count: `sampled - 1`, capped at what it was given), times it (the gap
    since the last call) against the tokens it processed, and returns the drafts trimmed by
    `keep_lengths`. Before `MIN_OBSERVATIONS` timed steps the drafts pass whole. `stats` counts the
    verification steps (drafted, accepted, histograms, positions), the tokens proposed and the forecast
    against the measured step seconds. Per-request state lives in slot arrays: ~0.3 ms a step at 256 rows.
    """
    def __init__(self, width: int, cost_memory: int = COST_MEMORY_STEPS, by_rows: bool = True,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.cost = CostByRows(1.0 - 1.0 / cost_memory, by_rows)
        self.model = self.cost.pooled  # the fit that prices this step (`begin`)
        self.table = PositionTable(width)
        self.record = RequestRecord()
        self.clock = clock
        self.slots: dict[str, int] = {}  # request id -> its slot
        self.ids: list[str | None] = []  # slot -> request id (None: free)
        self._free: list[int] = []
        self.given = np.zeros((3, 64), np.int64)  # [tokens given last step, their bucket, step last seen] per slot
        self.step = 0
        self.stats = SpecStats()
        self._stamp: float | None = None
        self._predicted: float | None = None
        self._now: tuple = ()  # this step's rows, slots, buckets, table, chances and cost (`begin`)
        self._gave = False  # whether the last step was given a draft (`plain` then closes it)

    def gate(self, req_ids: Sequence[str], sampled: Sequence[int], response_tokens: Sequence[int],
             drafts: Sequence[Sequence[int]]) -> list[Sequence[int]]:
        """Row i: request `req_ids[i]` sampled `sampled[i]` tokens this step (0: not decoding) and has
        written `response_tokens[i]`; its proposed draft `drafts[i]`. Returns the drafts to verify."""
        self.begin(req_ids, sampled, response_tokens)
        return self.finish(drafts)

    def begin(self, req_ids: Sequence[str], sampled: Sequence[int], response_tokens: Sequence[int]) -> None:
        """`gate`'s first half, before the drafter runs: close and time the step that ran, price this one."""
        now = self.clock()
        self.step += 1
        sizes = np.asarray(sampled, np.int64)
        live = np.flatnonzero(sizes > 0)
        slots = np.fromiter((self._slot(req_ids[i]) for i in live.tolist()), np.int64, len(live))
        self._close(slots, sizes[live], now)
        buckets = bucket_of(np.asarray(response_tokens, np.int64)[live])
        table = self.table.rows(buckets)
        self.model = self.cost.for_rows(len(live))
        self._now = (live, slots, buckets, table, adjust(table, self.record.factor(slots)),
                     self.model.seconds(len(live)))

    def plain(self, req_ids: Sequence[str], sampled: Sequence[int], response_tokens: Sequence[int]) -> list[list[int]]:
        """A step the switch (`SpecSwitch`) runs plainly: no drafts. After a step that verified drafts it
        is closed and counted as ever (`begin`); after a plain one its rows' steps are only counted."""
        if self._gave:
            self.begin(req_ids, sampled, response_tokens)
            return self.finish([[] for _ in sampled])
        self.step += 1
        self._stamp, self._predicted = None, None  # the next drafting step follows no timed one
        self.stats.steps += len(sampled) - list(sampled).count(0)
        self.stats.tokens += int(sum(sampled))
        return [[] for _ in sampled]

    def rows_worth_drafting(self) -> np.ndarray | None:
        """After `begin`: the batch rows where a draft token could pay this step (a full draft at
        this step's chances keeps one), None for every row (no fit yet, a re-check step). A drafter
        may skip the other rows; its own time there is then saved too."""
        live, _, _, _, q, seconds = self._now
        if seconds is None or not len(live):
            return None
        if self.model.wants_probe():
            return live[:0]
        if self._rechecking():
            return None
        full = np.full(len(live), q.shape[1])
        return live[keep_lengths(q, full, seconds, len(live), len(live)) > 0]

    def finish(self, drafts: Sequence[Sequence[int]]) -> list[Sequence[int]]:
        """`gate`'s second half: the proposed `drafts` (one per row) trimmed to what pays."""
        live, slots, buckets, table, q, seconds = self._now
        lengths = np.fromiter((len(drafts[i]) for i in live.tolist()), np.int64, len(live))
        self.stats.proposed += int(lengths.sum())
        out = list(drafts)
        if seconds is not None and len(live):
            kept = keep_lengths(q, np.zeros_like(lengths) if self.model.wants_probe() else lengths, seconds,
                                len(live), len(live))
            if self._rechecking():  # fresh evidence where the table has none: a few rows verify whole drafts
                kept = np.where(np.arange(len(live)) % RECHECK_SHARE == self.step % RECHECK_SHARE, lengths, kept)
            self.record.predicted(slots, within(table, kept).sum(1))
            self._predicted = float(seconds(len(live) + int(kept.sum())))
            for i, k in zip(live[kept < lengths].tolist(), kept[kept < lengths].tolist()):
                out[i] = list(drafts[i][:k])
            lengths = kept
        self.given[0, slots], self.given[1, slots], self.given[2, slots] = lengths, buckets, self.step
        self._gave = bool(lengths.any())
        self._stamp = self.clock()
        return out

    def _tally(self, fresh: np.ndarray, buckets: np.ndarray, drafted: np.ndarray, accepted: np.ndarray) -> None:
        """Count the continuing rows' verification steps in `stats` as HistoSpec's drafter counts its own
        (so these drafters need none of vLLM's per-step statistics)."""
        d, a, b = drafted[fresh], accepted[fresh], buckets[fresh]
        if not len(d):
            return
        size = int(d.max()) + 1 if d.any() else 0
        hist = np.bincount(d[d > 0], minlength=size).tolist() if size else []
        acc = np.bincount(a[d > 0], minlength=size).tolist() if size else []
        self.stats.add(Tally(len(d), int(a.sum()) + len(d), int((d > 0).sum()), int(d.sum()), int(a.sum()), hist, acc,
                             np.bincount(b, minlength=POSITION_BUCKETS).tolist(),
                             np.bincount(b, weights=a + 1.0, minlength=POSITION_BUCKETS).astype(int).tolist()))

    def _rechecking(self) -> bool:
        """Whether the first draft position of a response-position bucket in this step has had no
        verified token for `RECHECK_STEPS` steps: a chance measured while the drafter was cold (an
        empty cache) would otherwise stand for good."""
        buckets = self._now[2]
        return bool(len(buckets)) and bool(self.table.starved[np.unique(buckets), 0].max() >= RECHECK_STEPS)

    def _slot(self, req_id: str) -> int:
        slot = self.slots.get(req_id)
        if slot is None:
            if self._free:
                slot = self._free.pop()
            else:
                slot = len(self.ids)
                self.ids.append(None)
                if slot >= self.given.shape[1]:
                    self.given = np.concatenate([self.given, np.zeros_like(self.given)], axis=1)
            self.slots[req_id], self.ids[slot] = slot, req_id
            self.given[:, slot] = (0, 0, self.step)
            self.record.reset(slot)
        return slot

    def _close(self, slots: np.ndarray, sizes: np.ndarray, now: float) -> None:
        """Count the verified drafts of the step that ran, time it, and free the slots of requests
        unseen for two steps (finished)."""
        fresh = self.given[2, slots] == self.step - 1  # drafted for last step (a new slot was given 0)
        drafted = np.where(fresh, self.given[0, slots], 0)
        accepted = np.minimum(sizes - 1, drafted)
        self.table.count(self.given[1, slots], drafted, accepted)
        self.record.verified(slots, accepted)
        self._tally(fresh, self.given[1, slots], drafted, accepted)
        if self._stamp is not None and len(slots):
            processed, seconds, any_draft = len(slots) + int(drafted.sum()), now - self._stamp, bool(drafted.any())
            if self.cost.is_step(seconds):  # a pause between generate calls is no step
                self.cost.observe(len(slots), processed, seconds, any_draft)
                if self._predicted is not None:
                    self.stats.timed_step(self._predicted, seconds)
        self._predicted = None
        used = len(self.ids)
        stale = np.flatnonzero(self.given[2, :used] < self.step - 2)
        for slot in stale.tolist():
            if self.ids[slot] is not None:
                del self.slots[self.ids[slot]]
                self.ids[slot] = None
                self._free.append(slot)


def install_gate(runner: Any, cost_memory: int, by_rows: bool = True, switch: bool = True) -> bool:
    """Put a `GoodputGate` behind `runner.propose_draft_token_ids` (once), and with `switch` a
    `SpecSwitch` before it; False without speculation."""
    if getattr(runner, GATE_ATTR, None) is not None:
        return True
    spec = getattr(runner, "speculative_config", None)
    if spec is None:
        return False
    gate = GoodputGate(int(spec.num_speculative_tokens), cost_memory, by_rows)
    propose = runner.propose_draft_token_ids
    # Rows where no draft can pay are not drafted. vLLM's n-gram drafter reads the batch's tokens and
    # keeps no state: it skips a row given no sampled tokens (as a prefill chunk). Suffix decoding
    # records each row's tokens in `propose`, which must see every row; there the look-up
    # (`speculate`, most of its time) answers nothing for such rows.
    stateless = spec.method == "ngram"
    cache = getattr(getattr(runner, "drafter", None), "suffix_cache", None) if spec.method == "suffix" else None
    modes = SpecSwitch() if switch else None  # drafting or plain steps, per band of running requests

    def gated(scheduler_output: Any, sampled_token_ids: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(sampled_token_ids, list):
            return propose(scheduler_output, sampled_token_ids, *args, **kwargs)  # drafts kept on the device
        batch = runner.input_batch
        rows = len(sampled_token_ids)
        sizes = [len(t) for t in sampled_token_ids]
        written = (batch.num_tokens_no_spec[:rows] - batch.num_prompt_tokens[:rows]).tolist()
        if modes is not None and not modes.start(rows - sizes.count(0), sum(sizes)):
            if cache is not None:
                with _speculating_only_for(cache, set()):  # suffix's cache still records the step's tokens
                    propose(scheduler_output, sampled_token_ids, *args, **kwargs)
            return gate.plain(batch.req_ids[:rows], sizes, written)
        gate.begin(batch.req_ids[:rows], sizes, written)
        paying = gate.rows_worth_drafting() if stateless or cache is not None else None
        if paying is None:
            return gate.finish(propose(scheduler_output, sampled_token_ids, *args, **kwargs))
        if stateless:
            if not len(paying):
                return gate.finish([[] for _ in range(rows)])
            wanted = np.zeros(rows, bool)
            wanted[paying] = True
            masked = [t if w else [] for t, w in zip(sampled_token_ids, wanted.tolist())]
            return gate.finish(propose(scheduler_output, masked, *args, **kwargs))
        with _speculating_only_for(cache, {batch.req_ids[i] for i in paying.tolist()}):
            return gate.finish(propose(scheduler_output, sampled_token_ids, *args, **kwargs))

    runner.propose_draft_token_ids = gated
    setattr(runner, GATE_ATTR, gate)
    return True


@contextmanager
def _speculating_only_for(cache: Any, req_ids: set) -> Iterator[None]:
    """Within the block the suffix cache's `speculate` drafts nothing (an empty draft, as for an
    unmatched pattern) for requests not in `req_ids`; what `propose` records of the step's tokens
    is recorded as ever."""
    from arctic_inference.suffix_decoding import SuffixDecodingDraft

    speculate = cache.speculate

    def only_for(req_id: Any, *args: Any, **kwargs: Any) -> Any:
        return speculate(req_id, *args, **kwargs) if req_id in req_ids else SuffixDecodingDraft()

    cache.speculate = only_for
    try:
        yield
    finally:
        del cache.speculate  # the class's own again


def take_gate_stats(runner: Any) -> dict | None:
    """The gate's `SpecStats` since the last call, as a dict of plain values; None without a gate."""
    gate = getattr(runner, GATE_ATTR, None)
    if gate is None:
        return None
    stats, gate.stats = gate.stats, SpecStats()
    return dataclasses.asdict(stats)
