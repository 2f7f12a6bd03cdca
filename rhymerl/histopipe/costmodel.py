"""Cost model of one rollout worker under continuous batching, and its calibration from timings.

A worker (one vLLM engine) runs up to `capacity` requests at once. Each engine iteration decodes
one token for every running request and takes ``base_s + per_seq_s * b`` seconds when `b`
requests are running: `base_s` is the weight-streaming cost paid once per iteration, `per_seq_s`
the per-sequence KV/attention and sampling cost. A finished request frees its slot at the end of
its last iteration and the next queued request (in admission order) takes it. `startup_s` is a
fixed delay before the first iteration (prefill of the first batch, scheduler start-up).

The schedule's *structure* (which requests run in which iteration) depends only on the lengths,
the admission order and the capacity, never on the seconds. So a request's finish time is linear
in the parameters::

    end = startup_s + base_s * iterations + per_seq_s * occupancy

where `iterations` counts engine iterations up to and including its last token and `occupancy`
sums the running count over those iterations. `replay` computes both; `calibrate` fits the three
parameters to measured finish times by non-negative least squares. Attention cost growing with
context length is not modelled (it folds into `per_seq_s` on average).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from scipy.optimize import nnls


@dataclass(frozen=True)
class CostModel:
    """One worker: seconds per iteration as a function of batch occupancy, and its batch capacity."""

    base_s: float = 0.015  # seconds per engine iteration, independent of occupancy
    per_seq_s: float = 1e-4  # extra seconds per iteration for each running request
    startup_s: float = 0.0  # seconds before the first iteration
    capacity: int = 256  # most requests running at once (vLLM max_num_seqs)

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.per_seq_s < 0 or self.startup_s < 0:
            raise ValueError(f"CostModel times must be >= 0, got base_s={self.base_s}, "
                             f"per_seq_s={self.per_seq_s}, startup_s={self.startup_s}")
        if self.base_s + self.per_seq_s <= 0:
            raise ValueError("CostModel: base_s + per_seq_s must be > 0 (an iteration takes time)")
        if self.capacity < 1:
            raise ValueError(f"CostModel.capacity={self.capacity}: must be >= 1 (set it to max_num_seqs)")

    def step_time(self, running: float) -> float:
        """Seconds of one engine iteration with `running` requests in the batch."""
        return self.base_s + self.per_seq_s * running

    def request_times(self, lengths: Sequence[float]) -> list[float]:
        """Finish time of each request when one worker runs `lengths` in this admission order."""
        return [self.startup_s + self.base_s * it + self.per_seq_s * occ
                for it, occ in replay(lengths, self.capacity)]

    def worker_time(self, lengths: Sequence[float]) -> float:
        """Seconds one worker needs to finish all `lengths` (admitted in this order); 0 if none."""
        return max(self.request_times(lengths), default=0.0)

    def estimate(self, total_tokens: float, peak_tokens: float) -> float:
        """Closed-form load estimate of a worker given its tokens and its longest request.

        The iterations are at least the longest request and at least the tokens spread over full
        batches; the occupancy summed over iterations equals the tokens exactly. With long
        requests admitted first this lower bound is tight up to the last batch's tail.
        """
        if total_tokens <= 0:
            return 0.0
        iterations = max(peak_tokens, total_tokens / self.capacity)
        return self.startup_s + self.base_s * iterations + self.per_seq_s * total_tokens


def replay(lengths: Sequence[float], capacity: int) -> list[tuple[float, float]]:
    """(iterations, occupancy) at each request's finish, one worker, admission in list order.

    Every request costs at least one iteration (the engine returns at least one token). Requests
    finishing in the same iteration free their slots together, then queued requests are admitted
    in order. Iterations are counted from the worker's first iteration.
    """
    if capacity < 1:
        raise ValueError(f"replay: capacity={capacity} must be >= 1")
    out: list[tuple[float, float]] = [(0.0, 0.0)] * len(lengths)
    running: list[tuple[float, int]] = []  # (finish iteration, request index)
    v = occ = 0.0
    nxt = 0
    while nxt < len(lengths) or running:
        while nxt < len(lengths) and len(running) < capacity:
            heapq.heappush(running, (v + max(1.0, float(lengths[nxt])), nxt))
            nxt += 1
        finish = running[0][0]
        occ += len(running) * (finish - v)
        v = finish
        while running and running[0][0] <= v:
            _, i = heapq.heappop(running)
            out[i] = (v, occ)
    return out


@dataclass(frozen=True)
class Calibration:
    """A fitted cost model and how well it explains the measured finish times."""

    cost: CostModel
    requests: int  # measured requests used in the fit
    groups: int  # (epoch, step, worker) batches the requests came from
    rms_s: float  # root-mean-square error of predicted vs measured finish times
    r2: float  # fraction of the finish-time variance the model explains


_CALIBRATION_KEYS = ("worker_id", "gen_start", "gen_end", "length")


def _batches(records: Iterable[Mapping[str, Any]]) -> dict[tuple, list[Mapping[str, Any]]]:
    """Records grouped into one batch per (epoch, step, worker), keeping their order."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for i, r in enumerate(records):
        missing = [k for k in _CALIBRATION_KEYS if r.get(k) is None]
        if missing:
            raise ValueError(f"calibrate: record {i} lacks {missing}; pass lake rollout rows with "
                             f"{', '.join(_CALIBRATION_KEYS)} (rows with NULL timings cannot be used)")
        groups.setdefault((r.get("epoch"), r.get("step"), r["worker_id"]), []).append(r)
    return groups


def calibration_features(records: Iterable[Mapping[str, Any]], capacity: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Design matrix [1, iterations, occupancy] (R, 3), targets end - batch start (R,), batch count.

    Within a batch, requests are replayed in order of `gen_start`, then record order (the
    engine admits first-come first-served, so that is the order they were added in).
    """
    rows, targets = [], []
    batches = _batches(records)
    for batch in batches.values():
        ordered = sorted(batch, key=lambda r: r["gen_start"])  # stable: ties keep record order
        t0 = min(r["gen_start"] for r in ordered)
        for r, (it, occ) in zip(ordered, replay([r["length"] for r in ordered], capacity)):
            rows.append((1.0, it, occ))
            targets.append(r["gen_end"] - t0)
    return np.asarray(rows, dtype=np.float64).reshape(-1, 3), np.asarray(targets, dtype=np.float64), len(batches)


def calibrate(records: Iterable[Mapping[str, Any]], capacity: int) -> Calibration:
    """Fit startup_s, base_s and per_seq_s (all >= 0) to measured request timings.

    `records` are lake rollout rows (mappings with worker_id, gen_start, gen_end, length and
    optionally epoch, step); `capacity` is the engine's max_num_seqs. Needs at least two batches
    of requests or lengths that vary, else base and per-sequence cost cannot be told apart.
    """
    x, y, groups = calibration_features(records, capacity)
    if len(y) < 3:
        raise ValueError(f"calibrate: need at least 3 timed requests, got {len(y)}; run a step first")
    if np.linalg.matrix_rank(x) < 3:
        raise ValueError("calibrate: the timings cannot separate startup, per-iteration and per-sequence "
                         "cost (all requests alike); pass batches with different lengths or occupancies")
    coef, _ = nnls(x, y)
    pred = x @ coef
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    if coef[1] + coef[2] <= 0:
        raise ValueError("calibrate: fitted an iteration time of 0; the timings do not grow with length")
    cost = CostModel(base_s=float(coef[1]), per_seq_s=float(coef[2]), startup_s=float(coef[0]),
                     capacity=capacity)
    return Calibration(cost=cost, requests=len(y), groups=groups, rms_s=math.sqrt(ss_res / len(y)),
                       r2=1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0)
