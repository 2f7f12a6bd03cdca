"""The built-in reward functions, picked by name in `reward.functions`: `gsm8k` and `math`.

Each is a small frozen callable `fn(prompt, completion, row) -> (value, correct)` that reads the
gold answer from the row's answer column (`answer_key`), so it pickles by reference into any
process and follows the plug-in convention of `rhymerl.data.rewards`.

* `gsm8k`: the rule of `rhymerl.data.reward` (the completion's last non-empty line must be
  ``#### <number>``, equal to the gold number). The gold cell is a number (``"72"``, ``72``) or a
  worked solution ending in a ``#### <number>`` line. Value 1.0 when correct, else 0.0.
* `math`: mathematical equivalence with the `math-verify` library (the checker TRL and open-r1
  use): both sides are parsed to SymPy with math-verify's default extraction (LaTeX, including
  ``\\boxed{}`` and ``$...$``, then plain expressions) and compared by `math_verify.verify`, so
  ``\\frac{1}{2}`` equals ``0.5`` and ``\\sqrt{8}`` equals ``2\\sqrt{2}``. A gold cell without
  ``$`` or ``\\boxed`` is read as bare LaTeX (wrapped in ``$...$``), so ``2\\sqrt{2}`` parses. A
  completion with no parseable answer scores 0.0, wrong. Value 1.0 when equivalent, else 0.0.

A gold cell that cannot be read as an answer raises ValueError: that is a dataset bug, not a
wrong answer (the caller reports it as a `RewardFunctionError` naming the prompt).

math-verify bounds each parse and comparison with `signal.alarm`, which works only on a
process's main thread; elsewhere (a threaded actor) it runs without that bound.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from rhymerl.data.reward import OutcomeRewards, extract_answer, normalise_number, score

MATH_TIMEOUT_S = 5  # per math-verify parse or comparison (math-verify's own default)


def _gold_cell(row: Mapping[str, Any], answer_key: str) -> str:
    """The row's gold answer as text; KeyError naming the column when the row lacks it."""
    if answer_key not in row:
        raise KeyError(f"the row has no answer column {answer_key!r} (columns: {', '.join(map(str, row))})")
    value = row[answer_key]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"answer column {answer_key!r} holds {type(value).__name__} {value!r}; "
                         "it must be text or a number")
    return str(value)


@dataclass(frozen=True)
class Gsm8kReward:
    """``#### <number>`` answers compared exactly with the gold number (`rhymerl.data.reward.score`)."""

    answer_key: str = "answer"

    def __call__(self, prompt: str, completion: str, row: Mapping[str, Any]) -> tuple[float, bool]:
        gold = _gold_cell(row, self.answer_key)
        # A bare number, or a worked solution whose last line is "#### <number>".
        number = normalise_number(gold) or extract_answer(gold)
        if number is None:
            raise ValueError(f"gold answer {gold!r} is neither a number nor a solution ending in "
                             "'#### <number>'")
        result = score(completion, number, OutcomeRewards())
        return result.reward, result.correct


def _timeout() -> int | None:
    # signal.alarm exists only on the main thread; math-verify raises elsewhere unless told None.
    return MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def parse_gold(gold: str) -> list:
    """math-verify's parse of a gold answer: bare LaTeX is wrapped in ``$...$`` first."""
    from math_verify import parse  # lazy: it imports SymPy (about a second)

    anchored = "$" in gold or "\\boxed" in gold
    parsed = parse(gold if anchored else f"${gold}$", parsing_timeout=_timeout())
    return parsed or parse(gold, parsing_timeout=_timeout())


def math_equivalent(gold: str, completion: str) -> bool:
    """Whether the completion's answer equals `gold` by math-verify; ValueError if `gold` does not parse."""
    from math_verify import parse, verify

    gold_parsed = parse_gold(gold)
    if not gold_parsed:
        raise ValueError(f"gold answer {gold!r} does not parse as mathematics (math-verify found no "
                         "expression); write it as LaTeX or a number, e.g. '\\frac{1}{2}'")
    answer = parse(completion, parsing_timeout=_timeout())
    if not answer:
        return False
    return bool(verify(gold_parsed, answer, timeout_seconds=_timeout()))


@dataclass(frozen=True)
class MathReward:
    """Mathematical equivalence of the completion's answer with the gold answer (math-verify)."""

    answer_key: str = "answer"

    def __call__(self, prompt: str, completion: str, row: Mapping[str, Any]) -> tuple[float, bool]:
        correct = math_equivalent(_gold_cell(row, self.answer_key), completion)
        return (1.0 if correct else 0.0), correct


# name -> factory taking the answer column's name
BUILTINS: dict[str, Callable[[str], Callable[..., tuple[float, bool]]]] = {
    "gsm8k": Gsm8kReward,
    "math": MathReward,
}
