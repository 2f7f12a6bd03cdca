"""Measure a decode step's forward time the way an inference engine runs it: the cost surface for HistoPipe.

    .venv/bin/python scripts/gpu-costmodel.py [--out bench/results/cost-surface-<device>.json]
                                             [--models 0.5b,1.5b,7b] [--budget-s 270] [--device cuda]

For each model (random-weight Qwen2 architecture built from transformers' `Qwen2Config`: the
0.5B, 1.5B and 7B shapes of Qwen2.5; bf16 on a GPU) it times one forward of `batch` sequences
that each hold `context` tokens in a KV cache and feed `query` new tokens (query 1 is a plain
decode step; query > 1 is a speculative verification step), over a grid of (batch, query,
context). Only torch and transformers are used (no vLLM, no network, no weights to download), so
it runs on any GPU box with a plain PyTorch install; the whole grid fits in `--budget-s` (grid
points left when the budget runs out are skipped and listed).

The timed step is an engine's, not a Hugging Face `generate` step (`EngineStep`): the KV cache is
preallocated once per point and the step writes its new keys and values into it in place (no
concatenation, no growing cache); attention is PyTorch's SDPA with each query head group folded
onto its KV head, so every KV head is read once per step whatever the backend (what
`enable_gqa` does inside the flash kernels, here by layout, so it also holds for the masked
verification step); rotary cos/sin come from a table computed once. On a GPU each point is timed
both eagerly and as a CUDA-graph replay, and the faster is kept (`timing` says which; both
times are kept beside it): a graph saves kernel launches at small batches and can lose at large
ones. The weights and the projections are transformers' own modules, so only the cache and the
attention are this script's.

Beside each timed point a check: the first `CHECK_ROWS` sequences of the batch hold the real
keys and values of a token sequence (from a plain transformers forward of the same weights over
the whole sequence), and the timed forward's logits for them must equal that reference
forward's within `TOLERANCE[dtype]` (max |difference| over max |reference logit|); each point
records `logits_max_rel_diff` and `logits_ok`, and the script exits 1 if any point fails. The
other rows hold random keys and values: a forward's time does not depend on the cached values.

The JSON it writes is what `rhymerl.histopipe.cost_surface.load_cost_surface` reads, and what
`rhymerl bench e2e --cost-json` feeds to the cluster-scale estimate instead of the assumed
GPU-like cost model. The attention runs over one contiguous cache per sequence, not vLLM's
paged blocks; the weight streaming per step, the compute per token and the cache reads per
cached token are the same.
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
import torch.nn.functional as F
import transformers
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

FORMAT = "rhymerl-cost-surface/1"
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
CHECK_ROWS = 1  # sequences of each timed batch whose logits are checked against the reference forward
# max |timed - reference| / max |reference| allowed: the two forwards add in different orders, and
# a bf16 sum over a 28-layer residual stream drifts by about a percent where fp32 agrees to 1e-5
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def qwen2_config(size: str | dict, vocab_size: int = 151936) -> Qwen2Config:
    """The Qwen2.5 architecture of `size` (a key of SIZES), or a custom dict of Qwen2Config fields."""
    fields = SIZES[size] if isinstance(size, str) else size
    return Qwen2Config(vocab_size=vocab_size, max_position_embeddings=32768, rope_theta=1e6,
                       attn_implementation="sdpa", **fields)


def kv_bytes(cfg: Qwen2Config, batch: int, tokens: int, dtype: torch.dtype) -> int:
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * batch * cfg.num_key_value_heads * tokens * head_dim * dtype.itemsize


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> None:
    """Write a step's keys and values (batch, kv heads, query, head dim) into the cache at `start`, in place."""
    k_cache[:, :, start:start + k.shape[2]].copy_(k)
    v_cache[:, :, start:start + v.shape[2]].copy_(v)


class EngineStep:
    """One forward of (batch, query) new tokens over `context` cached ones, as an engine runs it.

    The cache (per layer, keys and values of shape (batch, kv heads, context + query, head dim))
    is allocated here, filled with random values, and written in place by every `forward()` at
    positions context .. context + query - 1; repeated forwards see the same context. `ids` holds
    the new tokens. `forward()` returns the logits (batch, query, vocab) of every new token.
    """

    def __init__(self, model: Qwen2ForCausalLM, batch: int, query: int, context: int, device: str,
                 dtype: torch.dtype) -> None:
        cfg = model.config
        self.model, self.context, self.query = model, context, query
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads
        shape = (batch, self.kv_heads, context + query, self.head_dim)
        self.k = [torch.randn(shape, device=device, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.randn(shape, device=device, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.ids = torch.randint(0, cfg.vocab_size, (batch, query), device=device)
        pos = torch.arange(context, context + query, device=device)[None]
        cos, sin = model.model.rotary_emb(self.k[0], pos)  # the table of this step's positions, once
        self.cos, self.sin = cos.to(dtype), sin.to(dtype)
        self.mask = None if query == 1 else self._folded_mask(context, query, device)

    def _folded_mask(self, context: int, query: int, device: str) -> torch.Tensor:
        """Causal mask of the folded query rows (group g, token i) -> row g * query + i: token i sees
        every cached token and the new tokens up to itself."""
        group = self.heads // self.kv_heads
        token = torch.arange(group * query, device=device) % query
        return torch.arange(context + query, device=device)[None, :] <= (context + token)[:, None]

    def _attention(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        attn = self.model.model.layers[layer].self_attn
        b, q, d = x.shape[0], x.shape[1], self.head_dim
        qh = attn.q_proj(x).view(b, q, self.heads, d).transpose(1, 2)
        kh = attn.k_proj(x).view(b, q, self.kv_heads, d).transpose(1, 2)
        vh = attn.v_proj(x).view(b, q, self.kv_heads, d).transpose(1, 2)
        qh, kh = apply_rotary_pos_emb(qh, kh, self.cos, self.sin)
        write_kv(self.k[layer], self.v[layer], kh, vh, self.context)
        # query head h serves KV head h // group: fold each group's heads into the query length, so
        # the attention has one head per KV head and reads its keys and values once
        folded = qh.reshape(b, self.kv_heads, (self.heads // self.kv_heads) * q, d)
        out = F.scaled_dot_product_attention(folded, self.k[layer], self.v[layer], attn_mask=self.mask)
        return attn.o_proj(out.reshape(b, self.heads, q, d).transpose(1, 2).reshape(b, q, self.heads * d))

    def forward(self) -> torch.Tensor:
        inner = self.model.model
        h = inner.embed_tokens(self.ids)
        for i, layer in enumerate(inner.layers):
            h = h + self._attention(i, layer.input_layernorm(h))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.model.lm_head(inner.norm(h))


@torch.inference_mode()
def reference(model: Qwen2ForCausalLM, rows: int, context: int, query: int, device: str) -> dict:
    """A plain transformers forward over `rows` random sequences of context + query tokens:
    {"tokens", "keys"/"values" (per layer, the first `context` positions), "logits" (rows, query, vocab)
    of the last `query` positions}."""
    gen = torch.Generator().manual_seed(context)
    tokens = torch.randint(0, model.config.vocab_size, (rows, context + query), generator=gen).to(device)
    out = model(input_ids=tokens, use_cache=True, logits_to_keep=query)
    layers = out.past_key_values.layers
    return {"tokens": tokens, "logits": out.logits, "keys": [layer.keys[:, :, :context] for layer in layers],
            "values": [layer.values[:, :, :context] for layer in layers]}


def load_reference(step: EngineStep, ref: dict) -> int:
    """Put the reference's sequences into the step's first rows; returns how many rows."""
    rows = min(step.ids.shape[0], ref["tokens"].shape[0])
    c, q = step.context, step.query
    step.ids[:rows] = ref["tokens"][:rows, c:c + q]
    for layer in range(len(step.k)):
        step.k[layer][:rows, :, :c] = ref["keys"][layer][:rows]
        step.v[layer][:rows, :, :c] = ref["values"][layer][:rows]
    return rows


def logits_diff(logits: torch.Tensor, ref: dict, rows: int, query: int) -> float:
    """max |timed - reference| / max |reference| over the checked rows' logits."""
    want = ref["logits"][:rows, :query].float()
    return float((logits[:rows].float() - want).abs().max() / want.abs().max().clamp_min(1e-30))


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@torch.inference_mode()
def time_eager(step: EngineStep, device: str, repeats: int = 5, warmup: int = 2) -> tuple[float, torch.Tensor]:
    """(median seconds of one eager forward, the last forward's logits)."""
    times = []
    for i in range(warmup + repeats):
        _sync(device)
        t0 = time.perf_counter()
        logits = step.forward()
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times), logits


@torch.inference_mode()
def time_graph(step: EngineStep, repeats: int = 5) -> tuple[float, torch.Tensor]:
    """(median seconds of a CUDA-graph replay of the forward, the replayed logits).

    The graph captures one forward over the step's buffers; every replay rewrites the same cache
    slots and reads the same cache, as an engine replays its captured decode steps.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graph requires
        for _ in range(2):
            step.forward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = step.forward()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), logits.clone()


@torch.inference_mode()
def time_point(model: Qwen2ForCausalLM, point: dict, ref: dict, device: str, dtype: torch.dtype,
               repeats: int, warmup: int, out: dict) -> dict:
    """Seconds of one point, how it was timed (the faster of eager and CUDA graph on a GPU) and its check.

    A graph capture that fails (an op that syncs with the host, say) is recorded in
    out["graph_error"] and the rest of that model is timed eagerly.
    """
    step = EngineStep(model, point["batch"], point["query"], point["context"], device, dtype)
    rows = load_reference(step, ref)
    eager_s, logits = time_eager(step, device, repeats, warmup)
    result = {"seconds": eager_s, "eager_seconds": eager_s, "timing": "eager",
              "logits_max_rel_diff": logits_diff(logits, ref, rows, point["query"])}
    if device.startswith("cuda") and "graph_error" not in out:
        try:
            graph_s, logits = time_graph(step, repeats)
            result["graph_seconds"] = graph_s
            diff = logits_diff(logits, ref, rows, point["query"])
            result["logits_max_rel_diff"] = max(result["logits_max_rel_diff"], diff)
            if graph_s < eager_s:
                result.update(seconds=graph_s, timing="cuda-graph")
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 -- any capture failure falls back to eager timing
            out["graph_error"] = f"{type(exc).__name__}: {exc}"[:500]
            torch.cuda.synchronize()
    result["logits_ok"] = result["logits_max_rel_diff"] <= TOLERANCE[dtype]
    del step
    return result


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

    Returns {"params", "config", "points": [{batch, query, context, seconds, timing, check...}],
    "skipped": [...]}: a point is skipped (with its reason) when its KV cache exceeds KV_BYTES_CAP,
    it runs out of memory, or the deadline has passed. Points go small to large so a short budget
    keeps the cheap ones. One reference forward per context serves every query length and batch.
    """
    model = build_model(cfg, device, dtype)
    out = {"params": sum(p.numel() for p in model.parameters()), "config": cfg.to_diff_dict(),
           "points": [], "skipped": []}
    for context in grid["context"]:
        ref = None
        for query in grid["query"]:
            for batch in grid["batch"]:
                point = {"batch": batch, "query": query, "context": context}
                if time.monotonic() > deadline:
                    out["skipped"].append({**point, "why": "time budget"})
                elif kv_bytes(cfg, batch, context + query, dtype) > KV_BYTES_CAP:
                    out["skipped"].append({**point, "why": "KV cache over cap"})
                else:
                    try:
                        ref = ref or reference(model, CHECK_ROWS, context, max(grid["query"]), device)
                        point.update(time_point(model, point, ref, device, dtype, repeats, warmup, out))
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
    doc = {"format": FORMAT, "kind": "measured", "device": device_name(device),
           "dtype": str(dtype).split(".")[-1], "torch": torch.__version__, "transformers": transformers.__version__,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "grid": {k: list(v) for k, v in grid.items()},
           "step": "engine-style: preallocated KV written in place, SDPA with query groups folded per KV head",
           "check": {"rows": CHECK_ROWS, "tolerance": TOLERANCE[dtype],
                     "against": "transformers forward of the same weights over the whole sequence"},
           "models": {}}
    for i, (name, cfg) in enumerate(models.items()):
        left = budget_s - (time.monotonic() - start)
        deadline = time.monotonic() + left / (len(models) - i)
        t0 = time.monotonic()
        doc["models"][name] = m = measure(cfg, grid, device, dtype, deadline, repeats, warmup)
        failed = sum(not p["logits_ok"] for p in m["points"])
        print(f"{name}: {len(m['points'])} points ({failed} failed the logits check), {len(m['skipped'])} "
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
    failed = [(name, p) for name, m in doc["models"].items() for p in m["points"] if not p["logits_ok"]]
    if failed:
        print(f"gpu-costmodel: {len(failed)} points' logits differ from the reference forward beyond "
              f"{TOLERANCE[dtype]} (first: {failed[0]}); their timings are not of a correct forward",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
