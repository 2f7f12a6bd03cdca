"""Sharded checkpoints (torch.distributed.checkpoint) through the checkpoint store, local and S3.

Single-process here (DCP without a process group); resharding across world sizes is tested in
test_sharded.py, where the ranks run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rhymerl.config.run import TrainConfig
from rhymerl.policy.checkpoint import load_trainer, save_trainer
from rhymerl.policy.lr_schedule import lr_at
from rhymerl.policy.trainer import Trainer
from storage.checkpoints import CheckpointStore
from storage.fs import LakeError
from helpers.sharded import BATCH, tiny_qwen2

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_qwen2(tmp_path_factory.mktemp("qwen2_tied"))


def _trainer(model_dir: str) -> Trainer:
    return Trainer(model_dir, TrainConfig(lr=1e-2, kl_coef=0.1, lr_schedule="cosine", warmup_steps=1),
                   threads=1, total_steps=4)


def test_sharded_checkpoint_round_trip(model_dir: str, lake_url: str) -> None:
    # Rule: weights, AdamW state, policy version, the lr schedule's step and RNG come back: the
    # next step is bit-equal, at the same (scheduled) learning rate.
    store = CheckpointStore(f"{lake_url}/_checkpoints")
    trainer = _trainer(model_dir)
    trainer.train_step(BATCH)
    save_trainer(trainer, store.sharded_url("r1", 3), **store.storage_options())
    assert store.steps("r1") == []  # written but not committed
    assert store.commit_sharded("r1", 3, {"epoch": 0}, keep=2)
    assert not store.commit_sharded("r1", 3, {"epoch": 0})
    ckpt = store.latest("r1")
    assert ckpt is not None and ckpt.sharded and ckpt.trainer_state == b"" and ckpt.meta == {"epoch": 0}
    rng = torch.get_rng_state()
    resumed = _trainer(model_dir)
    torch.manual_seed(123)  # restored below
    assert load_trainer(resumed, ckpt.trainer_url, **store.storage_options()) == 1
    assert torch.equal(torch.get_rng_state(), rng)
    assert resumed.lr_step == 1
    lrs = trainer.train_step(BATCH)["lr"], resumed.train_step(BATCH)["lr"]
    assert lrs[0] == lrs[1] == pytest.approx(lr_at(1, 4, 1e-2, "cosine", 1))
    for (name, p), (_, q) in zip(trainer.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(p, q), name


def test_uncommitted_or_damaged_sharded_checkpoint_is_refused(model_dir: str, tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "ckpt"))
    # Rule: no DCP .metadata (a rank still writing) -> no commit.
    (tmp_path / "ckpt/r1/step-00000001/trainer").mkdir(parents=True)
    (tmp_path / "ckpt/r1/step-00000001/trainer/__0_0.distcp").write_bytes(b"half")
    with pytest.raises(LakeError, match="have not all finished"):
        store.commit_sharded("r1", 1, {})
    assert store.steps("r1") == []
    # Rule: a trainer file whose size differs from the marker's is never loaded.
    save_trainer(_trainer(model_dir), store.sharded_url("r1", 2))
    store.commit_sharded("r1", 2, {})
    shard = next((tmp_path / "ckpt/r1/step-00000002/trainer").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-1])
    with pytest.raises(LakeError, match="distcp is missing or damaged"):
        store.load("r1", 2)
