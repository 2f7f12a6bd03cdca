"""End to end on the long-tail task: configs/long-tail.toml, shrunk, through the real flow (Prefect
harness, Ray local, vLLM on CPU) with HistoSpec and HistoPipe on.

The model is a barely trained long-task build (a few SFT steps on short chains, seconds): what it
learns does not matter here; that the config's task, model family and sizes run end to end does."""

from dataclasses import replace

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_long_model(tmp_path_factory):
    from rhymerl.policy.build import build_model
    from rhymerl.policy.long_build import LongBuildSettings

    spec = replace(LongBuildSettings(), steps=8, batch_size=8, max_steps=24, long_steps=2, long_batch_size=2,
                   eval_problems=0)
    return build_model(tmp_path_factory.mktemp("model") / "tiny-long", spec, progress=False)


def test_long_tail_config_runs_end_to_end(prefect_harness, local_ray, tiny_long_model, tmp_path, monkeypatch):
    from pathlib import Path

    from mlflow.tracking import MlflowClient

    from flows.run import run_flow
    from rhymerl.config.run import config_to_dict, load_config
    from rhymerl.data.long import parse_long_question
    from storage.lake import Lake

    config = Path(__file__).resolve().parents[2] / "configs" / "long-tail.toml"
    monkeypatch.chdir(tmp_path)
    prompts, per_step, n = 4, 2, 4
    cfg = load_config(config, [
        f'model.path="{tiny_long_model}"', "epochs=2", f"data.num_prompts={prompts}",
        f"rollout.prompts_per_step={per_step}", f"rollout.n={n}", "rollout.num_workers=1",
        "rollout.max_tokens=64", f'lake.url="{tmp_path / "lake"}"',
        f'tracking.uri="sqlite:///{tmp_path / "mlflow.db"}"',
        "recovery.restart_timeout_s=1200",  # engines took > 600 s to start at load average ~25
    ])
    assert (cfg.data.dataset, cfg.pipe.policy, cfg.spec.enabled) == ("builtin-long", "lpt", True)
    result = run_flow(config=config_to_dict(cfg))

    lake = Lake(str(tmp_path / "lake"))
    counts = lake.sql("SELECT epoch, step, count(*) AS n FROM rollouts GROUP BY ALL ORDER BY ALL").to_pylist()
    assert counts == [{"epoch": e, "step": s, "n": per_step * n} for e in range(2) for s in range(2)]
    assert len(result["history"]) == 4
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(result["mlflow_run_id"])
    assert run.data.params["data.dataset"] == "builtin-long"
    assert run.data.params["speculation.verifier"] == "rhymerl-exact"
    assert len(client.get_metric_history(run.info.run_id, "reward_mean")) == 4
    # The prompts are the long task's questions, and HistoSpec drafted in every step.
    texts = [r["prompt_text"] for r in lake.sql("SELECT DISTINCT prompt_text FROM rollouts").to_pylist()]
    assert len(texts) == prompts and all(parse_long_question(t.strip()) for t in texts)
    spec_rows = lake.sql("SELECT spec_method, spec_steps FROM steps").to_pylist()
    assert {r["spec_method"] for r in spec_rows} == {"histospec"} and all(r["spec_steps"] > 0 for r in spec_rows)
    assert [r["status"] for r in lake.sql("SELECT status FROM runs").to_pylist()] == ["finished"]

