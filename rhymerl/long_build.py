"""The built-in model's recipe for the long-tail task (`data.dataset = "builtin-long"`).

The same byte-level tokenizer and Qwen2 family as the default built-in model (`rhymerl.model_build`),
warm-started by SFT on `rhymerl.long_problems` so that it writes the long answers: positions up to
2,048, SFT batches cut into micro-batches of similar length (a few 1,500-token solutions would
otherwise pad every batch), and an evaluation stratified by response length, each bucket sampled
on its own so the short ones do not wait for the longest. It is cached beside the default model as
`builtin-long-<fingerprint>` (its own fields make its own fingerprint).

`build_settings_for(dataset)` is the one place that says which built-in recipe a run uses.

Measured (2026-12-03, this project's 2-core CPU machine shared with another developer's tests, load
average 3.3-5.5): `rhymerl model build --dataset builtin-long` 9 min 47 s wall (1,000 SFT steps 561 s,
evaluation 14 s), smoothed loss 5.6 -> 0.016; sampled at temperature 1.0, 16 problems per length
bucket: accuracy 0.44 (format 1.00), by bucket 1.00 (< 100 tokens), 0.75 (100-299), 0.00 (300-999),
0.00 (>= 1,000). The earlier recipe (300 steps of 32 problems of the run's own lengths, s up to 99,
d up to 9) reached loss 0.59 and accuracy 0.00 everywhere: it counted down but had not learned to
copy n or add d (docs/long-tail.md).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from rhymerl.long_problems import LongProblemSettings, draw_long_problem, make_long_problem
from rhymerl.model_build import BuildSettings
from rhymerl.records import Problem

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
    batch_size: int = 16  # short batches: 1,000 steps fit in ~10 min on a shared 2-core machine
    # long task: the run's problems (rhymerl.long_problems.LongProblemSettings' defaults, read from there)
    median_steps: int = _TASK.median_steps
    sigma: float = _TASK.sigma
    max_steps: int = _TASK.max_steps
    max_start: int = _TASK.max_start
    max_step: int = _TASK.max_step
    # SFT draws its problems with this median count instead (the same sigma and clip): short chains
    # teach the lines and the prompt look-ups (copy n, fetch d) in a fraction of the tokens (mean ~84
    # tokens against ~210), and the log-normal tail still shows a chain of 100+ lines now and then.
    sft_median_steps: int = 8
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
        return draw_long_problem(rng, index, replace(self.long_problems, median_steps=self.sft_median_steps))

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
