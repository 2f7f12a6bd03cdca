"""A history bundle from Python rows, and the engine settings that use a bundle.

The run itself asks the lake (`storage.lake.Lake.prompt_history`) once per epoch for every response
of the last `SpecConfig.history_epochs` epochs that saw each prompt, as Arrow, and cuts each worker's
bundle for each step from those columns (`rhymerl.histospec.columns`, `tasks.spec`).
`bundle_for_epoch` makes the same bundle from Python lists (tests, benchmarks). Every prompt asked
for is in the bundle, with or without history: the drafter only recognises bundled prompts, and
sibling drafts (the current group's own responses) need that from the first epoch on.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from rhymerl.histospec.columns import BundleInfo, HistoryColumns, HistorySlicer
from rhymerl.histospec.spec_config import SpecConfig
from rhymerl.data.records import Prompt


def bundle_for_epoch(prompts: Sequence[Prompt],
                     history: Mapping[str, Sequence[Any]]) -> tuple[bytes, BundleInfo]:
    """Serialised bundle for `prompts` from Python history columns, and what it holds (tests and
    benchmarks; the run cuts its bundles from Arrow columns, `rhymerl.histospec.columns`).

    `history` holds equal-length columns `prompt_id`, `response_token_ids` and `reward` (rows of
    any prompt not in `prompts` are ignored; a NULL reward counts as 0). The drafter's settings
    do not travel here: the engine gets them once (`rhymerl.vllm.speculation`).
    """
    blob, info = HistorySlicer(HistoryColumns.from_lists(history)).bundle(prompts)
    return blob.tobytes(), info


def uses_bundle(spec: SpecConfig) -> bool:
    """True when the engine's drafter is HistoSpec's and so needs a bundle each epoch."""
    return spec.enabled and spec.method == "histospec"


def counted_by_vllm(spec: SpecConfig) -> bool:
    """True when the engine's acceptance counters come from vLLM's metrics (its own drafters), so the
    engine needs `EngineSettings.log_stats`; HistoSpec counts for itself."""
    return spec.enabled and spec.method in ("ngram", "suffix")


__all__ = ["BundleInfo", "bundle_for_epoch", "counted_by_vllm", "uses_bundle"]
