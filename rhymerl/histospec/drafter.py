"""Drafting from a prompt's history: the `propose(context, budget) -> Draft` interface and the
HistoSpec and n-gram drafters (a run's settings: `rhymerl.histospec.spec_config.SpecConfig`; budget
rules: `rhymerl.histospec.budget`; acceptance counters: `rhymerl.histospec.stats`).

`HistoSpecDrafter` drafts from the prompt's own index (`PromptIndex`, rhymerl.histospec.flat) — its
responses of earlier epochs, the prompt itself (`SpecConfig.prompt_lookup`) and its siblings as they
grow — and, when given one, from a `RecentTree` of recent responses of every
prompt (`rhymerl.histospec.tree`), and proposes the draft with the higher score (the sum of its tokens'
estimated probabilities, i.e. its expected accepted length; ties go to the prompt's own). From the
prompt's index it finds the longest tail of the context (between `min_match` and `max_match` tokens)
that occurred before and follows the continuations of its most recent occurrences, like a walk down a
suffix tree: where they agree the draft copies them; where they branch it takes the branch with the
most occurrences (or, reward-weighted, the highest sum of response rewards), ties going to the most
recent. Either source stops a draft before a token whose estimated probability falls below
`min_token_prob` and keeps it within `max_spec_factor` x the matched length: a short match earns a
short draft.

The per-request draft budget adapts to acceptance through a rule picked by name from
`BUDGET_RULES` (`rhymerl.histospec.budget`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from rhymerl.histospec.flat import PromptIndex
from rhymerl.histospec.index import SuffixIndex
from rhymerl.histospec.tree import RecentTree

# A continuation seen m times gets at most m / (m + PRIOR): few sightings are weak evidence, so a draft
# from one sibling's tokens must score well to beat the cross-prompt tree's (whose library estimates
# have no such discount). Replays of a default run (2026-12-03; scratch runs, cross-prompt factor 2):
# PRIOR 0 / 1 gave 2.38 / 2.42 tokens per verification in epoch 0; 2 (factor 3) 2.50; 3 (factor 4) 2.52
# but 5.10 overall where 2 gives 5.19.
PRIOR = 2.0
# Most recent occurrences followed per draft: bounds the cost of common n-grams (on the built-in
# model's responses 32 drafted exactly as well as no cap; 8 lost ~14%). 16 drew the same in replay of
# two default lakes (2026-12-06: 6.957 -> 6.957, 6.275 -> 6.269 tokens per verification) and took a
# step with 64 history responses per prompt from 1.42-1.54 to 1.10-1.13 ms, but on the lossless test's
# untrained model (high-entropy samples, 4,000 per prompt) the engine accepted 17-25% fewer draft
# tokens (T = 1: 29,162 / 7,273 / 1,703 against 35,397 / 9,772 / 2,959 at draft positions 1-3): the
# more continuations a draft follows, the better its majority estimates a spread-out distribution's mode.
MAX_CANDIDATES = 32


Index = SuffixIndex | PromptIndex  # a prompt's index: the flat one (engine, replay) or the dict one


@dataclass(frozen=True)
class Draft:
    """Proposed next tokens for one request."""

    tokens: tuple[int, ...]
    match_len: int = 0  # length of the matched context tail (0: no match, empty draft)
    score: float = 0.0  # sum of the tokens' estimated probabilities (the expected accepted length)
    probs: tuple[float, ...] = ()  # [j]: estimated chance tokens 0..j are all right (nonincreasing);
    # the engine calibrates these against what the verifier accepts (rhymerl.histospec.step_budget)

    def __len__(self) -> int:
        return len(self.tokens)


EMPTY = Draft(())


class Drafter(Protocol):
    """Anything that proposes draft tokens for a context (prompt + response so far)."""

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        """At most `budget` tokens likely to follow `context`; only its tail is read."""
        ...


class HistoSpecDrafter:
    """Drafts from one prompt's index (history plus any siblings added to it) and, if given, from a
    cross-prompt `RecentTree`; the higher-scoring draft wins (the prompt's own on a tie)."""

    def __init__(self, index: Index, reward_weighted: bool = False,
                 max_candidates: int = MAX_CANDIDATES, min_token_prob: float = 0.0,
                 max_spec_factor: float = 0.0, recent: RecentTree | None = None,
                 recent_spec_factor: float = 0.0, recent_gate: float = 1.0) -> None:
        self.index = index
        self.reward_weighted = reward_weighted
        self.max_candidates = max_candidates
        self.min_token_prob = min_token_prob
        self.max_spec_factor = max_spec_factor
        self.recent = recent
        self.recent_spec_factor = recent_spec_factor
        self.recent_gate = recent_gate

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        if budget <= 0:
            return EMPTY
        return self.against_recent(self._from_index(context, budget), context, budget)

    def against_recent(self, own: Draft, context: Sequence[int], budget: int) -> Draft:
        """The better of `own` (the prompt's index's draft for `context`) and the cross-prompt tree's."""
        best = own
        if self.recent is not None and asks_tree(own.score, budget, self.recent_gate):
            other = Draft(*self.recent.speculate(context, budget, self.recent_spec_factor, self.min_token_prob))
            if other.score > best.score:
                best = other
        return best if best.tokens else EMPTY

    def _from_index(self, context: Sequence[int], budget: int) -> Draft:
        n, codes = self.index.recent_match(context, self.max_candidates)
        if not codes:
            return EMPTY
        if self.max_spec_factor > 0:  # a short match earns a short draft
            budget = min(budget, int(self.max_spec_factor * n))
            if budget <= 0:
                return EMPTY
        tokens, probs = follow(self.index, codes, budget, self.reward_weighted, self.min_token_prob)
        return Draft(tuple(tokens), n, sum(probs), tuple(probs)) if tokens else EMPTY


def asks_tree(own_score, budget, gate: float):
    """Whether a request whose own draft scores `own_score` asks the cross-prompt tree (see
    `SpecConfig.recent_gate`): its own draft expects fewer than gate x budget accepted tokens.
    Scalars, or numpy arrays of a batch's rows (then an array of bools)."""
    return own_score < gate * budget


def follow(index: Index, codes: Sequence[int], budget: int, reward_weighted: bool,
           min_token_prob: float = 0.0) -> tuple[list[int], list[float]]:
    """Walk the continuations at `codes` for up to `budget` tokens, branching to the best group;
    the tokens and each one's estimated probability (their sum is the draft's score).

    The continuations are sorted lexicographically, so those sharing a prefix are contiguous and a
    group agrees on a stretch exactly when its first and last members do: agreement runs cost one
    C-level slice comparison, and Python work is spent only where the history branches.
    A token's estimated probability is m / (m + PRIOR) for the m continuations followed, times the
    chosen groups' shares of the continuations at each branch so far (as a suffix tree estimates
    it); with `min_token_prob` the draft stops before a token whose probability falls below it.
    """
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
    conts = [conts[i] for i in order]
    kept = [kept[i] for i in order]
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


def _best_group(index: Index, conts: list[list[int]], codes: list[int], lo: int, hi: int,
                depth: int, reward_weighted: bool) -> tuple[int, int]:
    """The [lo, hi) run of `conts` sharing the best token at `depth`.

    Best = most occurrences (reward-weighted: highest reward sum, then most occurrences), ties to
    the group holding the most recent occurrence (highest code: later sequence, then later position).
    `codes` are the occurrence codes of `conts`.
    """
    best_key, best = None, (lo, hi)
    j = lo
    while j < hi:
        tok, start = conts[j][depth], j
        while j < hi and conts[j][depth] == tok:
            j += 1
        count, latest = j - start, max(codes[start:j])
        reward = 0.0
        if reward_weighted:  # summed oldest first, whatever the continuations' order (as the kernel sums)
            for code in sorted(codes[start:j]):
                reward += index.reward_of(code)
        key = (reward, count, latest) if reward_weighted else (count, latest)
        if best_key is None or key > best_key:
            best_key, best = key, (start, j)
    return best


class NgramDrafter:
    """Prompt lookup within the context itself (vLLM's n-gram method), for offline comparison:
    the earliest earlier occurrence of the longest tail (min_match..max_match tokens)."""

    def __init__(self, min_match: int = 3, max_match: int = 7) -> None:
        self.min_match = min_match
        self.max_match = max_match

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
