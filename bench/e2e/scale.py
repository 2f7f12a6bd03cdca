"""Cluster-scale estimate of the end-to-end speed-up, from the HistoPipe simulator and a measured
HistoSpec acceptance.

One rollout step of W workers (`bench.pipe_bench`'s heavy-tailed reasoning workload: per-prompt
lognormal lengths, median 1,024 tokens, capped at `max_tokens`; 32 prompts x n=8 per worker; two
epochs of history feed the length forecasts) is simulated four ways
(`rhymerl.histopipe.simulator`, GPU-like cost model 8 ms per iteration + 0.15 ms per running
request, 256 requests per worker at once):

- baseline: naive placement, one token per engine iteration;
- HistoPipe: tier-1 placement (``lpt``) from the forecasts;
- HistoSpec: naive placement, `accepted_len` tokens per iteration;
- RhymeRL: both.

Assumptions (stated in the report): HistoSpec turns a request of L tokens into ceil(L / a)
engine iterations, a = the mean accepted tokens per verification step measured in this
benchmark's RhymeRL arm (bonus token included), the same for every request and over its whole
length; verifying the drafts makes each iteration `verify_overhead` more expensive (a GPU
decoding a model that fits is memory-bound, so checking a few extra tokens per sequence costs
little; 0.2 is assumed, 0 and 0.5 bracket it); the drafter itself is free (it runs on the CPU
beside the engine). Rollout is a share `rollout_share` of the baseline step (the rest: reward,
training, weight sync, orchestration, which neither technique changes); the step speed-up is
1 / ((1 - f) + f / rollout speed-up) (Amdahl).

Streamed training (train.stream) with the trainer on GPUs of its own: training is a share
`train_share` of the baseline step (its forward/backward over the step's response tokens, so a
cost per token); each arm's groups train in the order its simulated rollout finishes them, and
only what is left when the rollout ends stays in the step (`rhymerl.histopipe.train_overlap`).

With a cost surface (measured, `scripts/gpu-costmodel.py`, or roofline, `scripts/roofline-surface.py`;
`rhymerl bench e2e --cost-json`, `scripts/gpu-estimate.py`) the plain cost model is the surface's at
a mean context of `SURFACE_CONTEXT` tokens (`surface_settings`), and speculation runs under the
goodput rule (`rhymerl.histopipe.spec_pace`): every engine step of b running requests verifies only
the draft tokens that raise expected tokens per second under the surface's step time, none where
nothing pays, with per-draft-position chances from the measured tokens per verification and draft
tokens per step, per response-position bucket where the result measured them (`position_mix`). The
arm `rhymerl_fixed` verifies every draft (the rule off) for comparison, and `controller` lists the
rule's mean draft length and speed-up by batch and context.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Iterable

import numpy as np

from bench.pipe_bench import heavy_workload
from rhymerl.histopipe.cost_surface import CostSurface
from rhymerl.histopipe.costmodel import CostModel
from rhymerl.histopipe.forecast import ForecastSettings, build_history, forecast_lengths
from rhymerl.histopipe.schedule import ScheduleRequest, schedule
from rhymerl.histopipe.simulator import simulate
from rhymerl.histopipe.spec_pace import chain_acceptance, draft_table, paced_cost
from rhymerl.histopipe.train_overlap import streamed_train
from rhymerl.histospec.stats import POSITION_EDGES, position_labels


@dataclass(frozen=True)
class ScaleSettings:
    """One cluster-scale point."""

    accepted_len: float  # tokens per verification step (measured)
    workers: int = 64
    max_tokens: int = 8192
    prompts_per_worker: int = 32
    n: int = 8
    verify_overhead: float = 0.2  # extra cost of an iteration that verifies drafts
    rollout_share: float = 0.85  # rollout share of the baseline step (the paper: 80-95%)
    train_share: float = 0.10  # trainer forward/backward share of the baseline step (part of the rest)
    seed: int = 0
    cost: CostModel = CostModel(base_s=0.008, per_seq_s=1.5e-4, capacity=256)
    cost_source: str = "assumed"  # "assumed" (the GPU-like model above) or "<model> on <device>" (a surface)
    surface: CostSurface | None = None  # a decode-step cost surface: speculation under the goodput rule
    drafted: float = 0.0  # draft tokens offered per verification step (measured; needed with `surface`)
    # tokens per verification step per response-position bucket (POSITION_EDGES; None: not measured)
    position_accepted: tuple[float | None, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.train_share <= 1.0 - self.rollout_share:
            raise ValueError(f"ScaleSettings: train_share={self.train_share} must be in [0, 1 - rollout_share = "
                             f"{1.0 - self.rollout_share:.2f}] (training is part of the step's non-rollout share)")
        if self.surface is not None and self.drafted < 0.5:
            raise ValueError(f"ScaleSettings: drafted={self.drafted}: a cost surface needs the measured draft "
                             "tokens per verification step (>= 0.5) to model what the goodput rule keeps")


CONTROLLER_BATCHES = (1, 16, 32, 64, 128, 256)  # the controller table's batches (those above capacity dropped)
CONTROLLER_CONTEXTS = (1024, 4096)  # and its contexts

# mean cached tokens per sequence while decoding: a prompt of a few hundred tokens plus half of a
# response of the workload's median length 1,024 (long responses weigh more, but are fewer)
SURFACE_CONTEXT = 1024


def surface_settings(spec: ScaleSettings, surface: CostSurface, drafted_per_step: float) -> ScaleSettings:
    """`spec` with the plain cost model from a cost `surface` and speculation under the goodput rule.

    `verify_overhead` becomes the surface's for every drafted token at half the capacity (what fixed
    drafts cost there; the simulated arms use the surface at every batch instead).
    """
    capacity = spec.cost.capacity
    cost = surface.cost_model(SURFACE_CONTEXT, query=1.0, capacity=capacity)
    overhead = surface.verify_overhead(1.0 + drafted_per_step, capacity / 2, SURFACE_CONTEXT)
    return replace(spec, cost=cost, verify_overhead=round(overhead, 3), surface=surface,
                   drafted=drafted_per_step, cost_source=f"{surface.model} on {surface.device}")


def amdahl(rollout_speedup: float, rollout_share: float) -> float:
    """Step speed-up when only the rollout share `f` of the step gets `rollout_speedup` faster."""
    return 1.0 / ((1.0 - rollout_share) + rollout_share / rollout_speedup)


def position_mix(spec: ScaleSettings, lengths: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
    """(K, W) draft chances and (K,) weights of the requests a step holds, for response `lengths`.

    Without `spec.position_accepted`: one profile from the pooled means. With it: one per response-
    position bucket, a bucket not measured taking the nearest measured one before it (the first
    measured one for those before that), weighted by the verification steps spent there (the
    workload's tokens in the bucket over its tokens per verification step).
    """
    measured = [a for a in spec.position_accepted if a is not None and math.isfinite(a)]
    if not measured:
        return chain_acceptance(spec.accepted_len, spec.drafted)[None, :], np.ones(1)
    filled, last = [], measured[0]
    for a in spec.position_accepted:
        last = a if a is not None and math.isfinite(a) else last
        filled.append(max(last, 1.0))
    edges = np.array((0,) + POSITION_EDGES + (np.inf,), np.float64)
    x = np.fromiter(lengths, np.float64)
    tokens = np.array([np.clip(x - lo, 0.0, hi - lo).sum() for lo, hi in zip(edges[:-1], edges[1:])])
    return np.stack([chain_acceptance(a, spec.drafted) for a in filled]), tokens / np.array(filled)


def workload(spec: ScaleSettings):
    """The step's workload (`bench.pipe_bench.heavy_workload`) with two epochs of history before it."""
    return heavy_workload(spec.prompts_per_worker * spec.workers, 3, spec.n, spec.seed)


def simulate_arms(spec: ScaleSettings) -> dict[str, dict]:
    """Makespan and bubble ratio of the four arms (module docstring) at one point."""
    history_epochs = 2
    wl = workload(spec)
    clip = lambda x: min(spec.max_tokens, x)  # noqa: E731
    records = [{"prompt_id": p, "epoch": e, "length": clip(x)}
               for e in range(history_epochs) for (p, _), x in wl.epochs[e].items()]
    forecasts = forecast_lengths(build_history(records), wl.prompt_ids,
                                 ForecastSettings(max_length=float(spec.max_tokens)), wl.prompt_lengths,
                                 target_epoch=history_epochs)
    request = ScheduleRequest(tuple(forecasts[p].demand(spec.n) for p in wl.prompt_ids), spec.workers, spec.cost)
    truth = {k: clip(x) for k, x in wl.epochs[history_epochs].items()}
    placements = {"naive": schedule("naive", request), "lpt": schedule("lpt", request)}
    arms = {"baseline": ("naive", truth, spec.cost), "histopipe": ("lpt", truth, spec.cost)}
    if spec.surface is None:  # a fixed verification overhead: ceil(L / a) dearer iterations per request
        spec_lengths = {k: max(1, math.ceil(x / spec.accepted_len)) for k, x in truth.items()}
        spec_cost = replace(spec.cost, base_s=spec.cost.base_s * (1 + spec.verify_overhead),
                            per_seq_s=spec.cost.per_seq_s * (1 + spec.verify_overhead))
        arms.update(histospec=("naive", spec_lengths, spec_cost), rhymerl=("lpt", spec_lengths, spec_cost))
    else:  # the surface's cost per expected token at each batch, drafts chosen by the goodput rule or all kept
        q, weights = position_mix(spec, truth.values())
        paced = {rule: paced_cost(spec.surface, q, SURFACE_CONTEXT, spec.cost.capacity, rule, weights)
                 for rule in (True, False)}
        arms.update(histospec=("naive", truth, paced[True]), rhymerl=("lpt", truth, paced[True]),
                    rhymerl_fixed=("lpt", truth, paced[False]))
    results = {name: simulate(placements[policy], lengths, cost) for name, (policy, lengths, cost) in arms.items()}
    base_step = results["baseline"].makespan / spec.rollout_share
    s_per_token = spec.train_share * base_step / max(sum(truth.values()), 1)  # every arm trains the same tokens
    out = {}
    for name, res in results.items():
        train = streamed_train(res.spans, truth, s_per_token)
        out[name] = {"makespan_s": res.makespan, "bubble_ratio": res.bubble_ratio,
                     "train_batch_s": train.batch_s, "train_tail_s": train.tail_s}
    return out


def streamed_step_speedup(arm: dict, base_makespan: float, spec: ScaleSettings) -> float:
    """An arm's step speed-up over the baseline's batch-trained step when its groups train while
    its tail generates: only the train tail stays in the step (module docstring)."""
    base_step = base_makespan / spec.rollout_share
    rest = base_step * (1.0 - spec.rollout_share - spec.train_share)  # reward, sync, orchestration
    return base_step / (arm["makespan_s"] + rest + arm["train_tail_s"])


def controller_table(spec: ScaleSettings) -> dict:
    """The goodput rule's mean draft length and speed-up by batch and context under `spec.surface`,
    for the step's mix of requests (what the simulated arms run) and, at `SURFACE_CONTEXT`, for each
    measured response-position bucket alone."""
    truth = workload(spec).epochs[2].values()
    q, weights = position_mix(spec, (min(spec.max_tokens, x) for x in truth))
    batches = tuple(b for b in CONTROLLER_BATCHES if b <= spec.cost.capacity)
    by_position = {label: {"accepted_len": a, "rows": draft_table(
        spec.surface, chain_acceptance(max(a, 1.0), spec.drafted), (SURFACE_CONTEXT,), batches)}
        for label, a in zip(position_labels(), spec.position_accepted) if a is not None and math.isfinite(a)}
    return {"acceptance": q.tolist(), "weights": (weights / weights.sum()).tolist(),
            "rows": draft_table(spec.surface, q, CONTROLLER_CONTEXTS, batches, weights), "by_position": by_position}


def estimate(spec: ScaleSettings, measured_rollout_share: float | None = None) -> dict:
    """The point's rollout and step speed-ups per arm, with share brackets and either verify-overhead
    brackets (no surface) or the goodput rule's table (a surface, `controller_table`)."""
    arms = simulate_arms(spec)
    base = arms["baseline"]["makespan_s"]
    for row in arms.values():
        row["rollout_speedup"] = base / row["makespan_s"]
        row["step_speedup"] = amdahl(row["rollout_speedup"], spec.rollout_share)
        row["step_speedup_streamed"] = streamed_step_speedup(row, base, spec)
    shares = sorted({0.8, spec.rollout_share, 0.95} | ({measured_rollout_share} if measured_rollout_share else set()))
    rollout = arms["rhymerl"]["rollout_speedup"]
    brackets = {"step_speedup_by_rollout_share": {f"{f:.2f}": amdahl(rollout, f) for f in shares}}
    if spec.surface is None:
        brackets["rollout_speedup_by_verify_overhead"] = {
            f"{v:.1f}": base / simulate_arms(replace(spec, verify_overhead=v))["rhymerl"]["makespan_s"]
            for v in (0.0, 0.5)}
        brackets["rollout_speedup_by_verify_overhead"][f"{spec.verify_overhead:.1f}"] = rollout
    else:
        brackets["controller"] = controller_table(spec)
    spec_dict = asdict(spec)
    return {"spec": spec_dict, "arms": arms, **brackets, "measured_rollout_share": measured_rollout_share}
