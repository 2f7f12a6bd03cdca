"""An exported checkpoint gives the trainer's log-probs in transformers and in vLLM, for a one-rank
(trainer.pt) and a two-rank (sharded DCP) checkpoint.

The checkpoints come from trainers that take GRPO steps and save, as a run's would (no RL run):
a `Trainer`'s state bytes after one step in the checkpoint store, and a 2-rank `ShardedTrainer`
(FSDP2 on gloo, two spawned processes) writing DCP shards after two steps, committed by the store.
Each is exported from its checkpoint step folder (`rhymerl.policy.export.export_checkpoint`) and
loaded by `LLM(OUT)` (through `VllmEngine`), one engine after the other (~1 min each). The engine's
in-place weight load is not a substitute for the second start: it is made for the trainer's whole
state dict (lm_head.weight included), not for a tied export's files, and did not match there.

Log-probs are of fixed token sequences (`probe_ids`): ids[i + 1] given ids[:i + 1]. Tolerances,
float32 on CPU: transformers 1e-5 (the trainer's own forward, only the load in between); vLLM
1e-4 (its own kernels; the run's weight sync accepts 1e-3).
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from helpers.export import tiny_source
from helpers.sharded import BATCH

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]
HF_TOL, VLLM_TOL = 1e-5, 1e-4


def _cfg(world_size: int):
    from rhymerl.config.run import TrainConfig

    return TrainConfig(lr=1e-2, micro_batch_size=2, world_size=world_size)


def _rank(rank: int, source: str, port: int, url: str, out: str) -> None:
    from rhymerl.policy.checkpoint import save_trainer
    from rhymerl.policy.sharded import DistSpec, ShardedTrainer
    from rhymerl.policy.trainer import probe_ids

    trainer = ShardedTrainer(source, _cfg(2), DistSpec(rank, 2, "127.0.0.1", port), threads=1)
    trainer.train_step(BATCH)
    trainer.train_step(BATCH[::-1])  # a second step: other weights than the one-rank checkpoint's
    save_trainer(trainer, url)
    logprobs = trainer.probe_logprobs(probe_ids(trainer.vocab_size))  # collective: both ranks
    if rank == 0:
        torch.save(logprobs, f"{out}/two-rank-logprobs.pt")


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """{"one-rank"|"two-rank": (exported folder, the trainer's probe log-probs)}, and the probe ids."""
    from rhymerl.policy.export import export_checkpoint
    from rhymerl.policy.sharded import free_port
    from rhymerl.policy.trainer import Trainer, probe_ids
    from storage.checkpoints import CheckpointStore

    root = tmp_path_factory.mktemp("export_vllm")
    source = str(tiny_source(root / "source", hidden=64))  # head size 32: one vLLM's CPU kernels take
    store = CheckpointStore(str(root / "ckpt"))
    trainer = Trainer(source, _cfg(1), threads=1)
    trainer.train_step(BATCH)
    ids = probe_ids(trainer.vocab_size)
    store.save("one", 0, trainer.state_bytes(), {"epoch": 0})
    mp.spawn(_rank, args=(source, free_port(), store.sharded_url("two", 0), str(root)), nprocs=2, join=True)
    store.commit_sharded("two", 0, {"epoch": 0})
    out = {}
    for name, run, logprobs in (("one-rank", "one", trainer.probe_logprobs(ids)),
                                ("two-rank", "two", torch.load(root / "two-rank-logprobs.pt"))):
        folder = export_checkpoint(root / "ckpt" / run / "step-00000000", source, root / name)
        out[name] = (folder, logprobs)
    return out, ids


def _hf_logprobs(folder, ids: list[int]) -> list[float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), -1)
    return logp.gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1).tolist()


@pytest.mark.parametrize("kind", ["one-rank", "two-rank"])
def test_transformers_gives_the_trainers_logprobs(exports, kind: str) -> None:
    found, ids = exports
    folder, want = found[kind]
    assert _hf_logprobs(folder, ids) == pytest.approx(want, abs=HF_TOL)


def test_vllm_gives_the_trainers_logprobs(exports) -> None:
    from rhymerl.vllm.engine import EngineSettings, VllmEngine
    from rhymerl.vllm.spec_guard import shutdown_llm

    found, ids = exports
    (one, one_lp), (two, two_lp) = found["one-rank"], found["two-rank"]
    assert max(abs(a - b) for a, b in zip(one_lp, two_lp)) > 10 * VLLM_TOL  # the check can tell them apart
    for folder, want in ((one, one_lp), (two, two_lp)):  # one engine at a time
        engine = VllmEngine(EngineSettings(str(folder), max_model_len=128))
        try:
            assert engine.probe_logprobs(ids) == pytest.approx(want, abs=VLLM_TOL), folder.name
        finally:
            shutdown_llm(engine.llm)
