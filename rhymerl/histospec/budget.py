"""Per-request draft budgets: how many tokens a request drafts next, given how its drafts fared.

A rule is picked by name from `BUDGET_RULES` (`spec.budget_rule`): "additive" (the paper: start 2,
+2 after a fully accepted draft, back to 2 after a rejection, cap 32), "doubling" (the public code:
x2 / halve within 2..16; the default, as it measured better) or "fixed".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol


class BudgetRule(Protocol):
    """How a request's draft budget moves with acceptance."""

    @property
    def initial(self) -> int:
        ...

    def update(self, budget: int, drafted: int, accepted: int) -> int:
        """Next budget after a step that drafted `drafted` tokens of which `accepted` were taken.
        A step without a draft leaves the budget unchanged."""
        ...


@dataclass(frozen=True)
class AdditiveBudget:
    """The paper's rule: start 2, +2 after a fully accepted draft, back to 2 on a rejection."""

    start: int = 2
    step: int = 2
    cap: int = 32

    @property
    def initial(self) -> int:
        return min(self.start, self.cap)

    def update(self, budget: int, drafted: int, accepted: int) -> int:
        if drafted == 0:
            return budget
        return min(budget + self.step, self.cap) if accepted >= drafted else self.initial


@dataclass(frozen=True)
class DoublingBudget:
    """The public code's rule: double after a fully accepted draft, halve on a rejection."""

    low: int = 2
    high: int = 16

    @property
    def initial(self) -> int:
        return min(self.low, self.high)

    def update(self, budget: int, drafted: int, accepted: int) -> int:
        if drafted == 0:
            return budget
        if accepted >= drafted:
            return min(budget * 2, self.high)
        return max(budget // 2, self.initial)


@dataclass(frozen=True)
class FixedBudget:
    """Always the same budget (vLLM's n-gram method drafts a fixed k)."""

    k: int = 8

    @property
    def initial(self) -> int:
        return self.k

    def update(self, budget: int, drafted: int, accepted: int) -> int:
        return self.k


# name -> factory taking the run's max_budget (the engine's num_speculative_tokens)
BUDGET_RULES: dict[str, Callable[[int], BudgetRule]] = {
    "additive": lambda max_budget: AdditiveBudget(cap=min(32, max_budget)),
    "doubling": lambda max_budget: DoublingBudget(high=min(16, max_budget)),
    "fixed": lambda max_budget: FixedBudget(max_budget),
}


def register_budget_rule(name: str, factory: Callable[[int], BudgetRule]) -> None:
    """Add a budget rule selectable as `spec.budget_rule=<name>`."""
    if name in BUDGET_RULES:
        raise ValueError(f"budget rule {name!r} is already registered")
    BUDGET_RULES[name] = factory
