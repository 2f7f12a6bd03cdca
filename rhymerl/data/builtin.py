"""The built-in verifiable problems: add a list of named small numbers, worked one addition per line.

A question names each number with a letter, ``"a=8 b=7 c=3 d=5"``; its worked solution starts the
running total at `a`, adds one named number per line and ends with the checkable final line::

    a=8
    b=7 8+7=15
    c=3 15+3=18
    d=5 18+5=23
    #### 23

Why these problems: every answer is an exact integer (a string compare verifies it), the number of
terms (2..max_terms) makes response length vary about 5x across prompts (~20 to ~110 characters,
one token each), and each extra line is one more chance for a slip, so a small model's accuracy
falls with length and RL has room to improve it. Each line looks its number up by name
("c=" in the line matches "c=" in the question): a small transformer learns that lookup quickly
and reliably, whereas finding "the 3rd number" of a bare "8+7+3+5=" by position took it a
number of steps that varied several-fold with the random seed.

Problems are a pure function of (num, seed, spec); the same arguments give the same list on every
process and machine (`random.Random` seeded with an int is stable). The prompt a model sees is
``question + "\\n"`` (the default template ``"{question}\\n"``); it must answer with the solution
followed by EOS.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass

from rhymerl.data.records import Problem

# The marker before the final answer (GSM8K convention, shared with the reward code).
ANSWER_MARKER = "#### "
NAMES = string.ascii_lowercase  # the i-th number of a question is called NAMES[i]
# Every character a question or solution of these problems can contain.
PROBLEM_ALPHABET = "0123456789+=\n# " + NAMES
_DEFINITION = re.compile(r"([a-z])=(\d+)")


@dataclass(frozen=True)
class ProblemSettings:
    """Difficulty knobs of the built-in problems."""

    min_terms: int = 2  # numbers added in the shortest problem (>= 2: at least one line of work)
    max_terms: int = 9  # numbers added in the longest problem (at most 26, one per letter)
    # Each number is drawn uniformly from 0..max_operand. Single digits keep sequences short (fast
    # CPU training) while running totals still need carries into two digits.
    max_operand: int = 9

    def __post_init__(self) -> None:
        if self.min_terms < 2:
            raise ValueError(f"ProblemSettings.min_terms={self.min_terms}: must be >= 2 (one addition at least)")
        if not self.min_terms <= self.max_terms <= len(NAMES):
            raise ValueError(f"ProblemSettings.max_terms={self.max_terms}: must be in "
                             f"min_terms..{len(NAMES)} (min_terms={self.min_terms})")
        if self.max_operand < 1:
            raise ValueError(f"ProblemSettings.max_operand={self.max_operand}: must be >= 1")


def _check_terms(terms: list[int]) -> None:
    if not 2 <= len(terms) <= len(NAMES) or any(t < 0 for t in terms):
        raise ValueError(f"need 2..{len(NAMES)} non-negative terms, got {terms!r}")


def question_of(terms: list[int]) -> str:
    """The question naming each term, e.g. [12, 7] -> "a=12 b=7"."""
    _check_terms(terms)
    return " ".join(f"{NAMES[i]}={t}" for i, t in enumerate(terms))


def solution_of(terms: list[int]) -> str:
    """The worked solution: "a=<a>", then "<name>=<t> <total>+<t>=<new total>" per term, then "#### <sum>"."""
    _check_terms(terms)
    lines = [f"{NAMES[0]}={terms[0]}"]
    total = terms[0]
    for name, t in zip(NAMES[1:], terms[1:]):
        lines.append(f"{name}={t} {total}+{t}={total + t}")
        total += t
    lines.append(f"{ANSWER_MARKER}{total}")
    return "\n".join(lines)


def parse_terms(question: str) -> list[int]:
    """Inverse of `question_of`: the numbers in a built-in question (raises ValueError otherwise)."""
    parts = question.split(" ")
    matches = [_DEFINITION.fullmatch(p) for p in parts]
    if len(parts) < 2 or not all(matches) or [m[1] for m in matches] != list(NAMES[:len(parts)]):
        raise ValueError(f"not a built-in question (want 'a=<n> b=<n> ...'): {question!r}")
    return [int(m[2]) for m in matches]


def make_problem(index: int, terms: list[int]) -> Problem:
    """One Problem for adding `terms`."""
    question, answer = question_of(terms), str(sum(terms))
    return Problem(index=index, question=question, answer=answer, solution=solution_of(terms),
                   row={"question": question, "answer": answer})


def builtin_problems(num: int, seed: int, spec: ProblemSettings = ProblemSettings()) -> list[Problem]:
    """`num` problems drawn with `seed`; the number of terms is uniform over min..max_terms.

    Deterministic: the same (num, seed, spec) always gives the same list, and a longer list
    starts with the shorter one (problem i depends only on seed and i's place in the stream).
    Questions are distinct (a repeat is drawn again): two equal prompts would be one prompt to
    the run, which keys everything by the prompt's tokens.
    """
    if num < 0:
        raise ValueError(f"builtin_problems: num={num} must be >= 0")
    rng = random.Random(seed)
    problems: list[Problem] = []
    seen: set[tuple[int, ...]] = set()
    while len(problems) < num:
        k = rng.randint(spec.min_terms, spec.max_terms)
        terms = [rng.randint(0, spec.max_operand) for _ in range(k)]
        if tuple(terms) not in seen:
            seen.add(tuple(terms))
            problems.append(make_problem(len(problems), terms))
    return problems
