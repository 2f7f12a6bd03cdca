"""The engine's drafter counts each verification step at the response position it came at."""

from __future__ import annotations

import numpy as np

from rhymerl.histospec.drafter import SpecConfig
from rhymerl.histospec.index import HistoryBundle, PromptHistory
from rhymerl.vllm.histospec_proposer import BatchDrafter

PROMPT, PATTERN = (50, 51), (1, 2, 3, 4, 5, 6, 7, 8)


def test_a_step_counts_at_the_tokens_its_request_had_written():
    bundle = HistoryBundle((PromptHistory(PROMPT, (PATTERN * 5,), (1.0,)),))
    batch = BatchDrafter(bundle, SpecConfig(recent_responses=0, cost_aware=False), k=4, max_model_len=64)
    rows = np.zeros((2, 64), dtype=np.int64)
    rows[:, :4] = [*PROMPT, 1, 2]  # two samples of the prompt, 2 response tokens written
    first = batch.propose([[2], [2]], np.array([4, 4]), rows)
    assert first == [[3, 4, 5, 6], [3, 4, 5, 6]]
    rows[0, 4:7] = [3, 4, 9]  # request 0: 2 draft tokens accepted + a correction
    rows[1, 4:5] = [7]  # request 1: none accepted, the correction only
    batch.propose([[3, 4, 9], [7]], np.array([7, 5]), rows)
    stats = batch.stats
    assert (stats.steps, stats.tokens) == (2, 4)
    assert stats.pos_steps == [2, 0, 0, 0] and stats.pos_tokens == [4, 0, 0, 0]  # both at position 2
