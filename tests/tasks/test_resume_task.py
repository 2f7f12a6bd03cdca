"""The resume tasks without Ray: checkpoint -> restore on a local lake, and committed rows read back."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prefect.logging import disable_run_logger

import tasks.resume as resume
from rhymerl.config.run import load_config
from rhymerl.data.rewards import RewardScore
from rhymerl.data.records import Prompt, Sample
from rhymerl.run.rollout import rollout_rows
from storage.checkpoints import CheckpointStore, checkpoint_url
from storage.lake import LakeWriter, rows_to_table
from tasks.setup import RunContext


class _Remote:
    """Calls a local object's method through `.remote(...)`, as a Ray actor handle does."""

    def __init__(self, target) -> None:
        self.target = target

    def __getattr__(self, name):
        return SimpleNamespace(remote=getattr(self.target, name))


class FakeTrainer:
    """State is its policy version, as bytes: enough to see what the store carried."""

    def __init__(self, version: int = 0) -> None:
        self.version = version

    def export_state(self) -> bytes:
        return f"v{self.version}".encode()

    def import_state(self, blob: bytes) -> int:
        self.version = int(blob.decode()[1:])
        return self.version


PROMPTS = [Prompt(f"p{i}", i, f"q{i}", (i + 1,), str(i)) for i in range(4)]


def _ctx(tmp_path, *overrides: str, prompts=PROMPTS) -> RunContext:
    cfg = load_config(None, [f'lake.url="{tmp_path / "lake"}"', "rollout.prompts_per_step=2", "rollout.n=2",
                             "epochs=2", "checkpoint.keep=1", *overrides])
    return RunContext(cfg=cfg, run_id="run-1", model_dir="m", prompts=tuple(prompts), skipped=0)


def _checkpoint(ctx: RunContext, trainer: FakeTrainer, *records: dict, version: int = 0) -> bool:
    pending = resume.begin_checkpoint(ctx, _Remote(trainer), int(records[-1]["global_step"]))
    return pending is not None and resume.checkpoint_task.fn(ctx, pending, list(records), version, "mlf-1")


def _commit(cfg, epoch: int, step: int, prompts, version: int) -> None:
    samples = [Sample(p.prompt_id, k, (7, k), (-0.5, -0.25), f"r{k}", "stop", 0, 1.0, 2.0)
               for p in prompts for k in range(2)]
    rows = rollout_rows("run-1", epoch, step, prompts, samples, [RewardScore(float(k), {"gsm8k": float(k)}, k == 1) for p in prompts
                                                                for k in range(2)], version)
    writer = LakeWriter(cfg.lake.url)
    key = writer.write_rollouts("run-1", epoch, step, 0, 1, rows_to_table(rows))
    writer.commit_step("run-1", epoch, step, [key])


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch):
    monkeypatch.setattr(resume.ray, "get", lambda value: value)


def test_checkpoint_then_restore_continues_after_it(tmp_path):
    # Rule: restore gives back the trainer state, counters and history of the last checkpoint.
    trainer, ctx, history = FakeTrainer(), _ctx(tmp_path), []
    for g, (epoch, step) in enumerate([(0, 0), (0, 1)]):
        _commit(ctx.cfg, epoch, step, PROMPTS[2 * step:2 * step + 2], version=g)
        trainer.version = g + 1
        history.append({"epoch": epoch, "step": step, "global_step": g, "reward_mean": 0.5})
        assert _checkpoint(ctx, trainer, *history, version=g + 1) is True
    assert CheckpointStore(checkpoint_url(ctx.cfg.lake.url)).steps("run-1") == [1]  # keep=1
    _commit(ctx.cfg, 1, 0, PROMPTS[:2], version=2)  # committed, then the run died before its checkpoint

    fresh = FakeTrainer()
    with disable_run_logger():
        restored = resume.restore_task.fn(_ctx(tmp_path), _Remote(fresh))
    plan = restored.plan
    assert (plan.epoch, plan.step, plan.global_step) == (1, 0, 2)
    assert plan.reuse == {(1, 0)} and fresh.version == restored.policy_version == 2
    assert restored.history == history and restored.mlflow_run_id == "mlf-1"


def test_every_steps_and_off(tmp_path):
    ctx = _ctx(tmp_path, "checkpoint.every_steps=2")
    assert _checkpoint(ctx, FakeTrainer(), {"epoch": 0, "step": 0, "global_step": 0}) is False
    assert _checkpoint(ctx, FakeTrainer(), {"epoch": 0, "step": 1, "global_step": 1}) is True
    off = _ctx(tmp_path, "checkpoint.every_steps=0")
    assert _checkpoint(off, FakeTrainer(), {"epoch": 0, "step": 0, "global_step": 0}) is False


def test_restore_refuses_without_checkpoint_or_with_other_prompts(tmp_path):
    ctx = _ctx(tmp_path)
    with pytest.raises(ValueError, match="no committed checkpoint"):
        resume.restore_task.fn(ctx, _Remote(FakeTrainer()))
    _checkpoint(ctx, FakeTrainer(), {"epoch": 0, "step": 0, "global_step": 0})
    with pytest.raises(ValueError, match="other prompts"):
        resume.restore_task.fn(_ctx(tmp_path, prompts=PROMPTS[::-1]), _Remote(FakeTrainer()))


def test_committed_rows_come_back_for_training(tmp_path):
    # Rule: the lake's rows of a step are the samples and scores it trained on, in batch order.
    cfg = _ctx(tmp_path).cfg
    _commit(cfg, 0, 1, PROMPTS[2:], version=1)
    samples, scores = resume.lake_rows_task.fn(cfg.lake.url, "run-1", 0, 1, PROMPTS[2:], 2, 1)
    assert [(s.prompt_id, s.sample_idx, s.token_ids) for s in samples] == [
        ("p2", 0, (7, 0)), ("p2", 1, (7, 1)), ("p3", 0, (7, 0)), ("p3", 1, (7, 1))]
    assert scores == [RewardScore(0.0, {"gsm8k": 0.0}, False), RewardScore(1.0, {"gsm8k": 1.0}, True)] * 2


def test_stored_config_round_trip(tmp_path):
    cfg = _ctx(tmp_path).cfg
    LakeWriter(cfg.lake.url).write_run("run-1", "rhymerl", cfg)
    assert resume.stored_config(cfg.lake.url, "run-1")["rollout"]["n"] == 2
    with pytest.raises(resume.LakeError, match="has no run 'other'"):
        resume.stored_config(cfg.lake.url, "other")


def test_resume_tracking_reopens_mlflow_and_the_lake_run(tmp_path):
    # Rule: the same MLflow run continues (its logged steps known), the lake run is 'running' again.
    from mlflow.tracking import MlflowClient

    from storage.lake import Lake
    from storage.tracking import MlflowTracker

    ctx = _ctx(tmp_path, f'tracking.uri="sqlite:///{tmp_path / "mlflow.db"}"')
    cfg = ctx.cfg
    tracker = MlflowTracker(cfg.tracking.uri, cfg.tracking.experiment)
    mlflow_run_id = tracker.start("run-1", {"seed": 0})
    tracker.log_metrics({"reward_mean": 0.5}, step=0)
    tracker.finish("failed")
    writer = LakeWriter(cfg.lake.url)
    writer.write_run("run-1", "rhymerl", cfg, started_at=100.0)
    writer.finish_run("run-1", "failed")
    with disable_run_logger():
        tracking = resume.resume_tracking_task.fn(ctx, mlflow_run_id)
    assert tracking.mlflow_run_id == mlflow_run_id and tracking.logged_steps == {0}
    assert MlflowClient(cfg.tracking.uri).get_run(mlflow_run_id).info.status == "RUNNING"
    tracking.tracker.finish("finished")
    run = Lake(cfg.lake.url).sql("SELECT status, started_at FROM runs").to_pylist()
    assert run == [{"status": "running", "started_at": 100.0}]


def test_cli_resume_takes_the_stored_config(tmp_path, monkeypatch, capsys):
    # Rule: `rhymerl run --resume R` runs with R's stored config, --set on top; a missing run is
    # one error line.
    import json

    from cli.main import main

    monkeypatch.chdir(tmp_path)  # no configs/default.toml here: its lake would be ./lake
    for name in ("PREFECT_HOME", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "RAY_AUTH_MODE",
                 "TOKENIZERS_PARALLELISM", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS",
                 "PREFECT_SERVER_ANALYTICS_ENABLED"):
        monkeypatch.setenv(name, "unchanged")  # the CLI sets these only if unset
    cfg = _ctx(tmp_path).cfg
    LakeWriter(cfg.lake.url).write_run("run-1", "rhymerl", cfg)
    lake = str(tmp_path / "lake")
    assert main(["run", "--resume", "run-1", "--lake", lake, "--set", "epochs=3", "--print-config"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["rollout"]["n"], printed["epochs"], printed["lake"]["url"]) == (2, 3, lake)
    assert main(["run", "--resume", "nope", "--lake", lake, "--print-config"]) == 2
    assert "has no run 'nope'" in capsys.readouterr().err


class FakeShardedTrainer(FakeTrainer):
    """Writes its version as a torch.distributed.checkpoint-like folder (.metadata last)."""

    def save_checkpoint(self, url: str, storage_options: dict) -> int:
        import fsspec

        for name, text in (("__0_0.distcp", f"v{self.version}"), (".metadata", "meta")):
            with fsspec.open(f"{url}/{name}", "w", auto_mkdir=True, **storage_options) as f:
                f.write(text)
        return self.version

    def load_checkpoint(self, url: str, storage_options: dict) -> int:
        import fsspec

        with fsspec.open(f"{url}/__0_0.distcp", "r", **storage_options) as f:
            self.version = int(f.read()[1:])
        return self.version


def test_sharded_checkpoint_restores_on_another_world_size(tmp_path):
    # Rule: a group's checkpoint is sharded and commits like the others; any world size loads it.
    ctx = _ctx(tmp_path, "train.world_size=2")
    _commit(ctx.cfg, 0, 0, PROMPTS[:2], version=0)
    record = {"epoch": 0, "step": 0, "global_step": 0}
    assert _checkpoint(ctx, FakeShardedTrainer(version=1), record, version=1) is True
    assert _checkpoint(ctx, FakeShardedTrainer(version=1), record, version=1) is False  # committed: kept
    ckpt = CheckpointStore(checkpoint_url(ctx.cfg.lake.url)).latest("run-1")
    assert ckpt.sharded and ckpt.trainer_state == b""
    reader = FakeShardedTrainer()
    with disable_run_logger():
        restored = resume.restore_task.fn(_ctx(tmp_path, "train.world_size=1"), _Remote(reader))
    assert reader.version == restored.policy_version == 1 and restored.plan.global_step == 1


def test_single_trainer_checkpoint_is_refused_by_a_group(tmp_path):
    _checkpoint(_ctx(tmp_path), FakeTrainer(version=1), {"epoch": 0, "step": 0, "global_step": 0}, version=1)
    with pytest.raises(ValueError, match="written by a single trainer.*train.world_size=1"):
        resume.restore_task.fn(_ctx(tmp_path, "train.world_size=2"), _Remote(FakeShardedTrainer()))


def test_a_checkpoint_stored_later_holds_its_own_steps_weights(tmp_path):
    # Rule: begin_checkpoint asks the trainer for its state at once (queued on the actor before the
    # next step's training), so a checkpoint stored in the background still holds its step's weights.
    trainer, ctx = FakeTrainer(version=1), _ctx(tmp_path)
    record = {"epoch": 0, "step": 0, "global_step": 0}
    pending = resume.begin_checkpoint(ctx, _Remote(trainer), 0)
    trainer.version = 2  # the next step trained before the checkpoint was stored
    assert resume.checkpoint_task.fn(ctx, pending, [record], 1, "mlf-1") is True
    stored = CheckpointStore(checkpoint_url(ctx.cfg.lake.url)).latest("run-1")
    assert stored.trainer_state == b"v1" and stored.meta["policy_version"] == 1
    with pytest.raises(ValueError, match="global step 0 given the history up to step 1"):
        resume.checkpoint_task.fn(ctx, pending, [{"epoch": 0, "step": 1, "global_step": 1}], 1, "mlf-1")
