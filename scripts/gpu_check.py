"""The trainer's real code path on one device, measured and checked: what `scripts/gpu-check.sh` runs.

    scripts/gpu-check.sh [--tiny] [--out bench/out/gpu-check.json] [--steps 3] [--micro-batch-size 8]

A randomly initialised model of Qwen2-0.5B's shape (transformers' `Qwen2Config`; nothing is
downloaded) is saved to a temporary folder and trained by `rhymerl.policy.sharded.ShardedTrainer`
with `train.world_size = 1`: FSDP2 (`fully_shard` on a one-rank mesh), bfloat16 compute on a GPU
(`train.bf16_compute`; float32 master weights and optimizer state), activation checkpointing, the
GRPO loss. The batch is synthetic: 8 prompts x 8 samples of 256 prompt + 768 response tokens (64
sequences of 1,024), random token ids, advantages from random rewards by `grpo.group_advantages`.
One warm-up step, then `--steps` timed ones.

Then the sync check: the trained weights as the engines get them (`state_dict_for_engine`, gathered
from the shards) are loaded into a fresh plain model (no FSDP, no checkpointing, the same compute
dtype), and its log-probs of the first micro-batch's responses are compared with the trainer's own
(`sequence_logprobs`). They must agree within LOGPROB_ATOL; and training must have moved the
log-probs by more than that, or the check could not tell trained weights from stale ones.

One JSON file: device, shape, tokens per second (prompt + response tokens through the training
steps, after the warm-up), peak memory (`torch.cuda.max_memory_allocated` on a GPU, the process's
peak RSS on a CPU) and the log-prob figures. Exit status 1 when a check fails (the JSON is written
first). `--tiny` (a 2-block, hidden-64 model, 4 sequences of 64 tokens) runs in seconds on a CPU.

Needs only torch and transformers (the rhymerl modules it imports load nothing else).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
import transformers
from transformers import AutoModelForCausalLM, Qwen2Config

from rhymerl.config.run import TrainConfig
from rhymerl.policy import grpo
from rhymerl.policy.sampling import token_logprobs
from rhymerl.policy.sharded import DistSpec, ShardedTrainer, free_port
from rhymerl.policy.trainer import TrainExample

# Qwen2.5-0.5B's architecture (hidden, intermediate, blocks, heads, KV heads, vocabulary, tied head)
SHAPES: dict[str, dict] = {
    "qwen2-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                       max_position_embeddings=32768, rope_theta=1e6),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256, tie_word_embeddings=True, max_position_embeddings=128),
}

# Largest |trainer - plain forward| log-prob allowed, by compute dtype. Both sides run the same
# weights in the same dtype, so only kernel choice and summation order differ: float32 agrees to
# ~1e-6; bfloat16 rounds every activation (8 bits of mantissa) through every block.
LOGPROB_ATOL = {torch.float32: 1e-3, torch.bfloat16: 0.05}


@dataclass(frozen=True)
class BatchShape:
    """A synthetic GRPO batch: `groups` prompts, `samples` responses each, fixed lengths."""

    groups: int
    samples: int
    prompt_tokens: int
    response_tokens: int

    @property
    def sequences(self) -> int:
        return self.groups * self.samples

    @property
    def tokens(self) -> int:
        """Prompt + response tokens of the whole batch: what one step runs through the model."""
        return self.sequences * (self.prompt_tokens + self.response_tokens)


BATCHES = {"qwen2-0.5b": BatchShape(8, 8, 256, 768), "tiny": BatchShape(2, 2, 16, 48)}


def log(message: str) -> None:
    print(f"gpu-check: {message}", file=sys.stderr, flush=True)


def synthetic_batch(shape: BatchShape, vocab_size: int, seed: int = 0) -> list[TrainExample]:
    """Random prompts and responses; rewards uniform in [0, 1), so no group is flat (every
    advantage is nonzero and every sequence has a gradient)."""
    generator = torch.Generator().manual_seed(seed)
    rewards = torch.rand(shape.groups, shape.samples, generator=generator)
    advantages = grpo.group_advantages(rewards)  # (G, n)
    batch = []
    for g in range(shape.groups):
        prompt = tuple(torch.randint(0, vocab_size, (shape.prompt_tokens,), generator=generator).tolist())
        for s in range(shape.samples):
            response = torch.randint(0, vocab_size, (shape.response_tokens,), generator=generator).tolist()
            batch.append(TrainExample(prompt, tuple(response), float(advantages[g, s])))
    return batch


def cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Parameters to `dtype`, buffers kept: the rotary `inv_freq` stays float32, as under FSDP2's
    mixed precision (which casts parameters only); a bfloat16 `inv_freq` would shift every angle."""
    with torch.no_grad():
        for param in model.parameters():
            param.data = param.data.to(dtype)


@torch.no_grad()
def plain_logprobs(config: Qwen2Config, weights: dict[str, torch.Tensor], examples: list[TrainExample],
                   dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Log-probs (B, T) of the responses of `examples` (all of one prompt and one response length)
    under a fresh Hugging Face model holding `weights`, computed in `dtype`: no FSDP, no checkpointing."""
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(weights)
    cast_parameters(model, dtype)
    model.to(device).eval()
    ids = torch.tensor([ex.prompt_ids + ex.response_ids for ex in examples], device=device)  # (B, L)
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
    start = len(examples[0].prompt_ids)
    # logits at position i predict token i + 1: the response's rows are start - 1 .. L - 2
    out = token_logprobs(logits[:, start - 1:-1], ids[:, start:]).cpu()
    del model, logits
    return out


def build_model(config: Qwen2Config, folder: Path, seed: int) -> tuple[dict[str, torch.Tensor], int]:
    """A seeded random model of `config` saved at `folder` (float32); its weights (for the
    log-probs before training) and its parameter count (a tied head counted once)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    count = sum(p.numel() for p in model.parameters())
    return {name: t.detach().clone() for name, t in model.state_dict().items()}, count


def peak_memory(device: torch.device) -> tuple[int, str]:
    """Peak bytes and how they were counted: the CUDA allocator's peak on a GPU, peak RSS on a CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    # ru_maxrss is in KiB on Linux, in bytes on macOS
    scale = 1 if platform.system() == "Darwin" else 1024
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale, "peak RSS of the process"


def train(trainer: ShardedTrainer, batch: list[TrainExample], steps: int) -> dict:
    """One warm-up step, then `steps` timed ones; throughput over the timed ones."""
    log("warm-up step")
    trainer.train_step(batch)
    seconds, metrics = 0.0, []
    for step in range(steps):
        start = time.perf_counter()
        metrics.append(trainer.train_step(batch))  # ends on .item(): the device has finished
        seconds += time.perf_counter() - start
        log(f"step {step + 1}/{steps}: loss {metrics[-1]['loss']:.4g}, {metrics[-1]['seconds']:.2f} s")
    tokens = sum(len(ex.prompt_ids) + len(ex.response_ids) for ex in batch) * steps
    return {
        "steps": steps,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "response_tokens_per_s": sum(m["tokens"] for m in metrics) / seconds,
        "last_step": {key: metrics[-1][key] for key in ("loss", "grad_norm", "clip_frac", "ratio_mean", "lr")},
    }


def compute_dtype(trainer: ShardedTrainer) -> torch.dtype:
    """The dtype the trainer's forward runs in: bfloat16 under FSDP2 mixed precision on a GPU
    (`train.bf16_compute`), else its weights' dtype."""
    if trainer.device.type == "cuda" and trainer.cfg.bf16_compute:
        return torch.bfloat16
    return next(trainer.model.parameters()).dtype


def sync_check(trainer: ShardedTrainer, config: Qwen2Config, initial: dict[str, torch.Tensor],
               examples: list[TrainExample], atol: float | None) -> dict:
    """The trainer's log-probs of `examples` against a fresh plain forward of the weights it hands
    out, and how far training moved them from the initial weights'."""
    dtype = compute_dtype(trainer)
    atol = LOGPROB_ATOL[dtype] if atol is None else atol
    ours = torch.tensor(trainer.sequence_logprobs(examples))  # (B, T): equal lengths
    weights = trainer.state_dict_for_engine()
    fresh = plain_logprobs(config, weights, examples, dtype, trainer.device)
    before = plain_logprobs(config, initial, examples, dtype, trainer.device)
    diff = float((ours - fresh).abs().max())
    change = float((fresh - before).abs().max())
    return {"compute_dtype": str(dtype).removeprefix("torch."), "sequences": len(examples),
            "tokens": int(ours.numel()), "logprob_max_abs_diff": diff, "logprob_tolerance": atol,
            "logprob_max_abs_change": change, "finite": bool(torch.isfinite(ours).all())}


def failures(report: dict) -> list[str]:
    """What the check found wrong, each a sentence naming the problem and what it means."""
    check = report["sync_check"]
    found = []
    if not (check["finite"] and all(map(_finite, report["training"]["last_step"].values()))):
        found.append("a loss, gradient norm or log-prob is not finite: the training step diverged")
    if not check["logprob_max_abs_diff"] <= check["logprob_tolerance"]:
        found.append(f"the trainer's log-probs and a plain forward of the weights it hands out differ by up to "
                     f"{check['logprob_max_abs_diff']:.3g} > {check['logprob_tolerance']:.3g}: the weights the "
                     "engines would get (state_dict_for_engine) are not the ones the trainer computes with")
    if not check["logprob_max_abs_change"] > check["logprob_tolerance"]:
        found.append(f"training moved the log-probs by at most {check['logprob_max_abs_change']:.3g}, not more "
                     f"than the tolerance {check['logprob_tolerance']:.3g}: the check cannot tell trained weights "
                     "from stale ones; raise --steps or --lr")
    return found


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


def run(shape_name: str, steps: int, micro_batch_size: int, lr: float | None, atol: float | None,
        seed: int = 0) -> dict:
    """Build, train and check; the report (see the module docstring)."""
    config = Qwen2Config(attn_implementation="sdpa", **SHAPES[shape_name])
    shape = BATCHES[shape_name]
    cfg = TrainConfig(world_size=1, bf16_compute=True, activation_checkpointing=True,
                      micro_batch_size=micro_batch_size, **({} if lr is None else {"lr": lr}))
    with tempfile.TemporaryDirectory(prefix="rhymerl-gpu-check-") as folder:
        log(f"building a random {shape_name} model in {folder}")
        initial, parameters = build_model(config, Path(folder), seed)
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        spec = DistSpec(rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port())
        trainer = ShardedTrainer(folder, cfg, spec, seed=seed, dtype="float32")
    try:
        batch = synthetic_batch(shape, config.vocab_size, seed)
        training = train(trainer, batch, steps)
        memory, memory_kind = peak_memory(trainer.device)
        log("sync check: trainer log-probs against a fresh plain forward")
        check = sync_check(trainer, config, initial, batch[:micro_batch_size], atol)
        device, sharded = trainer.device, isinstance(trainer.model, FSDPModule)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "device_type": device.type,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "shape": {"name": shape_name, **SHAPES[shape_name],
                  "parameters": parameters,
                  **asdict(shape), "sequences": shape.sequences},
        "trainer": {"world_size": 1, "fsdp2": sharded, "weights_dtype": "float32", "bf16_compute": cfg.bf16_compute,
                    "activation_checkpointing": cfg.activation_checkpointing,
                    "micro_batch_size": cfg.micro_batch_size, "lr": cfg.lr},
        "training": training,
        "peak_memory_bytes": memory, "peak_memory_kind": memory_kind,
        "sync_check": check,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny model and batch (seconds on a CPU)")
    parser.add_argument("--out", default="bench/out/gpu-check.json", help="the JSON report's path")
    parser.add_argument("--steps", type=int, default=3, help="timed training steps after the warm-up")
    parser.add_argument("--micro-batch-size", type=int, default=None,
                        help="sequences per forward/backward (default 8; the whole batch with --tiny)")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default: train.lr's)")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="largest log-prob difference allowed (default by compute dtype: "
                             + ", ".join(f"{str(k).removeprefix('torch.')} {v:g}" for k, v in LOGPROB_ATOL.items())
                             + ")")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    shape = "tiny" if args.tiny else "qwen2-0.5b"
    micro = args.micro_batch_size or (BATCHES[shape].sequences if args.tiny else 8)
    report = run(shape, args.steps, micro, args.lr, args.tolerance)
    problems = failures(report)
    report["ok"] = not problems
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    log(f"report written to {out}")
    for problem in problems:
        log(f"FAILED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
