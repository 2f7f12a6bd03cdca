"""Acceptance counters of speculative decoding (`SpecStats`), defined once for every reader."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit

# Response-position buckets (tokens written before a verification step): the last one shows the rollout's tail.
POSITION_EDGES = (100, 300, 1000)
POSITION_EDGE_ARRAY = np.asarray(POSITION_EDGES, np.int64)  # once, not per engine step
POSITION_BUCKETS = len(POSITION_EDGES) + 1


def position_labels() -> list[str]:
    """Metric suffixes of the position buckets: "pos0_100", ..., "pos1000_inf"."""
    lows, highs = (0,) + POSITION_EDGES, POSITION_EDGES + ("inf",)
    return [f"pos{lo}_{hi}" for lo, hi in zip(lows, highs)]


@dataclass
class SpecStats:
    """Counters of verification steps; a step (one request's) emits its accepted draft tokens plus one
    model token (bonus or correction), with or without a draft."""
    steps: int = 0
    tokens: int = 0  # tokens emitted: accepted + 1 per step
    drafts: int = 0  # steps that carried a non-empty draft
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens accepted
    draft_len_hist: list[int] = field(default_factory=list)  # [d]: drafts of length d
    accept_len_hist: list[int] = field(default_factory=list)  # [a]: drafts with a accepted
    drafter_seconds: float = 0.0  # time spent proposing (including indexes built on first use)
    index_seconds: float = 0.0  # time spent building history indexes
    index_tokens: int = 0  # tokens in the history indexes built (prompt prefixes, and the prompt's own sequence)
    # The goodput controller's side: `drafted` counts the tokens it kept for verification.
    proposed: int = 0  # draft tokens the drafter proposed before the controller trimmed them
    timed_steps: int = 0  # engine steps timed against the controller's forecast
    predicted_s: float = 0.0  # the controller's forecast of those steps' seconds, summed
    measured_s: float = 0.0  # their measured seconds, summed
    # Per POSITION_EDGES bucket: steps and tokens emitted (only the engine's drafter fills these).
    pos_steps: list[int] = field(default_factory=lambda: [0] * POSITION_BUCKETS)
    pos_tokens: list[int] = field(default_factory=lambda: [0] * POSITION_BUCKETS)

    def record(self, drafted: int, accepted: int) -> None:
        """Count one step that verified `drafted` draft tokens and accepted the first `accepted`."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted={accepted} must be within 0..drafted={drafted}")
        self.steps += 1
        self.tokens += accepted + 1
        if drafted:
            self.drafts += 1
            self.drafted += drafted
            self.accepted += accepted
            hist, acc = self.draft_len_hist, self.accept_len_hist
            if len(hist) <= drafted:
                hist.extend([0] * (drafted + 1 - len(hist)))
                acc.extend([0] * (drafted + 1 - len(acc)))
            hist[drafted] += 1
            acc[accepted] += 1

    def record_positions(self, positions: np.ndarray, accepted: np.ndarray) -> None:
        """Bucket counts only (not the totals): step j came after `positions[j]` response tokens and
        accepted `accepted[j]` draft tokens."""
        if not len(positions):
            return
        bucket = np.searchsorted(POSITION_EDGE_ARRAY, np.asarray(positions), side="right")
        steps = np.bincount(bucket, minlength=POSITION_BUCKETS)
        emitted = np.bincount(bucket, weights=np.asarray(accepted, np.float64) + 1.0, minlength=POSITION_BUCKETS)
        self.pos_steps = [a + int(b) for a, b in zip(self.pos_steps, steps)]
        self.pos_tokens = [a + int(b) for a, b in zip(self.pos_tokens, emitted)]

    def add(self, tally: "Tally", positions: bool = True) -> None:
        """Add one tally's counts (`positions`: its position buckets too, when it has them)."""
        self.steps += tally.steps
        self.tokens += tally.tokens
        self.drafts += tally.drafts
        self.drafted += tally.drafted
        self.accepted += tally.accepted
        _add_into(self.draft_len_hist, tally.draft_hist)  # both empty without a draft
        _add_into(self.accept_len_hist, tally.accept_hist)
        if positions and tally.pos_steps is not None:
            self.pos_steps = [a + b for a, b in zip(self.pos_steps, tally.pos_steps)]
            self.pos_tokens = [a + b for a, b in zip(self.pos_tokens, tally.pos_tokens)]

    def merge(self, other: "SpecStats") -> None:
        """Add `other`'s counts into these."""
        self.add(Tally(other.steps, other.tokens, other.drafts, other.drafted, other.accepted, other.draft_len_hist,
                       other.accept_len_hist, other.pos_steps, other.pos_tokens))
        for name in ("drafter_seconds", "index_seconds", "index_tokens", "proposed", "timed_steps", "predicted_s",
                     "measured_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def timed_step(self, predicted: float, measured: float) -> None:
        """Count one engine step the controller forecast at `predicted` s that took `measured` s."""
        self.timed_steps += 1
        self.predicted_s += float(predicted)  # plain floats: the counters cross vLLM's RPC
        self.measured_s += float(measured)

    @property
    def drafted_at(self) -> list[int]:
        """[j]: drafts that had a token at position j."""
        return _tail_sums(self.draft_len_hist)

    @property
    def accepted_at(self) -> list[int]:
        """[j]: drafts whose token at position j was accepted."""
        return _tail_sums(self.accept_len_hist)  # same length: both grow together

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per verification step, counting the bonus token (1.0 = no speed-up)."""
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def mean_accepted_length_drafted(self) -> float:
        """vLLM's definition: 1 + accepted tokens per step that carried a draft."""
        return 1.0 + self.accepted / self.drafts if self.drafts else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def acceptance_by_position(self) -> list[float]:
        """[j]: share of drafts reaching position j whose token j was accepted."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    def as_metrics(self, prefix: str = "spec/") -> dict[str, float]:
        """Flat metrics for MLflow and the lake: `acceptance_pos{j}` per draft position, and
        `steps_{label}` / `tokens_{label}` per position bucket when recorded (`position_labels`)."""
        out = {
            f"{prefix}steps": float(self.steps), f"{prefix}tokens": float(self.tokens),
            f"{prefix}drafts": float(self.drafts), f"{prefix}drafted": float(self.drafted),
            f"{prefix}accepted": float(self.accepted),
            f"{prefix}mean_accepted_length": self.mean_accepted_length,
            f"{prefix}mean_accepted_length_drafted": self.mean_accepted_length_drafted,
            f"{prefix}acceptance_rate": self.acceptance_rate,
            f"{prefix}drafter_seconds": self.drafter_seconds,
            f"{prefix}index_seconds": self.index_seconds,
            f"{prefix}index_tokens": float(self.index_tokens),
            f"{prefix}proposed": float(max(self.proposed, self.drafted)),
        }
        if self.timed_steps:  # mean seconds per engine step, forecast and measured
            out[f"{prefix}predicted_step_s"] = self.predicted_s / self.timed_steps
            out[f"{prefix}measured_step_s"] = self.measured_s / self.timed_steps
        for j, rate in enumerate(self.acceptance_by_position()):
            out[f"{prefix}acceptance_pos{j}"] = rate
        if any(self.pos_steps):  # e.g. spec/steps_pos0_100, spec/tokens_pos1000_inf
            for label, steps, tokens in zip(position_labels(), self.pos_steps, self.pos_tokens):
                out[f"{prefix}steps_{label}"], out[f"{prefix}tokens_{label}"] = float(steps), float(tokens)
        return out


def _add_into(mine: list[int], theirs: list[int]) -> None:
    """mine[j] += theirs[j] for every j, `mine` first lengthened with zeros to `theirs`'s length."""
    mine.extend([0] * (len(theirs) - len(mine)))
    for j, v in enumerate(theirs):
        mine[j] += v


def _tail_sums(hist: list[int]) -> list[int]:
    """[j] = sum(hist[j+1:]): how many lengths exceed j."""
    out, run = [], 0
    for v in reversed(hist[1:]):
        run += v
        out.append(run)
    return out[::-1]


@dataclass(frozen=True)
class Tally:
    """Counts of many verification steps (an engine's, `requests.Counts`), to add to several `SpecStats`:
    histograms as long as the longest draft + 1 (empty without a draft), position buckets if given."""
    steps: int
    tokens: int
    drafts: int
    drafted: int
    accepted: int
    draft_hist: list[int]
    accept_hist: list[int]
    pos_steps: list[int] | None = None
    pos_tokens: list[int] | None = None


@njit(cache=True)
def tally_row(totals, hist, acc, d, a):
    """`record` of a d-token draft with a accepted, into totals (steps, tokens, drafts, drafted, accepted)."""
    totals[0] += 1
    totals[1] += a + 1
    totals[3] += d
    totals[4] += a
    if d > 0:
        totals[2] += 1
        hist[d] += 1
        acc[a] += 1


@njit(cache=True)
def tally_position(edges, steps, tokens, position, a):
    """`record_positions` of one step after `position` response tokens that accepted a tokens."""
    b = np.searchsorted(edges, position, side="right")
    steps[b] += 1
    tokens[b] += a + 1
