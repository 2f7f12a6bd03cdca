"""Summarise `rhymerl.vllm.step_trace` files: per engine process, per generate call, steps and seconds by how
many requests were running (the tail is the steps with few).

    rhymerl bench steps TAG [--dir /tmp/rhymerl-steps] [--json]

One block per engine process (in start order: with `rhymerl bench spec`, the arms in their order, the
first being the plain engine that also samples the history). A generate call ends with the step after
which no request runs; calls that scheduled under a quarter of the largest call's tokens (warm-ups) are
left out. Per bucket of running requests (counted after the step): steps per call, mean milliseconds per
step (step + post_step, and post_step alone), mean scheduled tokens per step, emitted tokens per
step and per second (traces that record them), and seconds per call.
"""

from __future__ import annotations

import argparse
import glob
import json
import os

import numpy as np

BUCKETS = ((0, 8), (9, 32), (33, 128), (129, 100_000))
MIN_SHARE = 0.25


def summarise(path: str) -> dict | None:
    """The table of one trace file, or None when it holds no full generate call."""
    with open(path) as fh:
        rows = [line.split()[:6] for line in fh if line.strip()]
    if not rows:
        return None
    a = np.array(rows, dtype=float)
    calls = np.split(np.arange(len(a)), np.flatnonzero(a[:, 3] == 0) + 1)  # a call ends when nothing runs
    size = [float(a[c, 4].sum()) for c in calls]
    calls = [c for c, n in zip(calls, size) if n >= MIN_SHARE * max(size) and n > 0]
    if not calls:
        return None
    idx = np.concatenate(calls)
    step, post, running, tokens = a[idx, 1], a[idx, 2], a[idx, 3], a[idx, 4]
    emitted = a[idx, 5] if a.shape[1] > 5 else None
    n = len(calls)
    table = []
    for lo, hi in BUCKETS:
        m = (running >= lo) & (running <= hi)
        if m.any():
            table.append({"running": f"{lo}-{hi}" if hi < 100_000 else f"{lo}+", "steps_per_call": int(m.sum()) // n,
                          "ms_per_step": round(float((step[m] + post[m]).mean()) * 1e3, 2),
                          "post_ms": round(float(post[m].mean()) * 1e3, 2),
                          "tokens_per_step": round(float(tokens[m].mean()), 1),
                          "s_per_call": round(float((step[m] + post[m]).sum()) / n, 2)})
            if emitted is not None:
                table[-1]["emitted_per_step"] = round(float(emitted[m].mean()), 2)
                table[-1]["emitted_per_s"] = round(float(emitted[m].sum() / (step[m] + post[m]).sum()), 1)
    return {"file": os.path.basename(path), "calls": n, "steps_per_call": len(idx) // n,
            "tokens_per_call": int(tokens.sum()) // n, "buckets": table}


def _pid(path: str) -> int:
    return int(os.path.basename(path).rsplit("-", 1)[1].split(".")[0])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="rhymerl bench steps", description=__doc__.splitlines()[0])
    ap.add_argument("tag")
    ap.add_argument("--dir", default=os.environ.get("RHYMERL_TRACE_DIR", "/tmp/rhymerl-steps"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    files = sorted(glob.glob(os.path.join(args.dir, f"{args.tag}-*.txt")), key=_pid)  # start order
    found = [s for s in map(summarise, files) if s is not None]
    if not found:
        raise SystemExit(f"no engine steps under {args.dir} for tag {args.tag!r}: run with "
                         "RHYMERL_TRACE_STEPS and PYTHONPATH=bench/step_trace (see rhymerl/vllm/step_trace.py)")
    if args.json:
        print(json.dumps(found, indent=1))
        return
    for s in found:
        print(f"{s['file']}: {s['calls']} calls, {s['steps_per_call']} steps and {s['tokens_per_call']} "
              "scheduled tokens per call")
        print("  running  steps/call  ms/step  post ms  tokens/step  emitted/step  emitted/s  s/call")
        for b in s["buckets"]:
            print(f"  {b['running']:>7}  {b['steps_per_call']:>10}  {b['ms_per_step']:>7}  {b['post_ms']:>7}  "
                  f"{b['tokens_per_step']:>11}  {b.get('emitted_per_step', '-'):>12}  {b.get('emitted_per_s', '-'):>9}  "
                  f"{b['s_per_call']:>6}")


if __name__ == "__main__":
    main()
