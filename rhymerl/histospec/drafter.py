"""The reference drafter (`HistoSpecDrafter`, the oracle of the engine's batch path), vLLM's n-gram
lookup for comparison (`NgramDrafter`), the cross-prompt tree (`RecentTree`), the budget rules
(`BudgetRule`), and their builders from a `SpecConfig`.

The drafter follows the `MAX_CANDIDATES` most recent occurrences of the longest context tail in the
prompt's index; at a branch it takes the most occurrences (reward-weighted: the highest reward sum),
ties to the most recent. Estimates and the tree's gate: `follow`, `HistoSpecDrafter.propose` (and
docs/histospec.md, How a draft is made).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

from rhymerl.histospec.index import PromptIndex
from rhymerl.config.spec import SpecConfig, require_arctic_inference

PRIOR = 2.0  # few sightings are weak evidence: a continuation seen m times is worth at most m / (m + PRIOR)
MAX_CANDIDATES = 32  # most recent occurrences followed per draft: bounds the cost of common n-grams
TREE_CHUNK = 4  # a response's tokens join the cross-prompt tree this many at a time (engine and replay)
_NO_FACTOR = 1e9  # max_spec_factor 0 means "no cap": the library wants a number


@dataclass(frozen=True)
class Draft:
    """Proposed next tokens for one request."""
    tokens: tuple[int, ...]
    match_len: int = 0  # length of the matched context tail (0: no match, empty draft)
    score: float = 0.0  # sum of the tokens' estimated probabilities (the expected accepted length)
    probs: tuple[float, ...] = ()  # [j]: estimated chance tokens 0..j are all right (nonincreasing)

    def __len__(self) -> int:
        return len(self.tokens)


EMPTY = Draft(())


class Drafter(Protocol):
    """Anything that proposes draft tokens for a context (prompt + response so far)."""
    def propose(self, context: Sequence[int], budget: int) -> Draft:
        """At most `budget` tokens likely to follow `context`; only its tail is read."""
        ...


class RecentTree:
    """The last `capacity` responses of every prompt on Arctic Inference's suffix tree, oldest evicted
    first; `extend` of an evicted handle is a no-op."""
    def __init__(self, capacity: int, depth: int = 64) -> None:
        if capacity < 1 or depth < 2:
            raise ValueError(f"RecentTree needs capacity >= 1 and depth >= 2, got {capacity}, {depth}")
        require_arctic_inference()
        from arctic_inference.suffix_decoding._C import SuffixTree

        self.capacity, self.depth, self.tree = capacity, depth, SuffixTree(depth)
        self.held: deque[int] = deque()
        self.lengths: dict[int, int] = {}  # handle -> tokens, for responses still held
        self._next = 0

    def start(self, tokens: Sequence[int] = ()) -> int:
        """Open a response with its first `tokens`; its handle."""
        handle = self._next
        self._next = (self._next + 1) & 0x7FFFFFFF  # the library's ids are int32
        self.held.append(handle)
        self.lengths[handle] = 0
        while len(self.held) > self.capacity:
            old = self.held.popleft()
            del self.lengths[old]
            self.tree.remove(old)
        self.extend(handle, tokens)
        return handle

    def extend(self, handle: int, tokens: Sequence[int] | np.ndarray) -> None:
        """Append `tokens` (int32 arrays are passed as they are) to response `handle`, if still held."""
        tokens = np.asarray(tokens, dtype=np.int32)
        if handle in self.lengths and len(tokens):
            self.tree.extend_ndarray(handle, tokens)
            self.lengths[handle] += len(tokens)

    def speculate(self, context: Sequence[int], budget: int, max_spec_factor: float,
                  min_token_prob: float) -> tuple[tuple[int, ...], int, float, tuple[float, ...]]:
        """(tokens, match length, score, probs) of the tree's best-scoring draft after `context`'s last
        `depth` tokens: <= `budget` and `max_spec_factor` x the match (0: no cap), >= `min_token_prob`."""
        context = [int(t) for t in context[-self.depth:]]
        if budget <= 0 or not context:
            return (), 0, 0.0, ()
        d = self.tree.speculate(context, budget, max_spec_factor or _NO_FACTOR, 0.0, min_token_prob, False)
        return tuple(d.token_ids), int(d.match_len), float(d.score), tuple(d.probs)

    def speculate_row(self, context: np.ndarray, budget: int, max_spec_factor: float, min_token_prob: float) -> Any:
        """`speculate` of an int32 array (a view of an engine row), the library's draft object as it is."""
        return self.tree.speculate_ndarray(context[-self.depth:], budget, max_spec_factor or _NO_FACTOR, 0.0,
                                           min_token_prob, False)

    @property
    def num_tokens(self) -> int:
        """Tokens held (responses not yet evicted)."""
        return sum(self.lengths.values())

    def __len__(self) -> int:
        return len(self.held)


def asks_tree(own_score, budget, gate: float):
    """Whether an own draft scoring `own_score` (< gate x budget) asks the tree; scalars or arrays."""
    return own_score < gate * budget


class HistoSpecDrafter:
    """Drafts from one prompt's index and, if given, a cross-prompt `RecentTree` (see the module)."""
    def __init__(self, index: PromptIndex, reward_weighted: bool = False,
                 max_candidates: int = MAX_CANDIDATES, min_token_prob: float = 0.0,
                 max_spec_factor: float = 0.0, recent: RecentTree | None = None,
                 recent_spec_factor: float = 0.0, recent_gate: float = 1.0) -> None:
        self.index, self.reward_weighted, self.max_candidates = index, reward_weighted, max_candidates
        self.min_token_prob, self.max_spec_factor = min_token_prob, max_spec_factor
        self.recent, self.recent_spec_factor, self.recent_gate = recent, recent_spec_factor, recent_gate

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        """The own draft; the tree's if the own scores below recent_gate x budget and the tree's higher."""
        if budget <= 0:
            return EMPTY
        best = self.own(context, budget)
        if self.recent is not None and asks_tree(best.score, budget, self.recent_gate):
            other = Draft(*self.recent.speculate(context, budget, self.recent_spec_factor, self.min_token_prob))
            if other.score > best.score:
                best = other
        return best if best.tokens else EMPTY

    def own(self, context: Sequence[int], budget: int) -> Draft:
        """The draft from the prompt's index alone."""
        n, codes = self.index.recent_match(context, self.max_candidates)
        if not codes:
            return EMPTY
        if self.max_spec_factor > 0:  # a short match earns a short draft
            budget = min(budget, int(self.max_spec_factor * n))
            if budget <= 0:
                return EMPTY
        tokens, probs = follow(self.index, codes, budget, self.reward_weighted, self.min_token_prob)
        return Draft(tuple(tokens), n, sum(probs), tuple(probs)) if tokens else EMPTY


def follow(index: PromptIndex, codes: Sequence[int], budget: int, reward_weighted: bool,
           min_token_prob: float = 0.0) -> tuple[list[int], list[float]]:
    """The tokens and estimates of the walk down the continuations at `codes` (<= `budget`), taking the
    best group at branches: m continuations start at m / (m + PRIOR), times each chosen group's share;
    stops below `min_token_prob`. Sorted, a group agrees on a stretch iff its first and last members do."""
    conts, kept = [], []
    for code, cont in zip(codes, index.gather(codes, budget)):
        if cont:
            conts.append(cont)
            kept.append(code)
    if not conts:
        return [], []
    prob = len(conts) / (len(conts) + PRIOR)
    if prob < min_token_prob:
        return [], []
    if len(conts) == 1:
        return conts[0], [prob] * len(conts[0])
    order = sorted(range(len(conts)), key=conts.__getitem__)
    conts, kept = [conts[i] for i in order], [kept[i] for i in order]
    lo, hi, depth, src, probs = 0, len(conts), 0, conts[0], []
    while depth < budget:
        while lo < hi and len(conts[lo]) <= depth:  # ended here; a proper prefix sorts first
            lo += 1
        if lo == hi:
            break
        first, last = conts[lo], conts[hi - 1]
        src = first
        if first[depth] != last[depth]:  # a branch: keep the best group, take its token
            size = hi - lo
            lo, hi = _best_group(index, conts, kept, lo, hi, depth, reward_weighted)
            prob *= (hi - lo) / size
            if prob < min_token_prob:
                break
            src = conts[lo]
            depth += 1
            probs.append(prob)
            continue
        end = min(len(first), len(last))
        run = depth + 1
        if first[depth:end] == last[depth:end]:
            run = end
        else:
            while first[run] == last[run]:
                run += 1
        probs.extend([prob] * (run - depth))
        depth = run
    return src[:depth], probs


def _best_group(index: PromptIndex, conts: list[list[int]], codes: list[int], lo: int, hi: int,
                depth: int, reward_weighted: bool) -> tuple[int, int]:
    """The [lo, hi) run of `conts` sharing the best token at `depth` (module rules; rewards summed oldest first)."""
    best_key, best = None, (lo, hi)
    j = lo
    while j < hi:
        tok, start = conts[j][depth], j
        while j < hi and conts[j][depth] == tok:
            j += 1
        count, latest = j - start, max(codes[start:j])
        reward = 0.0
        if reward_weighted:
            for code in sorted(codes[start:j]):
                reward += index.reward_of(code)
        key = (reward, count, latest) if reward_weighted else (count, latest)
        if best_key is None or key > best_key:
            best_key, best = key, (start, j)
    return best


class NgramDrafter:
    """vLLM's n-gram prompt lookup: the earliest occurrence of the longest context tail."""
    def __init__(self, min_match: int = 3, max_match: int = 7) -> None:
        self.min_match, self.max_match = min_match, max_match

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        ctx = list(context)
        size = len(ctx)
        for n in range(min(self.max_match, size - 1), self.min_match - 1, -1):
            pat = ctx[size - n:]
            i = -1
            while True:
                try:
                    i = ctx.index(pat[0], i + 1, size - n)
                except ValueError:
                    break
                if ctx[i:i + n] == pat:
                    return Draft(tuple(ctx[i + n:i + n + budget]), n) if budget > 0 else EMPTY
        return EMPTY


@dataclass(frozen=True)
class BudgetRule:
    """A draft budget within [initial, cap] that adapts to each verified draft. "additive" (the paper's):
    +2 after a fully accepted draft, back to `initial` on a rejection; "doubling" (the public code's):
    x2, halved on a rejection; "fixed" (vLLM's n-gram method): always `cap`. No draft: no change."""
    kind: str = "fixed"
    cap: int = 16
    initial: int = 16

    def update(self, budget: int, drafted: int, accepted: int) -> int:
        """Next budget after a step that drafted `drafted` tokens of which `accepted` were taken."""
        if drafted == 0 or self.kind == "fixed":
            return budget
        if accepted >= drafted:
            return min(budget + 2 if self.kind == "additive" else budget * 2, self.cap)
        return self.initial if self.kind == "additive" else max(budget // 2, self.initial)


def rule_of(kind: str, max_budget: int) -> BudgetRule:
    """Rule `kind` (spec.budget_rule) for a run whose drafts are at most `max_budget` tokens: additive
    up to 32, doubling up to 16, fixed at max_budget; additive and doubling start at 2."""
    cap = {"additive": min(32, max_budget), "doubling": min(16, max_budget)}.get(kind, max_budget)
    return BudgetRule(kind, cap, cap if kind == "fixed" else min(2, cap))


def budget_rule(spec: SpecConfig) -> BudgetRule:
    """The configured budget rule, capped at `max_budget`."""
    return rule_of(spec.budget_rule, spec.max_budget)


def indexed_history(spec: SpecConfig, prompt: np.ndarray, tokens: np.ndarray, lengths: np.ndarray,
                    rewards: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The flat (tokens, lengths, rewards) a prompt's index is built over: its history, oldest first,
    after the prompt itself (reward 0) with `prompt_lookup`. Engine and replay both build through here."""
    if not (spec.prompt_lookup and len(prompt)):
        return tokens, lengths, rewards
    return (np.concatenate((prompt.astype(tokens.dtype, copy=False), tokens)),
            np.concatenate(([len(prompt)], lengths)).astype(lengths.dtype, copy=False),
            np.concatenate(([0.0], rewards)).astype(rewards.dtype, copy=False))


def new_index(spec: SpecConfig, responses: Sequence[Sequence[int]] = (), rewards: Sequence[float] | None = None,
              prefix: Sequence[int] = ()) -> PromptIndex:
    """The prompt's index over `responses`, oldest first, each after `prefix` (the prompt)."""
    lengths = np.fromiter(map(len, responses), dtype=np.int64, count=len(responses))
    tokens = np.fromiter((t for r in responses for t in r), dtype=np.int64, count=int(lengths.sum()))
    rewards = np.zeros(len(lengths)) if rewards is None else np.asarray(rewards, dtype=np.float64)
    tokens, lengths, rewards = indexed_history(spec, np.asarray(prefix, dtype=np.int64), tokens, lengths, rewards)
    return PromptIndex.build(tokens, lengths.tolist(), rewards.tolist(), min_match=spec.min_match,
                             max_match=spec.max_match, prefix=prefix)


def new_recent(spec: SpecConfig) -> RecentTree | None:
    """An empty cross-prompt tree of `recent_responses` responses (None: off)."""
    return RecentTree(spec.recent_responses, spec.tree_depth) if spec.recent_responses else None


def histospec_drafter(spec: SpecConfig, index: PromptIndex, recent: RecentTree | None = None) -> HistoSpecDrafter:
    """A HistoSpec drafter over `index` (and `recent`, if given) with `spec`'s drafting rules."""
    return HistoSpecDrafter(index, spec.reward_weighted, min_token_prob=spec.min_token_prob,
                            max_spec_factor=spec.max_spec_factor, recent=recent,
                            recent_spec_factor=spec.recent_spec_factor, recent_gate=spec.recent_gate)
