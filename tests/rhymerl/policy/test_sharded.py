"""Sharded trainer (FSDP2, gloo on CPU): one step on 2 ranks equals the step on 1 rank.

Two spawned processes form the group; each case builds a fresh ShardedTrainer per rank and
writes the updated whole weights, which are compared with the single-process Trainer's.
Resharding: a checkpoint written by 2 ranks resumes on 1, and one written by 1 resumes on 2; the
ranks' log-probs are those of the weights they hold.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.multiprocessing as mp

from rhymerl.config.run import TrainConfig
from rhymerl.policy.checkpoint import load_trainer, save_trainer
from rhymerl.policy.sharded import DistSpec, ShardedTrainer, free_port, split_by_tokens
from rhymerl.policy.trainer import Trainer
from helpers.sharded import BATCH, tiny_qwen2

CASES = [(agg, kl) for agg in ("token", "sequence") for kl in (0.0, 0.1)]


def _cfg(agg: str, kl: float, world_size: int) -> TrainConfig:
    # two updates: the second sees ratio != 1, so the sharded old log-probs matter
    return TrainConfig(lr=1e-2, loss_agg=agg, kl_coef=kl, micro_batch_size=2, updates_per_step=2,
                       world_size=world_size)


def _perturb(trainer: Trainer) -> None:
    """Move the policy off the reference so the KL term has a gradient (same on every rank)."""
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.mul_(1.01)


def _grads(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The last update's (clipped) gradient per parameter, whole (gathered from the shards)."""
    return {name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
            for name, p in trainer.model.named_parameters()}


def _rank(rank: int, model_dir: str, port: int, out_dir: str) -> None:
    spec = DistSpec(rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port)
    for agg, kl in CASES:
        # with KL on, the ranks also checkpoint activations (under FSDP2): still the 1-rank update
        cfg = dataclasses.replace(_cfg(agg, kl, 2), activation_checkpointing=kl > 0)
        trainer = ShardedTrainer(model_dir, cfg, spec, threads=1)
        _perturb(trainer)
        metrics = trainer.train_step(BATCH)
        weights = trainer.state_dict_for_engine()
        grads = _grads(trainer)
        if rank == 0:
            torch.save({"weights": weights, "grads": grads, "metrics": metrics}, f"{out_dir}/{agg}-{kl}.pt")
    # resharding: 2 ranks write a checkpoint after one step (read back by 1 rank in the test) ...
    trainer = ShardedTrainer(model_dir, _cfg("token", 0.1, 2), spec, threads=1)
    trainer.train_step(BATCH)
    save_trainer(trainer, f"{out_dir}/ckpt-2")
    # ... and resume what 1 rank wrote, then step again
    trainer = ShardedTrainer(model_dir, _cfg("token", 0.1, 2), spec, threads=1)
    version = load_trainer(trainer, f"{out_dir}/ckpt-1")
    trainer.train_step(BATCH)
    weights = trainer.state_dict_for_engine()
    logprobs = trainer.sequence_logprobs(BATCH)  # collective: both ranks run the whole batch
    if rank == 0:
        torch.save({"weights": weights, "version": version, "logprobs": logprobs}, f"{out_dir}/resumed-from-1.pt")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_qwen2(tmp_path_factory.mktemp("qwen2_tied"))


@pytest.fixture(scope="module")
def two_rank_results(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("sharded")
    single = Trainer(model_dir, _cfg("token", 0.1, 1), threads=1)
    single.train_step(BATCH)
    save_trainer(single, str(out / "ckpt-1"))
    mp.spawn(_rank, args=(model_dir, free_port(), str(out)), nprocs=2, join=True)
    results = {case: torch.load(out / f"{case[0]}-{case[1]}.pt") for case in CASES}
    return {**results, "out": out, "resumed-from-1": torch.load(out / "resumed-from-1.pt")}


def test_split_by_tokens_balances_and_keeps_order() -> None:
    # LPT: 9 -> r0, 5 -> r1, 4 -> r1 (9 vs 9), 3 -> r0, 1 -> r1
    assert split_by_tokens([9, 4, 5, 3, 1], 2) == [[0, 3], [1, 2, 4]]
    assert split_by_tokens([2, 2], 3) == [[0], [1], []]
    assert split_by_tokens([5], 1) == [[0]]


@pytest.mark.parametrize("agg,kl", CASES)
def test_two_ranks_update_equals_one_rank(model_dir: str, two_rank_results: dict, agg: str, kl: float) -> None:
    single = Trainer(model_dir, _cfg(agg, kl, 1), threads=1)
    _perturb(single)
    before = {k: v.clone() for k, v in single.state_dict_for_engine().items()}
    metrics = single.train_step(BATCH)
    expected = single.state_dict_for_engine()
    got = two_rank_results[(agg, kl)]
    assert got["weights"].keys() == expected.keys()
    for name, tensor in expected.items():
        if name.endswith("k_proj.bias"):
            # its true gradient is 0 (a key bias shifts a query's scores by one constant; softmax
            # ignores it): the float noise left, AdamW scales to +-lr in either run alike
            continue
        assert not torch.equal(tensor, before[name]), f"{name} did not move"
        # AdamW divides by sqrt(v): where a gradient is near 0, summation-order noise moves the
        # update by a sliver of lr (seen: 2e-3 of it); a hundredth of one step (lr = 1e-2) bounds
        # that. The gradients below are the strict check (AdamW would hide a wrong scale).
        torch.testing.assert_close(got["weights"][name], tensor, rtol=0, atol=1e-4)
    grads = _grads(single)
    for name, grad in grads.items():
        # float32 rounding in another summation order (~1e-7 seen); a wrong share or scale is far above
        torch.testing.assert_close(got["grads"][name], grad, rtol=1e-5, atol=1e-6)
    for key in ("loss", "grad_norm", "clip_frac", "ratio_mean", "kl", "tokens"):
        assert got["metrics"][key] == pytest.approx(metrics[key], rel=1e-5, abs=1e-7), key


def _two_steps(model_dir: str) -> dict[str, torch.Tensor]:
    single = Trainer(model_dir, _cfg("token", 0.1, 1), threads=1)
    single.train_step(BATCH)
    single.train_step(BATCH)
    return single.state_dict_for_engine()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_checkpoint_of_two_ranks_resumes_on_one(model_dir: str, two_rank_results: dict) -> None:
    resumed = Trainer(model_dir, _cfg("token", 0.1, 1), threads=1)
    assert load_trainer(resumed, str(two_rank_results["out"] / "ckpt-2")) == 1
    resumed.train_step(BATCH)
    got = resumed.state_dict_for_engine()
    for name, tensor in _two_steps(model_dir).items():
        if not name.endswith("k_proj.bias"):  # see test_two_ranks_update_equals_one_rank
            torch.testing.assert_close(got[name], tensor, rtol=0, atol=1e-4)


def test_checkpoint_of_one_rank_resumes_on_two(model_dir: str, two_rank_results: dict) -> None:
    got = two_rank_results["resumed-from-1"]
    assert got["version"] == 1
    for name, tensor in _two_steps(model_dir).items():
        if not name.endswith("k_proj.bias"):
            torch.testing.assert_close(got["weights"][name], tensor, rtol=0, atol=1e-4)


def test_two_ranks_give_the_log_probs_of_their_weights(model_dir: str, two_rank_results: dict) -> None:
    # Rule: the sharded trainer's sequence_logprobs are those one trainer computes with the same weights.
    got = two_rank_results["resumed-from-1"]
    single = Trainer(model_dir, _cfg("token", 0.1, 1), threads=1)
    single.model.load_state_dict(got["weights"])
    want = single.sequence_logprobs(BATCH)
    assert [len(row) for row in got["logprobs"]] == [len(ex.response_ids) for ex in BATCH]
    for row, expected in zip(got["logprobs"], want):
        assert row == pytest.approx(expected, abs=1e-5)


def test_activation_checkpointing_changes_no_update(model_dir: str) -> None:
    # Rule: recomputing a block's activations in backward gives the same gradients (eval mode, no dropout).
    plain, checkpointed = (Trainer(model_dir, dataclasses.replace(_cfg("token", 0.1, 1), activation_checkpointing=on),
                                   threads=1) for on in (False, True))
    for trainer in (plain, checkpointed):
        _perturb(trainer)
        trainer.train_step(BATCH)
    for (name, p), (_, q) in zip(plain.model.named_parameters(), checkpointed.model.named_parameters()):
        torch.testing.assert_close(q, p, rtol=0, atol=1e-6, msg=name)
    assert checkpointed.ref_model is not None
    assert "forward" not in vars(checkpointed.ref_model.model.layers[0])  # the reference is not wrapped


@pytest.mark.parametrize("overrides,message", [
    ({"train": {"world_size": 0}}, "train.world_size.*must be >= 1"),
    ({"train": {"world_size": 5}, "rollout": {"prompts_per_step": 4}}, "train.world_size.*at most 4 prompt groups"),
    ({"train": {"world_size": 2}, "placement": {"share_gpu": True}, "rollout": {"num_workers": 1,
      "gpu_memory_utilization": 0.4}}, "must be 1 with placement.share_gpu"),
    ({"train": {"sync_transport": "process_group"}, "placement": {"share_gpu": True}, "rollout": {"num_workers": 1,
      "gpu_memory_utilization": 0.4}}, "sync_transport.*must be object_store with placement.share_gpu"),
    ({"train": {"sync_transport": "nccl"}}, "train.sync_transport.*allowed values"),
])
def test_bad_world_size_is_a_config_error(overrides: dict, message: str) -> None:
    from rhymerl.config.run import config_from_dict
    from rhymerl.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        config_from_dict(overrides)
