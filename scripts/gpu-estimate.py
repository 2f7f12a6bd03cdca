"""The cluster-scale GPU estimate for every model of a cost surface, from a saved end-to-end result.

    .venv/bin/python scripts/gpu-estimate.py [--e2e bench/results/e2e.json]
        [--cost-json bench/results/cost-surface-roofline.json] [--models qwen2-7b@h200 ...]
        [--workers 64] [--max-tokens 8192] [--out bench/results/gpu-estimate.json]

The same estimate `rhymerl bench e2e --cost-json` appends to its report (`bench.e2e.scale`: the
simulator with the goodput rule choosing each step's drafts under the surface), with the measured
tokens per verification, acceptance and rollout share read from the saved result instead of new
runs. Prints one Markdown table row per model; writes every estimate to `--out`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

from bench.e2e.report import scale_estimate  # noqa: E402


def row(model: str, est: dict) -> str:
    """One Markdown row: model, drafts kept at full batch, rollout and step speed-ups (rule and fixed)."""
    a, s = est["arms"], est["spec"]
    first = est["controller"]["rows"][0]["context"]
    rows = [r for r in est["controller"]["rows"] if r["context"] == first]
    full = max(rows, key=lambda r: r["batch"])
    off = [f"{b.removeprefix('pos')} ({p['accepted_len']:.2f}): from batch "
           f"{min(r['batch'] for r in p['rows'] if r['off'])}"
           for b, p in est["controller"]["by_position"].items() if any(r["off"] for r in p["rows"])]
    return (f"| {model} | {s['accepted_len']:.2f} | {full['draft_len']:.1f} of {full['fixed_draft_len']:.0f} | "
            f"{'; '.join(off) or 'nowhere'} | {a['rhymerl']['rollout_speedup']:.2f}x | "
            f"**{a['rhymerl']['step_speedup']:.2f}x** | {a['rhymerl']['step_speedup_streamed']:.2f}x | "
            f"{a['rhymerl_fixed']['step_speedup']:.2f}x |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--e2e", default="bench/results/e2e.json", help="a saved `rhymerl bench e2e` result")
    p.add_argument("--cost-json", default="bench/results/cost-surface-roofline.json")
    p.add_argument("--models", nargs="*", help="models of --cost-json (default: all)")
    p.add_argument("--workers", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=8192)
    p.add_argument("--out", default="bench/results/gpu-estimate.json")
    args = p.parse_args(argv)
    doc = json.loads(Path(args.e2e).read_text())
    models = args.models or list(json.loads(Path(args.cost_json).read_text())["models"])
    out = {"e2e": args.e2e, "e2e_date": doc.get("date"), "e2e_commit": doc.get("commit"),
           "cost_json": args.cost_json, "estimates": {}}
    print("| model | tokens per verification | drafts kept at batch 256 | speculation off (response position, its "
          "tokens per verification) | rollout | step | step, streamed training | step, fixed drafts |\n"
          "|---|---|---|---|---|---|---|---|")
    for model in models:
        est = scale_estimate(doc["compare"], {"workers": args.workers, "max_tokens": args.max_tokens,
                                              "cost_json": args.cost_json, "cost_model": model},
                             doc.get("by_position", []))
        if est is None:
            print(f"gpu-estimate: {args.e2e} has no accepted drafts to estimate from", file=sys.stderr)
            return 1
        out["estimates"][model] = est
        print(row(model, est), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
