"""The trainer group on Ray: 2 CPU ranks (gloo) behind the single trainer actor's interface.

Exactness is test_sharded.py's; here: the calls the flow makes reach every rank in order and
give the single trainer's answers (weights, fingerprint, probe), sharded checkpoints round-trip
through the store, and the Hugging Face folder the group saves loads back.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import ray
import torch
import transformers

from rhymerl.config.run import RunConfig, TrainConfig
from rhymerl.policy.trainer import Trainer
from rhymerl.vllm.worker_ext import weights_fingerprint
from storage.checkpoints import CheckpointStore
from workers.actors import Placement
from workers.sync_group import broadcast_weights
from workers.trainer_group import TrainerGroup, launch_trainer, stop_trainer
from helpers.sharded import BATCH, tiny_qwen2

CFG = RunConfig(train=TrainConfig(lr=1e-2, kl_coef=0.1, micro_batch_size=2, world_size=2))
ON_CPU = Placement(worker_cpus=1, worker_gpus=0, trainer_cpus=0, trainer_gpus=0)


@ray.remote
class SinkEngine:
    """An engine stand-in for the process-group sync: a Hugging Face model in a Ray actor that
    joins the weight group and copies each received tensor into its parameter in place."""

    def __init__(self, model_dir: str) -> None:
        self.model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    def receive_weights(self, address, first_rank: int) -> float:
        from rhymerl.policy.weight_group import open_group

        params = dict(self.model.named_parameters(remove_duplicate=False))
        group = open_group(address, first_rank, timeout_s=60)
        with torch.no_grad():
            for name, tensor in group.receive():
                params[name].copy_(tensor)
        group.close()
        return weights_fingerprint(self.model.named_parameters())

    def state(self) -> dict:
        return {k: v.clone() for k, v in self.model.state_dict().items()}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_qwen2(tmp_path_factory.mktemp("qwen2_tied"))


@pytest.fixture(scope="module")
def group(model_dir: str, local_ray):
    group = launch_trainer(model_dir, CFG, ON_CPU, threads=2)
    yield group
    stop_trainer(group)


def test_group_answers_like_the_single_trainer(model_dir: str, group: TrainerGroup, tmp_path: Path) -> None:
    assert isinstance(group, TrainerGroup) and len(group.ranks) == 2
    single = Trainer(model_dir, CFG.train, threads=1)
    expected_metrics = single.train_step(BATCH)
    metrics = ray.get(group.train_step.remote(BATCH))
    assert metrics["loss"] == pytest.approx(expected_metrics["loss"], rel=1e-5)
    state = ray.get(group.state_for_engine.remote())
    for name, tensor in single.state_dict_for_engine().items():
        torch.testing.assert_close(state[name], tensor, rtol=0, atol=1e-4)  # AdamW noise: test_sharded
    assert state["lm_head.weight"] is state["model.embed_tokens.weight"]  # tied stays tied
    # the bucketed sync's stream: every tensor once, gathered from the ranks, in small buckets
    streamed = [ray.get(ref) for ref in group.state_buckets.remote(4096)]
    assert len(streamed) > 1 and {k: v for b in streamed for k, v in b.items()}.keys() == state.keys()
    for bucket in streamed:
        for name, tensor in bucket.items():
            assert torch.equal(tensor, state[name]), name
    fingerprint = ray.get(group.weights_fingerprint.remote())
    assert math.isclose(fingerprint, weights_fingerprint(state.items()), rel_tol=1e-6)
    ids, probe = ray.get(group.probe.remote(8))
    assert probe == pytest.approx(single.probe_logprobs(ids), abs=1e-3)
    assert ray.get(group.policy_version.remote()) == 1
    out = ray.get(group.save.remote(str(tmp_path / "hf")))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, state[name]), name


def test_group_checkpoint_round_trip(group: TrainerGroup, tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "ckpt"))
    version = ray.get(group.policy_version.remote())
    ray.get(group.save_checkpoint.remote(store.sharded_url("r1", 0), store.storage_options()))
    assert store.commit_sharded("r1", 0, {"policy_version": version})
    before = ray.get(group.state_for_engine.remote())
    ray.get(group.train_step.remote(BATCH))
    ckpt = store.latest("r1")
    assert ray.get(group.load_checkpoint.remote(ckpt.trainer_url, store.storage_options())) == version
    after = ray.get(group.state_for_engine.remote())
    for name, tensor in before.items():
        assert torch.equal(after[name], tensor), name


def test_group_broadcasts_weights_to_every_engine(model_dir: str, group: TrainerGroup) -> None:
    # rank 0 sends over a gloo weight group while rank 1 gathers with it; two engines receive
    ray.get(group.train_step.remote(BATCH))  # weights the engines' initial model does not have
    sinks = [SinkEngine.remote(model_dir) for _ in range(2)]
    sent, prints = broadcast_weights(group, sinks, bucket_bytes=4096)
    state = ray.get(group.state_for_engine.remote())
    assert sent >= sum(t.numel() * t.element_size() for t in state.values())
    trainer_print = ray.get(group.weights_fingerprint.remote())
    assert all(math.isclose(p, trainer_print, rel_tol=1e-6) for p in prints) and len(prints) == 2
    for sink in sinks:
        got = ray.get(sink.state.remote())
        for name, tensor in state.items():
            assert torch.equal(got[name], tensor), name
