"""Gantt chart of one step: a row per worker, a thin line per request, idle time left blank.

Works for simulated steps (`simulator.simulate`) and measured ones (`simulator.measure` over the
lake's rows) alike. Drawn with matplotlib's Agg canvas on a private Figure, so it needs no
display and leaves the global pyplot state alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from rhymerl.histopipe.simulator import RequestSpan, SimResult


def lanes(spans: Sequence[RequestSpan]) -> list[int]:
    """A lane per span so spans on one worker that overlap in time never share a lane.

    Greedy by start time: each span takes the lowest lane whose last span has ended. Returns
    lane indices in the order of `spans`.
    """
    out = [0] * len(spans)
    free_at: dict[int, list[float]] = {}  # worker -> end time of the last span in each lane
    for i in sorted(range(len(spans)), key=lambda i: (spans[i].worker, spans[i].start, spans[i].end)):
        s = spans[i]
        ends = free_at.setdefault(s.worker, [])
        lane = next((k for k, end in enumerate(ends) if end <= s.start), len(ends))
        if lane == len(ends):
            ends.append(s.end)
        else:
            ends[lane] = s.end
        out[i] = lane
    return out


def gantt_png(result: SimResult, path: str | Path, title: str = "") -> Path:
    """Draw `result` to a PNG at `path` (parent folders are created); returns the path.

    Each worker's row shows its busy intervals as a pale band and each request as a line in its
    own lane; migrated continuations are drawn in a second colour. The title line adds W,
    makespan, bubble ratio and migrations.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    height = min(16.0, 1.5 + 0.35 * result.workers)
    fig = Figure(figsize=(11.0, height), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    lane_of = lanes(result.spans)
    depth = {w: 1 for w in range(result.workers)}
    for s, lane in zip(result.spans, lane_of):
        depth[s.worker] = max(depth[s.worker], lane + 1)
    # One barh and one hlines call for the whole step: a call per request costs about a millisecond,
    # which at hundreds of requests makes the chart a visible share of every step.
    bars = [(w, a, b) for w, intervals in enumerate(result.busy) for a, b in intervals]
    if bars:
        ax.barh([w for w, _, _ in bars], [b - a for _, a, b in bars], left=[a for _, a, _ in bars],
                height=0.9, color="#dbe7f3", edgecolor="none")
    if result.spans:
        ax.hlines([s.worker - 0.42 + 0.84 * (lane + 0.5) / depth[s.worker] for s, lane in zip(result.spans, lane_of)],
                  [s.start for s in result.spans], [s.end for s in result.spans],
                  colors=["#d62728" if s.migrated else "#1f4e79" for s in result.spans],
                  linewidths=[max(0.3, min(2.0, 20.0 / depth[s.worker])) for s in result.spans])
    ax.axvline(result.makespan, color="#555555", linestyle="--", linewidth=0.8)
    ax.set_ylim(-0.6, result.workers - 0.4)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from step start")
    ax.set_ylabel("worker")
    summary = (f"W={result.workers}  makespan={result.makespan:.3g}s  bubble={100 * result.bubble_ratio:.1f}%  "
               f"migrations={result.migrations}")
    ax.set_title(f"{title}\n{summary}" if title else summary, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path
