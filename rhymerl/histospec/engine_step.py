"""HistoSpec's work in one engine step, on plain arrays (`BatchDrafter`): what the vLLM plug-in
(`rhymerl.vllm.histospec_proposer`) runs after every step, testable without an engine.

`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)` gets one row per running request:
the tokens sampled for it this step, its length, and its prompt + output tokens. It returns each
row's draft. In order:

1. Find each row's request (`rhymerl.histospec.requests.RequestTable`: by its length and last
   tokens before this step's, through a hash index). A request seen for the first time finds its
   prompt in the bundle (`PromptTable`), opens its sibling sequence in the prompt's index and its
   response in the cross-prompt tree.
2. Count what the step that ran accepted (a request's `sampled` is its accepted draft plus one
   token): `SpecStats` (added to when read), the acceptance calibration, the fail back-off, the
   step cost model; adapt budgets. Steps 1-2, the plan of step 4 and the drafts' record are
   compiled passes over all rows (`rhymerl.histospec.step_pass`).
3. Grow the siblings (one compiled call for all prompts) and the cross-prompt tree (every
   `TREE_CHUNK` tokens of a request; the first `spec.recent_per_group` requests of each prompt join
   it; with `spec.grow_behind`, on a helper thread while the engine runs its next forward pass:
   `rhymerl.histospec.growth`; the siblings' new n-grams are then filed there too, the step's
   drafting reading them unfiled). A request that arrives with a long prefix (moved from another worker,
   or preempted) joins them at most `SIDE_CATCH_UP` / `TREE_CATCH_UP` tokens a step beyond the step's
   new ones, so no step stalls on it; its siblings draft from what is indexed meanwhile.
4. Draft: the prompts' own drafts for all rows in one compiled call (`BatchIndexDrafter`), and the
   cross-prompt tree for the rows whose own draft scores below `spec.recent_gate` x budget (with the
   helper, asked there as the compiled call finishes each row: `rhymerl.histospec.tree_asks`).
5. Trim the drafts to what pays under the measured step cost (`spec.cost_aware`), keeping whole the
   drafts of the requests forecast to finish last (`spec.tail_fraction`).

When a prompt's index is built: its first request opens it with siblings only; the history part
(`FlatIndex`) is built by a background thread and attached when ready, so a step never waits for a
build (`rhymerl.histospec.builds`). Engine thread only.
"""

from __future__ import annotations

import time
from dataclasses import InitVar, dataclass
from typing import Sequence

import numpy as np

from rhymerl.histospec import step_pass
from rhymerl.histospec.batch import BatchIndexDrafter
from rhymerl.histospec.budget import FixedBudget
from rhymerl.histospec.builds import HistoryBuilds
from rhymerl.histospec.drafter import HistoSpecDrafter
from rhymerl.histospec.flat import FlatBundle, PromptIndex
from rhymerl.histospec.growth import StepGrowth
from rhymerl.histospec.index import HistoryBundle
from rhymerl.histospec.ledger import StepLedger
from rhymerl.histospec.requests import RequestTable, group
from rhymerl.histospec.rows import PromptTable
from rhymerl.histospec.side import SideIndex
from rhymerl.histospec.slots import SideSlots
from rhymerl.histospec.spec_config import SpecConfig
from rhymerl.histospec.stats import SpecStats
from rhymerl.histospec.step_budget import (AcceptanceCalibration, StepCostModel, position_acceptance, tail_rows,
                                           trim_drafts)
from rhymerl.histospec.tree import TREE_CHUNK, RecentTree
from rhymerl.histospec.tree_asks import TreeAsks, rows_done

STATE_GRACE_STEPS = 4  # keep a request's state this many steps while it is not scheduled
ENTRY_IDLE_STEPS = 512  # drop a prompt's built index after this many steps without a request


@dataclass
class _Prompt:
    """A bundle prompt's index, built on first use."""

    index: PromptIndex
    drafter: HistoSpecDrafter
    plen: int
    forecast: int = 0  # its longest earlier response (tokens); 0: no history, no forecast
    in_tree: int = 0  # its requests that joined the cross-prompt tree (spec.recent_per_group)


@dataclass
class BatchDrafter:
    """The engine-agnostic batch logic behind the proposer (testable with plain arrays)."""

    bundle: HistoryBundle | FlatBundle
    spec: SpecConfig
    k: int  # vLLM's num_speculative_tokens: no draft may be longer
    max_model_len: int
    initial_stats: InitVar[SpecStats | None] = None  # `stats` to count into (None: new ones)
    recent: RecentTree | None = None  # the cross-prompt tree; None: a new one if spec.recent_responses
    background: bool = True  # build large histories in a background thread (False: in the step)
    batched: bool = True  # prompts' own drafts in one compiled call (False: the Python drafter per row)

    def __post_init__(self, initial_stats: SpecStats | None) -> None:
        if not isinstance(self.bundle, FlatBundle):
            self.bundle = FlatBundle.of(self.bundle)
        self.builds = HistoryBuilds(self.spec, self.background)
        self.rule = self.spec.budget()
        if self.recent is None and self.spec.method == "histospec":
            self.recent = self.spec.new_recent()
        self.table: PromptTable | None = None
        self.prompts: dict[int, _Prompt] = {}
        self.last_seen = np.zeros(len(self.bundle), np.int64)  # [k]: the last step with a request of prompt k
        self._mark = np.full(len(self.bundle), -1, np.int64)  # scratch of `group`
        self.requests = RequestTable(max(1, self.k))
        self.step = 0
        self.cost = StepCostModel(decay=1.0 - 1.0 / self.spec.cost_memory)
        self.calibration = AcceptanceCalibration()  # the drafts' estimates vs what the verifier accepted
        self._stats = initial_stats if initial_stats is not None else SpecStats()
        self._lifetime = SpecStats()  # never reset (take_stats resets `stats`): acceptance per position
        self.ledger = StepLedger(self.requests.width)  # the steps' counts until `stats` / `lifetime` are read
        self._stamp: float | None = None  # when the last propose returned (the engine step starts)
        self.sides = SideSlots()  # the prompts' siblings' arrays, grown (and read) in one call per step
        behind = self.spec.grows_behind()
        beside = behind and self.recent is not None and self.batched  # the tree asked beside the kernel: `_drafts`
        # compiles (or loads) the kernels now
        self.own = BatchIndexDrafter(self.spec, sides=self.sides, beside=beside) if self.batched else None
        self.growth = StepGrowth(self.recent, behind,
                                 lambda: self.sides.flush_all(self.spec.min_match, self.spec.max_match))
        group(np.zeros(1, np.int64), np.full(1, -1, np.int64))
        step_pass.warm()
        if beside:
            rows_done(np.zeros(2, np.int64))

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray) -> list[list[int]]:
        """Draft token ids per row; rows without sampled tokens (prefill chunks) get none."""
        out: list[list[int]] = [[] for _ in sampled_token_ids]
        if not self.spec.enabled:
            return out
        t0 = time.perf_counter()
        self.step += 1
        self.builds.new_step(self._stats)
        self.growth.new_step()  # the step before's growth, if it ran behind, is in the indexes now
        self._count_helper()
        if self.table is None or self.table.dtype != token_ids_cpu.dtype:
            self.table = PromptTable([self.bundle.prompt(k) for k in range(len(self.bundle))],
                                     token_ids_cpu.dtype)
        sizes = np.fromiter(map(len, sampled_token_ids), np.int64, len(sampled_token_ids))
        req = self.requests
        rows = step_pass.begin(req, self.ledger, self.calibration, sizes, num_tokens_no_spec, token_ids_cpu,
                               self.step, self.spec.fail_backoff, TREE_CHUNK)
        processed = self._adapt_budgets(rows)  # tokens the step that just ran processed
        self._grow(rows, token_ids_cpu)
        live, slots, ends, new = rows.live, rows.slots, rows.ends, rows.new  # new: requests seen for the first time
        if len(new):
            slots[new] = self._start(token_ids_cpu, live[new], ends[new], sizes[live[new]])
            processed += int(rows.before[new].sum())  # their prefill (cached prompt blocks counted too)
        drafting, budgets = step_pass.plan(req, rows, self.last_seen, self.step, self.k, self.max_model_len)
        if len(drafting):
            ps = slots[drafting]
            toks, lens, probs = self._drafts(live[drafting], ps, ends[drafting], budgets, token_ids_cpu)
            step_pass.finish(req, ps, live[drafting], toks, lens, probs, out)
        if len(new) < len(slots) and self._stamp is not None:
            self._observe(processed, t0 - self._stamp)
        if self.spec.cost_aware:
            self._trim(out, live, slots)
        req.keep(rows.kept, slots, self.step, STATE_GRACE_STEPS)
        self._drop_idle()
        self.growth.start()  # behind: while the engine runs the next forward pass
        self._stamp = time.perf_counter()
        self._stats.drafter_seconds += self._stamp - t0
        return out

    @property
    def stats(self) -> SpecStats:
        """Acceptance counters (reset by assigning a new `SpecStats`), every step so far counted in
        when read (`StepLedger`): read it again for later steps' counts."""
        self.ledger.flush(self._stats, self._lifetime)
        return self._stats

    @stats.setter
    def stats(self, stats: SpecStats) -> None:
        self.ledger.flush(self._stats, self._lifetime)  # the steps so far count in the ones replaced
        self._stats = stats

    @property
    def lifetime(self) -> SpecStats:
        """Acceptance counters never reset (`stats` is), without position buckets: `_trim`'s fallback."""
        self.ledger.flush(self._stats, self._lifetime)
        return self._lifetime

    @lifetime.setter
    def lifetime(self, lifetime: SpecStats) -> None:
        self.ledger.flush(self._stats, self._lifetime)
        self._lifetime = lifetime

    def _adapt_budgets(self, rows: step_pass.StepRows) -> int:
        """Adapt the continuing requests' budgets to their verified drafts (`step_pass.begin` counted
        them); the tokens the step that ran processed for them."""
        if not isinstance(self.rule, FixedBudget):  # the fixed rule's update is the identity
            req, old = self.requests, rows.slots >= 0
            for slot, d, a in zip(rows.slots[old].tolist(), rows.drafted[old].tolist(), rows.accepted[old].tolist()):
                req.budget[slot] = self.rule.update(int(req.budget[slot]), d, a)
        return rows.processed

    def _grow(self, step_rows: step_pass.StepRows, tokens: np.ndarray) -> None:
        """Add continuing requests' new tokens to their prompts' siblings (one call for all) and,
        every TREE_CHUNK tokens, to the cross-prompt tree (`self.growth`: now or behind the step); a
        request behind (it arrived with a long prefix) catches up within the step's allowance."""
        req, growth, sib, due = self.requests, self.growth, step_rows.sib, step_rows.due
        slots, rows, starts, ends = step_rows.slots, step_rows.live, step_rows.before, step_rows.ends
        if len(sib):
            held = req.sib_n[slots[sib]]
            upto = held + growth.catch_up(ends[sib] - held, ends[sib] - starts[sib], "side")
            sides = self._extend_siblings(req.prompt[slots[sib]], req.sib[slots[sib]], tokens, rows[sib], held, upto)
            growth.ahead(sides, self.max_model_len + self.spec.max_match)  # behind the step: room for the next
            req.sib_n[slots[sib]] = upto
        if len(due):
            held = req.tree_n[slots[due]]
            # a request in step holds all but its last < TREE_CHUNK tokens before this step's
            upto = held + growth.catch_up(ends[due] - held, ends[due] - starts[due] + TREE_CHUNK - 1, "tree")
            growth.tree(req.tree[slots[due]], tokens, rows[due], held, upto)
            req.tree_n[slots[due]] = upto

    def _extend_siblings(self, keys: np.ndarray, seqs: np.ndarray, tokens: np.ndarray, rows: np.ndarray,
                         starts: np.ndarray, ends: np.ndarray) -> list[SideIndex]:
        """Append tokens[rows[j], starts[j]:ends[j]] to sibling seqs[j] of prompt keys[j] for every j,
        all prompts in one compiled call; the prompts' siblings (`SideIndex`es)."""
        distinct, which = group(keys, self._mark)
        indexes = [self.prompts[k].index for k in distinct.tolist()]
        # a prompt's sibling ids follow its history's: its SideIndex counts them from 0
        bases = np.fromiter((ix.base for ix in indexes), np.int64, len(indexes))
        sides = [ix.side for ix in indexes]
        # Behind the step, the helper files the new tokens' n-grams (~0.5 ms at 256 requests, 2026-12-06);
        # the drafting kernel reads them meanwhile where they lie, so the drafts are the same.
        self.sides.extend_rows(sides, which, seqs - bases[which], tokens, rows, starts, ends, self.growth.behind)
        if self.growth.behind:
            self.growth.file_behind()
        return sides

    @property
    def lagging(self) -> int:
        """Tokens of this step's requests not yet in the siblings or the tree (catching up)."""
        return self.growth.lagging

    def _drafts(self, rows: np.ndarray, slots: np.ndarray, ends: np.ndarray, budgets: np.ndarray,
                tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The planned rows' drafts as (tokens, lengths, estimated probabilities), R x (largest budget):
        `HistoSpecDrafter.propose` of each row's context, the prompts' own drafts computed for all
        rows in one call (`BatchIndexDrafter`), the cross-prompt tree's for the rows that ask it."""
        keys = self.requests.prompt[slots]
        if self.own is None:
            return self._drafts_by_row([self.prompts[k] for k in keys.tolist()], rows, ends, budgets, tokens)
        distinct, which = group(keys, self._mark)  # one look-up per prompt, not per row
        indexes, spec = [self.prompts[k].index for k in distinct.tolist()], self.spec
        if self.recent is None:
            toks, lens, _, _, probs = self.own.draft_groups(indexes, which, rows, ends, budgets, tokens)
            return toks, lens, probs
        # the rows that ask the tree ask it as the kernel drafts them, on the helper if there is one and no
        # history build wants the GIL meanwhile (HistoSpecDrafter.against_recent; ties go to the prompt's own)
        beside = self.growth.beside if self.growth.behind and not self.builds.building else None
        tree = TreeAsks(self.recent, beside, tokens, rows, ends, budgets, spec.recent_gate,
                        spec.recent_spec_factor, spec.min_token_prob)
        drafts = tree.drafts(lambda scores, progress, started: self.own.draft_groups(
            indexes, which, rows, ends, budgets, tokens, scores, progress, started))
        self.growth.seconds += tree.seconds  # the helper's CPU, with its growth behind the step
        return drafts

    def _drafts_by_row(self, prompts: list[_Prompt], rows: np.ndarray, ends: np.ndarray, budgets: np.ndarray,
                       tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`_drafts` with the Python drafter row by row (`batched=False`: the reference)."""
        tail, width = self.spec.context_tail, max(1, int(budgets.max()))
        toks, probs = np.zeros((len(rows), width), np.int64), np.zeros((len(rows), width))
        lens = np.zeros(len(rows), np.int64)
        for j, (p, i, n, b) in enumerate(zip(prompts, rows.tolist(), ends.tolist(), budgets.tolist())):
            d = p.drafter.propose(tokens[i, max(0, n - tail):n].tolist(), b)
            lens[j] = len(d.tokens)
            toks[j, :lens[j]], probs[j, :lens[j]] = d.tokens, d.probs[:lens[j]]
        return toks, lens, probs

    def _observe(self, processed: int, seconds: float) -> None:
        """Time the step that just ran, skipping outliers (a pause between generate calls)."""
        guess = self.cost.predict(processed)
        if guess is None or seconds < 10 * guess:
            self.cost.observe(processed, seconds)

    def _trim(self, out: list[list[int]], live: np.ndarray, slots: np.ndarray) -> None:
        """Shorten this step's drafts to what pays for itself (see rhymerl.histospec.step_budget)."""
        coef = self.cost.coefficients()
        drafts = [out[i] for i in live.tolist()]
        longest = max(map(len, drafts), default=0)
        if coef is None or longest == 0:
            return
        req = self.requests
        if self.calibration.tokens:
            lengths = np.fromiter(map(len, drafts), np.int64, len(drafts))
            probs = np.where(np.arange(longest)[None, :] < lengths[:, None], req.probs[slots, :longest], 0.0)
            q = self.calibration.rows(probs)
        else:  # no estimate recorded yet: acceptance by position alone
            q = np.tile(position_acceptance(self.lifetime.accepted_at, self.lifetime.drafted_at, longest),
                        (len(drafts), 1))
        forecast = req.forecast[slots]
        remaining = (forecast - (req.n[slots] - req.plen[slots])).tolist()
        tail = tail_rows([r if f else None for r, f in zip(remaining, forecast.tolist())], self.spec.tail_fraction)
        kept = trim_drafts(drafts, len(drafts), len(drafts), q, coef, tail)
        for i, slot, draft in zip(live.tolist(), slots.tolist(), kept):
            out[i] = draft
            req.drafted[slot] = len(draft)

    def _start(self, tokens: np.ndarray, rows: np.ndarray, ends: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """Slots for requests seen for the first time (row rows[j] of `tokens`, ends[j] tokens long,
        sizes[j] of them sampled this step): find their prompts, open their sibling sequences and
        their responses in the cross-prompt tree, with as much of each response as the step's
        allowances let in, first rows first (`StepGrowth.catch_up`; `_grow` adds the rest later).
        The siblings' tokens go in with one compiled call for all rows (a Python call per row took
        11-13 ms for 256 new requests, 2026-12-05)."""
        req = self.requests
        slots = np.fromiter((req.alloc() for _ in range(len(rows))), np.int64, len(rows))
        req.budget[slots] = self.rule.initial
        lookup = self.table.lookup
        keys = np.fromiter((-1 if k is None else k for k in (lookup(tokens[i], n) for i, n in
                            zip(rows.tolist(), ends.tolist()))), np.int64, len(rows))
        known = np.flatnonzero(keys >= 0)
        if len(known):
            self._join(slots[known], keys[known], tokens, rows[known], ends[known], sizes[known])
        return slots

    def _join(self, slots: np.ndarray, keys: np.ndarray, tokens: np.ndarray, rows: np.ndarray, ends: np.ndarray,
              sizes: np.ndarray) -> None:
        """`_start` for the new requests of known prompts (keys: their bundle indexes)."""
        req = self.requests
        prompts = []
        for k in keys.tolist():
            prompt = self.prompts.get(k)
            if prompt is None:
                prompt = self.prompts[k] = self._open(k)
            prompts.append(prompt)
        plen = np.fromiter((p.plen for p in prompts), np.int64, len(prompts))
        req.prompt[slots], req.plen[slots] = keys, plen
        req.forecast[slots] = np.fromiter((p.forecast for p in prompts), np.int64, len(prompts))
        due = np.maximum(ends - plen, 0)
        if self.spec.siblings:
            upto = plen + self.growth.catch_up(due, sizes, "side")
            seqs = np.fromiter((p.index.add() for p in prompts), np.int64, len(prompts))  # the prompt's tail alone
            self._extend_siblings(keys, seqs, tokens, rows, plen, upto)
            req.sib[slots], req.sib_n[slots] = seqs, upto
        if self.recent is not None:
            self._join_tree(prompts, slots, tokens, rows, plen, due, sizes)

    def _join_tree(self, prompts: list[_Prompt], slots: np.ndarray, tokens: np.ndarray, rows: np.ndarray,
                   plen: np.ndarray, due: np.ndarray, sizes: np.ndarray) -> None:
        """Open the responses of new requests in the cross-prompt tree: each prompt's first
        `spec.recent_per_group` requests (all with 0), within the step's allowance."""
        per_group, joins = self.spec.recent_per_group, []
        for j, prompt in enumerate(prompts):
            if not per_group or prompt.in_tree < per_group:
                prompt.in_tree += 1
                joins.append(j)
        if not joins:
            return
        j = np.asarray(joins, np.int64)
        upto = plen[j] + self.growth.catch_up(due[j], sizes[j], "tree")
        req = self.requests
        for slot, i, a, b in zip(slots[j].tolist(), rows[j].tolist(), plen[j].tolist(), upto.tolist()):
            req.tree[slot], req.tree_n[slot] = self.recent.start(tokens[i, a:b].tolist()), b

    def _open(self, k: int) -> _Prompt:
        """Prompt k's entry: its index with siblings only, the history attached now (small) or by
        the background thread (large)."""
        prefix = self.bundle.prompt(k)
        tokens, lengths, rewards = self.bundle.history(k)
        forecast = int(lengths.max()) if len(lengths) else 0
        # The index's sequences (`SpecConfig.indexed_history`: the prompt may lead the history) are
        # concatenated by the build, off the step for a large history (~0.75 ms at 256K tokens).
        _, seq_lengths, seq_rewards = self.spec.indexed_history(prefix, tokens[:0], lengths, rewards)
        index = PromptIndex(seq_rewards.tolist(), self.spec.min_match, self.spec.max_match, prefix.tolist())
        if len(seq_lengths):
            self.builds.submit(index, tokens, lengths, rewards, prefix)
        return _Prompt(index, self.spec.drafter(index, self.recent), len(prefix), forecast)

    @property
    def building(self) -> int:
        """Histories being indexed in the background now."""
        return self.builds.building

    def wait_for_builds(self) -> None:
        """Block until every background build is attached and the last step's growth applied (tests,
        benchmarks)."""
        self.finish_growth()
        self.builds.wait(self._stats)

    def finish_growth(self) -> None:
        """Block until the last step's growth is applied, its helper's CPU counted in `stats` (a
        proposer handing the cross-prompt tree to a new drafter; history builds go on)."""
        self.growth.finish()
        self._count_helper()

    def _count_helper(self) -> None:
        """Count the helper's CPU so far in `stats` (its growth waited for)."""
        self._stats.grow_seconds, self.growth.seconds = self._stats.grow_seconds + self.growth.seconds, 0.0

    def _drop_idle(self) -> None:
        """Every 64 steps, drop prompt indexes without a request for ENTRY_IDLE_STEPS steps."""
        if self.step % 64 == 0:
            self.prompts = {k: p for k, p in self.prompts.items()
                            if self.step - self.last_seen[k] < ENTRY_IDLE_STEPS}
            live = [p.index for p in self.prompts.values()]
            self.sides.retain(live)
            if self.own is not None:
                self.own.retain(live)
