"""Write examples/math-boxed/train.jsonl: built-in addition problems whose gold answers are LaTeX.

The questions are the built-in task's ("a=8 b=7 c=3"), so the built-in model can answer them; each
gold answer is the sum written in one of several equivalent LaTeX forms (\\boxed{18}, \\frac{36}{2},
4 \\cdot 4 + 2, ...), which the `math` reward compares with the model's "#### 18" by mathematical
equivalence (math-verify). Every row is checked here: its gold answer must equal the sum, differ
from the sum + 1, and accept the built-in worked solution.

    PYTHONPATH=. python examples/math-boxed/make_data.py
"""

from __future__ import annotations

import json
from pathlib import Path

from rhymerl.data.builtin import ProblemSettings, builtin_problems, parse_terms, solution_of
from rhymerl.data.reward_builtins import math_equivalent

OUT = Path(__file__).with_name("train.jsonl")
ROWS = 32
# 2 to 5 numbers: the built-in model gets about half right, so GRPO groups have something to rank.
SETTINGS = ProblemSettings(min_terms=2, max_terms=5)


def latex_forms(total: int) -> list[str]:
    """Equivalent LaTeX spellings of `total`, one picked per row in turn."""
    q, r = divmod(total, 4)
    return [
        rf"\boxed{{{total}}}",
        rf"\frac{{{2 * total}}}{{2}}",
        rf"$4 \cdot {q} + {r}$",
        rf"\boxed{{\dfrac{{{3 * total}}}{{3}}}}",
        rf"\sqrt{{{total * total}}}",
        rf"{total}.0",
    ]


def files() -> dict[Path, list[dict]]:
    """Each file this script writes, with its rows (one: train.jsonl)."""
    out = []
    for i, problem in enumerate(builtin_problems(ROWS, seed=11, spec=SETTINGS)):
        terms = parse_terms(problem.question)
        total = sum(terms)
        forms = latex_forms(total)
        gold = forms[i % len(forms)]
        assert math_equivalent(gold, str(total)) and not math_equivalent(gold, str(total + 1)), gold
        assert math_equivalent(gold, solution_of(terms)), (gold, solution_of(terms))
        out.append({"problem": problem.question, "solution": gold})
    return {OUT: out}


if __name__ == "__main__":
    for path, rows in files().items():
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {len(rows)} rows to {path}")
