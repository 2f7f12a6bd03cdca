"""What the export tests share: a tiny random Qwen2 with the built-in tokenizer, saved as a model
folder, and (`trained_exports`) a one-rank and a two-rank checkpoint of it exported as model folders."""

from __future__ import annotations

import torch


def tiny_source(folder, hidden: int = 16, layers: int = 2, heads: int = 2, max_positions: int = 128):
    """A seeded tied Qwen2 (vocab of the built-in tokenizer) with its tokenizer and generation
    config saved in `folder`: what a run's model.path holds. Returns `folder`."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from rhymerl.policy.build import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=1, intermediate_size=2 * hidden,
                         max_position_embeddings=max_positions, tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, dtype="float32", architectures=["Qwen2ForCausalLM"])
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _train_cfg(world_size: int):
    from rhymerl.config.run import TrainConfig

    return TrainConfig(lr=1e-2, micro_batch_size=2, world_size=world_size)


def _rank(rank: int, source: str, port: int, url: str, out: str) -> None:
    from helpers.sharded import BATCH

    from rhymerl.policy.checkpoint import save_trainer
    from rhymerl.policy.sharded import DistSpec, ShardedTrainer
    from rhymerl.policy.trainer import probe_ids

    trainer = ShardedTrainer(source, _train_cfg(2), DistSpec(rank, 2, "127.0.0.1", port), threads=1)
    trainer.train_step(BATCH)
    trainer.train_step(BATCH[::-1])  # a second step: other weights than the one-rank checkpoint's
    save_trainer(trainer, url)
    logprobs = trainer.probe_logprobs(probe_ids(trainer.vocab_size))  # collective: both ranks
    if rank == 0:
        torch.save(logprobs, f"{out}/two-rank-logprobs.pt")


def trained_exports(root, max_positions: int = 128):
    """Checkpoints of trainers that took GRPO steps and saved, as a run's would (no RL run): a
    `Trainer`'s state bytes after one step in the checkpoint store, and a 2-rank `ShardedTrainer`
    (FSDP2 on gloo, two spawned processes) writing DCP shards after two steps, committed by the
    store; each exported from its checkpoint step folder. Returns ({"one-rank"|"two-rank":
    (exported folder, the trainer's probe log-probs)}, the probe ids)."""
    import torch.multiprocessing as mp

    from helpers.sharded import BATCH

    from rhymerl.policy.export import export_checkpoint
    from rhymerl.policy.sharded import free_port
    from rhymerl.policy.trainer import Trainer, probe_ids
    from storage.checkpoints import CheckpointStore

    # head size 32: one vLLM's CPU kernels take
    source = str(tiny_source(root / "source", hidden=64, max_positions=max_positions))
    store = CheckpointStore(str(root / "ckpt"))
    trainer = Trainer(source, _train_cfg(1), threads=1)
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
