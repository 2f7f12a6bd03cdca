"""End to end: a tiny 2-epoch run through the real flow (Prefect harness, Ray local, vLLM on CPU).

The lake is on S3 over HTTP (moto, started by conftest), the harder of the two backends; the
slow resume, recovery, migration and benchmark tests run on local lakes, and the lake protocol
tests run on both. The run also evaluates a held-out set (`eval.*`) before its first epoch and after
its last."""

import json

import pytest

pytestmark = pytest.mark.slow


def test_two_epoch_run(prefect_harness, local_ray, tiny_model, s3_url, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from flows.run import run_flow
    from rhymerl.config.run import config_to_dict, load_config
    from rhymerl.policy.lr_schedule import lr_at
    from storage.lake import Lake

    monkeypatch.chdir(tmp_path)
    prompts, per_step, n = 6, 3, 4
    held_out = _held_out_set(tmp_path / "held_out.jsonl", trained=prompts, rows=3)
    cfg = load_config(None, [
        f'eval.dataset="{held_out}"', "eval.max_tokens=32",
        f'model.path="{tiny_model}"', "epochs=2", f"data.num_prompts={prompts}",
        f"rollout.prompts_per_step={per_step}", f"rollout.n={n}", "rollout.num_workers=1",
        "rollout.max_tokens=48", f'lake.url="{s3_url}"',
        f'tracking.uri="sqlite:///{tmp_path / "mlflow.db"}"', "train.lr=1e-2",
        # A barely trained model may score 0 on every sample (zero advantages, zero gradient);
        # decoupled weight decay still moves the weights each step, so the sync path is exercised.
        "train.weight_decay=0.5", 'train.lr_schedule="cosine"', "train.warmup_steps=1",
    ])
    result = run_flow(config=config_to_dict(cfg))

    lake = Lake(s3_url)
    counts = lake.sql("SELECT epoch, step, count(*) AS n FROM rollouts GROUP BY ALL ORDER BY ALL").to_pylist()
    # Every step of every epoch has exactly prompts_per_step x n rows.
    assert counts == [{"epoch": e, "step": s, "n": per_step * n} for e in range(2) for s in range(2)]
    assert lake.sql("SELECT count(*) AS n FROM steps").to_pylist() == [{"n": 4}]
    hist = result["history"]
    assert len(hist) == 4
    # The engine's weights change after every step (weight sync reached vLLM).
    prints = [result["initial_engine_fingerprint"]] + [h["engine_fingerprint"] for h in hist]
    assert all(a != b for a, b in zip(prints, prints[1:]))
    # ...and the engine holds exactly the trainer's weights (same sum up to summation order).
    assert all(h["engine_fingerprint"] == pytest.approx(h["trainer_fingerprint"], rel=1e-6) for h in hist)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(result["mlflow_run_id"])
    assert run.data.params["rollout.n"] == str(n)
    assert len(client.get_metric_history(run.info.run_id, "reward_mean")) == 4
    assert [r["status"] for r in lake.sql("SELECT status FROM runs").to_pylist()] == ["finished"]
    # The learning rate of each step, in MLflow: warm-up, then a half cosine over the run's 4 steps.
    lrs = sorted(client.get_metric_history(run.info.run_id, "train_lr"), key=lambda m: m.step)
    assert [m.value for m in lrs] == pytest.approx([lr_at(g, 4, 1e-2, "cosine", 1) for g in range(4)])
    _check_export(result, s3_url, run, tmp_path)
    # HistoSpec is on by default, verified by the exact (lossless) verifier: siblings in epoch 0,
    # history from epoch 1 (every prompt has its epoch-0 responses), acceptance in MLflow and the lake.
    assert run.data.params["speculation.verifier"] == "rhymerl-exact"
    assert len(client.get_metric_history(run.info.run_id, "spec/mean_accepted_length")) == 4
    per_epoch = client.get_metric_history(run.info.run_id, "epoch/spec_accepted_len")
    assert sorted(m.step for m in per_epoch) == [0, 1] and all(m.value >= 1.0 for m in per_epoch)
    # Each step's workers receive only that step's prompts: none has history in epoch 0, all do in 1.
    with_history = client.get_metric_history(run.info.run_id, "spec/history_prompts_with_history")
    assert [m.value for m in sorted(with_history, key=lambda m: m.step)] == [0, 0, per_step, per_step]
    # Epoch 1's history and first plan were prepared during epoch 0's last step (tasks.spec.prepare_epoch_task)
    assert "spec/history_prepared_s" not in hist[0] and hist[2]["spec/history_prepared_s"] > 0
    spec_rows = lake.sql("SELECT spec_method, spec_steps, spec_tokens, spec_accepted FROM steps").to_pylist()
    row = lake.sql("SELECT sum(length) - count(*) AS d, count(*) AS r FROM rollouts").to_pylist()[0]
    decoded, responses = int(row["d"]), int(row["r"])
    assert {r["spec_method"] for r in spec_rows} == {"histospec"}
    # Every decoded token is counted once: the drafter's counters add up to the lake's lengths
    # less each response's first token (sampled by the prefill step, which verifies no draft),
    # plus what a response's last step accepted past its stop (EOS or max_tokens), which the
    # engine drops: at most one draft's worth per response.
    counted = sum(r["spec_tokens"] for r in spec_rows)
    assert decoded <= counted <= decoded + responses * cfg.spec.max_budget
    assert counted - decoded < 0.05 * decoded
    assert all(r["spec_tokens"] == r["spec_steps"] + r["spec_accepted"] for r in spec_rows)
    _check_evaluations(lake, client, result, rows=3)


def _held_out_set(path, trained: int, rows: int):
    """A GSM8K-format file of built-in problems the run does not train on."""
    from rhymerl.data.builtin import builtin_problems

    seen = {p.question for p in builtin_problems(num=trained, seed=0)}
    extra = [p for p in builtin_problems(num=trained + 3 * rows, seed=0) if p.question not in seen][:rows]
    path.write_text("".join(json.dumps({"question": p.question, "answer": p.solution}) + "\n" for p in extra))
    return path


def _check_evaluations(lake, client, result, rows: int) -> None:
    """Evaluations before the first epoch and after the last: in the evals table (once each, the
    weights of that moment), in MLflow at those global steps, and never in training's data or history."""
    run_id, mlflow_run = result["run_id"], result["mlflow_run_id"]
    got = lake.sql("SELECT epoch, global_step, policy_version, count(*) AS n, count(DISTINCT prompt_id) AS p "
                   "FROM evals GROUP BY ALL ORDER BY epoch").to_pylist()
    assert got == [{"epoch": -1, "global_step": 0, "policy_version": 0, "n": rows, "p": rows},
                   {"epoch": 1, "global_step": 4, "policy_version": 4, "n": rows, "p": rows}]
    assert [(e["epoch"], e["global_step"]) for e in result["evals"]] == [(-1, 0), (1, 4)]
    leaked = lake.sql("SELECT count(*) AS n FROM rollouts r JOIN evals e ON r.prompt_id = e.prompt_id "
                      "OR r.prompt_text = e.prompt_text").to_pylist()
    assert leaked == [{"n": 0}]
    history = lake.prompt_history(run_id, 2, 2).column("prompt_id").to_pylist()  # what a 3rd epoch would draft from
    eval_ids = {r["prompt_id"] for r in lake.sql("SELECT DISTINCT prompt_id FROM evals").to_pylist()}
    assert history and not eval_ids & set(history)
    for name in ("eval/reward", "eval/reward/gsm8k", "eval/accuracy", "eval/mean_tokens"):
        points = sorted((m.step, m.value) for m in client.get_metric_history(mlflow_run, name))
        assert [s for s, _ in points] == [0, 4], name
    table = lake.sql("SELECT avg(reward) AS r, avg(tokens) AS t FROM evals WHERE epoch = 1").to_pylist()[0]
    assert result["evals"][1]["eval/reward"] == pytest.approx(table["r"])
    assert result["evals"][1]["eval/mean_tokens"] == pytest.approx(table["t"])


def _check_export(result, lake_url, mlflow_run, tmp_path):
    """The final model is at <lake>/_exports/<run_id>, named in MLflow, and holds the weights of
    the run's last checkpoint (written after the last step): what `from_pretrained` loads."""
    import fsspec
    import torch
    from transformers import AutoModelForCausalLM

    from rhymerl.policy.export import state_weights
    from storage.checkpoints import CheckpointStore

    url = f"{lake_url}/_exports/{result['run_id']}"
    assert result["export"] == url and mlflow_run.data.tags["rhymerl.export"] == url
    fs, path = fsspec.core.url_to_fs(url)
    fs.get(path, str(tmp_path / "export"), recursive=True)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "export")
    last = CheckpointStore(f"{lake_url}/_checkpoints").latest(result["run_id"])
    assert last.global_step == 3
    for name, tensor in state_weights(last.trainer_state, "last checkpoint").items():
        assert torch.equal(model.state_dict()[name], tensor), name
