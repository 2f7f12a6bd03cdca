"""HistoSpec: lossless speculative rollouts drafted from each prompt's own earlier responses.

Pure core (no engine imports): `index` (per-prompt n-gram occurrence index and the history bundle
that carries it to rollout workers), `drafter` (drafting, budget rules, `SpecConfig`, `SpecStats`),
`replay` (offline acceptance on recorded responses). `vllm_drafter` is the adapter that plugs the
drafter into vLLM as a `custom_class` proposer; it imports vLLM only when vLLM builds it.
"""

from rhymerl.histospec.drafter import (BUDGET_RULES, Draft, Drafter, HistoSpecDrafter, NgramDrafter,
                                       SpecConfig, SpecStats)
from rhymerl.histospec.index import HistoryBundle, PromptHistory, SuffixIndex

__all__ = ["BUDGET_RULES", "Draft", "Drafter", "HistoSpecDrafter", "HistoryBundle", "NgramDrafter",
           "PromptHistory", "SpecConfig", "SpecStats", "SuffixIndex"]
