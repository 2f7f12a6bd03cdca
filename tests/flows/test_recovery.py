"""Dead actors mid-run: a killed rollout worker restarts on the current policy, a killed trainer
comes back from its checkpoint in-run, no row lost or doubled (a dead trainer with restarts off,
then `rhymerl run --resume`, is tests/flows/test_resume.py's end-to-end test)."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest
from helpers.proc import kill_and_wait
from ray.exceptions import ActorDiedError

from rhymerl.config.run import load_config
from rhymerl.errors import ConfigError
from tasks.recovery import TrainerLost, check_recoverable, trainer_lost
from tasks.setup import RunContext
from workers.guard import WorkerGuard, resume_command


class _Handle:  # what trainer_lost reads from a Ray actor handle
    def __init__(self, actor_id: str) -> None:
        self._actor_id = SimpleNamespace(hex=lambda: actor_id)


def _died(actor_id: str) -> ActorDiedError:
    exc = ActorDiedError()
    exc.actor_id = actor_id
    return exc


def test_trainer_lost_only_for_the_trainers_own_death():
    # Rule: only an actor error naming the trainer's actor id (directly or as a cause) counts.
    trainer = _Handle("t1")
    assert trainer_lost(trainer, _died("t1"))
    try:
        try:
            raise _died("t1")
        except ActorDiedError as inner:
            raise RuntimeError("train task failed") from inner
    except RuntimeError as wrapped:
        assert trainer_lost(trainer, wrapped)
    assert not trainer_lost(trainer, _died("w0"))  # a rollout worker died: not the trainer
    assert not trainer_lost(trainer, RuntimeError("t1"))


def _ctx(**sets):
    cfg = load_config(None, [f"{k}={v}" for k, v in sets.items()])
    return RunContext(cfg=cfg, run_id="rhymerl-x-1", model_dir="m", prompts=(), skipped=0)


def test_a_trainer_that_cannot_come_back_names_the_resume_command():
    with pytest.raises(TrainerLost) as err:
        check_recoverable(_ctx(**{"recovery.trainer_restarts": 1, "lake.url": '"s3://b/lake"'}), 1, _died("t1"))
    assert "rhymerl run --resume rhymerl-x-1 --lake s3://b/lake" in str(err.value)
    assert isinstance(err.value.__cause__, ActorDiedError)
    assert resume_command("r", "lake") == "rhymerl run --resume r --lake lake"
    with pytest.raises(TrainerLost, match="checkpoints are off"):
        check_recoverable(_ctx(**{"checkpoint.every_steps": 0}), 0, _died("t1"))
    check_recoverable(_ctx(**{"recovery.trainer_restarts": 2}), 1, _died("t1"))  # one left: no error


def test_recovery_config_is_checked():
    with pytest.raises(ConfigError, match="recovery.worker_restarts"):
        load_config(None, ["recovery.worker_restarts=-1"])
    assert load_config(None, []).recovery.trainer_restarts == 1


# (no `slow` marker: a local Ray and fake workers, seconds; `slow` means vLLM engines)
def test_streamed_rollout_reruns_every_request_planned_on_a_dead_worker(local_ray, tmp_path):
    # Small real fakes on a real Ray: each "engine" streams one sample per request stamped with the
    # weights and history it holds and its pid; worker 1's first process dies before its 3rd, after
    # two of its samples reached the driver. Rule: all four of its requests run again on the
    # restarted process and the two early ones are discarded (keeping what finished before a crash
    # would keep the short responses).
    import ray

    from rhymerl.data.records import Prompt, Request, Sample
    from rhymerl.vllm.engine import SamplingSettings, StreamEvent
    from rhymerl.data.rewards import load_reward_set
    from workers.stream import Scoring, stream_rollout

    flag = tmp_path / "die-once"
    flag.write_text("")

    class FakeWorker:
        def __init__(self, wid):
            self.wid, self.weights, self.history = wid, 0.0, b""  # a restart starts from scratch

        def info(self):
            return {"node_id": "n", "pid": os.getpid(), "worker_id": self.wid}

        def load_weights(self, state):
            self.weights = state["w"]
            return self.weights

        def set_history(self, blob):
            self.history = blob
            return len(blob)

        def stream(self, reqs, spec, every_s, track):
            for i, r in enumerate(reqs):
                if self.wid == 1 and i == 2 and flag.exists():
                    flag.unlink()
                    time.sleep(0.5)  # the samples it reported reach the driver first
                    os._exit(1)
                text = f"{self.weights}|{self.history.decode()}|{os.getpid()}"
                yield StreamEvent((Sample(r.prompt.prompt_id, r.sample_idx, (1,), (-0.1,), text, "stop", self.wid,
                                          0.0, 0.0),), (), {})

    class FakeTrainer:
        def state_for_engine(self):
            return {"w": 7.0}

        def weights_fingerprint(self):
            return 7.0

    prompts = [Prompt(prompt_id=f"p{i}", index=i, text=f"q{i}", token_ids=(i + 1,), answer=str(i),
                      row={"question": f"q{i}", "answer": str(i)}) for i in range(4)]
    requests = [[Request(p, k) for p in prompts[2 * w:2 * w + 2] for k in range(2)] for w in range(2)]
    workers = [ray.remote(FakeWorker).options(max_restarts=1, max_concurrency=2).remote(w) for w in range(2)]
    trainer = ray.remote(FakeTrainer).remote()
    try:
        ray.get([w.load_weights.remote({"w": 7.0}) for w in workers])  # the run's synced state
        guard = WorkerGuard.watch(workers, trainer, timeout_s=120)
        guard.share_history(ray.put(b"H"))
        out = stream_rollout(workers, requests, SamplingSettings(n=2, temperature=1.0, top_p=1.0, max_tokens=4),
                             Scoring.of(load_reward_set(["gsm8k"]), prompts), guard=guard)
    finally:  # the session's Ray stays up: free its CPUs for the next test
        for actor in (*workers, trainer):
            ray.kill(actor)
    # Every request exactly once, each from the current weights and history (the restarted
    # process was resynced before it generated).
    assert sorted((s.prompt_id, s.sample_idx) for s in out.samples) == [(p.prompt_id, k) for p in prompts
                                                                         for k in range(2)]
    assert {tuple(s.text.split("|")[:2]) for s in out.samples} == {("7.0", "H")}
    [restart] = guard.restarts
    assert restart.worker == 1 and restart.mid_rollout and restart.engine_fingerprint == 7.0
    # Worker 1's two early samples were discarded: all four of its requests come from the new process.
    pids = [s.text.split("|")[2] for s in out.samples if s.worker_id == 1]
    assert pids == [str(restart.new_pid)] * 4 and out.discarded == 2


def test_a_killed_trainer_rank_counts_as_the_trainer_lost(local_ray, tmp_path):
    # A real 2-rank FSDP2 group (gloo) on Ray; rank 1's process is SIGKILLed. Rule: the next step
    # fails through rank 0's collective with an error that names no dead actor of its own, and the
    # run still sees the trainer lost (so it restarts it from a checkpoint, or exits 3 with the
    # resume command), not an unexpected error (exit 1).
    import ray
    from helpers.sharded import BATCH, tiny_qwen2
    from ray.exceptions import RayActorError

    from rhymerl.config.run import RunConfig, TrainConfig
    from workers.actors import Placement
    from workers.trainer_group import launch_trainer, stop_trainer

    cfg = RunConfig(train=TrainConfig(lr=1e-2, micro_batch_size=2, world_size=2))
    on_cpu = Placement(worker_cpus=1, worker_gpus=0, trainer_cpus=0, trainer_gpus=0)
    group = launch_trainer(tiny_qwen2(tmp_path / "qwen2"), cfg, on_cpu, threads=2)
    try:
        assert not trainer_lost(group, RuntimeError("a step failed"))  # nothing from Ray: not asked
        kill_and_wait(ray.get(group.ranks[1].info.remote())["pid"])
        with pytest.raises(Exception) as failed:
            ray.get(group.train_step.remote(BATCH))
        rank0 = group.ranks[0]._actor_id.hex()
        assert not (isinstance(failed.value, RayActorError) and failed.value.actor_id == rank0)
        assert group.dead_ranks() == [1]
        assert trainer_lost(group, failed.value)
    finally:
        stop_trainer(group)


# ---------------------------------------------------------------- end to end (slow)

def _config(tiny_model, tmp_path, *extra):
    return load_config(None, [
        f'model.path="{tiny_model}"', "epochs=2", f'lake.url="{tmp_path / "lake"}"',
        f'tracking.uri="sqlite:///{tmp_path / "mlflow.db"}"', "train.lr=1e-2", "train.weight_decay=0.5",
        "pipe.gantt=false", *extra])


def _lake_checks(lake_url: str, steps: int, rows: int) -> list[dict]:
    from storage.lake import Lake

    lake = Lake(lake_url)
    dup = lake.sql("SELECT count(*) AS n FROM (SELECT run_id, epoch, step, prompt_id, sample_idx FROM rollouts "
                   "GROUP BY ALL HAVING count(*) > 1)").to_pylist()
    assert dup == [{"n": 0}]  # no (run, epoch, step, prompt, sample) twice
    counts = lake.sql("SELECT epoch, step, count(*) AS n, min(policy_version) AS v0, max(policy_version) AS v1 "
                      "FROM rollouts GROUP BY epoch, step ORDER BY ALL").to_pylist()
    # Exactly prompts x n rows per step, each step sampled by the weights after the one before.
    assert counts == [{"epoch": g // 2, "step": g % 2, "n": rows, "v0": g, "v1": g} for g in range(steps)]
    assert [r["status"] for r in lake.sql("SELECT status FROM runs").to_pylist()] == ["finished"]
    return counts


@pytest.mark.slow
def test_killed_worker_and_trainer_recover_in_run(prefect_harness, local_ray, tiny_model, tmp_path, monkeypatch):
    # Worker 1's process is SIGKILLed while it still has requests generating (from global step 1
    # on, at its first streamed event that leaves requests unfinished); the trainer's process is
    # SIGKILLed before epoch 1. The run finishes by itself: Ray restarts the worker, which gets the
    # trainer's weights and the history before re-running its unfinished requests; a new trainer
    # is loaded from the checkpoint and trains step (1, 0) on its committed lake rows.
    from mlflow.tracking import MlflowClient

    import flows.run
    import flows.step
    import workers.stream
    from rhymerl.config.run import config_to_dict

    import ray

    monkeypatch.chdir(tmp_path)
    per_step, n = 8, 8  # 32 requests x up to 128 tokens per worker: seconds of generation
    cfg = _config(tiny_model, tmp_path, "data.num_prompts=16", f"rollout.prompts_per_step={per_step}",
                  f"rollout.n={n}", "rollout.num_workers=2", "rollout.max_tokens=128")
    real_rollout, real_history, real_take, seen = (flows.step.rollout_task, flows.run._epoch_history,
                                                   workers.stream._Driver.take, {"rollouts": 0})

    def rollout_arming_the_kill(workers, *args, **kwargs):
        seen["guard"] = kwargs["guard"]
        seen["rollouts"] += 1
        if seen["rollouts"] >= 2 and "killed_at" not in seen:  # from global step 1 on
            seen["pid"] = ray.get(workers[1].info.remote())["pid"]
        return real_rollout(workers, *args, **kwargs)

    def take_then_kill_worker_1(driver, sid, w, event):
        real_take(driver, sid, w, event)
        if w == 1 and "pid" in seen and "killed_at" not in seen and driver.unfinished[1] > 0:
            seen["killed_at"] = seen["rollouts"] - 1  # the global step being rolled out
            kill_and_wait(seen["pid"])

    def history_killing_the_trainer(ctx, st, epoch, *args):  # the start of an epoch, before its steps
        if epoch == 1 and "trainer_pid" not in seen:  # epoch 1, first time
            seen["trainer_pid"] = ray.get(st.trainer.info.remote())["pid"]
            kill_and_wait(seen["trainer_pid"])
        return real_history(ctx, st, epoch, *args)

    monkeypatch.setattr(flows.step, "rollout_task", rollout_arming_the_kill)
    monkeypatch.setattr(workers.stream._Driver, "take", take_then_kill_worker_1)
    monkeypatch.setattr(flows.run, "_epoch_history", history_killing_the_trainer)
    result = flows.run.run_flow(config=config_to_dict(cfg))

    _lake_checks(str(tmp_path / "lake"), steps=4, rows=per_step * n)
    [restart] = seen["guard"].restarts
    assert restart.worker == 1 and restart.mid_rollout and restart.new_pid != seen["pid"]
    assert restart.engine_fingerprint == pytest.approx(restart.trainer_fingerprint, rel=1e-6)
    assert seen["guard"].trainer_restarts == 1
    hist = result["history"]
    assert [h["global_step"] for h in hist] == [0, 1, 2, 3]
    assert [h["worker_restarts"] for h in hist] == [float(g == seen["killed_at"]) for g in range(4)]
    assert [h.get("reused_lake_rows", 0.0) for h in hist] == [0.0, 0.0, 1.0, 0.0]
    assert all(h["engine_fingerprint"] == pytest.approx(h["trainer_fingerprint"], rel=1e-6) for h in hist)
    client = MlflowClient(cfg.tracking.uri)
    [run] = client.search_runs([client.get_experiment_by_name(cfg.tracking.experiment).experiment_id])
    assert run.info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "reward_mean")) == [0, 1, 2, 3]
    assert sum(m.value for m in client.get_metric_history(run.info.run_id, "worker_restarts")) == 1.0
    assert [m.value for m in client.get_metric_history(run.info.run_id, "trainer_restarts")] == [1.0]
