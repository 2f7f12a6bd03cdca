"""Offline replay: the acceptance a drafter would have reached on recorded responses, without a model.

Recorded next tokens act as the model's choices: a step accepts the longest draft prefix equal to the
recorded continuation, plus one recorded token (bonus or correction); with lossless speculative
sampling this is exact in distribution. A prompt's group replays in lockstep as the engine runs it
(draft all, then verify and, with `siblings`, grow the shared index). A response's first token is the
prefill's, not counted (`prefilled`); its last is the model's own, so at most `len - 1` draft tokens
are accepted. `replay_suffix` replays Arctic Inference's suffix decoding the same way (`SuffixArm`).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Hashable, Iterable, Literal, Mapping, Sequence

from rhymerl.histospec.drafter import (TREE_CHUNK, Drafter, NgramDrafter, RecentTree, budget_rule, rule_of,
                                       histospec_drafter, new_index, new_recent)
from rhymerl.histospec.index import PromptIndex
from rhymerl.config.spec import SpecConfig, require_arctic_inference
from rhymerl.histospec.stats import SpecStats

# vLLM's defaults for `method="suffix"` (vllm/config/speculative.py, suffix_decoding_*): "stock".
STOCK_TREE_DEPTH = 24
STOCK_CACHED_REQUESTS = 10_000
STOCK_SPEC_FACTOR = 1.0
STOCK_MIN_TOKEN_PROB = 0.1


@dataclass(frozen=True)
class SuffixArm:
    """A replayed suffix cache's scope and knobs (vLLM's stock by default). "global": one cache for the
    run, keeping the newest `max_cached_requests` responses (`cache_steps > 0`: that many steps' plus the
    one in flight); "prompt": a fresh cache per group holding HistoSpec's history and the siblings."""
    scope: Literal["global", "prompt"] = "global"
    max_cached_requests: int = STOCK_CACHED_REQUESTS  # -1: unlimited
    cache_steps: float = 0.0  # > 0: size the global cache to this many steps' responses
    max_tree_depth: int = STOCK_TREE_DEPTH
    max_spec_factor: float = STOCK_SPEC_FACTOR
    min_token_prob: float = STOCK_MIN_TOKEN_PROB

    def __post_init__(self) -> None:
        if self.scope not in ("global", "prompt"):
            raise ValueError(f"SuffixArm.scope={self.scope!r}: use 'global' or 'prompt'")
        if self.max_cached_requests == 0 or self.max_cached_requests < -1:
            raise ValueError(f"SuffixArm.max_cached_requests={self.max_cached_requests}: use >= 1, or -1 "
                             "for no limit")
        if self.cache_steps < 0 or self.max_tree_depth < 1:
            raise ValueError("SuffixArm: cache_steps must be >= 0 and max_tree_depth >= 1")

    def new_cache(self, max_cached_requests: int | None = None) -> Any:
        """An empty `SuffixDecodingCache` of this depth (size: the argument, else the arm's)."""
        cache_cls = require_arctic_inference()
        size = self.max_cached_requests if max_cached_requests is None else max_cached_requests
        return cache_cls(max_tree_depth=self.max_tree_depth, max_cached_requests=size)


@dataclass(frozen=True)
class RecordedResponse:
    """One response from the lake, as replay needs it."""
    prompt_id: str
    epoch: int
    token_ids: tuple[int, ...]
    reward: float = 0.0
    prompt_token_ids: tuple[int, ...] = ()  # optional: lets the first tokens be drafted too
    step: int = 0  # training step that generated it (orders the global suffix cache, sizes a step)


@dataclass
class ReplayReport:
    """Acceptance per epoch for one setting."""
    config: SpecConfig
    per_epoch: dict[int, SpecStats] = field(default_factory=dict)

    def overall(self) -> SpecStats:
        total = SpecStats()
        for stats in self.per_epoch.values():
            total.merge(stats)
        return total


def prefilled(prompt: Sequence[int], response: Sequence[int]) -> int:
    """Tokens of `response` emitted before its first draft: 1 with a known prompt (the prefill's), else 0."""
    return 1 if len(prompt) and len(response) else 0


def accepted_prefix(draft: Sequence[int], actual: Sequence[int]) -> int:
    """Length of the longest common prefix of the draft and the actual continuation."""
    n = 0
    for d, a in zip(draft, actual):
        if d != a:
            break
        n += 1
    return n


def verify(draft: Sequence[int], response: Sequence[int], pos: int, stats: SpecStats) -> int:
    """One verification at `pos`, counted in `stats`: draft tokens accepted (<= tokens left - 1: the model's last)."""
    accepted = min(accepted_prefix(draft, response[pos:]), len(response) - pos - 1)
    stats.record(len(draft), accepted)
    return accepted


Group = tuple[Sequence[int], Sequence[Sequence[int]], PromptIndex | None]  # prompt, responses, history index


def replay_batch(groups: Sequence[Group], config: SpecConfig, stats: SpecStats | None = None,
                 recent: RecentTree | None = None) -> SpecStats:
    """Replay several groups (one training step's) in one lockstep batch, as one engine runs them."""
    stats = stats if stats is not None else SpecStats()
    rows = []  # (context prefix, response, drafter, index or None, sibling id, recent handle)
    for prompt, responses, index in groups:
        prompt = [int(t) for t in prompt]
        if config.method == "histospec":
            index = index if index is not None else new_index(config, prefix=prompt)
            drafter: Drafter = histospec_drafter(config, index, recent)
        else:
            drafter = NgramDrafter(config.min_match, config.max_match)
        per_group = config.recent_per_group
        for j, resp in enumerate(responses):
            first = resp[:prefilled(prompt, resp)]  # the prefill's token joins the siblings at once
            sib = index.add(first) if config.method == "histospec" and config.siblings else -1
            handle = recent.start() if recent is not None and (not per_group or j < per_group) else -1
            rows.append((prompt, resp, drafter, index, sib, handle))
    if config.method == "histospec":
        rule, tail = budget_rule(config), config.context_tail  # the drafter reads only the context's tail
    else:
        rule, tail = rule_of("fixed", config.max_budget), None  # vLLM's n-gram method has no adaptive budget
    pos = [prefilled(row[0], row[1]) for row in rows]
    held = [0] * len(rows)  # tokens of each response in the recent tree
    budget = [rule.initial] * len(rows)
    active = [k for k, row in enumerate(rows) if len(row[1]) > pos[k]]
    while active:
        t0 = time.perf_counter()
        drafts = []
        for k in active:
            prompt, resp, drafter = rows[k][:3]
            context = prompt + list(resp[:pos[k]])
            drafts.append(drafter.propose(context[-tail:] if tail else context, budget[k]).tokens)
        stats.drafter_seconds += time.perf_counter() - t0
        still = []
        for k, draft in zip(active, drafts):
            _, resp, _, index, sib, handle = rows[k]
            p = pos[k]
            accepted = verify(draft, resp, p, stats)
            budget[k] = rule.update(budget[k], len(draft), accepted)
            pos[k] = p + accepted + 1
            if sib >= 0:
                index.extend(sib, resp[p:pos[k]])
            if handle >= 0 and pos[k] - held[k] >= TREE_CHUNK:
                recent.extend(handle, resp[held[k]:pos[k]])  # in chunks, as the engine does
                held[k] = pos[k]
            if pos[k] < len(resp):
                still.append(k)
        active = still
    return stats


def history_for(epochs: Mapping[int, Sequence[RecordedResponse]], epoch: int,
                history_epochs: int) -> list[RecordedResponse]:
    """Responses from the last `history_epochs` epochs before `epoch` that saw the prompt, oldest first."""
    earlier = sorted(e for e in epochs if e < epoch)[-history_epochs:] if history_epochs else []
    return [r for e in earlier for r in epochs[e]]


def replay(records: Iterable[RecordedResponse], config: SpecConfig,
           only_epochs: Collection[int] | None = None,
           on_prompt: Callable[[], None] | None = None, arm: SuffixArm | None = None) -> ReplayReport:
    """Replay every (prompt, epoch) group of `records` under `config`; acceptance per epoch.

    Steps replay in generation order, each step's groups in one lockstep batch (the tree sees what one
    engine would). Epochs outside `only_epochs` are not reported but serve as history and feed the
    tree. `on_prompt` is called once per prompt; `arm`: the suffix cache's scope (method "suffix")."""
    if config.method == "suffix":
        return replay_suffix(records, config, arm or SuffixArm(), only_epochs, on_prompt)
    records = list(records)
    by_prompt: dict[str, dict[int, list[RecordedResponse]]] = defaultdict(lambda: defaultdict(list))
    steps: dict[tuple[int, int], dict[str, list[RecordedResponse]]] = defaultdict(dict)
    for r in records:
        by_prompt[r.prompt_id][r.epoch].append(r)
        steps[(r.epoch, r.step)].setdefault(r.prompt_id, []).append(r)
    report = ReplayReport(config)
    recent = new_recent(config) if config.method == "histospec" else None
    last_epoch = max((k[0] for k in steps if only_epochs is None or k[0] in only_epochs), default=None)
    for (epoch, _), groups in sorted(steps.items()):
        wanted = only_epochs is None or epoch in only_epochs
        if not wanted and recent is None:
            continue
        # an epoch not reported still runs when the recent tree needs its responses, as they grew
        stats = report.per_epoch.setdefault(epoch, SpecStats()) if wanted else SpecStats()
        batch = []
        for pid, group in groups.items():
            prompt, index = group[0].prompt_token_ids, None
            if config.method == "histospec":
                hist = history_for(by_prompt[pid], epoch, config.history_epochs)
                t0 = time.perf_counter()
                index = new_index(config, [h.token_ids for h in hist], [h.reward for h in hist], prefix=prompt)
                stats.index_seconds += time.perf_counter() - t0
                stats.index_tokens += index.num_tokens
            batch.append((prompt, [r.token_ids for r in group], index))
        replay_batch(batch, config, stats, recent)
        if on_prompt is not None and epoch == last_epoch:
            for _ in groups:
                on_prompt()
    return report


# ---------------------------------------------------------------- suffix decoding (Arctic Inference)


def replay_suffix(records: Iterable[RecordedResponse], config: SpecConfig, arm: SuffixArm,
                  only_epochs: Collection[int] | None = None,
                  on_prompt: Callable[[], None] | None = None) -> ReplayReport:
    """Replay through Arctic Inference's `SuffixDecodingCache` as vLLM's `suffix` method drafts (<=
    `config.max_budget` tokens, `arm`'s knobs and scope); tokens join as emitted, so siblings see each other."""
    records = list(records)
    report = ReplayReport(config)
    batches: dict[tuple, list[RecordedResponse]] = defaultdict(list)
    for r in records:
        batches[(r.epoch, r.step) if arm.scope == "global" else (r.epoch, r.step, r.prompt_id)].append(r)
    if arm.scope == "prompt":
        by_prompt: dict[str, dict[int, list[RecordedResponse]]] = defaultdict(lambda: defaultdict(list))
        for r in records:
            by_prompt[r.prompt_id][r.epoch].append(r)
    else:
        size = arm.max_cached_requests
        if arm.cache_steps > 0:  # that many steps of finished responses, plus the step in flight
            size = max(1, round((arm.cache_steps + 1) * responses_per_step(records)))
        cache = arm.new_cache(size)
    last_epoch = max((k[0] for k in batches if only_epochs is None or k[0] in only_epochs), default=None)
    for key in sorted(batches):  # generation order
        batch, epoch = batches[key], key[0]
        wanted = only_epochs is None or epoch in only_epochs
        stats = report.per_epoch.setdefault(epoch, SpecStats()) if wanted else SpecStats()
        if arm.scope == "prompt":
            if not wanted:
                continue
            hist = history_for(by_prompt[batch[0].prompt_id], epoch, config.history_epochs)
            t0 = time.perf_counter()
            cache = arm.new_cache(-1)
            for j, h in enumerate(hist):
                _cache_response(cache, ("history", j), h.token_ids)
            stats.index_seconds += time.perf_counter() - t0
            stats.index_tokens += sum(len(h.token_ids) for h in hist)
        requests = [((r.epoch, r.step, r.prompt_id, k), r.prompt_token_ids, r.token_ids)
                    for k, r in enumerate(batch)]
        replay_suffix_batch(cache, requests, config, arm, stats)
        if on_prompt is not None and epoch == last_epoch:
            for _ in {r.prompt_id for r in batch}:
                on_prompt()
    return report


def replay_suffix_batch(cache, requests: Sequence[tuple[Hashable, Sequence[int], Sequence[int]]],
                        config: SpecConfig, arm: SuffixArm, stats: SpecStats) -> SpecStats:
    """Replay (request id, prompt, response) triples in lockstep through `cache` (a `SuffixDecodingCache`)."""
    ids = [rid for rid, _, _ in requests]
    prompts = [[int(t) for t in prompt] for _, prompt, _ in requests]
    responses = [resp for _, _, resp in requests]
    for rid, prompt in zip(ids, prompts):
        cache.start_request(rid, prompt)
    depth = arm.max_tree_depth
    pos = [prefilled(prompt, resp) for prompt, resp in zip(prompts, responses)]
    for k, rid in enumerate(ids):
        if pos[k]:
            cache.add_active_response(rid, list(responses[k][:pos[k]]))
    active = [k for k, r in enumerate(responses) if len(r) > pos[k]]
    while active:
        t0 = time.perf_counter()
        drafts = []
        for k in active:
            context = (prompts[k] + list(responses[k][max(0, pos[k] - depth):pos[k]]))[-depth:]
            drafts.append(cache.speculate(ids[k], context, max_spec_tokens=config.max_budget,
                                          max_spec_factor=arm.max_spec_factor,
                                          min_token_prob=arm.min_token_prob).token_ids if context else [])
        stats.drafter_seconds += time.perf_counter() - t0
        still = []
        for k, draft in zip(active, drafts):
            resp, p = responses[k], pos[k]
            pos[k] = p + verify(draft, resp, p, stats) + 1
            cache.add_active_response(ids[k], list(resp[p:pos[k]]))
            if pos[k] < len(resp):
                still.append(k)
        active = still
    for rid in ids:
        cache.stop_request(rid)
    return stats


def _cache_response(cache, rid: Hashable, tokens: Sequence[int]) -> None:
    """Put a finished response into `cache`'s global tree (as vLLM does when a request ends)."""
    cache.start_request(rid, [])
    cache.add_active_response(rid, list(tokens))
    cache.stop_request(rid)


def responses_per_step(records: Iterable[RecordedResponse]) -> int:
    """The median number of responses one training step generated (by epoch and step)."""
    counts = Counter((r.epoch, r.step) for r in records)
    return int(statistics.median(counts.values())) if counts else 0
