"""HistoSpec's work in one engine step on plain arrays (`BatchDrafter`), what the vLLM plug-in
(`rhymerl.vllm.histospec_proposer`) runs after every step. Engine thread only.

`propose` per step: (1) find each row's request (`RequestTable`); a new one finds its prompt
(`PromptTable`) and opens its sibling sequence and tree response; (2) count what was accepted and adapt
budgets; (3) grow the siblings and, every `TREE_CHUNK` tokens, the tree, a long prefix catching up at
most `SIDE_CATCH_UP` / `TREE_CATCH_UP` tokens a step; (4) draft every row in one kernel call, then ask
the tree for rows below `spec.recent_gate` x budget; (5) the goodput controller keeps the draft tokens
that raise expected tokens per second (`spec.cost_aware`, `rhymerl.histospec.goodput`). Before all
this, the engine's `SpecSwitch` (`rhymerl.vllm.switch`) may find plain steps pay better at the batch's
size: the step then drafts nothing and, unless the step that ran verified drafts (counted in (2)),
does none of the above (a request is found again, by its prompt, when drafting resumes).
"""

from __future__ import annotations

import time
from dataclasses import InitVar, dataclass
from typing import Any, Sequence

import numpy as np

from rhymerl.histospec.bundle import HistoryBundle
from rhymerl.histospec.drafter import (TREE_CHUNK, HistoSpecDrafter, RecentTree, asks_tree, budget_rule,
                                       histospec_drafter, indexed_history, new_recent)
from rhymerl.histospec import goodput
from rhymerl.histospec.engine import step_pass
from rhymerl.histospec.engine.batch import BatchIndexDrafter, HistoryBuilds, SideSlots
from rhymerl.histospec.engine.requests import PromptTable, RequestTable, StepLedger, group
from rhymerl.histospec.index import PromptIndex
from rhymerl.config.spec import SpecConfig
from rhymerl.histospec.stats import SpecStats

STATE_GRACE_STEPS = 4  # keep a request's state this many steps while it is not scheduled
ENTRY_IDLE_STEPS = 512  # drop a prompt's built index after this many steps without a request
SIDE_CATCH_UP = 2048  # tokens a step adds to the siblings beyond its requests' new ones (catching up)
TREE_CATCH_UP = 512  # the same for the cross-prompt tree


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
    """The engine-agnostic batch logic behind the proposer."""
    bundle: HistoryBundle
    spec: SpecConfig
    k: int  # vLLM's num_speculative_tokens: no draft may be longer
    max_model_len: int
    initial_stats: InitVar[SpecStats | None] = None  # `stats` to count into (None: new ones)
    recent: RecentTree | None = None  # the cross-prompt tree; None: a new one if spec.recent_responses
    background: bool = True  # build large histories in a background thread (False: in the step)
    batched: bool = True  # prompts' own drafts in one kernel call (False: the Python drafter per row)
    switch: Any = None  # a `rhymerl.vllm.switch.SpecSwitch`: drafting or plain per band (None: always drafting)

    def __post_init__(self, initial_stats: SpecStats | None) -> None:
        self.builds = HistoryBuilds(self.spec, self.background)
        self.rule = budget_rule(self.spec)
        if self.recent is None and self.spec.method == "histospec":
            self.recent = new_recent(self.spec)
        self.table: PromptTable | None = None
        self.prompts: dict[int, _Prompt] = {}
        self.last_seen = np.zeros(len(self.bundle), np.int64)  # [k]: the last step with a request of prompt k
        self._mark = np.full(len(self.bundle), -1, np.int64)  # scratch of `group`
        self.requests = RequestTable(max(1, self.k))
        self.step = 0
        self.cost = goodput.CostByRows(1.0 - 1.0 / self.spec.cost_memory, self.spec.cost_by_rows)
        self.calibration = goodput.AcceptanceCalibration()  # the drafts' estimates vs what was accepted
        self.record = goodput.RequestRecord()  # each request's own recent acceptance
        self._predicted: float | None = None  # the controller's forecast of the step it shaped
        self._stats = initial_stats if initial_stats is not None else SpecStats()
        self._lifetime = SpecStats()  # never reset (take_stats resets `stats`): acceptance per position
        self.ledger = StepLedger(self.requests.width)  # the steps' counts until `stats` / `lifetime` are read
        self._stamp: float | None = None  # when the last propose returned (the engine step starts)
        self.sides = SideSlots()  # the prompts' siblings' arrays, grown (and read) in one call per step
        self.own = BatchIndexDrafter(self.spec, sides=self.sides) if self.batched else None
        self.left = {"side": SIDE_CATCH_UP, "tree": TREE_CATCH_UP}  # this step's catch-up allowances
        self.lagging = 0  # tokens of this step's requests not yet in the siblings or the tree
        self._gave = False  # whether the last step was given a draft (its verification is to be counted)
        self._resuming = False  # whether the last step was a plain one (`_plain`)
        group(np.zeros(1, np.int64), np.full(1, -1, np.int64))
        step_pass.warm()

    def propose(self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray) -> list[list[int]]:
        """Draft token ids per row; rows without sampled tokens (prefill chunks) get none."""
        out: list[list[int]] = [[] for _ in sampled_token_ids]
        if not self.spec.enabled:
            return out
        sizes = np.fromiter(map(len, sampled_token_ids), np.int64, len(sampled_token_ids))
        drafts = self.switch is None or self.switch.start(int(np.count_nonzero(sizes)), int(sizes.sum()))
        if not drafts and not self._gave:
            return self._plain(sizes, out)
        t0 = time.perf_counter()
        self.step += 1
        self.builds.new_step(self._stats)
        self.left, self.lagging = {"side": SIDE_CATCH_UP, "tree": TREE_CATCH_UP}, 0
        if self.table is None or self.table.dtype != token_ids_cpu.dtype:
            self.table = PromptTable([self.bundle.prompt(k) for k in range(len(self.bundle))], token_ids_cpu.dtype)
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
        if drafts and len(drafting):
            ps = slots[drafting]
            toks, lens, probs = self._drafts(live[drafting], ps, ends[drafting], budgets, token_ids_cpu)
            self._stats.proposed += int(lens.sum())
            step_pass.finish(req, ps, live[drafting], toks, lens, probs, out)
        if len(new) < len(slots) and self._stamp is not None:
            self._observe(len(live), processed, t0 - self._stamp, bool(rows.drafted.any()))
        if self.spec.cost_aware and drafts:
            self._trim(out, live, slots)
        self._gave, self._resuming = any(out), False
        req.keep(rows.kept, slots, self.step, STATE_GRACE_STEPS)
        self._drop_idle()
        self._stamp = time.perf_counter()
        self._stats.drafter_seconds += self._stamp - t0
        return out

    def _plain(self, sizes: np.ndarray, out: list[list[int]]) -> list[list[int]]:
        """A step the switch runs plainly after one that verified no draft: its rows' steps counted
        (one token each), nothing else done. (After a drafting step the full pass runs, drafting
        nothing, so that the drafts verified are counted.)"""
        self._stats.steps += int(np.count_nonzero(sizes))
        self._stats.tokens += int(sizes.sum())
        self._stamp, self._resuming = None, True  # the next drafting step's cost is not observed
        return out

    @property
    def stats(self) -> SpecStats:
        """Acceptance counters (reset by assigning a new `SpecStats`), every step so far counted in."""
        self.ledger.flush(self._stats, self._lifetime)
        return self._stats

    @stats.setter
    def stats(self, stats: SpecStats) -> None:
        self.ledger.flush(self._stats, self._lifetime)  # the steps so far count in the ones replaced
        self._stats = stats

    @property
    def lifetime(self) -> SpecStats:
        """Acceptance counters never reset, without position buckets: `_trim`'s fallback."""
        self.ledger.flush(self._stats, self._lifetime)
        return self._lifetime

    @lifetime.setter
    def lifetime(self, lifetime: SpecStats) -> None:
        # The proposer carries the counters over to each step's new drafter (histospec_proposer._make).
        self.ledger.flush(self._stats, self._lifetime)
        self._lifetime = lifetime

    def catch_up(self, due: np.ndarray, steady: np.ndarray, kind: str) -> np.ndarray:
        """Tokens each row adds this step to `kind` ("side" or "tree"): its due up to `steady`, plus a
        share of the step's allowance, first rows first (the rest counted in `lagging`)."""
        base = np.minimum(due, steady)
        behind = due - base
        if not behind.any():
            return due
        left = self.left[kind]
        extra = np.clip(left - (np.cumsum(behind) - behind), 0, behind)
        self.left[kind] = left - int(extra.sum())
        self.lagging += int((behind - extra).sum())
        return base + extra

    def _adapt_budgets(self, rows: step_pass.StepRows) -> int:
        """Adapt the continuing requests' budgets to their verified drafts; the tokens the step processed."""
        if self.rule.kind != "fixed":  # the fixed rule's update is the identity
            req, old = self.requests, rows.slots >= 0
            for slot, d, a in zip(rows.slots[old].tolist(), rows.drafted[old].tolist(), rows.accepted[old].tolist()):
                req.budget[slot] = self.rule.update(int(req.budget[slot]), d, a)
        old = rows.slots >= 0
        self.record.verified(rows.slots[old], rows.accepted[old])
        return rows.processed

    def _grow(self, step_rows: step_pass.StepRows, tokens: np.ndarray) -> None:
        """Add continuing requests' new tokens to the siblings and, every TREE_CHUNK, to the tree."""
        req, sib, due = self.requests, step_rows.sib, step_rows.due
        slots, rows, starts, ends = step_rows.slots, step_rows.live, step_rows.before, step_rows.ends
        if len(sib):
            held = req.sib_n[slots[sib]]
            upto = held + self.catch_up(ends[sib] - held, ends[sib] - starts[sib], "side")
            self._extend_siblings(req.prompt[slots[sib]], req.sib[slots[sib]], tokens, rows[sib], held, upto)
            req.sib_n[slots[sib]] = upto
        if len(due):
            held = req.tree_n[slots[due]]
            # a request in step holds all but its last < TREE_CHUNK tokens before this step's
            upto = held + self.catch_up(ends[due] - held, ends[due] - starts[due] + TREE_CHUNK - 1, "tree")
            for h, i, a, b in zip(req.tree[slots[due]].tolist(), rows[due].tolist(), held.tolist(), upto.tolist()):
                self.recent.extend(h, tokens[i, a:b])
            req.tree_n[slots[due]] = upto

    def _extend_siblings(self, keys: np.ndarray, seqs: np.ndarray, tokens: np.ndarray, rows: np.ndarray,
                         starts: np.ndarray, ends: np.ndarray) -> None:
        """Append tokens[rows[j], starts[j]:ends[j]] to sibling seqs[j] of prompt keys[j] for every j."""
        distinct, which = group(keys, self._mark)
        indexes = [self.prompts[k].index for k in distinct.tolist()]
        bases = np.fromiter((ix.base for ix in indexes), np.int64, len(indexes))  # sibling ids follow the history's
        self.sides.extend_rows([ix.side for ix in indexes], which, seqs - bases[which], tokens, rows, starts, ends)

    def _drafts(self, rows: np.ndarray, slots: np.ndarray, ends: np.ndarray, budgets: np.ndarray,
                tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens, lengths, probs) of the planned rows, as `HistoSpecDrafter.propose` of each context."""
        keys = self.requests.prompt[slots]
        if self.own is None:
            return self._drafts_by_row([self.prompts[k] for k in keys.tolist()], rows, ends, budgets, tokens)
        distinct, which = group(keys, self._mark)  # one look-up per prompt, not per row
        own = self.own.draft_groups([self.prompts[k].index for k in distinct.tolist()], which, rows, ends, budgets,
                                    tokens)
        if self.recent is not None:
            self._ask_tree(own.score, tokens, rows, ends, budgets, own.tokens, own.lengths, own.probs)
        return own.tokens, own.lengths, own.probs

    def _ask_tree(self, scores: np.ndarray, tokens: np.ndarray, rows: np.ndarray, ends: np.ndarray,
                  budgets: np.ndarray, toks: np.ndarray, lens: np.ndarray, probs: np.ndarray) -> None:
        """The tree's draft in place of the own where it scores higher, for rows that ask (`asks_tree`)."""
        spec = self.spec
        asks = np.flatnonzero(asks_tree(scores, budgets, spec.recent_gate) & (ends > 0))
        for j, i, n, b in zip(asks.tolist(), rows[asks].tolist(), ends[asks].tolist(), budgets[asks].tolist()):
            draft = self.recent.speculate_row(tokens[i, :n], b, spec.recent_spec_factor, spec.min_token_prob)
            if draft.score > scores[j]:
                size = len(draft.token_ids)
                probs[j] = 0.0
                toks[j, :size], probs[j, :size], lens[j] = draft.token_ids, draft.probs, size

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

    def _observe(self, rows: int, processed: int, seconds: float, drafted: bool) -> None:
        """Time the step that just ran (`rows` requests, `processed` tokens, with or without drafts),
        skipping outliers (a pause between generate calls)."""
        if self.cost.is_step(seconds):
            self.cost.observe(rows, processed, seconds, drafted)
            if self._predicted is not None:  # the controller's forecast of this step against the clock
                self._stats.timed_step(self._predicted, seconds)
        self._predicted = None

    def _trim(self, out: list[list[int]], live: np.ndarray, slots: np.ndarray) -> None:
        """Keep the draft tokens that raise expected tokens per second (`goodput`): chances from the
        estimates calibrated by response position, times each request's own record."""
        model = self.cost.for_rows(len(live))
        coef = model.coefficients()
        drafts = [out[i] for i in live.tolist()]
        longest = max(map(len, drafts), default=0)
        if coef is None or longest == 0:
            return
        if model.wants_probe():  # a draft-free step keeps the price of verifying at all measured
            drafts = [[] for _ in drafts]
        req = self.requests
        lengths = np.fromiter(map(len, drafts), np.int64, len(drafts))
        if self.calibration.tokens:
            probs = np.where(np.arange(longest)[None, :] < lengths[:, None], req.probs[slots, :longest], 0.0)
            q = self.calibration.rows(probs, goodput.bucket_of(req.n[slots] - req.plen[slots]))
        else:  # no estimate recorded yet: acceptance by position alone
            q = np.tile(goodput.position_acceptance(self.lifetime.accepted_at, self.lifetime.drafted_at, longest),
                        (len(drafts), 1))
        table, q = q, goodput.adjust(q, self.record.factor(slots))
        forecast = req.forecast[slots]
        remaining = (forecast - (req.n[slots] - req.plen[slots])).tolist()
        tail = goodput.tail_rows([r if f else None for r, f in zip(remaining, forecast.tolist())],
                                 self.spec.tail_fraction)
        kept = goodput.trim_drafts(drafts, len(drafts), len(drafts), q, coef, tail)
        sizes = np.fromiter(map(len, kept), np.int64, len(kept))
        self.record.predicted(slots, goodput.within(table, sizes).sum(1))
        self._predicted = coef[0] + coef[1] * (len(drafts) + int(sizes.sum())) + (coef[2] if sizes.any() else 0.0)
        for i, slot, draft in zip(live.tolist(), slots.tolist(), kept):
            out[i] = draft
            req.drafted[slot] = len(draft)

    def _start(self, tokens: np.ndarray, rows: np.ndarray, ends: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """Slots for new requests (rows, ends[j] tokens, sizes[j] sampled), prompts found, sibling
        sequences and tree responses opened within the step's allowances."""
        req = self.requests
        slots = np.fromiter((req.alloc() for _ in range(len(rows))), np.int64, len(rows))
        req.budget[slots] = self.rule.initial
        for slot in slots.tolist():
            self.record.reset(slot)
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
        req, prompts = self.requests, []
        for k in keys.tolist():
            prompt = self.prompts.get(k)
            if prompt is None:
                prompt = self.prompts[k] = self._open(k)
            prompts.append(prompt)
        plen = np.fromiter((p.plen for p in prompts), np.int64, len(prompts))
        if self._resuming:  # after plain steps one found again sampled this step's tokens plainly: counted
            back = ends - sizes > plen  # (one new since its prefill has written none before them)
            self._stats.steps += int(np.count_nonzero(back))
            self._stats.tokens += int(sizes[back].sum())
        req.prompt[slots], req.plen[slots] = keys, plen
        req.forecast[slots] = np.fromiter((p.forecast for p in prompts), np.int64, len(prompts))
        due = np.maximum(ends - plen, 0)
        if self.spec.siblings:
            upto = plen + self.catch_up(due, sizes, "side")
            seqs = np.fromiter((p.index.add() for p in prompts), np.int64, len(prompts))  # the prompt's tail alone
            self._extend_siblings(keys, seqs, tokens, rows, plen, upto)
            req.sib[slots], req.sib_n[slots] = seqs, upto
        if self.recent is not None:
            self._join_tree(prompts, slots, tokens, rows, plen, due, sizes)

    def _join_tree(self, prompts: list[_Prompt], slots: np.ndarray, tokens: np.ndarray, rows: np.ndarray,
                   plen: np.ndarray, due: np.ndarray, sizes: np.ndarray) -> None:
        """Open new requests in the tree: each prompt's first `spec.recent_per_group` (0: all)."""
        per_group, joins = self.spec.recent_per_group, []
        for j, prompt in enumerate(prompts):
            if not per_group or prompt.in_tree < per_group:
                prompt.in_tree += 1
                joins.append(j)
        if not joins:
            return
        j = np.asarray(joins, np.int64)
        upto = plen[j] + self.catch_up(due[j], sizes[j], "tree")
        req = self.requests
        for slot, i, a, b in zip(slots[j].tolist(), rows[j].tolist(), plen[j].tolist(), upto.tolist()):
            req.tree[slot], req.tree_n[slot] = self.recent.start(tokens[i, a:b].tolist()), b

    def _open(self, k: int) -> _Prompt:
        """Prompt k's entry, its history submitted to `builds`."""
        prefix = self.bundle.prompt(k)
        tokens, lengths, rewards = self.bundle.history(k)
        forecast = int(lengths.max()) if len(lengths) else 0
        _, seq_lengths, seq_rewards = indexed_history(self.spec, prefix, tokens[:0], lengths, rewards)
        index = PromptIndex(seq_rewards.tolist(), self.spec.min_match, self.spec.max_match, prefix.tolist())
        if len(seq_lengths):
            self.builds.submit(index, tokens, lengths, rewards, prefix)
        return _Prompt(index, histospec_drafter(self.spec, index, self.recent), len(prefix), forecast)

    @property
    def building(self) -> int:
        """Histories being indexed in the background now."""
        return self.builds.building

    def wait_for_builds(self) -> None:
        """Block until every background build is attached (tests, benchmarks)."""
        self.builds.wait(self._stats)

    def _drop_idle(self) -> None:
        """Every 64 steps, drop prompt indexes without a request for ENTRY_IDLE_STEPS steps."""
        if self.step % 64 == 0:
            self.prompts = {k: p for k, p in self.prompts.items() if self.step - self.last_seen[k] < ENTRY_IDLE_STEPS}
            live = [p.index for p in self.prompts.values()]
            self.sides.retain(live)
            if self.own is not None:
                self.own.retain(live)
