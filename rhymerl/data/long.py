"""The built-in long-tail problems (`data.dataset = "builtin-long"`): a counted addition chain.

Reasoning RL spends most of a step waiting for a few responses far longer than the rest. The
short built-in task (`rhymerl.data.builtin`) has answers of 20-110 tokens; this family has the
reasoning shape: most answers a hundred or two tokens, a few over 1,500. A question gives a start
`s`, a step `d` and a count `n`; the worked solution adds `d` to the running total `n` times, one
line per addition, each line headed by how many additions are left, then the checkable final line::

    s=7 d=3 n=3           <- question
    3 10                  <- solution: "<additions left> <total after this one>"
    2 13
    1 16
    #### 16               <- the reward compares this with the gold answer, s + n * d

Why this shape: a response's length follows from its problem alone (about n lines of 5-9
characters, one token each), so it is the same in every epoch, and `n` is drawn log-normal per
problem, so lengths are heavy-tailed across prompts (default: median ~125 tokens, 95th percentile
~5-7x that, the longest ~1,600). Every line needs only local work a tiny model learns (decrement the
counter, add `d` to the previous total, stop after counter 1), and each line is one more chance to
slip, so accuracy falls with length and RL has room to raise it.

Problems are a pure function of (num, seed, settings), like the short task's: a longer list starts
with the shorter one, and questions are distinct.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

from rhymerl.data.builtin import ANSWER_MARKER
from rhymerl.data.records import Problem

# Every character a question or solution of these problems can contain.
LONG_ALPHABET = "0123456789=\n# sdn"
_QUESTION = re.compile(r"s=(\d+) d=(\d+) n=(\d+)")


@dataclass(frozen=True)
class LongProblemSettings:
    """Length and difficulty knobs of the long-tail problems."""

    # The number of additions n is round(lognormal(log(median_steps), sigma)), clipped to
    # min_steps..max_steps: a few problems ~7x the median, none past the engines' token budget.
    median_steps: int = 20
    sigma: float = 1.0
    min_steps: int = 2
    max_steps: int = 220  # ~1,650 response tokens at most (configs/long-tail.toml: max_tokens 2048)
    # Small s and d keep the totals short (2 digits up to ~30 additions, at most 3): with s up to 99
    # and d up to 9 the built-in model learned the lines' shape but no answer (rhymerl/policy/long_build.py).
    max_start: int = 9  # s is uniform over 0..max_start
    max_step: int = 3  # d is uniform over 1..max_step

    def __post_init__(self) -> None:
        if not 2 <= self.min_steps <= self.median_steps <= self.max_steps:
            raise ValueError(f"LongProblemSettings: need 2 <= min_steps ({self.min_steps}) <= median_steps "
                             f"({self.median_steps}) <= max_steps ({self.max_steps})")
        if self.sigma < 0:
            raise ValueError(f"LongProblemSettings.sigma={self.sigma}: must be >= 0")
        if self.max_start < 0 or self.max_step < 1:
            raise ValueError(f"LongProblemSettings: max_start={self.max_start} must be >= 0 and "
                             f"max_step={self.max_step} >= 1")


def long_question_of(start: int, step: int, steps: int) -> str:
    """The question, e.g. (37, 7, 3) -> "s=37 d=7 n=3"."""
    if start < 0 or step < 0 or steps < 1:
        raise ValueError(f"need start >= 0, step >= 0, steps >= 1; got {start}, {step}, {steps}")
    return f"s={start} d={step} n={steps}"


def long_solution_of(start: int, step: int, steps: int) -> str:
    """The worked solution: "<left> <total>" for left = steps..1, then "#### <start + steps * step>"."""
    long_question_of(start, step, steps)  # same argument checks
    lines, total = [], start
    for left in range(steps, 0, -1):
        total += step
        lines.append(f"{left} {total}")
    lines.append(f"{ANSWER_MARKER}{total}")
    return "\n".join(lines)


def parse_long_question(question: str) -> tuple[int, int, int]:
    """Inverse of `long_question_of`: (start, step, steps); raises ValueError otherwise."""
    m = _QUESTION.fullmatch(question)
    if m is None:
        raise ValueError(f"not a long built-in question (want 's=<n> d=<n> n=<n>'): {question!r}")
    return int(m[1]), int(m[2]), int(m[3])


def make_long_problem(index: int, start: int, step: int, steps: int) -> Problem:
    """One Problem for adding `step` to `start`, `steps` times."""
    question, answer = long_question_of(start, step, steps), str(start + steps * step)
    return Problem(index=index, question=question, answer=answer, solution=long_solution_of(start, step, steps),
                   row={"question": question, "answer": answer})


def draw_long_problem(rng: random.Random, index: int,
                      spec: LongProblemSettings = LongProblemSettings()) -> Problem:
    """One problem drawn from `rng`: n heavy-tailed (log-normal, clipped), s and d uniform."""
    steps = round(rng.lognormvariate(math.log(spec.median_steps), spec.sigma))
    steps = min(spec.max_steps, max(spec.min_steps, steps))
    return make_long_problem(index, rng.randint(0, spec.max_start), rng.randint(1, spec.max_step), steps)


def long_problems(num: int, seed: int, spec: LongProblemSettings = LongProblemSettings()) -> list[Problem]:
    """`num` distinct problems drawn with `seed`; deterministic, and a longer list extends a shorter one."""
    if num < 0:
        raise ValueError(f"long_problems: num={num} must be >= 0")
    rng = random.Random(seed)
    problems: list[Problem] = []
    seen: set[str] = set()
    while len(problems) < num:
        p = draw_long_problem(rng, len(problems), spec)
        if p.question not in seen:  # equal prompts would be one prompt to the run
            seen.add(p.question)
            problems.append(p)
    return problems

