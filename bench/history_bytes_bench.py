"""HistoSpec history bytes per worker per step, whole-epoch bundles against per-worker cuts,
replayed on a lake a run wrote.

    rhymerl bench history-bytes [--lake lake] [--run RUN_ID] [--json-out FILE]

For every epoch >= 1 of the run (epoch 0 has no history), with the run's own `spec.history_epochs`
window (4 by default) and the placement the run actually used (each (epoch, step, worker)'s prompts,
read from the rollouts' `worker_id`):
- before: one bundle of the epoch's every prompt, built from Python lists (`to_pydict` +
  `bundle_for_epoch`) and sent to every worker once per epoch: a worker
  received and held all of it; per step that is the epoch bundle / steps per epoch;
- after: each worker's bundle of the prompts it served in the step, cut from Arrow columns
  (`HistoryColumns.from_arrow` + `cut_for_workers`, the run's path), sent before every step.
Also the CPU seconds of both builds, side by side in one process (the machine is shared; compare
the ratio). Prompt token ids are the prompt text's bytes (the built-in model's tokenizer is
byte-level); they are a small part of a bundle.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from rhymerl.histospec.bundle import HistoryColumns, HistorySlicer, bundle_for_epoch
from rhymerl.data.records import Prompt
from storage.lake import Lake
from workers.history_bundles import cut_for_workers

PLACEMENT_SQL = """SELECT epoch, step, worker_id, prompt_id, any_value(prompt_text) AS text
FROM rollouts WHERE run_id = ? GROUP BY ALL ORDER BY epoch, step, worker_id, prompt_id"""


def _placements(lake: Lake, run_id: str) -> dict[int, dict[int, dict[int, list[Prompt]]]]:
    """epoch -> step -> worker -> the prompts it served (as the run placed them)."""
    out: dict = {}
    for r in lake.sql(PLACEMENT_SQL, [run_id]).to_pylist():
        p = Prompt(r["prompt_id"], 0, r["text"] or "", tuple((r["text"] or "?").encode()), answer="")
        out.setdefault(r["epoch"], {}).setdefault(r["step"], {}).setdefault(r["worker_id"], []).append(p)
    return out


def measure(lake_url: str, run_id: str | None, history_epochs: int = 4) -> dict:
    """Per epoch: bytes per worker per step before and after, and both builds' seconds."""
    with Lake(lake_url) as lake:
        if run_id is None:
            run_id = lake.sql("SELECT run_id FROM rollouts GROUP BY run_id ORDER BY count(*) DESC LIMIT 1"
                              ).to_pylist()[0]["run_id"]
        plan = _placements(lake, run_id)
        workers = 1 + max(w for steps in plan.values() for ws in steps.values() for w in ws)
        rows = []
        for epoch in sorted(e for e in plan if e > 0):
            steps = plan[epoch]
            prompts = [p for s in sorted(steps) for w in sorted(steps[s]) for p in steps[s][w]]
            table = lake.prompt_history(run_id, epoch, history_epochs)
            t0 = time.process_time()
            before, _ = bundle_for_epoch(list({p.prompt_id: p for p in prompts}.values()), table.to_pydict())
            before_s = time.process_time() - t0
            t0 = time.process_time()
            slicer = HistorySlicer(HistoryColumns.from_arrow(table))
            cuts = [cut_for_workers(slicer, [steps[s].get(w, []) for w in range(workers)]) for s in sorted(steps)]
            after_s = time.process_time() - t0
            per_worker_step = [b.nbytes for c in cuts for b in c.blobs]
            rows.append({"epoch": epoch, "steps": len(steps), "prompts": len(prompts),
                         "before_bytes_per_worker_per_epoch": len(before),
                         "before_bytes_per_worker_per_step": len(before) / len(steps),
                         "after_bytes_per_worker_per_step_mean": statistics.fmean(per_worker_step),
                         "after_bytes_per_worker_per_step_max": max(per_worker_step),
                         "after_bytes_per_worker_per_epoch_mean": sum(per_worker_step) / workers,
                         "before_build_cpu_s": before_s, "after_build_cpu_s": after_s})
    return {"run_id": run_id, "lake": lake_url, "workers": workers, "history_epochs": history_epochs,
            "epochs": rows}


def format_table(result: dict) -> str:
    lines = [f"run {result['run_id']}: {result['workers']} workers, history of the last "
             f"{result['history_epochs']} epochs; KB per worker",
             "| epoch | before: held / sent per epoch | before: per step | after: per step (mean / max) "
             "| after: per epoch | build CPU s before / after |", "|---|---|---|---|---|---|"]
    for r in result["epochs"]:
        lines.append(f"| {r['epoch']} | {r['before_bytes_per_worker_per_epoch'] / 1024:.1f} "
                     f"| {r['before_bytes_per_worker_per_step'] / 1024:.1f} "
                     f"| {r['after_bytes_per_worker_per_step_mean'] / 1024:.1f} / "
                     f"{r['after_bytes_per_worker_per_step_max'] / 1024:.1f} "
                     f"| {r['after_bytes_per_worker_per_epoch_mean'] / 1024:.1f} "
                     f"| {r['before_build_cpu_s']:.3f} / {r['after_build_cpu_s']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rhymerl bench history-bytes", description=__doc__.splitlines()[0])
    parser.add_argument("--lake", default="lake", help="lake folder or URL (default: ./lake)")
    parser.add_argument("--run", default=None, help="run id (default: the run with the most rows)")
    parser.add_argument("--history-epochs", type=int, default=4, help="spec.history_epochs of the run")
    parser.add_argument("--json-out", default=None, help="also write the result as JSON here")
    args = parser.parse_args(argv)
    result = measure(args.lake, args.run, args.history_epochs)
    print(format_table(result))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
