"""`rhymerl bench history-bytes` on a small lake: per-worker cuts hold a fraction of the epoch bundle."""

from __future__ import annotations

from bench.history_bytes_bench import format_table, measure
from storage.lake import LakeWriter, rows_to_table


def test_per_worker_step_bundles_are_smaller_than_the_epoch_bundle(tmp_path):
    # 2 epochs x 2 steps x 2 workers, one prompt each: every worker-step bundle holds 1 of 4 prompts.
    url = str(tmp_path / "lake")
    w = LakeWriter(url)
    for epoch in range(2):
        for step in range(2):
            rows = [{"run_id": "r", "epoch": epoch, "step": step, "prompt_id": f"p{2 * step + wk}", "sample_idx": k,
                     "prompt_text": f"q{2 * step + wk}\n", "response_token_ids": [wk + 1] * 500, "reward": 1.0,
                     "length": 500, "worker_id": wk} for wk in range(2) for k in range(4)]
            w.commit_step("r", epoch, step, [w.write_rollouts("r", epoch, step, 0, 0, rows_to_table(rows))])
    result = measure(url, None)
    [row] = result["epochs"]
    assert result["run_id"] == "r" and result["workers"] == 2 and row["steps"] == 2 and row["prompts"] == 4
    assert row["after_bytes_per_worker_per_step_max"] < row["before_bytes_per_worker_per_epoch"] / 2
    assert "| 1 |" in format_table(result)
