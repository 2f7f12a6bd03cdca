"""The lake report: one run's analysis views as a Markdown page with plots.

`lake_report(url, run_id)` runs the lake's analysis views (`lake_summary`, `length_by_epoch`,
`rhyme_epochs`, `length_rank_stability`) and the `steps` table for one run (the latest started
one by default) and returns a `Report`: Markdown text, the PNG plots, and the per-epoch rows.
`Report.markdown_inline()` embeds the plots as data URIs so the page is self-contained (a
Prefect artifact holds text only); `Report.write(folder)` saves `report.md` with the PNGs beside
it. Nothing here imports Prefect: the `lake-report` deployment wraps it in a task.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from storage.fs import LakeError
from storage.lake import Lake
from storage.plots import plot_epochs

# One row per epoch of the chosen run; every analysis view joins on (run_id, epoch).
EPOCHS_SQL = """
WITH st AS (
    SELECT epoch, count(*) AS steps, avg(reward_mean) AS reward_mean, avg(accuracy) AS accuracy,
           sum(rollout_s) AS rollout_s, sum(total_s) AS total_s,
           sum(spec_tokens)::DOUBLE / nullif(sum(spec_steps), 0) AS spec_accepted_len
    FROM steps WHERE run_id = $run GROUP BY epoch
)
SELECT l.epoch, st.steps, l.responses, st.reward_mean, st.accuracy, l.mean AS length_mean,
       l.p10 AS length_p10, l.p50 AS length_p50, l.p90 AS length_p90, l.truncated_frac,
       r.rhyme, s.spearman AS length_spearman, s.moved_frac, st.spec_accepted_len,
       st.rollout_s, st.total_s
FROM length_by_epoch l
LEFT JOIN st ON st.epoch = l.epoch
LEFT JOIN rhyme_epochs r ON r.run_id = l.run_id AND r.epoch = l.epoch
LEFT JOIN length_rank_stability s ON s.run_id = l.run_id AND s.epoch = l.epoch
WHERE l.run_id = $run
ORDER BY l.epoch
"""

RUNS_SQL = """
SELECT s.run_id, any_value(s.name) AS name, any_value(s.status) AS status,
       count(s.epoch) AS epochs, coalesce(sum(s.steps), 0)::BIGINT AS steps,
       coalesce(sum(s.responses), 0)::BIGINT AS responses, coalesce(sum(s.bytes), 0)::BIGINT AS bytes,
       any_value(r.started_at) AS started_at
FROM lake_summary s LEFT JOIN runs r USING (run_id)
GROUP BY s.run_id ORDER BY started_at DESC NULLS LAST, s.run_id
"""

# (column, header, format) of the per-epoch table, in order.
EPOCH_COLUMNS = (
    ("epoch", "epoch", "{}"), ("steps", "steps", "{}"), ("responses", "responses", "{}"),
    ("reward_mean", "reward", "{:.3f}"), ("accuracy", "accuracy", "{:.3f}"),
    ("length_mean", "length mean", "{:.1f}"), ("length_p90", "length p90", "{:.0f}"),
    ("truncated_frac", "cut at max_tokens", "{:.1%}"),
    ("rhyme", "rhyme vs previous epoch", "{:.3f}"),
    ("length_spearman", "length-rank Spearman", "{:.3f}"), ("moved_frac", "prompts moved >25 pct", "{:.1%}"),
    ("spec_accepted_len", "HistoSpec tokens/verification", "{:.2f}"), ("rollout_s", "rollout s", "{:.1f}"),
)


@dataclass(frozen=True)
class Report:
    """A rendered lake report. `markdown` links the plots by file name (see `write`)."""

    run_id: str
    markdown: str
    images: dict[str, bytes] = field(default_factory=dict)  # file name -> PNG bytes
    epochs: list[dict[str, Any]] = field(default_factory=list)

    def markdown_inline(self) -> str:
        """The Markdown with every plot embedded as a base64 data URI (no files needed)."""
        text = self.markdown
        for name, png in self.images.items():
            text = text.replace(f"]({name})", f"](data:image/png;base64,{base64.b64encode(png).decode()})")
        return text

    def write(self, folder: str | Path) -> Path:
        """Save `report.md` and its PNGs into `folder` (created); returns the Markdown's path."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        for name, png in self.images.items():
            (out / name).write_bytes(png)
        path = out / "report.md"
        path.write_text(self.markdown)
        return path


def _fmt(value: Any, pattern: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return pattern.format(value)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    """A GitHub-style Markdown table of `rows` with (key, header, format) columns."""
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(_fmt(r.get(k), f) for k, _, f in columns) + " |" for r in rows]
    return "\n".join(lines)


def _latest_run(lake: Lake) -> str:
    rows = lake.sql(RUNS_SQL).to_pylist()
    if not rows:
        raise LakeError(f"lake {lake.url} holds no run yet; train one first (`rhymerl run`)")
    return rows[0]["run_id"]


def lake_report(url: str, run_id: str = "") -> Report:
    """Run the analysis views for `run_id` ("" = the latest started run) and render the report."""
    with Lake(url) as lake:
        runs = lake.sql(RUNS_SQL).to_pylist()
        run_id = run_id or _latest_run(lake)
        if run_id not in {r["run_id"] for r in runs}:
            raise LakeError(f"lake {url} has no run {run_id!r}; its runs: "
                            f"{', '.join(r['run_id'] for r in runs) or 'none'}")
        epochs = lake.sql(EPOCHS_SQL, {"run": run_id}).to_pylist()
    images = {"epochs.png": plot_epochs(epochs, run_id)} if epochs else {}
    run_cols = (("run_id", "run", "`{}`"), ("status", "status", "{}"), ("epochs", "epochs", "{}"),
                ("steps", "steps", "{}"), ("responses", "responses", "{}"), ("bytes", "MB", "{:.1f}"))
    for r in runs:
        r["bytes"] = (r["bytes"] or 0) / 1e6
    parts = [f"# Lake report: `{run_id}`", "",
             f"Lake `{url}`: {len(runs)} run(s). Views: `length_by_epoch`, `rhyme_epochs`, "
             "`length_rank_stability`, `steps`, `lake_summary` (see storage/README.md).", "",
             "## Per epoch", ""]
    if epochs:
        parts += [markdown_table(epochs, EPOCH_COLUMNS), "", "![per-epoch plots](epochs.png)", ""]
    else:
        parts += ["The run has no committed step yet.", ""]
    parts += ["## Runs in the lake", "", markdown_table(runs, run_cols), ""]
    return Report(run_id=run_id, markdown="\n".join(parts), images=images, epochs=epochs)
