"""Plain-text reporting of a run: per-step lines and the end-of-run per-epoch summary table."""

from __future__ import annotations

from typing import Sequence

SUMMARY_COLUMNS = ("reward_mean", "accuracy", "length_mean", "plan_s", "rollout_s", "reward_s", "lake_s",
                   "train_s", "sync_s", "step_s", "rollout_tokens_per_s", "bubble_ratio")
_SUMS = {"plan_s", "rollout_s", "reward_s", "lake_s", "train_s", "sync_s", "step_s"}  # seconds add up


def accuracy_part(rec: dict, prefix: str = " acc ") -> str:
    """`prefix` and the accuracy (" acc 0.250") when the record has one; "" when no reward function
    judges correctness (an accuracy of 0 would be a lie)."""
    return f"{prefix}{rec['accuracy']:.3f}" if rec.get("accuracy") is not None else ""


def step_line(rec: dict) -> str:
    """One human-readable line per step."""
    return (f"epoch {rec['epoch']} step {rec['step']}: reward {rec['reward_mean']:.3f}"
            f"{accuracy_part(rec)} len {rec['length_mean']:.1f} (max {rec['length_max']:.0f}) | "
            f"rollout {rec['rollout_s']:.1f}s ({rec['rollout_tokens_per_s']:.0f} tok/s, "
            f"bubble {rec.get('bubble_ratio', 0.0):.0%}) "
            f"train {rec['train_s']:.1f}s sync {rec['sync_s']:.1f}s step {rec['step_s']:.1f}s"
            + _spec_part(rec))


def _spec_part(rec: dict) -> str:
    """Speculation's share of the line: tokens per verification step and draft acceptance."""
    if "spec/steps" not in rec:
        return ""
    return (f" | spec {rec['spec/mean_accepted_length']:.2f} tok/verify, "
            f"{rec['spec/acceptance_rate']:.0%} of drafts accepted")


def _mean_where_present(recs: Sequence[dict], weights: Sequence[float], col: str) -> float | None:
    """Sample-weighted mean of `col` over the steps that have it; None when none has."""
    have = [(r[col], w) for r, w in zip(recs, weights) if r.get(col) is not None]
    return sum(v * w for v, w in have) / max(sum(w for _, w in have), 1e-9) if have else None


def epoch_summary(history: Sequence[dict]) -> list[dict]:
    """Per epoch: sample-weighted means of quality metrics, sums of stage seconds, and each reward
    function's mean (`reward/<name>`). Accuracy is left out when no step has one (no reward
    function judges correctness), never shown as 0."""
    epochs: dict[int, list[dict]] = {}
    for rec in history:
        epochs.setdefault(int(rec["epoch"]), []).append(rec)
    out = []
    for epoch, recs in sorted(epochs.items()):
        weights = [r["tokens"] / max(r["length_mean"], 1e-9) for r in recs]  # samples per step
        total = sum(weights)
        row: dict = {"epoch": epoch, "steps": len(recs)}
        for col in SUMMARY_COLUMNS:
            if col in _SUMS:
                row[col] = sum(r.get(col, 0.0) for r in recs)
            elif col == "accuracy":
                if (mean := _mean_where_present(recs, weights, col)) is not None:
                    row[col] = mean
            else:
                row[col] = sum(r.get(col, 0.0) * w for r, w in zip(recs, weights)) / total
        for col in dict.fromkeys(k for r in recs for k in r if k.startswith("reward/")):
            row[col] = _mean_where_present(recs, weights, col)
        if any("spec/steps" in r for r in recs):  # ratio of sums: tokens per verification step
            steps = sum(r.get("spec/steps", 0.0) for r in recs)
            row["spec_accepted_len"] = sum(r.get("spec/tokens", 0.0) for r in recs) / max(steps, 1.0)
        out.append(row)
    return out


def format_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """A fixed-width text table (numbers to 3 significant decimals)."""
    def cell(v) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    body = [[cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) if body else len(c) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) for v, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def format_summary(rows: Sequence[dict], run_id: str, lake: str, tracking: str, mlflow_run_id: str,
                   skipped: int, export: str = "") -> str:
    """The end-of-run report: the per-epoch table and where the data (and the exported model) went."""
    spec = ("spec_accepted_len",) if any("spec_accepted_len" in r for r in rows) else ()
    columns = tuple(c for c in SUMMARY_COLUMNS if c != "accuracy" or any("accuracy" in r for r in rows))
    functions = tuple(dict.fromkeys(k for r in rows for k in r if k.startswith("reward/")))
    table = format_table(rows, ("epoch", "steps") + columns[:1] + functions + columns[1:] + spec)
    return (f"Run {run_id} finished.\n{table}\n"
            f"prompts skipped (too long or repeated): {skipped}\n"
            f"lake: {lake}   (rhymerl lake sql \"SELECT epoch, count(*), avg(reward) FROM rollouts GROUP BY epoch\")\n"
            f"MLflow: {tracking}  run {mlflow_run_id}"
            + (f"\nmodel: {export}   (a Hugging Face folder: AutoModelForCausalLM.from_pretrained, "
               "vllm.LLM; docs/exported-models.md)" if export else ""))
