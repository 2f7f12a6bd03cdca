"""Measure a decode step's forward time on this machine's accelerator: the cost surface for HistoPipe.

    .venv/bin/python scripts/gpu-costmodel.py [--out bench/results/cost-surface-<device>.json]
                                             [--models 0.5b,1.5b,7b] [--budget-s 270] [--device cuda]

For each model (random-weight Qwen2 architecture built from transformers' `Qwen2Config`: the
0.5B, 1.5B and 7B shapes of Qwen2.5; bf16 on a GPU) it times one forward of `batch` sequences
that each hold `context` tokens in a KV cache and feed `query` new tokens (query 1 is a plain
decode step; query > 1 is a speculative verification step), over a grid of (batch, query,
context). Only torch and transformers are used (no vLLM, no network, no weights to download), so
it runs on any GPU box with a plain PyTorch install; the whole grid fits in `--budget-s` (grid
points left when the budget runs out are skipped and listed). The KV cache is filled with random
tensors instead of a prefill: a forward's time does not depend on the cached values, and a
prefill of 256 x 8k tokens through a 7B model would cost more than the whole budget.

The JSON it writes is what `rhymerl.histopipe.cost_surface.load_cost_surface` reads, and what
`rhymerl bench e2e --cost-json` feeds to the cluster-scale estimate instead of the assumed
GPU-like cost model. The timing is eager PyTorch with SDPA attention: slower than vLLM's CUDA
graphs and paged attention in absolute terms, but it has the shape (weight streaming per
iteration, compute per token, attention per cached token) that the cost model needs.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

# Qwen2.5 shapes (hidden, intermediate, layers, attention heads, KV heads, tied embeddings)
SIZES: dict[str, dict] = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, tie_word_embeddings=True),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, tie_word_embeddings=False),
}
GRID = {"batch": (1, 8, 32, 64, 128, 256), "query": (1, 4, 8, 17), "context": (256, 1024, 4096, 8192)}
KV_BYTES_CAP = 48 * 2**30  # skip points whose KV cache alone is larger (the 7B at 256 x 8k needs 120 GB)


def qwen2_config(size: str, vocab_size: int = 151936) -> Qwen2Config:
    """The Qwen2.5 architecture of `size` (a key of SIZES), or a custom dict of Qwen2Config fields."""
    fields = SIZES[size] if isinstance(size, str) else size
    return Qwen2Config(vocab_size=vocab_size, max_position_embeddings=32768, rope_theta=1e6,
                       attn_implementation="sdpa", **fields)


def kv_bytes(cfg: Qwen2Config, batch: int, tokens: int, dtype: torch.dtype) -> int:
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * batch * cfg.num_key_value_heads * tokens * head_dim * dtype.itemsize


def random_cache(cfg: Qwen2Config, batch: int, context: int, device: str, dtype: torch.dtype) -> DynamicCache:
    """A KV cache holding `context` random tokens per sequence in every layer."""
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    cache = DynamicCache(config=cfg)
    for layer in range(cfg.num_hidden_layers):
        k = torch.randn(batch, cfg.num_key_value_heads, context, head_dim, device=device, dtype=dtype)
        cache.update(k, torch.randn_like(k), layer)
    return cache


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@torch.inference_mode()
def time_point(model: Qwen2ForCausalLM, batch: int, query: int, context: int, device: str, dtype: torch.dtype,
               repeats: int = 5, warmup: int = 2) -> float:
    """Median seconds of one forward of (batch, query) new tokens over `context` cached tokens."""
    cfg = model.config
    cache = random_cache(cfg, batch, context, device, dtype)
    ids = torch.randint(0, cfg.vocab_size, (batch, query), device=device)
    pos = torch.arange(context, context + query, device=device)
    times = []
    for i in range(warmup + repeats):
        _sync(device)
        t0 = time.perf_counter()
        model(input_ids=ids, past_key_values=cache, cache_position=pos, position_ids=pos.expand(batch, -1),
              use_cache=True)
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        cache.crop(-query)  # drop the query tokens again: every repeat sees the same context
    return statistics.median(times)


def build_model(cfg: Qwen2Config, device: str, dtype: torch.dtype) -> Qwen2ForCausalLM:
    """Random weights straight on `device` in `dtype` (no fp32 copy on the host)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def measure(cfg: Qwen2Config, grid: dict, device: str, dtype: torch.dtype, deadline: float,
            repeats: int = 5, warmup: int = 2) -> dict:
    """Time every (batch, query, context) of `grid` for one model until `deadline` (time.monotonic()).

    Returns {"params", "config", "points": [{batch, query, context, seconds}], "skipped": [...]}:
    a point is skipped (with its reason) when its KV cache exceeds KV_BYTES_CAP, it runs out of
    memory, or the deadline has passed. Points go small to large so a short budget keeps the cheap ones.
    """
    model = build_model(cfg, device, dtype)
    out = {"params": sum(p.numel() for p in model.parameters()), "config": cfg.to_diff_dict(),
           "points": [], "skipped": []}
    for context in grid["context"]:
        for query in grid["query"]:
            for batch in grid["batch"]:
                point = {"batch": batch, "query": query, "context": context}
                if time.monotonic() > deadline:
                    out["skipped"].append({**point, "why": "time budget"})
                elif kv_bytes(cfg, batch, context + query, dtype) > KV_BYTES_CAP:
                    out["skipped"].append({**point, "why": "KV cache over cap"})
                else:
                    try:
                        point["seconds"] = time_point(model, batch, query, context, device, dtype, repeats, warmup)
                        out["points"].append(point)
                    except torch.OutOfMemoryError:
                        out["skipped"].append({**point, "why": "out of memory"})
                        torch.cuda.empty_cache()
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(device) if device.startswith("cuda") else platform.processor() or "cpu"


def run(models: dict[str, Qwen2Config], grid: dict, device: str, dtype: torch.dtype, budget_s: float,
        repeats: int = 5, warmup: int = 2) -> dict:
    """The whole surface file: every model gets an equal share of what is left of `budget_s`."""
    start = time.monotonic()
    doc = {"format": "rhymerl-cost-surface/1", "device": device_name(device), "dtype": str(dtype).split(".")[-1],
           "torch": torch.__version__, "transformers": transformers.__version__,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "grid": {k: list(v) for k, v in grid.items()},
           "models": {}}
    for i, (name, cfg) in enumerate(models.items()):
        left = budget_s - (time.monotonic() - start)
        deadline = time.monotonic() + left / (len(models) - i)
        t0 = time.monotonic()
        doc["models"][name] = measure(cfg, grid, device, dtype, deadline, repeats, warmup)
        print(f"{name}: {len(doc['models'][name]['points'])} points, {len(doc['models'][name]['skipped'])} "
              f"skipped, {time.monotonic() - t0:.0f}s", file=sys.stderr, flush=True)
    doc["wall_s"] = time.monotonic() - start
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="\n\n".join(__doc__.split("\n\n")[:3]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="JSON path (default bench/results/cost-surface-<device>.json)")
    p.add_argument("--models", default="0.5b,1.5b,7b", help=f"comma-separated sizes of {list(SIZES)}")
    p.add_argument("--budget-s", type=float, default=270.0, help="seconds for the whole grid (default 270)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    if not args.device.startswith("cuda"):
        print("gpu-costmodel: no GPU; timing on the CPU says nothing about a GPU (use it for a smoke check)",
              file=sys.stderr)
    dtype = torch.bfloat16
    models = {f"qwen2-{s}": qwen2_config(s) for s in args.models.split(",")}
    doc = run(models, GRID, args.device, dtype, args.budget_s)
    slug = doc["device"].lower().replace(" ", "-")
    out = Path(args.out or f"bench/results/cost-surface-{slug}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out} in {doc['wall_s']:.0f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
