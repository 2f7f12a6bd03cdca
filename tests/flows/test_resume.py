"""Resuming a run: the pure decisions (next step, reused lake rows) and one end-to-end resume."""

from __future__ import annotations

import pytest
from helpers.proc import kill_and_wait

from rhymerl.data.rewards import RewardScore
from rhymerl.data.records import Prompt
from rhymerl.run.resume import plan_resume, prompts_digest, samples_from_rows


def _prompt(i: int) -> Prompt:
    return Prompt(prompt_id=f"p{i}", index=i, text=f"q{i}", token_ids=(i + 1,), answer=str(i))


def _rows(prompts, n, version=3):
    # Stored in an order unlike the batch's (the lake gives no order): worker 1 first.
    return [{"prompt_id": p.prompt_id, "sample_idx": k, "response_token_ids": [5, k], "logprobs": [-0.1, -0.2],
             "response_text": f"r{k}", "finish_reason": "stop", "worker_id": 1, "gen_start": 1.0,
             "gen_end": 2.0, "reward": float(k), "correct": k == 1, "reward_values": [("gsm8k", float(k))],
             "policy_version": version} for p in reversed(prompts) for k in reversed(range(n))]


def test_next_step_within_and_across_epochs():
    # Rule: continue right after the checkpointed step; the last step of an epoch rolls over.
    assert plan_resume((0, 0, 0), 2, 2, []) == plan_resume((0, 0, 0), 2, 2, [(0, 0)])
    p = plan_resume((0, 0, 0), 2, 2, [(0, 0)])
    assert (p.epoch, p.step, p.global_step, p.reuse, p.done) == (0, 1, 1, frozenset(), False)
    p = plan_resume((0, 1, 1), 2, 2, [(0, 0), (0, 1)])
    assert (p.epoch, p.step, p.global_step, p.done) == (1, 0, 2, False)


def test_steps_committed_after_the_checkpoint_are_reused():
    # Rule: a crash between lake commit and checkpoint: those steps train on their lake rows.
    p = plan_resume((0, 1, 1), 2, 3, [(0, 0), (0, 1), (1, 0), (1, 1)])
    assert (p.epoch, p.step, p.global_step) == (1, 0, 2)
    assert p.reuse == {(1, 0), (1, 1)}


def test_a_gap_in_committed_steps_is_refused():
    # Rule: step (1, 1) cannot be committed while (1, 0) is not; the lake lost a step.
    with pytest.raises(ValueError, match="a step is missing"):
        plan_resume((0, 1, 1), 2, 3, [(1, 1)])


def test_a_finished_run_has_nothing_left():
    p = plan_resume((1, 1, 3), 2, 2, [(0, 0), (0, 1), (1, 0), (1, 1)])
    assert p.done and p.reuse == frozenset()
    assert not plan_resume((1, 1, 3), 2, 3, []).done  # more epochs asked for: continue


def test_checkpoint_must_fit_the_steps_per_epoch():
    with pytest.raises(ValueError, match="prompts_per_step"):
        plan_resume((0, 5, 5), 2, 2, [])


def test_rows_come_back_in_batch_order():
    # Rule: samples follow the batch's prompt order, then sample_idx; scores line up with them.
    prompts = [_prompt(0), _prompt(1)]
    samples, scores = samples_from_rows(_rows(prompts, 2), prompts, n=2, policy_version=3)
    assert [(s.prompt_id, s.sample_idx) for s in samples] == [("p0", 0), ("p0", 1), ("p1", 0), ("p1", 1)]
    assert samples[1].token_ids == (5, 1) and samples[1].logprobs == (-0.1, -0.2)
    assert scores[:2] == [RewardScore(0.0, {"gsm8k": 0.0}, False), RewardScore(1.0, {"gsm8k": 1.0}, True)]
    # Rows from before the lake kept each function's value (and with no verdict) still read back.
    old = [{**r, "reward_values": None, "correct": None} for r in _rows(prompts, 2)]
    assert samples_from_rows(old, prompts, n=2, policy_version=3)[1][1] == RewardScore(1.0, {}, None)


def test_rows_of_other_prompts_or_policies_are_refused():
    prompts = [_prompt(0), _prompt(1)]
    with pytest.raises(ValueError, match="needs 2 for each of its 2 prompts"):
        samples_from_rows(_rows(prompts[:1], 2), prompts, n=2, policy_version=3)
    with pytest.raises(ValueError, match="off-policy"):
        samples_from_rows(_rows(prompts, 2, version=2), prompts, n=2, policy_version=3)


def test_prompts_digest_depends_on_order():
    a, b = _prompt(0), _prompt(1)
    assert prompts_digest([a, b]) == prompts_digest([a, b]) != prompts_digest([b, a])


# ---------------------------------------------------------------- end to end (slow)

@pytest.mark.slow
def test_crash_after_lake_commit_then_resume(prefect_harness, local_ray, tiny_model, tmp_path, monkeypatch):
    # In-run trainer restarts off, the trainer's process is SIGKILLed before epoch 1: global step 2
    # rolls out and commits its lake rows, then its training fails the run with the exact resume
    # command. The resumed run trains that step on its committed rows and finishes: every step
    # once, every row once, the same steps and policy versions as an uninterrupted run, one MLflow run.
    from mlflow.tracking import MlflowClient

    import flows.run
    from rhymerl.config.run import config_to_dict, load_config
    from rhymerl.policy.lr_schedule import lr_at
    from storage.checkpoints import CheckpointStore, checkpoint_url
    from storage.lake import Lake
    from tasks.ops import latest_run_task, retrain_config_task, retrain_plan_task
    from tasks.recovery import TrainerLost

    import ray

    monkeypatch.chdir(tmp_path)
    per_step, n, lake_url, tracking = 3, 4, str(tmp_path / "lake"), f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_config(None, [
        f'model.path="{tiny_model}"', "epochs=2", "data.num_prompts=6", f"rollout.prompts_per_step={per_step}",
        f"rollout.n={n}", "rollout.num_workers=1", "rollout.max_tokens=48", f'lake.url="{lake_url}"',
        f'tracking.uri="{tracking}"', "train.lr=1e-2", "train.weight_decay=0.5", "pipe.gantt=false",
        "recovery.trainer_restarts=0", 'train.lr_schedule="linear"',
    ])
    real_history, killed = flows.run._epoch_history, []

    def history_killing_the_trainer(ctx, st, epoch, *args):  # the start of an epoch, before its steps
        if epoch == 1 and not killed:  # epoch 1 of the interrupted run
            killed.append(ray.get(st.trainer.info.remote())["pid"])
            kill_and_wait(killed[0])
        return real_history(ctx, st, epoch, *args)

    monkeypatch.setattr(flows.run, "_epoch_history", history_killing_the_trainer)
    with pytest.raises(TrainerLost) as err:
        flows.run.run_flow(config=config_to_dict(cfg))
    [crashed] = Lake(lake_url).sql("SELECT run_id, status FROM runs").to_pylist()
    run_id = crashed["run_id"]
    assert crashed["status"] == "failed"
    assert f"rhymerl run --resume {run_id} --lake {lake_url}" in str(err.value)
    store = CheckpointStore(checkpoint_url(lake_url))
    assert store.steps(run_id) == [0, 1]  # step 2 was committed to the lake, never trained
    assert Lake(lake_url).sql("SELECT DISTINCT epoch, step FROM rollouts ORDER BY ALL").to_pylist() == [
        {"epoch": 0, "step": 0}, {"epoch": 0, "step": 1}, {"epoch": 1, "step": 0}]
    checkpointed = store.latest(run_id).meta["history"][-1]
    monkeypatch.setattr(flows.run, "_epoch_history", real_history)
    result = flows.run.run_flow(config=config_to_dict(cfg), resume=run_id)
    # Retrain: on the same data it continues the run; on new data a new run starts from the
    # newest checkpoint's weights (1 epoch of 3 other prompts).
    latest = latest_run_task(lake_url, cfg.tracking.experiment)
    same = retrain_plan_task(latest, retrain_config_task(latest, 1, None), 1)
    plan = retrain_plan_task(latest, retrain_config_task(latest, 1, ["data.num_prompts=3", "data.seed=5"]), 1)
    warm = flows.run.run_flow(config=plan["config"], resume=plan["resume"])

    assert result["run_id"] == run_id
    lake = Lake(lake_url)
    counts = lake.sql("SELECT epoch, step, count(*) AS n, min(policy_version) AS v0, max(policy_version) AS v1 "
                      "FROM rollouts WHERE run_id = ? GROUP BY epoch, step ORDER BY ALL", [run_id]).to_pylist()
    # Exactly prompts_per_step x n rows per step, each step sampled by the weights after the one before.
    assert counts == [{"epoch": g // 2, "step": g % 2, "n": per_step * n, "v0": g, "v1": g} for g in range(4)]
    assert lake.sql("SELECT count(*) AS n FROM steps WHERE run_id = ?", [run_id]).to_pylist() == [{"n": 4}]
    assert lake.sql("SELECT run_id, status FROM runs ORDER BY started_at").to_pylist() == [
        {"run_id": run_id, "status": "finished"}, {"run_id": warm["run_id"], "status": "finished"}]
    hist = result["history"]
    # What an uninterrupted run of this config has: global step g (epoch g // 2) makes policy g + 1.
    assert [(h["epoch"], h["step"], h["global_step"], h["policy_version"]) for h in hist] == [
        (g // 2, g % 2, g, g + 1) for g in range(4)]
    assert hist[1] == checkpointed
    # The learning rate decays over the run's 4 optimizer steps and goes on where the crash left it.
    assert [h["train_lr"] for h in hist] == pytest.approx([lr_at(g, 4, 1e-2, "linear") for g in range(4)])
    assert hist[2]["train_lr"] == pytest.approx(5e-3)
    assert [h.get("reused_lake_rows", 0.0) for h in hist] == [0.0, 0.0, 1.0, 0.0]
    # The engines got the checkpoint's weights before the first resumed step.
    assert result["initial_engine_fingerprint"] == pytest.approx(checkpointed["trainer_fingerprint"], rel=1e-6)
    assert all(h["engine_fingerprint"] == pytest.approx(h["trainer_fingerprint"], rel=1e-6) for h in hist)
    client = MlflowClient(tracking)
    runs = client.search_runs([client.get_experiment_by_name(cfg.tracking.experiment).experiment_id])
    assert sorted(r.info.run_id for r in runs) == sorted([result["mlflow_run_id"], warm["mlflow_run_id"]])
    run = client.get_run(result["mlflow_run_id"])  # the resumed run kept its one MLflow run
    assert run.info.status == "FINISHED"
    rewards = client.get_metric_history(run.info.run_id, "reward_mean")
    assert sorted(m.step for m in rewards) == [0, 1, 2, 3]
    assert CheckpointStore(checkpoint_url(lake_url)).steps(run_id) == [2, 3]
    # The retrain plans: same data -> continue this run; new data -> a new run on its weights.
    assert (same["resume"], same["reason"], same["config"]["epochs"]) == (run_id, "same data", 3)
    assert (plan["resume"], plan["reason"], plan["config"]["epochs"]) == (None, "data changed", 1)
    assert warm["run_id"] != run_id and warm["warm_start"]["run_id"] == run_id
    assert warm["warm_start"]["global_step"] == 3  # the newest checkpoint
    # Its engines started on the source's last trained weights, and it counts policy versions anew.
    assert warm["initial_engine_fingerprint"] == pytest.approx(hist[-1]["trainer_fingerprint"], rel=1e-6)
    assert [(h["global_step"], h["policy_version"]) for h in warm["history"]] == [(0, 1)]
    assert warm["history"][0]["train_lr"] == pytest.approx(1e-2)  # its own schedule, from its start
    assert lake.sql("SELECT count(*) AS n FROM rollouts WHERE run_id = ?", [warm["run_id"]]).to_pylist() == [
        {"n": 3 * n}]
    warm_run = client.get_run(warm["mlflow_run_id"])
    assert warm_run.data.params["model.init_from_run"] == run_id and warm["mlflow_run_id"] != run.info.run_id
