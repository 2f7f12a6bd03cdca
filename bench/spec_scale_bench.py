"""HistoSpec's data path at reasoning-RL size, on synthetic rhyming histories.

    rhymerl bench spec-scale [--json] [--json-out FILE] [--quick] [--seed 0] [--point L,H,R] [--spec prompt|engine]
                             [--forward busy|idle]

Generator: `bench.rhyming` (seeded rhyming histories; response length L, H history responses per
prompt, R requests per engine, 16 live samples per prompt). Grid: L in 1K, 4K, 16K; H in 16, 64; R in
128, 256, 512 requests per engine (R / 16 prompts per engine); epochs of P = 1K and 20K prompts.

Arms, side by side in one process (the machine is shared and noisy; compare within a row):
- new: `FlatIndex` (reversed-context suffix array) through `BatchDrafter`: history built by
  its background thread, requests keyed by length + tail, every row's own draft in one compiled call
  (`rhymerl.histospec.engine.batch`);
- new_py: the same `BatchDrafter` drafting row by row in Python (`batched=False`, the reference the
  compiled path equals; drafting only, so no build columns);
- arctic: Arctic Inference's `SuffixTree` (depth 24, the engine of vLLM's `suffix`) per prompt,
  drafting with its stock settings (factor 1, min_token_prob 0.1);
- suffix: what vLLM's `suffix` method does per step (`SuffixDecodingProposer.propose`): each row's new
  tokens into its request's tree and the global cache, then the library's speculate over both; the
  cache first holds every prompt's history responses and the requests' prefixes (skipped where that
  exceeds `SUFFIX_TOKENS`, the trees' bytes being several hundred per token).

Per (L, H), one prompt's index: bytes per indexed token beyond the tokens themselves (new: array bytes; arctic: the library's `estimate_memory`, all of it),
build tokens/s (wall, best of 3 below 1M tokens) and the build's peak memory (tracemalloc; arctic:
its estimate). Per (L, H, R), an engine step at 8K-token contexts (L/2 below 16K) with the prompt's
index only (no siblings, no cross-prompt tree, no trim: those are the same in every arm; `--spec engine`
drafts new and new_py with the engine's default settings instead: siblings and the cross-prompt tree on,
trimming off):
- stall: the longest step while the step's R / 16 new prompts' histories are indexed (new: measured,
  builds in the background, and with `--spec engine` until the requests' 8K-token prefixes have
  caught up into the siblings and the tree, a bounded number of tokens a step, so new's timed steps
  run at a longer context, `timed_context` in the JSON; a forward pass of 10 ms between steps, as
  below; arctic builds in the step: R / 16 x one prompt's build time);
- drafter ms per step and us per request (median of steps, CPU time of the drafting thread: what a
  step costs the engine's thread, whatever else runs on this shared machine; the sampled-token lists
  the engine hands the drafter are built before the clock starts; new's wall time beside
  it, step_wall_ms in the JSON; arctic drafts from 2 prompts' indexes, as building all of them
  would take minutes and costs nothing per draft). new, new_py and suffix steps accept what a model sampling the row's own tokens would: a
  draft's longest prefix equal to the row's next tokens, then one token (`acceptance_rate` in the
  JSON), and 10 ms pass between timed steps (the engine's forward pass; every arm). Steps that
  accepted nothing would let `spec.fail_backoff` pause most rows and understate the cost. The
  drafting thread spins through the forward pass, as it does waiting on a GPU
  (`bench.rhyming.Forward`; `--forward idle` sleeps instead: the step after a sleep starts with
  cold caches and costs more);
- index memory per engine (R / 16 prompts, tokens included); with `--spec engine`, the siblings'
  indexes too (`sibling_bytes`, `sibling_bytes_per_token` in the JSON: every running request's
  tokens, prompt tails included, with their n-gram table and links). Per (L, H, P), arithmetic on those
  figures: the epoch's history tokens, and what a worker holds when every worker receives every
  prompt's history as Python tuples (`HistoryBundle.from_bytes`, 36 B per token) against the
  flat arrays it reads (4 B per token; each worker gets only its prompts' history).
Each drafting arm runs with the heap alive before it frozen (`rhymerl.run.heap.frozen_heap`), as an
engine's, so a full GC of the benchmark's own heap cannot land in a step and read as a stall.
Targets: <= 16 B/token beyond the tokens, >= 2M tokens/s, no stall from history work, <= 1 ms per
step for 256 requests (3.9 us per request).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import tracemalloc
from datetime import date

import numpy as np

from bench.rhyming import PROMPT_LEN, SAMPLES, Forward, accept, engine_rows, rhyming_group
from rhymerl.run.heap import frozen_heap
from rhymerl.histospec.engine.step_drafter import BatchDrafter
from rhymerl.histospec.index import FlatIndex
from rhymerl.config.spec import SpecConfig, has_arctic_inference

# Requests per engine: 128, 256 (where the 1 ms target is set) and 512.
FULL = {"lengths": (1024, 4096, 16384), "histories": (16, 64), "requests": (128, 256, 512), "epochs": (1000, 20000)}
QUICK = {"lengths": (96,), "histories": (4,), "requests": (32,), "epochs": (10,)}
SPEC = SpecConfig(siblings=False, recent_responses=0, cost_aware=False)  # the prompt's index alone
ENGINE_SPEC = SpecConfig(cost_aware=False)  # --spec engine: siblings and the cross-prompt tree too
TARGETS = {"bytes_per_token": 16, "build_tokens_per_s": 2e6, "step_ms_256": 1.0}
SUFFIX_TOKENS = 10_000_000  # the suffix arm's history + request prefixes at most (~3.5 GB of its trees)
# Arms without an index build of their own: new_py drafts from new's index, suffix keeps
# its trees itself (their memory is in its drafting point).
UNBUILT = ("new_py", "suffix")


def _timed(build, repeats: int) -> tuple[object, float]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = build()
        best = min(best, time.perf_counter() - t0)
    return out, best


def _peak(build) -> int:
    tracemalloc.start()
    try:
        build()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _new(prompt, hist):
    return FlatIndex.build(hist.ravel(), [hist.shape[1]] * len(hist), prompt,
                           min_match=SPEC.min_match, max_match=SPEC.max_match)


def _arctic(prompt, hist):
    from arctic_inference.suffix_decoding._C import SuffixTree

    tree = SuffixTree(24)
    for i, r in enumerate(hist.tolist()):
        tree.extend(i, prompt.tolist() + r)
    return tree


def build_point(rng, length: int, history: int, arms: list[str]) -> dict:
    """One prompt's index per arm: bytes/token, build tokens/s, peak build memory."""
    prompt, rows = rhyming_group(rng, length, history)
    hist = rows[:history]
    tokens = hist.size + history * PROMPT_LEN
    repeats = 3 if tokens < 1_000_000 else 1
    out = {"length": length, "history": history, "tokens": tokens}
    for arm in arms:
        make = {"new": _new, "arctic": _arctic}[arm]
        index, seconds = _timed(lambda: make(prompt, hist), repeats)
        peak = _peak(lambda: make(prompt, hist)) if arm != "arctic" else int(index.estimate_memory())
        size = index.nbytes if arm == "new" else peak
        out[arm] = {"bytes_per_token": size / tokens, "build_tokens_per_s": tokens / seconds,
                    "build_s": seconds, "peak_bytes": peak}
        del index
    return out


def draft_point(rng, length: int, history: int, requests: int, arms: list[str], steps: int,
                spec: SpecConfig = SPEC, forward: Forward = Forward()) -> dict:
    """An engine step of R requests per arm: stall from history work, drafter ms/step and us/request."""
    bundle, groups, rows, n0 = engine_rows(rng, length, history, requests)
    out = {"length": length, "history": history, "requests": requests, "context": n0,
           "prompts": len(groups)}
    for arm in [a for a in arms if a in ("new", "new_py")]:
        with frozen_heap():  # as an engine's start-up heap (rhymerl.run.heap): full collections walk the arm's own
            out[arm] = _draft_new(bundle, rows, n0, requests, steps, spec, batched=arm != "new_py", forward=forward)
    if "suffix" in arms:  # the library's trees hold ~355 B per token: cap what one point may put in them
        held = len(groups) * history * length + requests * n0
        with frozen_heap():
            out["suffix"] = (_draft_suffix(groups, rows, n0, requests, steps, history, forward)
                             if held <= SUFFIX_TOKENS else
                             {"skipped": f"{held / 1e6:.1f}M tokens for its trees (> {SUFFIX_TOKENS / 1e6:.0f}M)"})
    two = groups[:2]  # arctic: 2 prompts' indexes serve every request
    for arm in [a for a in arms if a == "arctic"]:
        make = _arctic
        indexes, build_s = [], []
        for prompt, r in two:
            index, seconds = _timed(lambda: make(prompt, r[:history]), 2)
            indexes.append(index)
            build_s.append(seconds)
        with frozen_heap():  # as the other arms' steps
            per_step = _draft_other(arm, indexes, rows, n0, requests, steps, forward)
        out[arm] = {"stall_ms": 1e3 * statistics.mean(build_s) * len(groups), "step_ms": per_step * 1e3,
                    "us_per_request": per_step / requests * 1e6}
    return out


def _draft_new(bundle, rows, n0, requests: int, steps: int, spec: SpecConfig, batched: bool,
               forward: Forward = Forward()) -> dict:
    """Steps of BatchDrafter: the first sees every request new, and steps go on while the
    background thread indexes the histories and the requests' long prefixes catch up into the
    siblings and the tree (`BatchDrafter.lagging`; the longest of these steps is the stall); then
    steady steps, at `timed_context` tokens. Each step accepts what a model sampling the row's own
    tokens would: a draft's longest prefix equal to the row's next tokens, then one more token (so
    rows advance unevenly and fail_backoff pauses only rows whose drafts fail). Between timed steps
    the engine's forward pass is `forward`'s wait, during which growth behind the step runs."""
    drafter = BatchDrafter(bundle, spec, k=16, max_model_len=rows.shape[1] + 16, batched=batched)
    num = np.full(requests, n0 - 1, dtype=np.int64)
    drafts: list[list[int]] = [[] for _ in range(requests)]

    def step() -> tuple[float, float]:
        sampled = [t.tolist() for t in accept(rows, num, drafts)]  # the engine's input, not timed
        w0, c0 = time.perf_counter(), time.thread_time()
        drafts[:] = drafter.propose(sampled, num, rows)
        return time.perf_counter() - w0, time.thread_time() - c0

    room = rows.shape[1] - 17 * (steps + 2)  # rows must not run out before the timed steps end
    t0 = time.perf_counter()
    stall, building_steps = step()[0], 1
    while (drafter.building or drafter.lagging) and num.max() < room:
        forward.wait()  # the forward pass, as in the engine
        stall = max(stall, step()[0])
        building_steps += 1
    drafter.wait_for_builds()
    build_wait = time.perf_counter() - t0
    timed_context, stats = int(num.mean()), drafter.stats
    drafted, accepted = stats.drafted, stats.accepted
    timed = []
    for _ in range(steps):
        timed.append(step())
        forward.wait()
    per_step = statistics.median(cpu for _, cpu in timed)
    stats = drafter.stats  # read again: the steps' counts are added to it when it is read
    index_bytes = sum(p.index.flat.nbytes + p.index.flat.text.nbytes for p in drafter.prompts.values())
    sides = [p.index.side for p in drafter.prompts.values()]  # the siblings' indexes (empty without siblings)
    sibling_tokens, sibling_bytes = sum(s.num_tokens for s in sides), sum(s.nbytes for s in sides)
    return {"stall_ms": stall * 1e3, "steps_while_building": building_steps, "build_wait_s": build_wait,
            "step_ms": per_step * 1e3, "us_per_request": per_step / requests * 1e6, "index_bytes": index_bytes,
            "sibling_tokens": sibling_tokens, "sibling_bytes": sibling_bytes,
            "sibling_bytes_per_token": sibling_bytes / sibling_tokens if sibling_tokens else 0.0,
            "step_wall_ms": statistics.median(wall for wall, _ in timed) * 1e3,
            "step_wall_max_ms": max(wall for wall, _ in timed) * 1e3,
            "forward_ms": forward.seconds * 1e3,
            "timed_context": timed_context,
            "acceptance_rate": (stats.accepted - accepted) / max(1, stats.drafted - drafted)}


def _draft_suffix(groups, rows, n0: int, requests: int, steps: int, history: int,
                  forward: Forward = Forward()) -> dict:
    """vLLM's `suffix` method's work per step (`SuffixDecodingProposer.propose`, stock settings): every
    row's new tokens into its request's local tree and the global cache, then the library's
    speculate over both. The global cache first holds every prompt's history responses (as vLLM's
    cache holds the responses it served), and each request's prefix before the first timed step;
    steps accept as `_draft_new`'s do. Its memory: the library's estimate of all its trees."""
    from arctic_inference.suffix_decoding import SuffixDecodingCache
    cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=-1)
    t0 = time.perf_counter()
    for p, (prompt, responses) in enumerate(groups):
        for h in range(history):
            cache.start_request(("history", p, h), prompt.astype(np.int32))
            cache.add_active_response(("history", p, h), responses[h].astype(np.int32))
            cache.stop_request(("history", p, h))
    for i in range(requests):
        cache.start_request(i, rows[i, :PROMPT_LEN].copy())
        cache.add_active_response(i, rows[i, PROMPT_LEN:n0 - 1].copy())
    build_s = time.perf_counter() - t0
    num = np.full(requests, n0 - 1, dtype=np.int64)
    drafts: list[list[int]] = [[] for _ in range(requests)]
    timed = []
    for _ in range(steps):
        sampled = accept(rows, num, drafts)
        w0, c0 = time.perf_counter(), time.thread_time()
        for i, new in enumerate(sampled):  # as SuffixDecodingProposer.propose, per request
            cache.add_active_response(i, new)
            n = int(num[i])
            drafts[i] = cache.speculate(i, rows[i, max(0, n - 24):n], max_spec_tokens=16, max_spec_factor=1.0,
                                        min_token_prob=0.1).token_ids
        timed.append((time.perf_counter() - w0, time.thread_time() - c0))
        forward.wait()
    per_step = statistics.median(cpu for _, cpu in timed)
    memory = cache._global_tree.estimate_memory() + sum(t.estimate_memory() for t in cache._local_trees.values())
    return {"stall_ms": 0.0, "build_s": build_s, "step_ms": per_step * 1e3, "us_per_request": per_step / requests * 1e6,
            "step_wall_ms": statistics.median(wall for wall, _ in timed) * 1e3, "index_bytes": int(memory),
            "timed_context": int(num.mean())}


def _draft_other(arm: str, indexes, rows, n0: int, requests: int, steps: int, forward: Forward) -> float:
    """Median seconds per step of the library's speculate for R requests: request i is row i % 32, a live sample of prompt (i % 32) // 16,
    and drafts from that prompt's index."""
    drafters = indexes
    times = []
    for step in range(steps):
        n = n0 + step
        t0 = time.thread_time()
        for i in range(requests):
            j = i % (SAMPLES * len(drafters))
            row, drafter = rows[j], drafters[j // SAMPLES]
            drafter.speculate(row[max(0, n - 24):n].tolist(), 16, 1.0, 0.0, 0.1, False)
        times.append(time.thread_time() - t0)
        forward.wait()
    return statistics.median(times)


def epoch_point(length: int, history: int, prompts: int, new_bpt: float) -> dict:
    """What a worker holds for an epoch's history when every worker gets every prompt's."""
    tokens = prompts * history * length
    return {"length": length, "history": history, "epoch_prompts": prompts, "history_tokens": tokens,
            "worker_bytes_all_tuples": tokens * 36, "worker_bytes_own_arrays": tokens * 4,
            "index_bytes_if_all_indexed": tokens * (4 + new_bpt)}


def run(grid: dict, seed: int, arms: list[str], steps: int, spec: str = "prompt",
        forward: Forward = Forward()) -> dict:
    rng = np.random.default_rng(seed)
    built = [a for a in arms if a not in UNBUILT]
    # Drafting first: the builds leave freed memory behind, and a step drafted in that heap reads
    # slower; an engine never builds several prompts' indexes side by side.
    drafts = [draft_point(rng, L, H, R, arms, steps, ENGINE_SPEC if spec == "engine" else SPEC, forward)
              for L in grid["lengths"] for H in grid["histories"] for R in grid["requests"]]
    builds = [build_point(rng, L, H, built) for L in grid["lengths"] for H in grid["histories"]]
    bpt = {(b["length"], b["history"]): b["new"]["bytes_per_token"] for b in builds if "new" in b}
    epochs = [epoch_point(L, H, P, bpt.get((L, H), 12.0))
              for L in grid["lengths"] for H in grid["histories"] for P in grid["epochs"]]
    return {"date": date.today().isoformat(), "machine": f"{platform.machine()}, {platform.processor() or '?'}, "
            f"{__import__('os').cpu_count()} CPUs (shared)", "seed": seed, "grid": grid, "arms": arms,
            "targets": TARGETS, "spec": spec,
            "forward": {"ms": forward.seconds * 1e3, "busy": forward.busy}, "builds": builds, "drafts": drafts, "epochs": epochs}


def table(result: dict) -> str:
    """Markdown tables of `result`."""
    arms = result["arms"]
    built = [a for a in arms if a not in UNBUILT]
    lines = ["| L | H | tokens | " + " | ".join(f"{a} B/token | {a} Mtok/s | {a} peak MB" for a in built) + " |",
             "|---" * (3 + 3 * len(built)) + "|"]
    for b in result["builds"]:
        cells = [f"{b[a]['bytes_per_token']:.1f} | {b[a]['build_tokens_per_s'] / 1e6:.2f} | "
                 f"{b[a]['peak_bytes'] / 2**20:.0f}" for a in built]
        lines.append(f"| {b['length']} | {b['history']} | {b['tokens']} | " + " | ".join(cells) + " |")
    lines += ["", "| L | H | R | context | " + " | ".join(f"{a} stall ms | {a} ms/step | {a} us/req" for a in arms)
              + " |", "|---" * (4 + 3 * len(arms)) + "|"]
    for d in result["drafts"]:
        cells = [f"{d[a]['stall_ms']:.1f} | {d[a]['step_ms']:.2f} | {d[a]['us_per_request']:.1f}"
                 if "skipped" not in d[a] else "- | - | -" for a in arms]
        lines.append(f"| {d['length']} | {d['history']} | {d['requests']} | {d['context']} | " + " | ".join(cells) + " |")
    lines += ["", "| L | H | R | new wall ms/step |", "|---|---|---|---|"]
    lines += [f"| {d['length']} | {d['history']} | {d['requests']} | {d['new']['step_wall_ms']:.2f} |"
              for d in result["drafts"]]
    sib = [d for d in result["drafts"] if d.get("new", {}).get("sibling_tokens")]
    if sib:
        lines += ["", "| L | H | R | sibling tokens (new) | MB | B/token |", "|---|---|---|---|---|---|"]
        lines += [f"| {d['length']} | {d['history']} | {d['requests']} | {d['new']['sibling_tokens']} | "
                  f"{d['new']['sibling_bytes'] / 2**20:.0f} | {d['new']['sibling_bytes_per_token']:.0f} |" for d in sib]
    lines += ["", "| L | H | P | history tokens | per worker, every prompt as tuples | own prompts as arrays | indexed (new) |",
              "|---|---|---|---|---|---|---|"]
    for e in result["epochs"]:
        keys = ("worker_bytes_all_tuples", "worker_bytes_own_arrays", "index_bytes_if_all_indexed")
        gb = [e[k] / 2**30 for k in keys]
        lines.append(f"| {e['length']} | {e['history']} | {e['epoch_prompts']} | {e['history_tokens']:.3g} | "
                     f"{gb[0]:.1f} GB | {gb[1]:.1f} GB | {gb[2]:.1f} GB |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rhymerl bench spec-scale", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    parser.add_argument("--json-out", metavar="FILE", help="also write the JSON results to FILE")
    parser.add_argument("--quick", action="store_true", help="a tiny grid (tests)")
    parser.add_argument("--seed", type=int, default=0, help="the generator's seed")
    parser.add_argument("--steps", type=int, default=20, help="timed engine steps per point (their median "
                        "is reported; a median of 5 is noisy on a shared machine)")
    parser.add_argument("--point", metavar="L,H,R", help="one point of the grid instead (e.g. 16384,16,256: "
                        "256 requests at 8K-token contexts), epochs of 1K prompts")
    parser.add_argument("--spec", choices=("prompt", "engine"), default="prompt",
                        help="draft from the prompt's index alone, or with the engine's defaults (siblings, "
                        "cross-prompt tree)")
    parser.add_argument("--forward", choices=("busy", "idle"), default="busy",
                        help="the drafting thread during the 10 ms forward pass between steps: spinning, as "
                        "it does waiting on a GPU (default), or asleep (its core's caches may go cold)")
    args = parser.parse_args(argv)
    # `new` drafts first: an engine's process holds no other arm's memory, and the others (the
    # Python path, the library's trees) leave the heap and caches in a state that slows it.
    arms = ["new", "new_py"] + (
        ["arctic", "suffix"] if has_arctic_inference() else [])
    if "arctic" not in arms:
        print("note: arctic-inference missing, its arm left out (make setup builds it)", file=sys.stderr)
    grid = QUICK if args.quick else FULL
    if args.point:
        length, history, requests = (int(x) for x in args.point.split(","))
        grid = {"lengths": (length,), "histories": (history,), "requests": (requests,), "epochs": (1000,)}
    result = run(grid, args.seed, arms, 2 if args.quick else args.steps, args.spec,
                 Forward(busy=args.forward == "busy"))
    text = json.dumps(result, indent=1)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text)
    print(text if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
