"""A plug-in reward for examples/chat-reward: partial credit for a final answer near the gold sum.

`reward.functions` names it as "examples/chat-reward/reward.py:near_miss"; the run calls it as
near_miss(prompt, completion, row) for every response, with `row` the dataset row (every column).
It reads two columns: `answer` (the gold sum) and `tolerance` (this row's slack, an extra column of
the data). It returns a number only, so it does not judge correctness: accuracy comes from the
`gsm8k` reward it is combined with.
"""

from __future__ import annotations

import re

_FINAL = re.compile(r"####\s*(-?\d+)\s*")


def near_miss(prompt: str, completion: str, row: dict) -> float:
    """1.0 for the exact sum, falling linearly to 0.0 at `tolerance + 1` away; 0.0 without a
    final "#### <number>" line."""
    lines = [line for line in completion.splitlines() if line.strip()]
    match = _FINAL.fullmatch(lines[-1]) if lines else None
    if match is None:
        return 0.0
    miss = abs(int(match[1]) - int(row["answer"]))
    return max(0.0, 1.0 - miss / (row["tolerance"] + 1))
