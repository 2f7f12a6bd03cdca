"""Cost-aware trimming in the engine's drafter keeps the drafts of the requests forecast to finish
last (DAS-style length-aware speculation) and cuts the others on a compute-bound batch."""

from __future__ import annotations

import numpy as np

from rhymerl.histospec.bundle import HistoryBundle, PromptHistory
from rhymerl.config.spec import SpecConfig
from rhymerl.histospec.goodput import MIN_OBSERVATIONS
from rhymerl.histospec.engine.step_drafter import BatchDrafter

LONG, SHORT = (50, 51), (60, 61)
PATTERN = (1, 2, 3, 4, 5, 6, 7, 8)


def _batch(tail_fraction: float) -> BatchDrafter:
    # Both prompts' histories repeat PATTERN; the long prompt's responses ran 40 tokens, the short one's 9.
    bundle = HistoryBundle.of((PromptHistory(LONG, (PATTERN * 5,), (1.0,)), PromptHistory(SHORT, (PATTERN + (9,),), (1.0,))))
    spec = SpecConfig(recent_responses=0, max_spec_factor=0.0, tail_fraction=tail_fraction)
    batch = BatchDrafter(bundle, spec, k=4, max_model_len=64)
    for _ in range(MIN_OBSERVATIONS):  # a compute-bound engine: every token costs as much as the step
        batch.cost.observe(2, 10, 10.0)  # steps of the two rows proposed below
        batch.cost.observe(2, 20, 20.0)
    return batch


def _drafts(batch: BatchDrafter) -> list[list[int]]:
    rows = np.zeros((2, 64), dtype=np.int64)
    rows[0, :4] = [*LONG, 1, 2]
    rows[1, :4] = [*SHORT, 1, 2]
    return batch.propose([[2], [2]], np.array([4, 4]), rows)


def test_the_request_forecast_to_finish_last_keeps_its_draft():
    # Rule: remaining 38 (long prompt) vs 7 (short one): with tail_fraction 0.5 only the first is
    # in the tail and keeps its whole draft; the knapsack cuts the other's (tokens cost c1 = 1 s,
    # c0 = 0: no draft token pays for itself on throughput alone).
    assert _drafts(_batch(0.5)) == [[3, 4, 5, 6], []]
    assert _drafts(_batch(0.0)) == [[], []]
