"""The end-to-end benchmark's Markdown report (`OUT/REPORT.md`) from its JSON report and plots."""

from __future__ import annotations

from bench.e2e.analysis import OVERHEAD, SPLIT
from bench.e2e.cpu import cpu_section
from bench.e2e.format import SPLIT_LABELS, mean_sd, num

ROWS = [("wall_s", "step time (epoch wall), s"), *[(k, f"  {SPLIT_LABELS[k]}, s") for k in SPLIT],
        ("overhead_s", "overhead (plan .. epoch flow), s")]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def headline(report: dict) -> list[str]:
    """Overall table (the late epochs): both arms, ratio; speed-ups; targets."""
    o, t = report["compare"]["overall"], report["targets"]
    if "wall_s" not in o:
        return ["No epoch finished by both arms yet."]
    rows = [[label, mean_sd(o[k]["baseline"]), mean_sd(o[k]["rhymerl"]), num(o[k]["ratio"], ".3f")] for k, label in ROWS]
    out = [f"Totals over epochs {', '.join(map(str, o['epochs']))} (mean ± sd over seeds):", ""]
    out += _table(["", "baseline", "RhymeRL", "RhymeRL / baseline"], rows)
    sw, sr = o["speedup_wall"], o["speedup_rollout"]
    out += ["", f"**Step-time speed-up {num(sw['mean'])}x** (per seed: {', '.join(num(x) for x in sw['per_seed'])}); "
            f"rollout {num(sr['mean'])}x (per seed: {', '.join(num(x) for x in sr['per_seed'])}). "
            f"Overhead: {num(o['overhead_frac_baseline'], '.1%')} (baseline), "
            f"{num(o['overhead_frac_rhymerl'], '.1%')} (RhymeRL) of the step time. Rollout is "
            f"{num(t['step_speedup']['rollout_share_baseline'], '.0%')} of the baseline's step here, so even a "
            f"rollout that took no time would give at most {num(t['step_speedup']['ceiling_if_rollout_free'])}x "
            "(Amdahl).", "",
            "| target | measured | met |", "|---|---|---|",
            f"| step time ratio >= {t['step_speedup']['target']}x from epoch 2 | {num(t['step_speedup']['measured'])}x "
            f"| {_yes(t['step_speedup']['met'])} |", *_workload_rows(t),
            f"| orchestration overhead <= {t['overhead_frac']['target']:.0%} (worse arm) | "
            f"{num(t['overhead_frac']['measured'], '.1%')} | {_yes(t['overhead_frac']['met'])} |",
            f"| train time RhymeRL / baseline within ±{t['train_ratio']['target']:.0%} | "
            f"{num(t['train_ratio']['measured'], '.3f')} | {_yes(t['train_ratio']['met'])} |",
            f"| tail (90th-percentile request's finish to the last's, per step) >= "
            f"{num(t['tail_shorter']['target'], '.0f')}x shorter | {num(t['tail_shorter']['measured'])}x "
            f"({mean_sd(o['tail_s']['baseline'])} s -> {mean_sd(o['tail_s']['rhymerl'])} s) | "
            f"{_yes(t['tail_shorter']['met'])} |",
            f"| accuracy parity (final epoch) | diff {num(t['accuracy_parity']['diff'], '+.3f')}, "
            f"p = {num(t['accuracy_parity']['p_value'], '.3f')} | {_yes(t['accuracy_parity']['met'])} |"]
    return out


def _workload_rows(t: dict) -> list[str]:
    """The workload's own targets (the long-tail task's rollout speed-up and share), where it has them."""
    rows = []
    if "rollout_speedup" in t:
        r = t["rollout_speedup"]
        rows.append(f"| rollout >= {r['target']}x from epoch 2 | {num(r['measured'])}x | {_yes(r['met'])} |")
    if "rollout_share" in t:
        r = t["rollout_share"]
        rows.append(f"| rollout >= {r['target']:.0%} of the baseline's step | {num(r['measured'], '.0%')} | "
                    f"{_yes(r['met'])} |")
    return rows


def _yes(v) -> str:
    return "n/a" if v is None else ("yes" if v else "**no**")


def per_epoch(report: dict) -> list[str]:
    """One row per epoch: step and rollout time, speed-up, tokens/s, acceptance, bubble, quality."""
    rows = []
    for e in report["compare"]["epochs"]:
        b = lambda k, f=".2f": mean_sd(e[k]["baseline"], f)  # noqa: E731
        r = lambda k, f=".2f": mean_sd(e[k]["rhymerl"], f)  # noqa: E731
        rows.append([str(e["epoch"]), b("wall_s"), r("wall_s"), num(e["speedup"]["mean"]), b("rollout_s"),
                     r("rollout_s"), num(e["rollout_s"]["ratio"], ".3f"), b("rollout_tokens_per_s", ".0f"),
                     r("rollout_tokens_per_s", ".0f"), r("accepted_len"), b("bubble_ratio", ".3f"),
                     r("bubble_ratio", ".3f"), b("reward_mean", ".3f"), r("reward_mean", ".3f"), b("accuracy", ".3f"),
                     r("accuracy", ".3f"), b("overhead_frac", ".3f"), r("overhead_frac", ".3f")])
    return _table(["epoch", "step s B", "step s R", "speed-up", "rollout s B", "rollout s R", "R/B",
                   "tok/s B", "tok/s R", "tok/verify R", "bubble B", "bubble R", "reward B", "reward R",
                   "acc B", "acc R", "overhead B", "overhead R"], rows)


def split_table(report: dict) -> list[str]:
    """Every part of the time split per epoch and arm, with the RhymeRL/baseline ratio."""
    rows = []
    for e in report["compare"]["epochs"]:
        for k in ("wall_s",) + SPLIT:
            rows.append([str(e["epoch"]), SPLIT_LABELS.get(k, "step time (epoch wall)"),
                         num(e[k]["baseline"]["mean"]), num(e[k]["rhymerl"]["mean"]), num(e[k]["ratio"], ".3f")])
    return _table(["epoch", "part", "baseline s", "RhymeRL s", "R/B"], rows)


def position_section(report: dict) -> list[str]:
    """Tokens per verification by response position (RhymeRL arm, pooled over seeds), per epoch."""
    rows = report.get("by_position") or []
    if not rows:
        return ["No position counts in these runs (speculation off, or runs before they were recorded)."]
    names = [b.removeprefix("pos").replace("_inf", "+").replace("_", "-") for b in rows[0]["buckets"]]
    body = [[str(r["epoch"])] + [f"{t:.2f} ({100 * sh:.0f}%)" if n else "n/a"
                                 for t, sh, n in zip(r["tokens_per_verify"], r["step_share"], r["steps"])]
            for r in rows]
    return (["Tokens per verification step (bonus token included) of the RhymeRL arm by the number of "
             "tokens its request had written before the step, pooled over seeds; in brackets the "
             "bucket's share of the epoch's verification steps. Positions past 1,000 occur only in long "
             "responses: that column is the tail's speed-up from drafting.", ""]
            + _table(["epoch"] + [f"tokens {n}" for n in names], body))


def parity_section(report: dict) -> list[str]:
    out = []
    for key, p in report["parity"].items():
        if p.get("p_value") is None:
            out.append(f"- {key}: {p.get('note')} (baseline {p.get('baseline')}, RhymeRL {p.get('rhymerl')})")
            continue
        out.append(f"- {key}, epoch {p['epoch']}: baseline {', '.join(num(v, '.3f') for v in p['baseline'])}; "
                   f"RhymeRL {', '.join(num(v, '.3f') for v in p['rhymerl'])}. Difference {num(p['diff'], '+.3f')}, "
                   f"standard error {num(p['se'], '.3f')}, permutation p = {num(p['p_value'], '.3f')} ({p['note']}). "
                   f"Parity (|diff| <= 2 SE and p >= 0.05): {_yes(p['parity'])}.")
    return out


def scale_section(report: dict) -> list[str]:
    sc = report.get("scale")
    if not sc:
        return ["No estimate: needs a RhymeRL run whose speculation accepted drafts."]
    s, arms = sc["spec"], sc["arms"]
    rows = [[name, num(a["makespan_s"], ".1f"), num(a["bubble_ratio"], ".3f"), num(a["rollout_speedup"]),
             num(a["step_speedup"]), num(a.get("step_speedup_streamed"))] for name, a in arms.items()]
    verify = (f"verification overhead {s['verify_overhead']:.0%} per iteration" if not s.get("surface") else
              "the drafts of every engine step chosen by the goodput rule (arm rhymerl_fixed: every draft verified)")
    out = [f"Simulated rollout step at {s['workers']} workers, {s['prompts_per_worker']} prompts x n={s['n']} per "
           f"worker, responses capped at {s['max_tokens']} tokens (heavy-tailed, median 1,024), "
           f"{num(s['accepted_len'])} tokens per verification step (this benchmark's RhymeRL arm, late epochs), "
           f"{verify}, rollout {s['rollout_share']:.0%} of the baseline step:", ""]
    out += _table(["arm", "makespan s", "bubble", "rollout speed-up", "step speed-up",
                   "step speed-up, streamed training"], rows)
    by_share = ", ".join(f"{k}: {num(v)}x" for k, v in sc["step_speedup_by_rollout_share"].items())
    out += ["", f"Step speed-up by rollout share of the step ({sc['measured_rollout_share']} measured here): "
            f"{by_share}."]
    if "rollout_speedup_by_verify_overhead" in sc:
        out[-1] += " Rollout speed-up by verification overhead: " + ", ".join(
            f"{k}: {num(v)}x" for k, v in sc["rollout_speedup_by_verify_overhead"].items()) + "."
    if "controller" in sc:
        out += ["", "The goodput rule per engine step (mean draft tokens verified per request, 0 = speculation "
                "off; tokens per second over plain decoding, the rule's and fixed drafts'):", ""]
        out += _table(["context", "batch", "drafts kept", "speed-up", "fixed drafts", "fixed speed-up"],
                      [[str(r["context"]), str(r["batch"]), num(r["draft_len"], ".1f"), num(r["speedup"]),
                        num(r["fixed_draft_len"], ".1f"), num(r["fixed_speedup"])] for r in sc["controller"]["rows"]])
    out += ["", "Assumptions: every request's tokens come a per verification step over its whole length "
            "(acceptance measured on 160-token responses of a tiny model; long reasoning responses may "
            f"accept more or less); {_cost_text(s)}; a free drafter; "
            "the pipe benchmark's length noise model for forecasts; reward, training and sync unchanged. "
            f"Streamed training (train.stream, trainer on GPUs of its own): training is {s.get('train_share', 0):.0%} "
            "of the baseline step at a cost per response token; groups train one at a time as the simulated "
            "rollout finishes them, and only the rest after its end stays in the step."]
    return out


def _cost_text(s: dict) -> str:
    """Where the scale estimate's cost model came from: assumed, or a measured or roofline cost surface."""
    c = s["cost"]
    per_iter = f"{1e3 * c['base_s']:.2f} ms per iteration + {1e3 * c['per_seq_s']:.4f} ms per running request"
    if s.get("cost_source", "assumed") == "assumed":
        return (f"a GPU-like cost model ({per_iter}, {c['capacity']} requests at once) where verifying drafts "
                "costs the stated share of an iteration")
    kind, script = (("roofline", "scripts/roofline-surface.py") if "(roofline)" in s["cost_source"]
                    else ("measured", "scripts/gpu-costmodel.py"))
    return (f"the cost model fitted to a {kind} decode-step surface of {s['cost_source']} "
            f"({script}; {per_iter} at a 1,024-token context, {c['capacity']} requests at once), "
            "whose step time at every batch prices the drafts the goodput rule weighs (draft token j accepted "
            "with chance alpha^j, fitted to the measured tokens per verification per response position and "
            "drafted tokens per step)")


def markdown(report: dict, plots: dict[str, str]) -> str:
    """The whole report as Markdown; `plots` maps figure names to files next to it."""
    s = report["settings"]
    loads = [r["loadavg_start"][0] for r in report["runs"] if r.get("loadavg_start")]
    lines = ["# RhymeRL end-to-end benchmark", "",
             f"Generated {report['date']} on {report['machine']} by `rhymerl bench e2e` "
             f"(code {report.get('commit') or 'unknown'}). "
             f"{len(s['seeds'])} seed(s) per arm x {s['epochs']} epochs x {s['prompts']} prompts "
             f"(n = {s.get('n')}, max_tokens {s.get('max_tokens')}, {s.get('prompts_per_step')} prompts per step), "
             f"{s['workers']} rollout workers, config `{s['config']}` {' '.join(s['overrides'])}. "
             "Baseline = `spec.enabled=false pipe.policy=\"naive\"`; RhymeRL = HistoSpec (exact verifier) + "
             "HistoPipe tier 1. One child process per run; seeds alternate which arm runs first.",
             "", f"Runs: {len(report['runs'])}; 1-minute load average at their starts: "
             f"{', '.join(num(x, '.1f') for x in loads) or 'n/a'}. Set-up per run (outside the epochs: "
             f"Prefect's temporary API, Ray, engines, trainer; not in any figure below): "
             f"{', '.join(num(r.get('setup_s'), '.0f') + ' s' for r in report['runs']) or 'n/a'}.",
             "", "## Headline", ""]
    lines += headline(report)
    if "speedup" in plots:
        lines += ["", f"![speed-up]({plots['speedup']})", f"![time split]({plots['split']})"]
    lines += ["", "## Per epoch (B = baseline, R = RhymeRL; mean ± sd over seeds)", ""] + per_epoch(report)
    lines += ["", "Overhead = " + " + ".join(SPLIT_LABELS[k] for k in OVERHEAD) + ", as a share of the "
              "epoch's wall time. Dispatch = a step's wall time minus every timed part (Prefect task "
              "start/finish, Ray round trips without their own timer); epoch flow = the epoch's wall time "
              "minus its steps and the index build. Wall times leave out the benchmark's own CPU "
              "recording (`bench.e2e.cpu`, between a step's timed parts; its cost per step is in the CPU "
              "section).", "", "## Time split per epoch (seed means)", ""]
    lines += split_table(report)
    cpu = report.get("cpu") or {}
    lines += ["", "## CPU seconds per process and part of the step", ""]
    lines += cpu_section(cpu.get("arms", {}), cpu.get("epochs", []))
    if "acceptance" in plots:
        lines += ["", f"![acceptance]({plots['acceptance']})", f"![bubble ratio]({plots['bubble']})"]
    lines += ["", "## Tokens per verification by response position", ""] + position_section(report)
    lines += ["", "## Accuracy parity", ""] + parity_section(report)
    if "curves" in plots:
        lines += ["", f"![reward curves]({plots['curves']})"]
    lines += ["", "## Cluster-scale estimate (simulator)", ""] + scale_section(report)
    return "\n".join(lines) + "\n"
