"""Resuming a run: the pure decisions (next step, reused lake rows) and one end-to-end run that is
interrupted twice and resumed each time: first its reward plug-in (a file reading an extra dataset
column, beside a built-in) breaks, then its trainer dies after a step's lake commit."""

from __future__ import annotations

import json

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

# The reward plug-in, written by the test so it can break it and fix it. `scale` is an extra dataset column.
REWARD_FN = '''
from pathlib import Path


def scaled_length(prompt, completion, row):
    """Longer responses score more, up to the row's `scale` at 64 characters."""
    if Path({marker!r}).exists() and {breaks}:
        with open({raised_log!r}, "a") as log:  # how many times it was called broken
            log.write(row["question"] + "\\n")
        raise RuntimeError("the marker file is there")
    return row["scale"] * min(len(completion), 64) / 64
'''
FUNCTIONS, WEIGHTS = ["gsm8k", "reward_fn.py:scaled_length"], [1.0, 0.5]


def _write_task(folder, num: int) -> None:
    """`num` built-in problems as data.jsonl with an extra `scale` column, and the broken plug-in."""
    from rhymerl.data.builtin import builtin_problems

    rows = [{"question": p.question, "answer": p.solution, "scale": 0.5 + 0.75 * (i % 3)}
            for i, p in enumerate(builtin_problems(num=num, seed=3))]
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _write_plugin(folder, breaks=True)


def _write_plugin(folder, breaks: bool) -> None:
    (folder / "reward_fn.py").write_text(REWARD_FN.format(
        marker=str(folder / "break-it"), breaks=breaks, raised_log=str(folder / "raised.log")))


def _check_reward_failure(err, lake_url: str, raised_log) -> None:
    """The plug-in raised in epoch 1: the message names the function, the prompt and the exception;
    the failed step wrote nothing; its chunk was scored once (neither again on the driver nor retried)."""
    from storage.lake import Lake

    lake = Lake(lake_url)
    message = str(err.value)
    prompt_ids = {r["prompt_id"] for r in lake.sql("SELECT DISTINCT prompt_id FROM rollouts").to_pylist()}
    assert "'scaled_length'" in message and "RuntimeError: the marker file is there" in message
    assert any(f"on prompt {pid}:" in message for pid in prompt_ids), message
    assert lake.sql("SELECT DISTINCT epoch, step FROM rollouts ORDER BY ALL").to_pylist() == [
        {"epoch": 0, "step": 0}, {"epoch": 0, "step": 1}]
    assert lake.sql("SELECT count(*) AS n FROM steps").to_pylist() == [{"n": 2}]
    assert len(raised_log.read_text().splitlines()) == 1


def _check_rewards(lake_url: str, run_id: str, tracking: str, result: dict, data, rows: int) -> None:
    """Every row's reward is what the functions and weights give its response and dataset row,
    the reused step's rows included, and MLflow has each function's per-step mean."""
    from helpers.rewards import check_lake_rewards, check_reward_metrics, jsonl_rows

    from storage.lake import Lake

    assert check_lake_rewards(lake_url, run_id, FUNCTIONS, WEIGHTS, jsonl_rows(data)) == rows
    values = Lake(lake_url).sql("SELECT reward_values['scaled_length'] AS v FROM rollouts").to_pylist()
    assert any(r["v"] > 0 for r in values)  # the plug-in's column is not trivially zero
    check_reward_metrics(lake_url, run_id, tracking, result["mlflow_run_id"], ["gsm8k", "scaled_length"])
    assert all("reward/scaled_length" in h and "accuracy" in h for h in result["history"])


@pytest.mark.slow
def test_reward_failure_then_crash_after_lake_commit_then_resume(prefect_harness, local_ray, tiny_model, tmp_path,
                                                                 monkeypatch):
    # 1. The reward plug-in breaks at epoch 1: the run stops naming it and the prompt, and the lake
    #    keeps nothing of the failed step. 2. `--resume` after the fix goes on; in-run trainer
    #    restarts off, its trainer's process is SIGKILLed before epoch 1: global step 2 rolls out and
    #    commits its lake rows, then its training fails the run with the exact resume command.
    # 3. The second resume trains that step on its committed rows and finishes: every step once,
    # every row once (its reward what the functions give it), the same steps and policy versions as
    # an uninterrupted run, one MLflow run.
    from mlflow.tracking import MlflowClient

    import flows.run
    from rhymerl.config.run import config_to_dict, load_config
    from rhymerl.data.rewards import RewardFunctionError
    from rhymerl.policy.lr_schedule import lr_at
    from storage.checkpoints import CheckpointStore, checkpoint_url
    from storage.lake import Lake
    from tasks.ops import latest_run_task, retrain_config_task, retrain_plan_task
    from tasks.recovery import TrainerLost

    import ray

    monkeypatch.chdir(tmp_path)  # the data file and the plug-in are given relative to here
    _write_task(tmp_path, 6)
    marker, raised_log = tmp_path / "break-it", tmp_path / "raised.log"
    per_step, n, lake_url, tracking = 3, 4, str(tmp_path / "lake"), f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_config(None, [
        f'model.path="{tiny_model}"', "epochs=2", 'data.dataset="data.jsonl"', "data.num_prompts=6",
        f"rollout.prompts_per_step={per_step}", f"rollout.n={n}", "rollout.num_workers=1", "rollout.max_tokens=48", f'lake.url="{lake_url}"',
        f'tracking.uri="{tracking}"', "train.lr=1e-2", "train.weight_decay=0.5", "pipe.gantt=false",
        "recovery.trainer_restarts=0", 'train.lr_schedule="linear"',
        f"reward.functions={json.dumps(FUNCTIONS)}", f"reward.weights={json.dumps(WEIGHTS)}",
    ])
    real_history, killed = flows.run._epoch_history, []

    def history_interrupting(ctx, st, epoch, *args):  # the start of an epoch, before its steps
        if epoch == 1 and not marker.exists():  # epoch 1 of the first run: its plug-in breaks
            marker.write_text("")
        elif epoch == 1 and not killed:  # epoch 1 of the first resume: its trainer dies
            killed.append(ray.get(st.trainer.info.remote())["pid"])
            kill_and_wait(killed[0])
        return real_history(ctx, st, epoch, *args)

    monkeypatch.setattr(flows.run, "_epoch_history", history_interrupting)
    with pytest.raises(RewardFunctionError) as err:
        flows.run.run_flow(config=config_to_dict(cfg))
    [crashed] = Lake(lake_url).sql("SELECT run_id, status FROM runs").to_pylist()
    run_id = crashed["run_id"]
    assert crashed["status"] == "failed"
    _check_reward_failure(err, lake_url, raised_log)
    _write_plugin(tmp_path, breaks=False)  # the fix
    with pytest.raises(TrainerLost) as err:
        flows.run.run_flow(config=config_to_dict(cfg), resume=run_id)
    assert Lake(lake_url).sql("SELECT run_id, status FROM runs").to_pylist() == [
        {"run_id": run_id, "status": "failed"}]
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

    assert result["run_id"] == run_id and marker.exists()  # the fixed code runs, marker or not
    _check_rewards(lake_url, run_id, tracking, result, tmp_path / "data.jsonl", 4 * per_step * n)
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
