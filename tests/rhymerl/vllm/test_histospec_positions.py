"""The engine's drafter counts each verification step at the response position it came at."""

from __future__ import annotations

import numpy as np

from rhymerl.histospec.bundle import HistoryBundle, PromptHistory
from rhymerl.config.spec import SpecConfig
from rhymerl.histospec.engine.step_drafter import BatchDrafter

PROMPT, PATTERN = (50, 51), (1, 2, 3, 4, 5, 6, 7, 8)


def test_a_step_counts_at_the_tokens_its_request_had_written():
    bundle = HistoryBundle.of((PromptHistory(PROMPT, (PATTERN * 5,), (1.0,)),))
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


def test_a_migrated_request_counts_its_prefix_and_an_unknown_prompt_counts_its_prompt():
    bundle = HistoryBundle.of((PromptHistory(PROMPT, (PATTERN * 5,), (1.0,)),))
    batch = BatchDrafter(bundle, SpecConfig(recent_responses=0, cost_aware=False), k=4, max_model_len=256)
    rows = np.zeros((2, 256), dtype=np.int64)
    moved = [*PROMPT, *(100 + np.arange(150) % 7)]  # arrives 150 tokens in, written on another worker
    unknown = [60, 61, 62, *(200 + np.arange(98) % 5)]  # a prompt not in the bundle, 98 tokens in
    rows[0, :152], rows[1, :101] = moved, unknown
    batch.propose([[moved[-1]], [unknown[-1]]], np.array([152, 101]), rows)  # first seen: nothing to count
    rows[0, 152], rows[1, 101] = 9, 9
    batch.propose([[9], [9]], np.array([153, 102]), rows)  # one token each: no draft token accepted
    # the moved request at 152 - 2 = 150; the unknown prompt at 101 (plen 0: its 3 prompt tokens count)
    assert batch.stats.pos_steps == [0, 2, 0, 0] and batch.stats.pos_tokens == [0, 2, 0, 0]
