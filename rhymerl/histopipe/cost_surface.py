"""A decode-step cost surface, measured (scripts/gpu-costmodel.py) or roofline, turned into a `CostModel`.

The surface holds the seconds of one forward of `batch` sequences, each feeding `query` new
tokens over `context` cached tokens. It is fitted as

    seconds = base_s + token_s * batch * query + kv_s * batch * context + attn_s * batch * query * context

`base_s` is what an iteration pays whatever its size (streaming the weights, launching kernels),
`token_s` the compute per new token (projections, MLP, logits), `kv_s` reading a sequence's cached
K/V once per iteration, and `attn_s` the attention arithmetic per new token per cached token.
The `kv_s` term is reading the cache, which a step does once however many query tokens it
feeds; `token_s` is the compute that grows with them (docs/benchmarks.md).
Fitted by non-negative least squares on relative error (every point weighs the same whether it
took 5 ms or 500 ms). A GPU below its compute roof is flat in batch and then linear, so the fit
is a chord through that knee: its r2 and worst relative error are kept so a report can say how
well the line explains the measurements.

`cost_model(context, query)` gives the `CostModel` of a worker whose sequences hold `context`
tokens on average and feed `query` tokens per iteration (1 plain decoding; 1 + drafted tokens
when HistoSpec verifies drafts), and `verify_overhead` how much more such an iteration costs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from scipy.optimize import nnls

from rhymerl.histopipe.costmodel import CostModel

FORMAT = "rhymerl-cost-surface/1"


@dataclass(frozen=True)
class CostSurface:
    """One model's fitted decode-step cost on one device."""

    model: str
    device: str
    base_s: float  # seconds per iteration, whatever its size
    token_s: float  # seconds per new token (batch x query)
    kv_s: float  # seconds per cached context token read, once per sequence per iteration
    attn_s: float  # seconds per new token per cached context token
    points: int  # measurements the fit used
    r2: float  # share of the variance of the seconds the fit explains
    max_rel_err: float  # worst |predicted / measured - 1| over the points

    def step_time(self, batch: float, query: float = 1.0, context: float = 0.0) -> float:
        """Seconds of one forward of `batch` sequences x `query` new tokens over `context` cached ones."""
        tokens = batch * query
        return self.base_s + self.token_s * tokens + self.kv_s * batch * context + self.attn_s * tokens * context

    def cost_model(self, context: float, query: float = 1.0, capacity: int = 256, startup_s: float = 0.0) -> CostModel:
        """The per-iteration cost of a worker at mean `context` feeding `query` tokens per sequence."""
        per_seq_s = query * (self.token_s + self.attn_s * context) + self.kv_s * context
        return CostModel(base_s=self.base_s, per_seq_s=per_seq_s,
                         startup_s=startup_s, capacity=capacity)

    def verify_overhead(self, query: float, batch: float, context: float) -> float:
        """Extra share of an iteration's time when each sequence feeds `query` tokens instead of 1."""
        return self.step_time(batch, query, context) / self.step_time(batch, 1.0, context) - 1.0


def fit_surface(points: Sequence[Mapping[str, float]], model: str = "", device: str = "") -> CostSurface:
    """Fit base_s, token_s, kv_s and attn_s (all >= 0) to points {batch, query, context, seconds}."""
    if len(points) < 4:
        raise ValueError(f"fit_surface: {model or 'model'} has {len(points)} measured points; need >= 4")
    tokens = np.array([p["batch"] * p["query"] for p in points], dtype=np.float64)
    ctx = np.array([p["context"] for p in points], dtype=np.float64)
    seqs = np.array([p["batch"] for p in points], dtype=np.float64)
    y = np.array([p["seconds"] for p in points], dtype=np.float64)
    if np.any(y <= 0):
        raise ValueError(f"fit_surface: {model or 'model'} has a point with seconds <= 0")
    x = np.stack([np.ones_like(y), tokens, seqs * ctx, tokens * ctx], axis=1)
    coef, _ = nnls(x / y[:, None], np.ones_like(y))  # relative error: divide each row by its target
    pred = x @ coef
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((y - pred) ** 2)) / ss_tot if ss_tot > 0 else 1.0
    if coef[0] + coef[1] <= 0:
        raise ValueError(f"fit_surface: {model or 'model'}: fitted a step time of 0; the timings do not "
                         "grow with batch or query")
    return CostSurface(model=model, device=device, base_s=float(coef[0]), token_s=float(coef[1]),
                       kv_s=float(coef[2]), attn_s=float(coef[3]), points=len(y), r2=r2,
                       max_rel_err=float(np.max(np.abs(pred / y - 1.0))))


def load_cost_surface(path: str | Path, model: str | None = None) -> CostSurface:
    """The fitted surface of `model` in the JSON at `path`: measured (`scripts/gpu-costmodel.py`) or
    analytic (`scripts/roofline-surface.py`, one entry per model and device).

    `model` may be omitted when the file holds one model; otherwise the error lists the choices.
    A model's own "device" overrides the file's (a roofline file holds several devices).
    """
    doc = json.loads(Path(path).read_text())
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a cost surface (format {doc.get('format')!r}, want {FORMAT!r}); "
                         "write one with scripts/gpu-costmodel.py")
    models = doc.get("models") or {}
    if model is None and len(models) == 1:
        model = next(iter(models))
    if model not in models:
        raise ValueError(f"{path}: model {model!r} not in the surface; choose one of {sorted(models)}")
    return fit_surface(models[model]["points"], model=model, device=models[model].get("device", doc.get("device", "")))
