"""A tiny real run (Prefect harness, Ray, 2 vLLM engines on CPU) with tier 2 placement and
straggler migration forced on: every step still has exactly prompts x n rows, each sample index
once, and every migrated row joins its prefix and continuation with one log-prob per token.
Streamed training is on too (train.stream: groups, migrated samples among them, train while the
tail generates): every step takes its update from the stream, and the engines get its weights."""

import pytest

pytestmark = pytest.mark.slow


def test_forced_migration_keeps_every_sample_once(prefect_harness, local_ray, tiny_model, tmp_path, monkeypatch):

    from flows.run import run_flow
    from rhymerl.config.run import config_to_dict, load_config
    from storage.lake import Lake

    monkeypatch.chdir(tmp_path)
    prompts, n, lake_url = 8, 4, str(tmp_path / "lake")
    cfg = load_config(None, [
        f'model.path="{tiny_model}"', "epochs=1", f"data.num_prompts={prompts}",
        "rollout.prompts_per_step=4", f"rollout.n={n}", "rollout.num_workers=2", "rollout.max_tokens=64",
        # Threshold 0 and the whole step as "tail": any running request may move once a worker idles.
        "pipe.policy=tier2", "pipe.migrate=true", "pipe.migrate_threshold=0.0", "pipe.migrate_tail=1.0",
        "pipe.migrate_per_worker=4", "pipe.gantt=false", "checkpoint.every_steps=0", "train.stream=true",
        f'lake.url="{lake_url}"', f'tracking.uri="sqlite:///{tmp_path / "mlflow.db"}"',
    ])
    result = run_flow(config=config_to_dict(cfg))

    lake = Lake(lake_url)
    per_step = lake.sql("SELECT step, count(*) AS rows, count(DISTINCT (prompt_id, sample_idx)) AS keys, "
                        "min(sample_idx) AS lo, max(sample_idx) AS hi, sum(migrations) AS moved "
                        "FROM rollouts GROUP BY step ORDER BY step").to_pylist()
    assert [(r["rows"], r["keys"], r["lo"], r["hi"]) for r in per_step] == [(4 * n, 4 * n, 0, n - 1)] * 2
    migrated = lake.sql("SELECT * FROM rollouts WHERE migrations = 1").to_pylist()
    assert migrated, "no request migrated although every running request qualified"
    for row in migrated:
        assert len(row["response_token_ids"]) == len(row["logprobs"]) == row["length"] >= 2
        assert row["migrated_from_worker"] != row["worker_id"]
        assert row["gen_start"] < row["migrated_at"] < row["gen_end"]
    steps = lake.sql("SELECT step, migrations, reward_s, reward_total_s FROM steps ORDER BY step").to_pylist()
    assert [s["migrations"] for s in steps] == [int(r["moved"]) for r in per_step]
    assert all(s["reward_total_s"] > 0 for s in steps)
    hist = result["history"]
    assert [h["train_streamed"] for h in hist] == [1.0, 1.0]
    assert all(h["engine_fingerprint"] == pytest.approx(h["trainer_fingerprint"], rel=1e-6) for h in hist)
