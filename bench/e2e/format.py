"""Labels and number formats shared by the end-to-end report's text (`bench.e2e.report`) and
Markdown (`bench.e2e.markdown`) forms; a module of its own so neither imports the other."""

from __future__ import annotations

import math

SPLIT_LABELS = {"rollout_s": "rollout", "reward_s": "reward", "train_s": "train", "sync_s": "weight sync",
                "index_s": "index build", "plan_s": "plan (forecast query)", "lake_s": "lake write",
                "measure_s": "measure (bubble, Gantt)", "log_s": "log (MLflow, steps row)",
                "checkpoint_s": "checkpoint", "dispatch_s": "dispatch (Prefect/Ray)",
                "flow_s": "epoch flow"}


def num(x, fmt: str = ".2f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def mean_sd(cell: dict, fmt: str = ".2f") -> str:
    """mean ± sd over seeds (sd only with > 1 seed)."""
    return num(cell["mean"], fmt) + (f" ± {num(cell['sd'], fmt)}" if cell["n"] > 1 else "")
