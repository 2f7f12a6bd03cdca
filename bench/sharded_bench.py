"""Sharded trainer on Ray: memory per rank, step time, weight sync s/GB, checkpoint write/read.

A mid-size Qwen2 (random weights, built locally: no download) is trained for two steps by a
trainer of world size 1, then 2 (gloo on CPU, `workers.trainer_group`); each measures:

- state_mb_per_rank: parameters + AdamW state held by one rank (its shards), from the tensors;
- rss_mb / peak_rss_mb per rank: resident memory after the steps, and its peak (the peak includes
  loading the whole model before sharding);
- step_s: the second step's wall time;
- sync_s_per_gb: the bucketed weight stream (`state_buckets`) through Ray's object store into two
  sink actors (as into two engines), seconds per GB of weights;
- pg_sync_s_per_gb: the same weights broadcast by rank 0 over a weight group (`workers.sync_group`,
  `train.sync_transport = "process_group"`, gloo here) into two sink actors;
- ckpt_write_s / ckpt_read_s: a sharded checkpoint (torch.distributed.checkpoint) to a local folder.

    rhymerl bench sharded --json-out bench/out/sharded.json     (or python -m bench.sharded_bench)
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import ray
import torch
import transformers

from rhymerl.config.run import RunConfig, TrainConfig
from rhymerl.policy.trainer import TrainExample
from workers.actors import Placement
from workers.sync_group import broadcast_weights
from workers.trainer_group import launch_trainer, stop_trainer

ON_CPU = Placement(worker_cpus=1, worker_gpus=0, trainer_cpus=0, trainer_gpus=0)


def build_model(path: Path, hidden: int, layers: int, vocab: int) -> int:
    """A random Qwen2 of the given size saved at `path`; its parameter count."""
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                      num_attention_heads=hidden // 64, num_key_value_heads=2,
                                      intermediate_size=4 * hidden, max_position_embeddings=512,
                                      tie_word_embeddings=True)
    model = transformers.Qwen2ForCausalLM(config)
    model.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def batch(vocab: int, sequences: int, prompt: int, response: int) -> list[TrainExample]:
    g = torch.Generator().manual_seed(1)
    return [TrainExample(tuple(torch.randint(vocab, (prompt,), generator=g).tolist()),
                         tuple(torch.randint(vocab, (response - 4 * i,), generator=g).tolist()),
                         1.0 if i % 2 else -1.0) for i in range(sequences)]


@ray.remote(num_cpus=0)
class Sink:
    """Takes weight buckets as an engine's stage_weights would, and counts their bytes."""

    def stage(self, bucket: dict) -> int:
        return sum(t.numel() * t.element_size() for t in bucket.values())

    def ready(self) -> bool:
        return True


@ray.remote(num_cpus=0)
class GroupSink:
    """Joins a weight group as an engine worker would (`rhymerl.policy.weight_group`); counts the bytes."""

    def receive_weights(self, address, first_rank: int) -> int:
        from rhymerl.policy.weight_group import open_group

        group = open_group(address, first_rank)
        got = sum(t.numel() * t.element_size() for _, t in group.receive())
        group.close()
        return got

    def ready(self) -> bool:
        return True


def _memory(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a local process in MB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def measure(model_dir: str, world: int, examples: list[TrainExample], bucket_mb: int) -> dict:
    cfg = RunConfig(train=TrainConfig(world_size=world, micro_batch_size=4, sync_bucket_mb=bucket_mb))
    t0 = time.perf_counter()
    trainer = launch_trainer(model_dir, cfg, ON_CPU, threads=2)
    start_s = time.perf_counter() - t0
    ranks = getattr(trainer, "ranks", [trainer])
    ray.get(trainer.train_step.remote(examples))
    t0 = time.perf_counter()
    ray.get(trainer.train_step.remote(examples))
    step_s = time.perf_counter() - t0
    state_mb = [b / 2**20 for b in ray.get([r.held_bytes.remote() for r in ranks])]
    sinks, group_sinks = [Sink.remote() for _ in range(2)], [GroupSink.remote() for _ in range(2)]
    ray.get([a.ready.remote() for a in (*sinks, *group_sinks)])  # actor start-up is not the sync's time
    t0 = time.perf_counter()
    buckets = trainer.state_buckets.remote(bucket_mb * 2**20)
    moved = sum(ray.get([s.stage.remote(ref) for s in sinks])[0] for ref in buckets)
    sync_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    broadcast_weights(trainer, group_sinks, bucket_mb * 2**20)
    pg_sync_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as folder:
        t0 = time.perf_counter()
        ray.get(trainer.save_checkpoint.remote(folder, {}))
        write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ray.get(trainer.load_checkpoint.remote(folder, {}))
        read_s = time.perf_counter() - t0
        ckpt_mb = sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file()) / 2**20
    memory = [_memory(ray.get(r.info.remote())["pid"]) for r in ranks]
    stop_trainer(trainer)
    return {"world_size": world, "start_s": start_s, "step_s": step_s, "state_mb_per_rank": state_mb,
            "rss_mb": [m[0] for m in memory], "peak_rss_mb": [m[1] for m in memory],
            "sync_gb": moved / 1e9, "sync_s": sync_s, "sync_s_per_gb": sync_s / (moved / 1e9),
            "pg_sync_s": pg_sync_s, "pg_sync_s_per_gb": pg_sync_s / (moved / 1e9),
            "ckpt_mb": ckpt_mb, "ckpt_write_s": write_s, "ckpt_read_s": read_s}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--bucket-mb", type=int, default=64)
    parser.add_argument("--json-out", default="")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        params = build_model(Path(folder), args.hidden, args.layers, args.vocab)
        examples = batch(args.vocab, args.sequences, prompt=32, response=96)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            rows = [measure(folder, world, examples, args.bucket_mb) for world in (1, 2)]
        finally:
            ray.shutdown()
    out = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {torch.get_num_threads()} threads",
           "params_m": params / 1e6, "sequences": args.sequences, "rows": rows}
    print(json.dumps(out, indent=1))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
