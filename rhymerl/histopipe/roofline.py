"""An analytic roofline decode-step cost surface: what a step costs on a GPU when nothing is measured.

One forward of `batch` sequences, each feeding `query` new tokens over `context` cached tokens,
takes

    seconds = max(bytes read / HBM bandwidth, FLOPs / peak dense bf16 FLOP/s) + overhead_s

- bytes read: every weight once per step (bf16; an untied input embedding is looked up, not
  streamed, so it is left out; a tied one is streamed as the output projection) plus the cached
  keys and values of every sequence, context + query tokens each. Activations are left out
  (a few MB against GBs of weights).
- FLOPs: 2 per weight of every matrix per new token (the input embedding is a lookup), plus the
  attention: 4 x layers x attention heads x head dim per new token per attended token (Q.K and
  P.V), each new token attending to context + query tokens (the causal half inside the query
  block is not subtracted: an upper bound by query / 2 tokens).
- overhead_s: what an engine pays per step beyond the kernels' roofline (scheduling, sampling,
  launch gaps of a CUDA-graph replay); assumed, not measured (`RooflineSettings`).

This is a lower bound of a real step's time: kernels reach 60-90% of the bandwidth and less of the
peak FLOP/s. Its use is the shape: a decode step is memory-bound until batch x query reaches
peak / bandwidth x 2 bytes (about 400 new tokens on an H200), so at a large batch feeding 17
tokens per sequence costs several times one, where reading the cache does not grow with query.

`surface_doc()` writes it in the measured surface's format (`rhymerl-cost-surface/1`, one entry
per model and device, each with its own "device"), so `load_cost_surface` and
`rhymerl bench e2e --cost-json` take it like a measured one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

FORMAT = "rhymerl-cost-surface/1"


@dataclass(frozen=True)
class Device:
    """A GPU's roofs: peak dense bf16 tensor FLOP/s, HBM bandwidth, memory, and where they come from."""

    name: str
    peak_flops: float  # dense bf16 tensor-core FLOP/s (without structured sparsity)
    hbm_bytes_per_s: float
    memory_bytes: float
    source: str


DEVICES: dict[str, Device] = {
    "h100": Device("NVIDIA H100 SXM", 989.4e12, 3.35e12, 80e9,
                   "NVIDIA H100 Tensor Core GPU datasheet, SXM5 column: BF16 Tensor Core 1,979 TFLOPS with "
                   "sparsity (989.4 dense), GPU memory 80 GB HBM3 at 3.35 TB/s"),
    "h200": Device("NVIDIA H200 SXM", 989.4e12, 4.8e12, 141e9,
                   "NVIDIA H200 Tensor Core GPU datasheet, SXM column: BF16 Tensor Core 1,979 TFLOPS with "
                   "sparsity (989.4 dense, the H100's compute), GPU memory 141 GB HBM3e at 4.8 TB/s"),
}


@dataclass(frozen=True)
class Shape:
    """A decoder-only transformer of the Qwen2 / Llama family (SwiGLU MLP, grouped-query attention)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool  # output projection shares the input embedding's weights
    qkv_bias: bool = True  # Qwen2 has biases on q, k, v; Llama has none

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def matrix_params(self) -> int:
        """Weights of every matrix a new token is multiplied by: attention, MLP, output projection."""
        kv = self.kv_heads * self.head_dim
        per_layer = 2 * self.hidden * self.hidden + 2 * self.hidden * kv + 3 * self.hidden * self.intermediate
        return self.layers * per_layer + self.vocab * self.hidden

    def params(self) -> int:
        """All weights: matrices, q/k/v biases, norms, and the input embedding if not tied."""
        bias = (self.hidden + 2 * self.kv_heads * self.head_dim) if self.qkv_bias else 0
        small = self.layers * (bias + 2 * self.hidden) + self.hidden
        return self.matrix_params() + small + (0 if self.tied else self.vocab * self.hidden)

    def weight_bytes_read(self, bytes_per_value: int = 2) -> int:
        """Bytes of weights one step streams: all but an untied input embedding (only looked up)."""
        return bytes_per_value * (self.params() - (0 if self.tied else self.vocab * self.hidden))

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * bytes_per_value


# the Qwen2.5 shapes scripts/gpu-costmodel.py measures (same fields as its SIZES)
SHAPES: dict[str, Shape] = {
    "qwen2-0.5b": Shape(hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, vocab=151936, tied=True),
    "qwen2-1.5b": Shape(hidden=1536, intermediate=8960, layers=28, heads=12, kv_heads=2, vocab=151936, tied=True),
    "qwen2-7b": Shape(hidden=3584, intermediate=18944, layers=28, heads=28, kv_heads=4, vocab=151936, tied=False),
}
# an 8B model of the published engine figure the roofline is compared with (Llama 3.1 8B's shape)
ANCHOR_SHAPE = Shape(hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8, vocab=128256, tied=False,
                     qkv_bias=False)
GRID = {"batch": (1, 8, 32, 64, 128, 256, 512), "query": (1, 4, 8, 17), "context": (256, 1024, 4096, 8192)}


@dataclass(frozen=True)
class RooflineSettings:
    """The roofline's assumptions beyond the device's datasheet."""

    overhead_s: float = 1.0e-3  # per step: scheduling, sampling, launch gaps of a CUDA-graph engine
    bytes_per_value: int = 2  # bf16 weights and KV cache


def step_terms(shape: Shape, device: Device, batch: int, query: int, context: int,
               settings: RooflineSettings = RooflineSettings()) -> dict:
    """{"bytes", "flops", "memory_s", "compute_s", "seconds", "bound"} of one step (module docstring)."""
    tokens = batch * query
    attended = context + query
    nbytes = shape.weight_bytes_read(settings.bytes_per_value) + \
        batch * attended * shape.kv_bytes_per_token(settings.bytes_per_value)
    flops = 2 * shape.matrix_params() * tokens + 4 * shape.layers * shape.heads * shape.head_dim * tokens * attended
    memory_s, compute_s = nbytes / device.hbm_bytes_per_s, flops / device.peak_flops
    return {"bytes": nbytes, "flops": flops, "memory_s": memory_s, "compute_s": compute_s,
            "seconds": max(memory_s, compute_s) + settings.overhead_s,
            "bound": "memory" if memory_s >= compute_s else "compute"}


def fits(shape: Shape, device: Device, batch: int, tokens: int, bytes_per_value: int = 2) -> bool:
    """Whether the weights and a KV cache of `batch` x `tokens` fit in the device's memory."""
    need = shape.params() * bytes_per_value + batch * tokens * shape.kv_bytes_per_token(bytes_per_value)
    return need <= device.memory_bytes


def model_points(shape: Shape, device: Device, grid: dict, settings: RooflineSettings) -> dict:
    """{"device", "params", "points", "skipped"} of one model on one device over `grid`."""
    out = {"device": f"{device.name} (roofline)", "params": shape.params(), "points": [], "skipped": []}
    for context in grid["context"]:
        for query in grid["query"]:
            for batch in grid["batch"]:
                point = {"batch": batch, "query": query, "context": context}
                if not fits(shape, device, batch, context + query, settings.bytes_per_value):
                    out["skipped"].append({**point, "why": "weights and KV cache over the device's memory"})
                    continue
                terms = step_terms(shape, device, batch, query, context, settings)
                out["points"].append({**point, "seconds": terms["seconds"], "timing": "roofline",
                                      "bound": terms["bound"]})
    return out


ANCHOR = {"what": "a vLLM-class engine decoding an 8B model on an H200: 8.2 ms per step at 1 sequence, 8.8 ms "
                  "at 64 (inclusionAI/AReno#545; context length not stated)", "ms": {1: 8.2, 64: 8.8}}


def anchor_comparison(settings: RooflineSettings = RooflineSettings(), contexts: tuple = (256, 1024, 4096)) -> dict:
    """The roofline of the anchor's 8B shape on an H200 at 1 and 64 sequences, against the published steps."""
    h200, (b1, b64) = DEVICES["h200"], sorted(ANCHOR["ms"])
    ms = {c: {b: 1e3 * step_terms(ANCHOR_SHAPE, h200, b, 1, c, settings)["seconds"] for b in (b1, b64)}
          for c in contexts}
    weights_s = ANCHOR["ms"][b1] / 1e3 - settings.overhead_s
    rise = ", ".join(f"{ms[c][b64] - ms[c][b1]:.1f} ms at a {c:,}-token context" for c in contexts)
    kv_tokens = (ANCHOR["ms"][b64] - ANCHOR["ms"][b1]) / 1e3 * h200.hbm_bytes_per_s / \
        (b64 * ANCHOR_SHAPE.kv_bytes_per_token(settings.bytes_per_value))
    return {"published": ANCHOR["what"],
            "roofline_ms": {f"batch {b}, context {c}": round(ms[c][b], 2) for c in contexts for b in (b1, b64)},
            "comparison": f"At 1 sequence the roofline gives {ms[contexts[0]][b1]:.1f} ms against the engine's "
                          f"{ANCHOR['ms'][b1]} ms: the roofline is a lower bound about "
                          f"{ANCHOR['ms'][b1] / ms[contexts[0]][b1]:.1f}x below a real engine at a small batch (with "
                          f"the assumed {settings.overhead_s * 1e3:.1f} ms overhead, the engine streams the "
                          f"{ANCHOR_SHAPE.weight_bytes_read() / 1e9:.1f} GB of weights at "
                          f"{ANCHOR_SHAPE.weight_bytes_read() / weights_s / 1e12:.1f} TB/s of the 4.8). From 1 to "
                          f"{b64} sequences the roofline rises by {rise}; the engine's step rose by "
                          f"{ANCHOR['ms'][b64] - ANCHOR['ms'][b1]:.1f} ms, what reading about {kv_tokens:,.0f} "
                          "cached tokens per sequence costs at full bandwidth, so its context was short. Both "
                          "agree that a decode step at 64 sequences is bound by streaming the weights."}


def surface_doc(devices: dict[str, Device] = DEVICES, shapes: dict[str, Shape] = SHAPES, grid: dict = GRID,
                settings: RooflineSettings = RooflineSettings()) -> dict:
    """The whole roofline surface file: every shape on every device, keyed "<shape>@<device key>"."""
    return {"format": FORMAT, "kind": "roofline", "device": "roofline: " + ", ".join(d.name for d in devices.values()),
            "dtype": "bfloat16", "grid": {k: list(v) for k, v in grid.items()},
            "formula": "seconds = max((weight bytes + batch x (context + query) x KV bytes per token) / HBM bandwidth, "
                       "(2 x matrix weights + 4 x layers x heads x head dim x (context + query)) x batch x query "
                       "/ peak dense bf16 FLOP/s) + overhead",
            "assumptions": {**asdict(settings), "devices": {k: asdict(d) for k, d in devices.items()},
                            "left out": "activations' traffic; the causal half inside the query block; kernel "
                                        "efficiency (a lower bound of a real step)"},
            "anchor": anchor_comparison(settings),
            "models": {f"{name}@{key}": model_points(shape, device, grid, settings)
                       for key, device in devices.items() for name, shape in shapes.items()}}
