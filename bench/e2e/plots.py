"""PNG plots of the end-to-end benchmark (matplotlib, no display): one function per figure.

Each takes the report (`bench.e2e.report.build_report`) or the runs and writes one file;
`plot_all` writes them all and returns {name: file name} for the Markdown report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from bench.e2e.analysis import SPLIT, step_curves  # noqa: E402

ARM_STYLE = {"baseline": {"color": "tab:gray", "label": "baseline (no HistoSpec, naive)"},
             "rhymerl": {"color": "tab:blue", "label": "RhymeRL (HistoSpec + HistoPipe)"}}
PART_COLORS = {"rollout_s": "tab:blue", "reward_s": "tab:olive", "train_s": "tab:orange", "sync_s": "tab:purple",
               "index_s": "tab:cyan", "plan_s": "tab:pink", "lake_s": "tab:brown", "measure_s": "tab:green",
               "log_s": "gold", "checkpoint_s": "tab:red", "dispatch_s": "black", "flow_s": "dimgray"}


def _epochs(report: dict) -> list[int]:
    return [e["epoch"] for e in report["compare"]["epochs"]]


def plot_speedup(report: dict, path: Path) -> None:
    """Per epoch: step-time and rollout-time speed-up (baseline / RhymeRL), seeds as dots."""
    rows = report["compare"]["epochs"]
    x = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    step = [r["speedup"]["mean"] for r in rows]
    rollout = [r["rollout_s"]["baseline"]["mean"] / r["rollout_s"]["rhymerl"]["mean"] for r in rows]
    ax.bar([i - 0.2 for i in x], step, 0.4, label="step time", color="tab:blue")
    ax.bar([i + 0.2 for i in x], rollout, 0.4, label="rollout time", color="tab:green")
    for i, r in enumerate(rows):
        ax.plot([i - 0.2] * len(r["speedup"]["per_seed"]), r["speedup"]["per_seed"], "k.", ms=4)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(2.6, color="tab:red", ls="--", lw=0.8, label="target 2.6x (step)")
    ax.set_xticks(x, [str(r["epoch"]) for r in rows])
    ax.set(xlabel="epoch", ylabel="baseline / RhymeRL", title="Speed-up per epoch (dots: seeds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_split(report: dict, path: Path) -> None:
    """Stacked bars: each epoch's seconds by part, baseline (left) and RhymeRL (right), seed means."""
    rows = report["compare"]["epochs"]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, r in enumerate(rows):
        for j, arm in enumerate(("baseline", "rhymerl")):
            bottom = 0.0
            for part in SPLIT:
                v = max(r[part][arm]["mean"], 0.0)
                ax.bar(i + (j - 0.5) * 0.42, v, 0.4, bottom=bottom, color=PART_COLORS[part],
                       label=part.removesuffix("_s") if i == 0 and j == 0 else None,
                       edgecolor="white", linewidth=0.3)
                bottom += v
            ax.text(i + (j - 0.5) * 0.42, bottom, "BR"[j], ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)), [str(r["epoch"]) for r in rows])
    ax.set(xlabel="epoch (B = baseline, R = RhymeRL)", ylabel="seconds per epoch", title="Where the time goes")
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_epoch_metric(report: dict, key: str, ylabel: str, title: str, path: Path,
                      arms: Sequence[str] = ("baseline", "rhymerl")) -> None:
    """One per-epoch metric per arm: seed mean with a min-max band."""
    rows = report["compare"]["epochs"]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    x = [r["epoch"] for r in rows]
    for arm in arms:
        cells = [r[key][arm] for r in rows]
        ax.plot(x, [c["mean"] for c in cells], "o-", color=ARM_STYLE[arm]["color"], label=ARM_STYLE[arm]["label"])
        ax.fill_between(x, [c["min"] for c in cells], [c["max"] for c in cells], color=ARM_STYLE[arm]["color"],
                        alpha=0.2)
    ax.set(xlabel="epoch", ylabel=ylabel, title=title)
    ax.set_xticks(x)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_curves(runs: Sequence[dict], path: Path) -> None:
    """Reward and accuracy per global step, both arms: seed mean and min-max band."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key in zip(axes, ("reward_mean", "accuracy")):
        for arm, style in ARM_STYLE.items():
            curve = step_curves(runs, arm, key)
            if not curve:
                continue
            xs = sorted(curve)
            mean = [sum(curve[s]) / len(curve[s]) for s in xs]
            ax.plot(xs, mean, "-", color=style["color"], label=f"{style['label']}, {len(curve[xs[0]])} seeds")
            ax.fill_between(xs, [min(curve[s]) for s in xs], [max(curve[s]) for s in xs], color=style["color"],
                            alpha=0.2)
        ax.set(xlabel="global step", ylabel=key, title=f"{key} per step (band: seed min-max)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_all(runs: Sequence[dict], report: dict, out: Path) -> dict[str, str]:
    """Every figure into `out`; returns {name: file name} of those written."""
    if not report["compare"]["epochs"]:
        return {}
    files = {"speedup": "speedup.png", "split": "time_split.png", "acceptance": "acceptance.png",
             "bubble": "bubble.png", "curves": "reward_curves.png"}
    plot_speedup(report, out / files["speedup"])
    plot_split(report, out / files["split"])
    plot_epoch_metric(report, "accepted_len", "tokens per verification step", "HistoSpec acceptance per epoch",
                      out / files["acceptance"], arms=("rhymerl",))
    plot_epoch_metric(report, "bubble_ratio", "idle worker share of rollout", "Bubble ratio per epoch",
                      out / files["bubble"])
    plot_curves(runs, out / files["curves"])
    return files
