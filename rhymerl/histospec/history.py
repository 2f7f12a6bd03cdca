"""An epoch's history bundle from lake rows, and the engine settings that use it.

Before each epoch the run asks the lake (`storage.lake.Lake.prompt_history`) for every response of
the last `SpecConfig.history_epochs` epochs that saw each prompt; `bundle_for_epoch` turns those
rows into the `HistoryBundle` that rollout workers hand to their drafter. Every prompt of the epoch
is in the bundle, with or without history: the drafter only recognises bundled prompts, and
sibling drafts (the current group's own responses) need that from the first epoch on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from rhymerl.histospec.drafter import SpecConfig
from rhymerl.histospec.index import HistoryBundle, PromptHistory
from rhymerl.records import Prompt


@dataclass(frozen=True)
class BundleInfo:
    """What an epoch's bundle holds (for logs, MLflow and the steps table)."""

    prompts: int
    prompts_with_history: int
    responses: int
    tokens: int  # response tokens in the bundle
    bytes: int
    build_s: float

    def as_metrics(self, prefix: str = "spec/history_") -> dict[str, float]:
        return {f"{prefix}{k}": float(v) for k, v in self.__dict__.items()}


def bundle_for_epoch(prompts: Sequence[Prompt],
                     history: Mapping[str, Sequence[Any]]) -> tuple[bytes, BundleInfo]:
    """Serialised bundle for `prompts` from history columns, and what it holds.

    `history` holds equal-length columns `prompt_id`, `response_token_ids` and `reward` (rows of
    any prompt not in `prompts` are ignored; a NULL reward counts as 0). The drafter's settings
    do not travel here: the engine gets them once (`rhymerl.vllm.speculation`).
    """
    t0 = time.perf_counter()
    ids, responses = history.get("prompt_id", ()), history.get("response_token_ids", ())
    rewards = history.get("reward", ())
    if not len(ids) == len(responses) == len(rewards):
        raise ValueError(f"history columns differ in length: prompt_id {len(ids)}, "
                         f"response_token_ids {len(responses)}, reward {len(rewards)}")
    by_prompt: dict[str, tuple[list, list]] = {p.prompt_id: ([], []) for p in prompts}
    for pid, tokens, reward in zip(ids, responses, rewards):
        slot = by_prompt.get(pid)
        if slot is not None and tokens:
            slot[0].append(tuple(int(t) for t in tokens))
            slot[1].append(float(reward or 0.0))
    entries = tuple(PromptHistory(tuple(p.token_ids), tuple(by_prompt[p.prompt_id][0]),
                                  tuple(by_prompt[p.prompt_id][1])) for p in prompts)
    blob = HistoryBundle(entries).to_bytes()
    info = BundleInfo(
        prompts=len(entries), prompts_with_history=sum(1 for e in entries if e.responses),
        responses=sum(len(e.responses) for e in entries),
        tokens=sum(len(r) for e in entries for r in e.responses), bytes=len(blob),
        build_s=time.perf_counter() - t0)
    return blob, info


def merge_history(own: Mapping[str, Sequence[Any]], warm: Mapping[str, Sequence[Any]]) -> dict[str, list]:
    """History columns: `own` rows, plus `warm` rows of prompts that have no row in `own`.

    A prompt's own history always wins over a warm start's: it comes from the current policy.
    """
    names = ("prompt_id", "response_token_ids", "reward")
    have = set(own.get("prompt_id", ()))
    keep = [i for i, pid in enumerate(warm.get("prompt_id", ())) if pid not in have]
    return {k: list(own.get(k, ())) + [warm[k][i] for i in keep] for k in names}


def uses_bundle(spec: SpecConfig) -> bool:
    """True when the engine's drafter is HistoSpec's and so needs a bundle each epoch."""
    return spec.enabled and spec.method == "histospec"


def counted_by_vllm(spec: SpecConfig) -> bool:
    """True when the engine's acceptance counters come from vLLM's metrics (its own drafters), so the
    engine needs `EngineSettings.log_stats`; HistoSpec counts for itself."""
    return spec.enabled and spec.method in ("ngram", "suffix")


__all__ = ["BundleInfo", "bundle_for_epoch", "counted_by_vllm", "merge_history",
           "uses_bundle"]
