"""The one road from the run's `SpecConfig` to an engine's speculative decoding.

`engine_speculation(spec)` turns the user's typed settings into the engine's typed
`EngineSpeculation`; only `EngineSpeculation.speculative_config()` / `.additional_config` become the
dicts vLLM takes, at the moment the engine is built. HistoSpec's own settings ride along in
`additional_config[HISTOSPEC_KEY]` (vLLM builds the proposer inside its worker process from its
`VllmConfig`, so no constructor argument can reach it) and the proposer rebuilds the same
`SpecConfig` from there (`drafter_settings`). The history itself travels separately, as a file
(`histospec_proposer.INDEX_ENV`), because it changes every epoch while the settings do not.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rhymerl.config.spec import SpecConfig, require_arctic_inference
from rhymerl.vllm.spec_guard import EngineSpeculation

PROPOSER_CLASS = "rhymerl.vllm.histospec_proposer.HistoSpecProposer"
HISTOSPEC_KEY = "rhymerl_histospec"  # additional_config key holding the drafter's SpecConfig fields


def engine_speculation(spec: SpecConfig, **guard: Any) -> EngineSpeculation | None:
    """The engine's `EngineSpeculation` for `spec` (None: speculation off).

    `guard` passes `EngineSpeculation`'s start-up check fields (`self_check`, `check_rows`, ...).
    """
    if not spec.enabled:
        return None
    common = dict(num_speculative_tokens=spec.max_budget, verifier=spec.verifier, **guard)
    gate = dict(goodput_memory=spec.cost_memory if spec.cost_aware else 0,  # stock drafters: the controller
                goodput_by_rows=spec.cost_by_rows, goodput_switch=spec.switch)
    if spec.method == "ngram":
        return EngineSpeculation("ngram", options=(("prompt_lookup_max", spec.max_match),
                                                   ("prompt_lookup_min", spec.min_match)), **gate, **common)
    if spec.method == "suffix":  # vLLM's stock suffix decoding; drafts of up to max_budget tokens
        require_arctic_inference()  # fail here, naming the fix, not inside the engine's worker
        return EngineSpeculation("suffix", **gate, **common)
    return EngineSpeculation("custom_class", model=PROPOSER_CLASS,
                             additional_config=((HISTOSPEC_KEY, dataclasses.asdict(spec)),), **common)


def drafter_settings(additional_config: dict | None, num_speculative_tokens: int) -> SpecConfig:
    """The `SpecConfig` `engine_speculation` sent (inside the engine's worker); stock settings capped
    at the engine's `num_speculative_tokens` when an engine was built without them (tests, tools)."""
    fields = (additional_config or {}).get(HISTOSPEC_KEY)
    return SpecConfig(**fields) if fields else SpecConfig(max_budget=num_speculative_tokens)


__all__ = ["HISTOSPEC_KEY", "PROPOSER_CLASS", "drafter_settings", "engine_speculation"]
