"""The steps-table row a flow step record becomes (`tasks.report.step_row`)."""

from __future__ import annotations

from rhymerl.histospec.stats import SpecStats
from storage.schema import STEPS_SCHEMA, rows_to_table
from tasks.report import step_row

BASE = {"epoch": 0, "step": 0, "policy_version": 1, "rollout_s": 1.0, "reward_s": 0.1, "train_s": 0.5,
        "sync_s": 0.2, "lake_s": 0.05, "step_s": 2.0, "reward_mean": 0.5, "accuracy": 0.25,
        "length_mean": 120.0, "length_max": 900.0, "tokens": 480.0, "rollout_tokens_per_s": 480.0}


def test_response_position_counts_become_list_columns_in_bucket_order():
    stats = SpecStats()
    for drafted, accepted in ((4, 3), (4, 0), (0, 0)):
        stats.record(drafted, accepted)
    stats.record_positions([5, 1200, 150], [3, 0, 0])  # [0,100): 4 tokens; [100,300): 1; 1000+: 1
    row = step_row({**BASE, **stats.as_metrics("spec/")}, "histospec")
    assert row["spec_steps_by_response_pos"] == [1, 1, 0, 1]
    assert row["spec_tokens_by_response_pos"] == [4, 1, 0, 1]
    assert (row["spec_steps"], row["spec_tokens"], row["spec_method"]) == (3, 6, "histospec")
    table = rows_to_table([{**row, "run_id": "r", "epoch": 0, "step": 0}], STEPS_SCHEMA)  # as the lake writes it
    assert table.column("spec_tokens_by_response_pos").to_pylist() == [[4, 1, 0, 1]]


def test_counters_without_positions_leave_the_columns_null():
    # Rule: vLLM's own drafters' counters (`stats_from_counters`) carry no positions.
    stats = SpecStats(steps=10, tokens=25, drafts=10, drafted=40, accepted=15)
    row = step_row({**BASE, **stats.as_metrics("spec/")}, "ngram")
    assert "spec_steps_by_response_pos" not in row and row["spec_tokens"] == 25
    assert "spec_steps_by_response_pos" not in step_row(BASE)  # speculation off
