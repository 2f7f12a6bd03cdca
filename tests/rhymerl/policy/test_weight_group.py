"""Weights by broadcast (gloo): a sender and receivers in spawned processes, as trainer and engines.

The engine side here is a plain process holding a Hugging Face Qwen2, loading each received tensor
into its parameter in place; the vLLM worker extension's receiver is tested with an engine in
tests/rhymerl/vllm/test_engine_weight_sync.py (slow).
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
import transformers

from rhymerl.policy.sharded import free_port
from rhymerl.policy.trainer import Trainer
from rhymerl.config.run import TrainConfig
from rhymerl.vllm.worker_ext import weights_fingerprint
from rhymerl.policy.weight_group import ALIGN, GroupAddress, open_group, pack, unpack
from rhymerl.policy.weight_sync import bucketed
from helpers.sharded import BATCH, tiny_qwen2

MIXED = {"f32": torch.randn(3, 5), "bf16": torch.randn(7).to(torch.bfloat16), "i64": torch.arange(3),
         "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 4), "f16": torch.randn(2, 3).half()}


def test_pack_round_trips_dtypes_shapes_and_aligns() -> None:
    header, payload = pack(MIXED, torch.device("cpu"))
    assert header.dtype == payload.dtype == torch.uint8 and payload.numel() % ALIGN == 0
    got = dict(unpack(header, payload))
    assert list(got) == list(MIXED)  # the sender's order
    for name, tensor in MIXED.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(got[name], tensor), name
        # a view into the payload, not a copy: the receiver loads from the bucket's own buffer
        assert got[name].numel() == 0 or got[name].untyped_storage().data_ptr() == payload.untyped_storage().data_ptr()


def test_address_and_rank_are_checked() -> None:
    with pytest.raises(ValueError, match="world_size"):
        GroupAddress("127.0.0.1", 1234, world_size=1)
    with pytest.raises(ValueError, match="backend"):
        GroupAddress("127.0.0.1", 1234, world_size=2, backend="mpi")
    with pytest.raises(ValueError, match="rank 2"):
        open_group(GroupAddress("127.0.0.1", 1234, world_size=2), rank=2)


def _member(rank: int, address: GroupAddress, model_dir: str, trained_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    group = open_group(address, rank, timeout_s=60)
    if rank == 0:  # the trainer: trained weights, bucketed small so the sync takes several buckets
        trainer = Trainer(trained_dir, TrainConfig(), threads=1)
        sent = group.send(bucketed(trainer.engine_tensors(), bucket_bytes=4096))
        torch.save({"sent": sent, "fingerprint": weights_fingerprint(trainer.model.named_parameters())},
                   f"{out_dir}/0.pt")
    else:  # an engine: the initial weights, replaced in place one received tensor at a time
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        params = dict(model.named_parameters(remove_duplicate=False))
        storages = {name: p.data_ptr() for name, p in params.items()}
        names = []
        with torch.no_grad():
            for name, tensor in group.receive():
                params[name].copy_(tensor)
                names.append(name)
        moved = [name for name, p in params.items() if p.data_ptr() != storages[name]]
        torch.save({"names": names, "moved": moved, "weights": {k: v.clone() for k, v in params.items()},
                    "fingerprint": weights_fingerprint(model.named_parameters())}, f"{out_dir}/{rank}.pt")
    group.close()


@pytest.fixture(scope="module")
def synced(tmp_path_factory: pytest.TempPathFactory) -> dict:
    model_dir = tiny_qwen2(tmp_path_factory.mktemp("initial"))
    trained = Trainer(model_dir, TrainConfig(lr=1e-2), threads=1)
    trained.train_step(BATCH)  # weights the receivers do not have yet
    trained_dir = str(trained.save(tmp_path_factory.mktemp("trained")))
    out = tmp_path_factory.mktemp("synced")
    address = GroupAddress("127.0.0.1", free_port(), world_size=3)  # a trainer and two engines
    mp.spawn(_member, args=(address, model_dir, trained_dir, str(out)), nprocs=3, join=True)
    expected = Trainer(trained_dir, TrainConfig(), threads=1).state_dict_for_engine()
    return {"expected": expected, **{rank: torch.load(out / f"{rank}.pt") for rank in range(3)}}


@pytest.mark.parametrize("rank", [1, 2])
def test_every_receiver_holds_the_senders_weights_in_place(synced: dict, rank: int) -> None:
    got, expected = synced[rank], synced["expected"]
    assert got["names"] == list(expected)  # every tensor once, in the sender's order
    assert got["moved"] == []  # loaded into the existing parameters: no new storage
    for name, tensor in expected.items():
        assert torch.equal(got["weights"][name], tensor), name
    assert got["fingerprint"] == synced[0]["fingerprint"]  # the sync's check, exact here


def test_sender_counts_every_byte(synced: dict) -> None:
    tensors = synced["expected"].values()
    assert synced[0]["sent"] >= sum(t.numel() * t.element_size() for t in tensors)  # plus alignment
