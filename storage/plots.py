"""Every plot of a run's records, in one place (matplotlib's Agg canvas on private Figures: no
display, no global pyplot state, safe in threads and workers).

`plot_reward_curve` (per step: reward and accuracy; logged to MLflow at the end of a run) and
`plot_epochs` (per epoch: the lake report's four panels). HistoPipe's Gantt chart of a step is
HistoPipe's own (`rhymerl.histopipe.gantt`), and the end-to-end benchmark's figures live with it
(`bench/e2e/plots.py`).
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def _series(rows: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [math.nan if row.get(key) is None else float(row[key]) for row in rows]


def plot_reward_curve(history: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Plot reward mean ± std and accuracy per step, with epoch boundaries marked; save a PNG.

    Each history row is one step in training order with `reward_mean`, and optionally
    `reward_std`, `accuracy` and `epoch`. Returns the written path.
    """
    if not history:
        raise ValueError("plot_reward_curve needs at least one step in history")
    for i, row in enumerate(history):
        if row.get("reward_mean") is None:
            raise ValueError(f"history row {i} has no 'reward_mean'; give every step its mean reward")
    x = list(range(len(history)))
    mean, std, acc = (_series(history, k) for k in ("reward_mean", "reward_std", "accuracy"))
    fig = Figure(figsize=(8, 5.5), tight_layout=True)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.plot(x, mean, marker=".", label="reward mean")
    if any(not math.isnan(s) for s in std):
        top.fill_between(x, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                         alpha=0.25, label="± std")
    top.set_ylabel("reward")
    top.legend(loc="best")
    bottom.plot(x, acc, marker=".", color="tab:green")
    bottom.set_ylabel("accuracy")
    bottom.set_xlabel("step")
    epochs = [row.get("epoch") for row in history]
    for i in range(len(history)):
        if i == 0 or epochs[i] != epochs[i - 1]:
            for ax in (top, bottom):
                ax.axvline(i - 0.5, color="grey", linestyle="--", linewidth=0.8)
            if epochs[i] is not None:
                top.annotate(f"epoch {epochs[i]}", (i - 0.5, 1), xycoords=("data", "axes fraction"),
                             xytext=(3, -12), textcoords="offset points", fontsize=8, color="grey")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return buf.getvalue()


def plot_epochs(rows: Sequence[dict[str, Any]], run_id: str) -> bytes:
    """Four panels over epochs: reward and accuracy, length percentiles, rhyme, rank stability."""
    fig = Figure(figsize=(9, 6), tight_layout=True)
    FigureCanvasAgg(fig)
    (a, b), (c, d) = fig.subplots(2, 2, sharex=True)
    x = [int(r["epoch"]) for r in rows]
    a.plot(x, _series(rows, "reward_mean"), marker="o", label="reward")
    a.plot(x, _series(rows, "accuracy"), marker="o", label="accuracy")
    a.set_title("reward and accuracy")
    a.legend(loc="best")
    for key, label in (("length_p10", "p10"), ("length_p50", "p50"), ("length_p90", "p90")):
        b.plot(x, _series(rows, key), marker=".", label=label)
    b.set_title("response length (tokens)")
    b.legend(loc="best")
    c.plot(x, _series(rows, "rhyme"), marker="o", color="tab:purple")
    c.set_title("rhyme with the previous epoch")
    c.set_ylim(0, 1.05)
    d.plot(x, _series(rows, "length_spearman"), marker="o", color="tab:green", label="Spearman")
    d.plot(x, _series(rows, "moved_frac"), marker="o", color="tab:red", label="moved > 25 pct")
    d.set_title("length-rank stability")
    d.set_ylim(-0.05, 1.05)
    d.legend(loc="best")
    for ax in (c, d):
        ax.set_xlabel("epoch")
    fig.suptitle(run_id, fontsize=9)
    return _png(fig)


__all__ = ["plot_epochs", "plot_reward_curve"]
