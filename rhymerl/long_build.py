"""The built-in model's recipe for the long-tail task (`data.dataset = "builtin-long"`).

The same byte-level tokenizer and Qwen2 family as the default built-in model (`rhymerl.model_build`),
warm-started by SFT on `rhymerl.long_problems` so that it writes the long answers: positions up to
2,048, SFT batches cut into micro-batches of similar length (a few 1,500-token solutions would
otherwise pad every batch), and an evaluation stratified by response length, each bucket sampled
on its own so the short ones do not wait for the longest. It is cached beside the default model as
`builtin-long-<fingerprint>` (its own fields make its own fingerprint).

`build_settings_for(dataset)` is the one place that says which built-in recipe a run uses.

Measured (2026-12-03, shared 2-core machine, load average 10-30 falling to ~3): 300 steps in 15 min 20 s
(~2 s per step at the end: ~10 min idle), smoothed loss 5.63 -> 0.59 and still falling fast; sampled
answers have the format (0.94) but none is right in any length bucket. More steps are needed before
RL has a signal (docs/benchmarks.md).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rhymerl.long_problems import LongProblemSettings, draw_long_problem, make_long_problem
from rhymerl.model_build import BuildSettings
from rhymerl.records import Problem

LONG_DATASET = "builtin-long"
# Evaluation buckets by response tokens (solution + EOS): a bucket's key is its lower edge.
LENGTH_EDGES = (0, 100, 300, 1000)
# Steps per evaluation bucket: a spread across each, from the generator's own length rule.
_EVAL_STEPS = {0: (3, 5, 7, 9), 100: (18, 24, 30, 36), 300: (55, 70, 85, 100), 1000: (160, 175, 190, 200)}


@dataclass(frozen=True)
class LongBuildSettings(BuildSettings):
    """`BuildSettings` for the long-tail task; the defaults are the built model's recipe."""

    max_position_embeddings: int = 2304
    steps: int = 300
    stop_loss: float = 0.0  # every step: the loss stays low long before the longest answers come out right
    batch_size: int = 32
    # long task
    median_steps: int = 18
    sigma: float = 1.0
    max_steps: int = 200
    max_start: int = 99
    max_step: int = 9
    # One torch thread: on a shared machine two threads ran ~7x slower than one (model_build.py's
    # note); on an idle 2-core machine one is ~1.45x slower than two.
    threads: int = 1
    eval_problems: int = 16  # per length bucket (4 buckets)
    eval_max_tokens: int = 2048

    cache_prefix = "builtin-long"
    sft_chunks = 4

    @property
    def long_problems(self) -> LongProblemSettings:
        return LongProblemSettings(median_steps=self.median_steps, sigma=self.sigma, max_steps=self.max_steps,
                                   max_start=self.max_start, max_step=self.max_step)

    def draw_problem(self, rng: random.Random, index: int) -> Problem:
        return draw_long_problem(rng, index, self.long_problems)

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


def build_settings_for(dataset: str) -> BuildSettings:
    """The built-in model's recipe for a run on `dataset`: the long one for "builtin-long", else the default."""
    return LongBuildSettings() if dataset == LONG_DATASET else BuildSettings()
