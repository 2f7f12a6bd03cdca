"""HistoSpec against no speculation and vLLM's n-gram and suffix drafters: same prompts, same engine settings.

    rhymerl bench spec [--json] [--json-out FILE] [--prompts 64] [--n 8] [--max-tokens 160]
                       [--repeats 2] [--max-num-seqs 0] [--arms plain,ngram,histospec,siblings,suffix]
                       [--variant NAME=key=value,key=value ...]

One process; each arm starts its own vLLM engine on the built-in model and all stay up (an idle
engine takes no CPU), so the arms alternate: every round times each arm once, in an order rotated
each round (`round_order`), and a slow or fast spell of a shared machine falls on every arm alike.

1. history: the plain engine samples every prompt's group once (temperature 1): "epoch 0".
2. each arm samples the same prompts again ("epoch 1"), timed after a short warm-up (which also
   puts every prompt in the engine's prefix cache, as the plain engine's history did):
   (a) plain: no speculation; (b) ngram: vLLM's n-gram drafter (prompt lookup 3..7);
   (c) histospec: drafts from each prompt's epoch-0 responses only; (d) siblings: history plus
   the group's own responses as they grow; (e) suffix: vLLM's `suffix` method (Arctic Inference's
   suffix trees, stock settings, drafts <= 16). Its history lives in the engine's own cache of
   finished responses, so its engine samples the epoch-0 groups itself first (untimed; lossless, so
   the same distribution as the plain engine's); the cache is sized to two epochs of responses
   (stock: 10,000) so that each timed repeat drafts from exactly the previous epoch plus its own
   siblings, as HistoSpec does. Speculative arms verify with RhymeRL's exact (lossless) verifier; the
   row says which verifier ran. Without arctic-inference the default arms leave suffix out (a note
   says so; `make setup` builds it).

`--variant NAME=key=value,...` adds an arm with those `spec.*` settings (values in TOML, e.g.
`--variant tight=min_token_prob=0.1,max_spec_factor=1.0`), to compare settings in one run. A variant
with `history_epochs=0` gets no history (a run's epoch 0: siblings and the cross-prompt tree only).

Figures per arm: wall seconds (median of repeats), the CPU seconds of this process and its engine
processes over the same calls (median; less sensitive than the wall time to other jobs on a shared
machine), tokens/s, mean accepted tokens per verification step (counting the bonus token; 1.0
without speculation), draft acceptance rate, drafter seconds as a share of the wall time, and the
wall-time speed-up over (a).

The policy does not move between the history and the timed samples here (a real run's policy
takes one epoch of updates in between), so acceptance is at the optimistic end of what a run
sees; `rhymerl spec replay` measures it on a real run's lake.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from rhymerl.config.task import DataConfig
from rhymerl.data.datasets import BUILTIN_DATASETS
from rhymerl.errors import ConfigError
from rhymerl.histospec.bundle import bundle_for_epoch, counted_by_vllm, uses_bundle
from rhymerl.config.spec import INSTALL_HINT, SpecConfig, has_arctic_inference
from rhymerl.histospec.stats import SpecStats
from rhymerl.vllm.engine import EngineSettings, SamplingSettings, VllmEngine
from rhymerl.vllm.histospec_proposer import INDEX_ENV
from rhymerl.vllm.spec_guard import shutdown_llm
from rhymerl.vllm.speculation import engine_speculation

ARMS = {
    "plain": SpecConfig(enabled=False),
    "ngram": SpecConfig(method="ngram", max_budget=4, max_match=7),  # k=4: at k=16 its 3% acceptance wastes more
    "histospec": SpecConfig(siblings=False),
    "siblings": SpecConfig(siblings=True),
    "suffix": SpecConfig(method="suffix"),  # stock suffix decoding, drafts <= max_budget (16)
}


@dataclass(frozen=True)
class ArmResult:
    """One configuration's figures (medians over repeats where timed)."""

    arm: str
    verifier: str
    wall_s: float
    cpu_s: float  # CPU seconds of this process and its children (the engine's) per timed call
    tokens: int
    tokens_per_s: float
    mean_accepted_length: float
    acceptance_rate: float
    drafted_per_step: float  # draft tokens verified per verification step (a request's step)
    drafter_share: float  # drafter seconds / wall seconds
    speedup: float = 0.0  # plain wall / this wall
    walls: tuple[float, ...] = ()
    note: str = ""  # the speculation guard's message
    # Where the drafts go right or wrong: [j] drafts of length j; acceptance at draft position j;
    # tokens per verification step by response position bucket (stats.position_labels). The arms vLLM
    # counts (ngram, suffix) take every draft as full length and record no buckets: read their totals only.
    draft_len_hist: tuple[int, ...] = ()
    acceptance_by_position: tuple[float, ...] = ()
    tokens_per_step_by_response_position: tuple[float, ...] = ()


def load_prompts(model_dir: str, num_prompts: int, max_prompt_tokens: int, dataset: str = "builtin"):
    """The built-in task's (`dataset`'s) first `num_prompts` prompts, tokenized by the model's tokenizer."""
    from rhymerl.config.task import RewardConfig
    from rhymerl.data.datasets import load_problems
    from rhymerl.data.prompts import load_tokenizer, prompt_renderer, render_prompts

    cfg = DataConfig(dataset=dataset, num_prompts=num_prompts)
    prompts, _ = render_prompts(load_problems(cfg, RewardConfig()), prompt_renderer(cfg), load_tokenizer(model_dir),
                                max_prompt_tokens=max_prompt_tokens, on_long="skip")
    return prompts


class Arm:
    """One arm's engine, its history file and its timed repeats (`time_once`), summed by `result`."""

    def __init__(self, name: str, spec: SpecConfig, base: EngineSettings, prompts, sampling: SamplingSettings,
                 history: dict, bundle_path: Path, engine: VllmEngine | None = None) -> None:
        self.name, self.spec, self.prompts, self.sampling = name, spec, prompts, sampling
        speculation = engine_speculation(spec)
        if spec.enabled and spec.method == "suffix":  # its cache: the previous epoch and the one in flight
            cached = 2 * len(prompts) * sampling.n
            speculation = replace(speculation, options=(("suffix_decoding_max_cached_requests", cached),))
        held = history if spec.history_epochs else {column: [] for column in history}  # 0: epoch 0's case
        self.blob = bundle_for_epoch(prompts, held)[0] if uses_bundle(spec) else b""
        self.bundle_path = bundle_path
        os.environ[INDEX_ENV] = str(bundle_path)  # read once by the drafter in this engine's processes
        self.engine = engine or VllmEngine(replace(base, speculation=speculation, log_stats=counted_by_vllm(spec)))
        self.publish()
        self.engine.generate(prompts[:4], replace(sampling, n=2))  # warm-up (not timed)
        self.engine.generate(prompts, replace(sampling, n=1, max_tokens=1))  # every prompt cached, as plain's
        if spec.enabled and spec.method == "suffix":
            self.engine.generate(prompts, sampling)  # its own epoch 0 fills its cache (not timed)
        self.engine.spec_stats()  # drop the warm-up's counters
        self.walls: list[float] = []
        self.cpus: list[float] = []
        self.stats, self.tokens = SpecStats(), 0

    def publish(self) -> None:
        """A fresh history (siblings of an earlier repeat must not leak in)."""
        if self.blob:
            self.bundle_path.write_bytes(self.blob)

    def time_once(self) -> float:
        """One timed generation of every prompt; returns its wall seconds."""
        self.publish()
        c0, t0 = _cpu_seconds(), time.perf_counter()
        samples = self.engine.generate(self.prompts, self.sampling)
        self.walls.append(time.perf_counter() - t0)
        self.cpus.append(_cpu_seconds() - c0)
        self.tokens += sum(len(s.token_ids) for s in samples)
        got = self.engine.spec_stats()
        if got is not None:
            self.stats.merge(got)
        return self.walls[-1]

    def result(self) -> ArmResult:
        stats, walls, total_wall = self.stats, self.walls, sum(self.walls)
        return ArmResult(
            arm=self.name, verifier=self.engine.speculation.verifier, wall_s=statistics.median(walls),
            cpu_s=statistics.median(self.cpus), tokens=self.tokens // len(walls),
            tokens_per_s=self.tokens / total_wall,
            mean_accepted_length=stats.mean_accepted_length if stats.steps else 1.0,
            acceptance_rate=stats.acceptance_rate,
            drafted_per_step=stats.drafted / stats.steps if stats.steps else 0.0,
            drafter_share=stats.drafter_seconds / total_wall,
            walls=tuple(round(w, 3) for w in walls), note=self.engine.speculation.message,
            draft_len_hist=tuple(stats.draft_len_hist),
            acceptance_by_position=tuple(round(a, 4) for a in stats.acceptance_by_position()),
            tokens_per_step_by_response_position=tuple(round(t / s, 3) if s else 0.0
                                                       for s, t in zip(stats.pos_steps, stats.pos_tokens)))


def round_order(names: list[str], round_index: int) -> list[str]:
    """The arms' order in one round: rotated each round, so that every arm takes every place in
    turn and none always runs right after the same neighbour (a slow or fast spell of a shared
    machine falls on all arms alike)."""
    k = round_index % len(names)
    return names[k:] + names[:k]


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and every live child (the engine's processes)."""
    total = 0.0
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:  # a child that just exited
            continue
        total += t.user + t.system
    return total


def parse_variant(text: str) -> tuple[str, SpecConfig]:
    """`NAME=key=value,key=value` -> (NAME, SpecConfig with those settings); values are TOML."""
    name, _, settings = text.partition("=")
    if not name or not settings:
        raise ValueError(f"--variant {text!r}: expected NAME=key=value[,key=value...]")
    fields = {}
    for item in settings.split(","):
        key, _, value = item.partition("=")
        try:
            fields[key.strip()] = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"--variant {name}: value of {key!r} is not TOML ({exc}); e.g. 0.1, true, \"fixed\"")
    try:
        return name, SpecConfig(**fields)
    except TypeError as exc:
        raise ValueError(f"--variant {name}: {exc}; keys are spec.* settings (docs/configuration.md)") from None


def run_bench(args: argparse.Namespace) -> dict:
    """Every requested arm on the same prompts; returns the JSON-able report."""
    from rhymerl.policy.build import ensure_builtin_model
    from rhymerl.policy.long_build import build_settings_for

    build = build_settings_for(args.dataset)
    model_dir = str(ensure_builtin_model(spec=build).absolute())
    # The default task's prompts take up to 352 tokens; the long task's answers up to ~2,000 (its
    # prompts < 20): room for both, and a KV cache for every request at its longest.
    max_model_len = max(512, args.max_tokens + 64)
    kv_per_token = build.num_layers * 2 * build.num_kv_heads * (build.hidden_size // build.num_heads) * 4  # fp32 K, V
    kv_gib = max(0.5, args.prompts * args.n * max_model_len * kv_per_token / 2**30)
    base = EngineSettings(model_dir=model_dir, max_model_len=max_model_len, seed=args.seed,
                          max_num_seqs=args.max_num_seqs or None, kv_cache_gib=round(kv_gib, 2))
    prompts = load_prompts(model_dir, args.prompts, max_model_len - args.max_tokens, args.dataset)
    sampling = SamplingSettings(n=args.n, temperature=args.temperature, max_tokens=args.max_tokens)
    bundle_dir = Path(tempfile.mkdtemp(prefix="rhymerl-bench-spec-"))  # one history file per arm
    t0 = time.perf_counter()
    plain = VllmEngine(base)
    hist = plain.generate(prompts, sampling)
    history = {"prompt_id": [s.prompt_id for s in hist], "response_token_ids": [s.token_ids for s in hist],
               "reward": [0.0] * len(hist)}
    print(f"history: {len(hist)} responses, {sum(len(s.token_ids) for s in hist)} tokens "
          f"({time.perf_counter() - t0:.0f}s)", file=sys.stderr)
    arms: dict[str, Arm] = {}
    try:
        for name in args.arms:  # every engine stays up (idle engines take no CPU): the arms alternate
            t = time.perf_counter()
            arms[name] = Arm(name, args.specs[name], base, prompts, sampling, history,
                             bundle_dir / f"{name}.npz", engine=plain if name == "plain" else None)
            print(f"{name}: started ({time.perf_counter() - t:.0f}s)", file=sys.stderr)
        for r in range(args.repeats):
            for name in round_order(list(arms), r):
                print(f"round {r + 1} {name}: {arms[name].time_once():.2f}s", file=sys.stderr)
    finally:
        for arm in arms.values():
            if arm.engine is not plain:
                shutdown_llm(arm.engine.llm)
        shutdown_llm(plain.llm)
    results = [arm.result() for arm in arms.values()]
    for r in results:
        print(f"{r.arm}: {r.wall_s:.2f}s, {r.mean_accepted_length:.2f} tok/verify, "
              f"{r.acceptance_rate:.1%} of {r.drafted_per_step:.2f} drafted/verify", file=sys.stderr)
    ref = next((r.wall_s for r in results if r.arm == "plain"), None)
    if ref:
        results = [replace(r, speedup=ref / r.wall_s) for r in results]
    return {"bench": "spec", "date": time.strftime("%Y-%m-%d"), "machine": _machine(),
            "settings": {"dataset": args.dataset, "prompts": len(prompts), "n": args.n, "temperature": args.temperature,
                         "max_tokens": args.max_tokens, "repeats": args.repeats,
                         "max_num_seqs": args.max_num_seqs or "vLLM default"},
            "arms": [r.__dict__ for r in results]}


def _machine() -> str:
    import platform

    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    return f"{platform.machine()} {os.cpu_count()} cores, {device}"


def format_report(report: dict) -> str:
    cols = ("arm", "verifier", "wall_s", "cpu_s", "tokens_per_s", "mean_accepted_length", "acceptance_rate",
            "drafted_per_step", "drafter_share", "speedup")
    rows = [[f"{r[c]:.3f}" if isinstance(r.get(c), float) else str(r.get(c, "-")) for c in cols]
            for r in report["arms"]]  # reports written before a column existed show "-"
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in rows]
    s = report["settings"]
    head = (f"HistoSpec bench, {report['date']}, {report['machine']}: {s.get('dataset', 'builtin')}, "
            f"{s['prompts']} prompts x n={s['n']}, "
            f"T={s['temperature']}, max_tokens {s['max_tokens']}, max_num_seqs {s['max_num_seqs']}, "
            f"median of {s['repeats']}")
    return head + "\n" + "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rhymerl bench spec", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.add_argument("--json-out", help="also write the JSON report to this file")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--dataset", choices=BUILTIN_DATASETS, default="builtin",
                   help="the built-in task and its model; builtin-long: the long-tail task "
                        "(use --max-tokens 2048)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-num-seqs", type=int, default=0, help="requests per engine step (0: vLLM's default)")
    p.add_argument("--arms", type=lambda s: s.split(","), default=None,
                   help=f"comma-separated subset of {','.join(ARMS)} (default: all; suffix only where "
                        "arctic-inference is installed)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=key=value,...",
                   help="an extra arm with these spec.* settings (TOML values), e.g. "
                        "tight=min_token_prob=0.1,max_spec_factor=1.0; repeatable")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.arms is None:
        args.arms = [a for a in ARMS if a != "suffix" or has_arctic_inference()]
        if "suffix" not in args.arms:
            print(f"rhymerl bench spec: note: arm suffix skipped: {INSTALL_HINT}", file=sys.stderr)
    try:
        variants = dict(parse_variant(v) for v in args.variant)
    except (ValueError, ConfigError) as exc:
        print(f"rhymerl bench spec: {exc}", file=sys.stderr)
        return 2
    args.specs = {**ARMS, **variants}
    args.arms += [v for v in variants if v not in args.arms]
    unknown = [a for a in args.arms if a not in args.specs]
    if unknown:
        print(f"rhymerl bench spec: unknown arm(s) {unknown}; choose from {', '.join(ARMS)} or add one "
              "with --variant", file=sys.stderr)
        return 2
    if any(args.specs[a].needs_arctic_inference and args.specs[a].method == "suffix" for a in args.arms) \
            and not has_arctic_inference():
        print(f"rhymerl bench spec: arm suffix: {INSTALL_HINT}", file=sys.stderr)
        return 2
    report = run_bench(args)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
