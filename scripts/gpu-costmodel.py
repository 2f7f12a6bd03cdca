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
GPU-like cost model. On a GPU each point is timed as a CUDA-graph replay of the forward (as vLLM
replays its decode steps; the eager time is kept beside it as `eager_seconds`, since an eager
forward on a fast GPU is bound by Python's kernel launches); on the CPU, eagerly. The attention is
PyTorch's SDPA over a contiguous cache, not vLLM's paged kernels: the absolute times differ, the
shape (weight streaming per iteration, compute per token, attention per cached token) is what the
cost model needs.
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
GRID = {"batch": (1, 8, 32, 64, 128, 256, 512), "query": (1, 4, 8, 17), "context": (256, 1024, 4096, 8192)}
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


def _forward(model: Qwen2ForCausalLM, ids: torch.Tensor, cache: DynamicCache, pos: torch.Tensor) -> None:
    model(input_ids=ids, past_key_values=cache, cache_position=pos, position_ids=pos.expand(ids.shape[0], -1),
          use_cache=True)


@torch.inference_mode()
def time_point(model: Qwen2ForCausalLM, batch: int, query: int, context: int, device: str, dtype: torch.dtype,
               repeats: int = 5, warmup: int = 2) -> float:
    """Median seconds of one eager forward of (batch, query) new tokens over `context` cached tokens."""
    cfg = model.config
    cache = random_cache(cfg, batch, context, device, dtype)
    ids = torch.randint(0, cfg.vocab_size, (batch, query), device=device)
    pos = torch.arange(context, context + query, device=device)
    times = []
    for i in range(warmup + repeats):
        _sync(device)
        t0 = time.perf_counter()
        _forward(model, ids, cache, pos)
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        cache.crop(-query)  # drop the query tokens again: every repeat sees the same context
    return statistics.median(times)


@torch.inference_mode()
def time_point_graph(model: Qwen2ForCausalLM, batch: int, query: int, context: int, device: str,
                     dtype: torch.dtype, repeats: int = 5) -> tuple[float, float]:
    """(median seconds of a CUDA-graph replay of the forward, seconds of the last eager warm-up forward).

    vLLM replays decode steps as CUDA graphs, so an eager forward (hundreds of kernel launches
    from Python) overstates the fixed cost of a step several times on a fast GPU. The graph
    captures one forward over this cache; each replay recomputes it on the same buffers (the
    cache's concatenation writes into the graph's own pool, so every replay sees `context`
    cached tokens). The original K/V tensors are held so that the replays read live memory.
    """
    cfg = model.config
    cache = random_cache(cfg, batch, context, device, dtype)
    held = [(layer.keys, layer.values) for layer in cache.layers]
    ids = torch.randint(0, cfg.vocab_size, (batch, query), device=device)
    pos = torch.arange(context, context + query, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graph requires
        for _ in range(2):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            _forward(model, ids, cache, pos)
            torch.cuda.synchronize()
            eager_s = time.perf_counter() - t0
            cache.crop(-query)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _forward(model, ids, cache, pos)
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    del graph, held, cache
    return statistics.median(times), eager_s


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
                        point.update(_time(model, point, device, dtype, repeats, warmup, out))
                        out["points"].append(point)
                    except torch.OutOfMemoryError:
                        out["skipped"].append({**point, "why": "out of memory"})
                        torch.cuda.empty_cache()
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


def _time(model: Qwen2ForCausalLM, point: dict, device: str, dtype: torch.dtype, repeats: int, warmup: int,
          out: dict) -> dict:
    """{"seconds": ...} of one point: a CUDA-graph replay on a GPU (eager seconds beside it), else eager.

    If a capture fails (an op that syncs with the host, say), the rest of that model is timed
    eagerly and the failure is recorded in out["graph_error"].
    """
    b, q, c = point["batch"], point["query"], point["context"]
    if device.startswith("cuda") and "graph_error" not in out:
        try:
            seconds, eager_s = time_point_graph(model, b, q, c, device, dtype, repeats)
            return {"seconds": seconds, "eager_seconds": eager_s, "timing": "cuda-graph"}
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 -- any capture failure falls back to eager timing
            out["graph_error"] = f"{type(exc).__name__}: {exc}"[:500]
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return {"seconds": time_point(model, b, q, c, device, dtype, repeats, warmup), "timing": "eager"}


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
