"""The built-in verifiable task: add a list of small numbers, worked one addition per line.

A question is the sum written out, e.g. ``"8+7+3+5="``; its worked solution carries a running total
down one line per addition and ends with the checkable final line::

    8+7=15
    15+3=18
    18+5=23
    #### 23

Why this task: every answer is an exact integer (a string compare verifies it), the number of
terms (2..max_terms) makes response length vary about 5x across prompts (13 to ~70 characters,
one token each), and each extra line is one more chance for an arithmetic slip, so a small
model's accuracy falls with length and RL has room to improve it. Problems are a pure function of (num, seed, spec); the same arguments give the
same list on every process and machine (`random.Random` seeded with an int is stable).

The prompt a model sees is ``question + "\\n"`` (the default template ``"{question}\\n"``); it must
answer with the solution followed by EOS.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rhymerl.records import Problem

# Every character a question or solution of this task can contain.
TASK_ALPHABET = "0123456789+=\n# "
# The marker before the final answer (GSM8K convention, shared with the reward code).
ANSWER_MARKER = "#### "


@dataclass(frozen=True)
class TaskSpec:
    """Difficulty knobs of the built-in task."""

    min_terms: int = 2  # numbers added in the shortest problem (>= 2: at least one line of work)
    max_terms: int = 9  # numbers added in the longest problem
    # Each number is drawn uniformly from 0..max_operand. Single digits keep sequences short (fast
    # CPU training) while running totals still need carries into two digits.
    max_operand: int = 9

    def __post_init__(self) -> None:
        if self.min_terms < 2:
            raise ValueError(f"TaskSpec.min_terms={self.min_terms}: must be >= 2 (one addition at least)")
        if self.max_terms < self.min_terms:
            raise ValueError(f"TaskSpec.max_terms={self.max_terms}: must be >= min_terms={self.min_terms}")
        if self.max_operand < 1:
            raise ValueError(f"TaskSpec.max_operand={self.max_operand}: must be >= 1")


def question_of(terms: list[int]) -> str:
    """The question text for adding `terms` in order, e.g. [12, 7] -> "12+7="."""
    return "+".join(str(t) for t in terms) + "="


def solution_of(terms: list[int]) -> str:
    """The worked solution: one "total+next=new_total" line per addition, then "#### <sum>"."""
    if len(terms) < 2:
        raise ValueError(f"solution_of needs at least 2 terms, got {terms!r}")
    lines = []
    total = terms[0]
    for t in terms[1:]:
        lines.append(f"{total}+{t}={total + t}")
        total += t
    lines.append(f"{ANSWER_MARKER}{total}")
    return "\n".join(lines)


def parse_terms(question: str) -> list[int]:
    """Inverse of `question_of`: the numbers in a built-in question (raises ValueError otherwise)."""
    if not question.endswith("="):
        raise ValueError(f"not a built-in question (must end with '='): {question!r}")
    parts = question[:-1].split("+")
    if len(parts) < 2 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a built-in question (want numbers joined by '+'): {question!r}")
    return [int(p) for p in parts]


def make_problem(index: int, terms: list[int]) -> Problem:
    """One Problem for adding `terms`."""
    return Problem(index=index, question=question_of(terms), answer=str(sum(terms)),
                   solution=solution_of(terms))


def builtin_problems(num: int, seed: int, spec: TaskSpec = TaskSpec()) -> list[Problem]:
    """`num` problems drawn with `seed`; the number of terms is uniform over min..max_terms.

    Deterministic: the same (num, seed, spec) always gives the same list, and a longer list
    starts with the shorter one (problem i depends only on seed and i's place in the stream).
    """
    if num < 0:
        raise ValueError(f"builtin_problems: num={num} must be >= 0")
    rng = random.Random(seed)
    problems = []
    for i in range(num):
        k = rng.randint(spec.min_terms, spec.max_terms)
        terms = [rng.randint(0, spec.max_operand) for _ in range(k)]
        problems.append(make_problem(i, terms))
    return problems
