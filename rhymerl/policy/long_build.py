"""The built-in model's recipe for the long-tail task (`data.dataset = "builtin-long"`).

The same byte-level tokenizer and Qwen2 family as the default built-in model (`rhymerl.policy.build`),
warm-started by SFT on `rhymerl.data.long` so that it writes the long answers: positions up to
2,048, SFT batches cut into micro-batches of similar length (a few 1,500-token solutions would
otherwise pad every batch), and an evaluation stratified by response length, each bucket sampled
on its own so the short ones do not wait for the longest. It is cached beside the default model as
`builtin-long-<fingerprint>` (its own fields make its own fingerprint).

`build_settings_for(dataset)` is the one place that says which built-in recipe a run uses.

Two stages: short chains teach the lines and the prompt look-ups (copy n, fetch d), then a stage on
long chains (fields `long_*`) teaches the long answers; a recipe trained only on the run's own
lengths counts down but never learns to copy n or add d. Build time and accuracy by length bucket:
docs/long-tail.md.
"""

from __future__ import annotations

import math
import random
import sys
import time
from dataclasses import dataclass, replace

import torch

from rhymerl.data.long import LongProblemSettings, draw_long_problem, make_long_problem
from rhymerl.policy.build import BuildSettings, sft_backward
from rhymerl.data.records import Problem

LONG_DATASET = "builtin-long"
# Evaluation buckets by response tokens (solution + EOS): a bucket's key is its lower edge.
LENGTH_EDGES = (0, 100, 300, 1000)
# Steps per evaluation bucket: a spread across each, from the generator's own length rule.
_EVAL_STEPS = {0: (3, 5, 7, 9), 100: (18, 24, 30, 36), 300: (55, 70, 85, 100), 1000: (175, 190, 205, 220)}


_TASK = LongProblemSettings()  # the one source of the task's defaults


@dataclass(frozen=True)
class LongBuildSettings(BuildSettings):
    """`BuildSettings` for the long-tail task; the defaults are the built model's recipe."""

    max_position_embeddings: int = 2304
    steps: int = 1000
    stop_loss: float = 0.0  # every step: the loss stays low long before the longest answers come out right
    batch_size: int = 16  # short batches keep a 1,000-step build to minutes on a CPU
    # long task: the run's problems (rhymerl.data.long.LongProblemSettings' defaults, read from there)
    median_steps: int = _TASK.median_steps
    sigma: float = _TASK.sigma
    max_steps: int = _TASK.max_steps
    max_start: int = _TASK.max_start
    max_step: int = _TASK.max_step
    # SFT draws its problems with this median count instead (the same sigma and clip): short chains
    # teach the lines and the prompt look-ups (copy n, fetch d) in a fraction of the tokens (mean ~84
    # tokens against ~210), and the log-normal tail still shows a chain of 100+ lines now and then.
    sft_median_steps: int = 8
    # One torch thread: on a machine whose cores are shared, two threads run far slower than one
    # (on an idle machine one is only somewhat slower than two).
    threads: int = 1
    # Second stage, after the short chains: chains of long_min_steps..max_steps additions drawn
    # log-uniform (3-digit counters and totals, positions past 1,000), each problem's loss its own
    # token mean so a long chain weighs what a short one does (`sft_backward(per_sequence=True)`).
    # A separate stage, because a share of long chains inside the first stage made it worse.
    long_steps: int = 500
    long_batch_size: int = 8
    long_lr: float = 1.5e-3
    long_min_steps: int = 3
    eval_problems: int = 16  # per length bucket (4 buckets)
    eval_max_tokens: int = 2048

    cache_prefix = "builtin-long"
    sft_chunks = 4

    @property
    def long_problems(self) -> LongProblemSettings:
        return LongProblemSettings(median_steps=self.median_steps, sigma=self.sigma, max_steps=self.max_steps,
                                   max_start=self.max_start, max_step=self.max_step)

    def draw_problem(self, rng: random.Random, index: int) -> Problem:
        return draw_long_problem(rng, index, replace(self.long_problems, median_steps=self.sft_median_steps))

    def second_stage(self, model, tokenizer, progress: bool) -> list[float]:
        """SFT on long chains (fields `long_*`); the loss per step."""
        return train_long_chains(model, tokenizer, self, progress)

    def eval_groups(self) -> list[list[Problem]]:
        """`eval_problems` fresh problems per length bucket, one group per bucket."""
        rng = random.Random(self.seed + 1_000_003)
        groups = []
        for edge, steps in _EVAL_STEPS.items():
            group = [make_long_problem(i, rng.randint(0, self.max_start), rng.randint(1, self.max_step),
                                       steps[i % len(steps)]) for i in range(self.eval_problems)]
            groups.append(group)
        return groups

    def bucket(self, problem: Problem) -> tuple[str, int]:
        tokens = len(problem.solution) + 1  # one token per character, plus EOS
        return "length", max(e for e in LENGTH_EDGES if tokens >= e)


def long_chain_batch(rng: random.Random, spec: LongBuildSettings) -> list[Problem]:
    """One second-stage batch: chain lengths log-uniform over long_min_steps..max_steps."""
    low, high = math.log(spec.long_min_steps), math.log(spec.max_steps)
    return [make_long_problem(i, rng.randint(0, spec.max_start), rng.randint(1, spec.max_step),
                              round(math.exp(rng.uniform(low, high)))) for i in range(spec.long_batch_size)]


def train_long_chains(model, tokenizer, spec: LongBuildSettings, progress: bool = True) -> list[float]:
    """The second SFT stage: `long_steps` AdamW steps, 20 of warm-up then cosine to 10% of `long_lr`."""
    if spec.long_steps <= 0:
        return []
    opt = torch.optim.AdamW(model.parameters(), lr=spec.long_lr, betas=(0.9, 0.98), weight_decay=spec.weight_decay)
    rng, losses, smooth, t0 = random.Random(spec.seed + 2), [], 0.0, time.perf_counter()
    model.train()
    for step in range(spec.long_steps):
        warm = min(1.0, (step + 1) / 20)
        for group in opt.param_groups:
            group["lr"] = spec.long_lr * warm * (0.1 + 0.45 * (1 + math.cos(math.pi * step / spec.long_steps)))
        opt.zero_grad(set_to_none=True)
        losses.append(sft_backward(model, tokenizer, long_chain_batch(rng, spec), chunks=2, per_sequence=True))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        smooth = losses[-1] if step == 0 else 0.9 * smooth + 0.1 * losses[-1]
        if progress and (step % 25 == 0 or step == spec.long_steps - 1):
            print(f"[rhymerl build] long chains: step {step + 1}/{spec.long_steps} loss {smooth:.4f} "
                  f"({time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)
    model.eval()
    return losses


def build_settings_for(dataset: str) -> BuildSettings:
    """The built-in model's recipe for a run on `dataset`: the long one for "builtin-long", else the default."""
    return LongBuildSettings() if dataset == LONG_DATASET else BuildSettings()
