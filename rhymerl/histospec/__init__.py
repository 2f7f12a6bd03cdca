"""HistoSpec: lossless speculative rollouts drafted from each prompt's own earlier responses.

Pure core (no engine imports): `index` (per-prompt n-gram occurrence index and the history bundle
that carries it to rollout workers), `drafter` (drafting),
`spec_config` (`SpecConfig`, a run's `spec.*` settings), `tree` (the cross-prompt
tree of recent responses, on Arctic Inference's suffix tree), `budget` (budget rules), `stats`
(`SpecStats`), `replay` (offline acceptance on recorded responses). The vLLM adapter
(`rhymerl.vllm.histospec_proposer`) plugs the drafter into vLLM as a `custom_class` proposer.
"""

from rhymerl.histospec.compiled import fresh_cache

fresh_cache()  # before any compiled module loads its numba cache (see rhymerl.histospec.compiled)

from rhymerl.histospec.budget import BUDGET_RULES
from rhymerl.histospec.drafter import Draft, Drafter, HistoSpecDrafter, NgramDrafter
from rhymerl.histospec.index import HistoryBundle, PromptHistory, SuffixIndex
from rhymerl.histospec.spec_config import SpecConfig
from rhymerl.histospec.stats import SpecStats

__all__ = ["BUDGET_RULES", "Draft", "Drafter", "HistoSpecDrafter", "HistoryBundle", "NgramDrafter",
           "PromptHistory", "SpecConfig", "SpecStats", "SuffixIndex"]
