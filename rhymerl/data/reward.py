"""Verifiable reward for GSM8K-format answers: pure functions from response text to a score.

Answer format (the same rule is applied to model responses and to dataset solutions):

* The response's last non-empty line, with surrounding whitespace stripped, must be
  ``#### <number>``: the marker at the start of the line, optional spaces, one number, nothing
  else. Anything after that line other than blank lines (more text, a second answer, units such
  as ``$`` or ``%``) makes the response unformatted.
* Several ``####`` lines are allowed; only the last one counts, and it must be the last
  non-empty line (so the answer is the one after the LAST marker).
* A number is an optional sign, digits (optionally grouped by commas into proper thousands,
  ``1,234,567``; ``1,23`` is not a number) and an optional decimal part: ``1,234``, ``-3.50``,
  ``+7``, ``.5`` and ``5.`` are numbers; ``1e3``, ``3/4``, ``$5`` and ``1 234`` are not.
  Only ASCII digits count.

Numbers compare by their canonical string (`normalise_number`), computed exactly on the digits
(no floats): ``#### 1,234`` equals ``1234`` and ``#### -3.50`` equals ``-3.5``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

# Integer part: comma-grouped thousands, or plain digits (possibly empty for ".5").
_NUMBER_RE = re.compile(r"([+-]?)((?:[0-9]{1,3}(?:,[0-9]{3})+)|[0-9]*)(?:\.([0-9]*))?")
_ANSWER_LINE_RE = re.compile(r"####[ \t]*(\S+)")


@dataclass(frozen=True)
class OutcomeRewards:
    """Reward values for the three outcomes of scoring one response."""

    correct_reward: float = 1.0  # well formatted and equal to the gold answer
    wrong_reward: float = 0.0  # well formatted, different number
    unformatted_reward: float = 0.0  # no valid final "#### <number>" line (never counts as correct)

    def __post_init__(self) -> None:
        for name in ("correct_reward", "wrong_reward", "unformatted_reward"):
            value = getattr(self, name)
            is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not is_number or not math.isfinite(value):
                raise ValueError(f"OutcomeRewards.{name} must be a finite number, got {value!r}")


@dataclass(frozen=True)
class RewardResult:
    """Score of one response."""

    reward: float
    correct: bool  # formatted and the predicted number equals the gold number
    formatted: bool  # the response ends with a valid "#### <number>" line
    predicted: str | None  # normalised predicted number; None when not formatted


def normalise_number(text: str) -> str | None:
    """Canonical string of a number, or None if `text` (stripped) is not a number.

    The canonical form has no sign for zero or positives, a leading "-" for negatives, no
    commas, no leading zeros in the integer part, and no trailing zeros (or dot) in the
    fraction: "1,234" -> "1234", "-3.50" -> "-3.5", "007" -> "7", ".5" -> "0.5", "-0.0" -> "0".
    """
    match = _NUMBER_RE.fullmatch(text.strip())
    if match is None:
        return None
    sign, integer, fraction = match.group(1), match.group(2), match.group(3) or ""
    if not integer and not fraction:
        return None  # a sign and/or dot with no digits
    integer = integer.replace(",", "").lstrip("0") or "0"
    fraction = fraction.rstrip("0")
    body = f"{integer}.{fraction}" if fraction else integer
    # Zero has one canonical form, so "-0" and "0.00" compare equal to "0".
    if sign == "-" and body != "0":
        return "-" + body
    return body


def extract_answer(text: str) -> str | None:
    """Normalised number of a well-formatted response, else None (rule in the module docstring).

    Examples: "so 6*7=42\\n#### 42\\n" -> "42"; "#### 1\\n#### 2" -> "2";
    "#### 42\\nI hope this helps" -> None; "#### $42" -> None; "the answer is 42" -> None.
    """
    lines = [line.strip() for line in text.splitlines()]
    non_empty = [line for line in lines if line]
    if not non_empty:
        return None
    match = _ANSWER_LINE_RE.fullmatch(non_empty[-1])
    if match is None:
        return None
    return normalise_number(match.group(1))


def score(response_text: str, gold: str, cfg: OutcomeRewards = OutcomeRewards()) -> RewardResult:
    """Score one response against the gold answer (any number form; it is normalised here).

    Raises ValueError if `gold` is not a number: that is a dataset bug, not a wrong answer.
    """
    gold_norm = normalise_number(gold)
    if gold_norm is None:
        raise ValueError(
            f"gold answer {gold!r} is not a number; gold answers must be numbers such as '42' "
            "or '-3.5' (check the dataset's '#### <number>' lines)"
        )
    predicted = extract_answer(response_text)
    if predicted is None:
        return RewardResult(reward=float(cfg.unformatted_reward), correct=False,
                            formatted=False, predicted=None)
    correct = predicted == gold_norm
    reward = cfg.correct_reward if correct else cfg.wrong_reward
    return RewardResult(reward=float(reward), correct=correct, formatted=True, predicted=predicted)


def score_batch(texts: Sequence[str], golds: Sequence[str],
                cfg: OutcomeRewards = OutcomeRewards()) -> list[RewardResult]:
    """Score responses pairwise with their gold answers (`texts[i]` against `golds[i]`)."""
    if len(texts) != len(golds):
        raise ValueError(
            f"score_batch got {len(texts)} responses but {len(golds)} gold answers; "
            "pass one gold answer per response (repeat a prompt's answer for each of its samples)"
        )
    return [score(text, gold, cfg) for text, gold in zip(texts, golds)]
