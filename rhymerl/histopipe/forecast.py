"""Per-prompt response-length forecasts from history, and how good they were.

History is plain records: mappings (or an Arrow table's rows) with at least ``prompt_id``,
``epoch`` and ``length`` (one per generated response), as the lake's rollout rows carry them.
A prompt's forecast is the length spread of its samples in the last epoch it was seen, shifted by
a damped trend (the change of its mean between its last two epochs). Prompts never seen get a
prior: the dataset's mean length, or a least-squares line from prompt length to mean response
length when prompt lengths are given, with the dataset's typical spread around the mean.

Quality compares forecast and actual mean lengths over the prompts of an epoch: Spearman rank
correlation, and the fraction of prompts whose percentile rank moved by more than 25 points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Sequence

import numpy as np

from rhymerl.histopipe.schedule import Demand

_HISTORY_KEYS = ("prompt_id", "epoch", "length")


@dataclass(frozen=True)
class ForecastSettings:
    """How forecasts are made."""

    trend_weight: float = 0.5  # fraction of the last epoch-to-epoch change of the mean carried forward
    prior: Literal["dataset", "prompt_length"] = "prompt_length"  # unseen prompts ("dataset" ignores length)
    min_length: float = 1.0  # forecasts are clipped to [min_length, max_length]
    max_length: float = math.inf  # the rollout's max_tokens
    cold_start: float = 128.0  # forecast when there is no history at all

    def __post_init__(self) -> None:
        if not 0.0 <= self.trend_weight <= 1.0:
            raise ValueError(f"ForecastSettings.trend_weight={self.trend_weight}: must be in [0, 1]")
        if not 0 < self.min_length <= self.max_length:
            raise ValueError(f"ForecastSettings: need 0 < min_length <= max_length, got "
                             f"{self.min_length}, {self.max_length} (set max_length to rollout.max_tokens)")


@dataclass(frozen=True)
class PromptHistory:
    """A prompt's recorded lengths, one entry per epoch it was seen (ascending)."""

    prompt_id: str
    epochs: tuple[int, ...]
    lengths: tuple[tuple[int, ...], ...]  # per epoch, the sample lengths, longest first

    def mean(self, i: int = -1) -> float:
        return sum(self.lengths[i]) / len(self.lengths[i])


@dataclass(frozen=True)
class Forecast:
    """One prompt's forecast for its next generation."""

    prompt_id: str
    lengths: tuple[float, ...]  # forecast sample-length spread, longest first
    mean: float  # forecast mean length per sample
    peak: float  # forecast longest sample
    trend: float  # change of the mean per epoch between the last two epochs seen (0 if fewer)
    last_epoch: int | None  # last epoch seen; None for a prior
    source: Literal["history", "prior"]

    def demand(self, n: int) -> Demand:
        """Scheduling demand for n samples: n evenly spaced quantiles of the forecast spread."""
        if n < 1:
            raise ValueError(f"Forecast.demand: n={n} must be >= 1 (the rollout's samples per prompt)")
        return Demand(self.prompt_id, resample(self.lengths, n))


def resample(values: Sequence[float], n: int) -> tuple[float, ...]:
    """n evenly spaced quantiles of `values` (kept in their order): the k-th is at (k + 0.5) / n."""
    m = len(values)
    return tuple(values[min(m - 1, int((k + 0.5) * m / n))] for k in range(n))


def rows_of(records: Any, columns: Sequence[str] = _HISTORY_KEYS) -> list[Mapping[str, Any]]:
    """Rows as mappings from an iterable of mappings or anything with Arrow's `select`/`to_pylist`."""
    if hasattr(records, "to_pylist") and hasattr(records, "select"):
        missing = [c for c in columns if c not in records.column_names]
        if missing:
            raise ValueError(f"table lacks column(s) {missing}; select {', '.join(columns)} in the query")
        return records.select(list(columns)).to_pylist()
    return list(records)


def build_history(records: Any) -> dict[str, PromptHistory]:
    """Group response records by prompt and epoch (records with a NULL length are skipped)."""
    per: dict[str, dict[int, list[int]]] = {}
    for i, r in enumerate(rows_of(records)):
        missing = [k for k in ("prompt_id", "epoch") if r.get(k) is None]
        if missing:
            raise ValueError(f"history record {i} lacks {missing}; pass rollout rows with "
                             f"{', '.join(_HISTORY_KEYS)}")
        if r.get("length") is not None:
            per.setdefault(r["prompt_id"], {}).setdefault(int(r["epoch"]), []).append(int(r["length"]))
    return {p: PromptHistory(p, tuple(sorted(by)), tuple(tuple(sorted(by[e], reverse=True)) for e in sorted(by)))
            for p, by in per.items()}


def history_from_summary(rows: Any, epoch: int) -> dict[str, PromptHistory]:
    """History from per-prompt aggregates of one epoch (the lake's `length_forecast` columns:
    prompt_id, responses, mean_length, max_length).

    The spread is rebuilt as one sample at the max and the rest sharing the remaining tokens, so
    mean and peak are kept (to whole tokens); the trend needs per-epoch rows and is 0 here.
    """
    out: dict[str, PromptHistory] = {}
    for i, r in enumerate(rows_of(rows, ("prompt_id", "responses", "mean_length", "max_length"))):
        n, mean, peak = int(r["responses"]), float(r["mean_length"]), float(r["max_length"])
        if n < 1 or peak < mean:
            raise ValueError(f"summary row {i} ({r['prompt_id']}): need responses >= 1 and "
                             f"max_length >= mean_length, got {n}, {peak}, {mean}")
        rest = (n * mean - peak) / (n - 1) if n > 1 else peak
        lengths = (int(round(peak)),) + (int(round(rest)),) * (n - 1)
        out[r["prompt_id"]] = PromptHistory(r["prompt_id"], (epoch,), (lengths,))
    return out


@dataclass(frozen=True)
class Prior:
    """Forecast for unseen prompts: mean = intercept + slope * prompt length (the dataset mean when
    the prompt's length is unknown), with a typical spread."""

    intercept: float
    slope: float
    dataset_mean: float
    shape: tuple[float, ...]  # typical sample lengths / their mean, longest first

    def mean_for(self, prompt_length: float | None) -> float:
        if prompt_length is None:
            return self.dataset_mean
        return self.intercept + self.slope * prompt_length


def fit_prior(history: Mapping[str, PromptHistory], spec: ForecastSettings,
              prompt_lengths: Mapping[str, int] | None = None) -> Prior:
    """The prior from seen prompts' last-epoch means (a line in prompt length when it is known
    for at least two seen prompts of different lengths, else the plain mean)."""
    if not history:
        return Prior(spec.cold_start, 0.0, spec.cold_start, (1.0,))
    means = {p: h.mean() for p, h in history.items()}
    width = max(len(h.lengths[-1]) for h in history.values())
    shapes = np.asarray([resample(h.lengths[-1], width) for h in history.values()], dtype=np.float64)
    means_last = np.asarray([max(h.mean(), 1e-9) for h in history.values()])
    shape = tuple(float(x) for x in (shapes / means_last[:, None]).mean(axis=0))  # (width,), longest first
    dataset_mean = float(np.mean(list(means.values())))
    known = [p for p in means if prompt_lengths and p in prompt_lengths]
    xs = np.asarray([prompt_lengths[p] for p in known], dtype=np.float64) if known else np.zeros(0)
    if spec.prior == "prompt_length" and len(set(xs.tolist())) >= 2:
        slope, intercept = np.polyfit(xs, np.asarray([means[p] for p in known]), 1)
        return Prior(float(intercept), float(slope), dataset_mean, shape)
    return Prior(dataset_mean, 0.0, dataset_mean, shape)


def _clip(x: float, spec: ForecastSettings) -> float:
    return float(min(spec.max_length, max(spec.min_length, x)))


def forecast_prompt(h: PromptHistory, spec: ForecastSettings, target_epoch: int | None = None) -> Forecast:
    """A seen prompt's forecast for `target_epoch` (default: the epoch after its last one)."""
    last = h.epochs[-1]
    target = last + 1 if target_epoch is None else target_epoch
    trend = 0.0
    if len(h.epochs) >= 2:
        trend = (h.mean(-1) - h.mean(-2)) / (h.epochs[-1] - h.epochs[-2])
    mean_last = h.mean()
    mean = _clip(mean_last + spec.trend_weight * trend * max(0, target - last), spec)
    scale = mean / mean_last if mean_last > 0 else 1.0
    lengths = tuple(_clip(x * scale, spec) for x in h.lengths[-1])
    return Forecast(h.prompt_id, lengths, sum(lengths) / len(lengths), max(lengths), trend, last, "history")


def forecast_lengths(history: Mapping[str, PromptHistory], prompt_ids: Iterable[str],
                     spec: ForecastSettings = ForecastSettings(), prompt_lengths: Mapping[str, int] | None = None,
                     target_epoch: int | None = None) -> dict[str, Forecast]:
    """Forecast of every prompt in `prompt_ids`: from its history if seen, else from the prior.

    `prompt_lengths` (prompt tokens by prompt_id) feeds the prior; `target_epoch` is the epoch
    being scheduled (history from that epoch or later should not be passed in).
    """
    prior = fit_prior(history, spec, prompt_lengths)
    out: dict[str, Forecast] = {}
    for p in prompt_ids:
        if p in history:
            out[p] = forecast_prompt(history[p], spec, target_epoch)
            continue
        mean = _clip(prior.mean_for((prompt_lengths or {}).get(p)), spec)
        lengths = tuple(_clip(mean * s, spec) for s in prior.shape)
        out[p] = Forecast(p, lengths, sum(lengths) / len(lengths), max(lengths), 0.0, None, "prior")
    return out


@dataclass(frozen=True)
class ForecastQuality:
    """How well forecast means ranked the prompts' actual mean lengths."""

    prompts: int  # prompts with both a forecast and an actual length
    spearman: float  # rank correlation; NaN when either side has no spread (all tied)
    moved_fraction: float  # prompts whose percentile rank differs by more than `moved_percentiles`

    def as_metrics(self, prefix: str = "forecast_") -> dict[str, float]:
        return {f"{prefix}{k}": float(v) for k, v in self.__dict__.items()}


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks, ties sharing the average of the ranks they span."""
    x = np.asarray(values, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and x[order[j + 1]] == x[order[i]]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def forecast_quality(forecast: Mapping[str, float], actual: Mapping[str, float],
                     moved_percentiles: float = 25.0) -> ForecastQuality:
    """Quality over the prompts in both maps (prompt_id -> mean length).

    Percentile rank = 100 * (rank - 1) / (N - 1) with average ranks for ties.
    """
    common = [p for p in actual if p in forecast]
    if len(common) < 2:
        raise ValueError(f"forecast_quality: {len(common)} prompt(s) have both a forecast and an actual "
                         "length; need at least 2 (compare the same epoch's prompts)")
    rf = average_ranks([forecast[p] for p in common])
    ra = average_ranks([actual[p] for p in common])
    rho = float(np.corrcoef(rf, ra)[0, 1]) if rf.std() > 0 and ra.std() > 0 else math.nan
    moved = np.abs(rf - ra) * 100.0 / (len(common) - 1) > moved_percentiles
    return ForecastQuality(len(common), rho, float(moved.mean()))


def epoch_means(records: Any, epoch: int) -> dict[str, float]:
    """prompt_id -> mean response length over that epoch's records."""
    history = build_history(records)
    return {p: sum(h.lengths[i]) / len(h.lengths[i]) for p, h in history.items()
            for i, e in enumerate(h.epochs) if e == epoch}
