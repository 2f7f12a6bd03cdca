"""Speculative decoding in the simulator: each engine step's drafts chosen by the goodput rule.

A worker running `b` requests over `context` cached tokens each decides, every step, how many
draft tokens of each request to verify (`rhymerl.histospec.goodput.keep_lengths`): candidates join
in decreasing acceptance chance while they raise expected tokens per second under the cost
surface's step time, and none join when nothing pays, so a step is never slower per token than
plain decoding (up to the surface's own accuracy). The same drafts with every token kept give the
fixed-draft comparison.

Acceptance: `chain_acceptance` turns two measured means, tokens per verification step (bonus
included) and draft tokens offered per step, into a per-position chance q_j = alpha^j for draft
token j = 1..W (W the mean drafted, rounded), alpha chosen so the chances sum to the accepted draft
tokens. A geometric chain is the standard model of a draft accepted token by token.

Requests at different places in their responses accept differently (deep drafts in long answers
less): with a chance profile per response-position bucket, a step's requests are split among the
buckets in proportion to the steps spent there, and the rule weighs them jointly, so it can keep the
drafts of young requests and verify none of the old ones in the same step.

`PacedCost` carries the result into the simulator: seconds per emitted token per running request,
by how many requests run. The simulator's clock then counts expected tokens (a fluid
approximation: a request of L tokens finishes after L / tokens-per-step steps, not a whole number).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rhymerl.histopipe.cost_surface import CostSurface
from rhymerl.histospec.goodput import keep_lengths


def chain_acceptance(accepted_len: float, drafted: float) -> np.ndarray:
    """(W,) chance that draft token j = 1..W is accepted: alpha^j, W = round(drafted), sum = accepted_len - 1.

    `accepted_len` is tokens per verification step with the bonus token, `drafted` the draft tokens
    offered per step; more accepted than drafted (impossible) caps alpha at 1.
    """
    width = int(round(drafted))
    if width < 1 or accepted_len < 1.0:
        raise ValueError(f"chain_acceptance: need drafted >= 0.5 and accepted_len >= 1, got drafted={drafted}, "
                         f"accepted_len={accepted_len}; pass the measured draft tokens per verification step")
    target = accepted_len - 1.0
    powers = np.arange(1, width + 1, dtype=np.float64)
    low, high = 0.0, 1.0
    if target <= 0.0:
        return np.zeros(width)
    if width <= target:
        return np.ones(width)
    for _ in range(60):  # bisection: the sum grows with alpha
        mid = 0.5 * (low + high)
        low, high = (mid, high) if float(np.sum(mid ** powers)) < target else (low, mid)
    return (0.5 * (low + high)) ** powers


@dataclass(frozen=True)
class DraftChoice:
    """One step of `batch` requests over `context` cached tokens: what the rule kept and what it gives."""

    batch: int
    context: float
    draft_len: float  # mean draft tokens verified per request (0: speculation off)
    tokens_per_step: float  # expected tokens emitted per request per step (1 without drafts)
    seconds: float  # the step's seconds with the kept drafts
    plain_seconds: float  # the step's seconds without drafts

    @property
    def speedup(self) -> float:
        """Tokens per second over plain decoding's at the same batch and context (>= 1 under the rule)."""
        return self.tokens_per_step * self.plain_seconds / self.seconds


def batch_rows(weights: np.ndarray, batch: int) -> np.ndarray:
    """(K,) requests of each of K kinds in a batch of `batch`, in proportion to `weights` (largest remainder)."""
    share = np.asarray(weights, np.float64) / float(np.sum(weights)) * batch
    rows = np.floor(share).astype(np.int64)
    rows[np.argsort(-(share - rows), kind="stable")[:batch - int(rows.sum())]] += 1
    return rows


def choose_drafts(surface: CostSurface, q: np.ndarray, batch: int, context: float,
                  controlled: bool = True, weights: np.ndarray | None = None) -> DraftChoice:
    """The drafts of a step of `batch` requests that offer draft chances `q`: (W,) for all alike, or
    (K, W) for K kinds of request (e.g. response positions) mixed in proportion to `weights` (K,).

    controlled: the goodput rule picks them; otherwise every draft token is verified (fixed drafts).
    """
    q = np.atleast_2d(np.asarray(q, np.float64))
    rows = np.repeat(q, batch_rows(np.ones(len(q)) if weights is None else weights, batch), axis=0)
    lengths = np.full(batch, q.shape[1], np.int64)
    if controlled:
        kept = keep_lengths(rows, lengths, lambda tokens: surface.step_time(batch, np.asarray(tokens) / batch,
                                                                           context),
                            float(batch), float(batch))
    else:
        kept = lengths
    cumulative = np.concatenate((np.zeros((batch, 1)), np.cumsum(rows, axis=1)), axis=1)
    gained = float(cumulative[np.arange(batch), kept].sum())
    drafted = float(np.sum(kept))
    return DraftChoice(batch=batch, context=context, draft_len=drafted / batch,
                       tokens_per_step=1.0 + gained / batch,
                       seconds=surface.step_time(batch, 1.0 + drafted / batch, context),
                       plain_seconds=surface.step_time(batch, 1.0, context))


@dataclass(frozen=True)
class PacedCost:
    """A worker whose requests gain several tokens per step: seconds per emitted token per running
    request, by the number running. Stands in for `CostModel` in `rhymerl.histopipe.simulator`."""

    seconds_per_token: tuple[float, ...]  # index b: b requests running (index 0 repeats index 1)
    draft_len: tuple[float, ...]  # index b: mean drafts verified per request at b running
    capacity: int
    startup_s: float = 0.0

    def step_time(self, running: float) -> float:
        """Seconds until each of `running` requests has one more token, on average."""
        return self.seconds_per_token[min(max(int(running), 1), self.capacity)]


def paced_cost(surface: CostSurface, q: np.ndarray, context: float, capacity: int, controlled: bool = True,
               weights: np.ndarray | None = None, startup_s: float = 0.0) -> PacedCost:
    """`PacedCost` of a worker at mean `context` whose requests offer drafts `q` (mixed by `weights`,
    as in `choose_drafts`), for 1..capacity running."""
    choices = [choose_drafts(surface, q, b, context, controlled, weights) for b in range(1, capacity + 1)]
    per_token = [c.seconds / c.tokens_per_step for c in choices]
    lengths = [c.draft_len for c in choices]
    return PacedCost(seconds_per_token=tuple(per_token[:1] + per_token),
                     draft_len=tuple(lengths[:1] + lengths), capacity=capacity, startup_s=startup_s)


def draft_table(surface: CostSurface, q: np.ndarray, contexts: tuple[float, ...], batches: tuple[int, ...],
                weights: np.ndarray | None = None) -> list[dict]:
    """Per context and batch: the rule's mean draft length and speed-up, and fixed drafts' speed-up."""
    out = []
    for context in contexts:
        for b in batches:
            rule = choose_drafts(surface, q, b, context, True, weights)
            fixed = choose_drafts(surface, q, b, context, False, weights)
            out.append({"context": context, "batch": b, "draft_len": rule.draft_len, "off": rule.draft_len == 0,
                        "speedup": rule.speedup, "fixed_draft_len": fixed.draft_len, "fixed_speedup": fixed.speedup})
    return out
