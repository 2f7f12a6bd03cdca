"""HistoSpec calls only the tests make, written over the production API: a batch drafter's drafts
as `Draft`s, one prompt's replay, the calibration and the step counters counted from plain lists."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rhymerl.config.spec import SpecConfig
from rhymerl.histospec.drafter import EMPTY, Draft, RecentTree
from rhymerl.histospec.engine.batch import BatchIndexDrafter
from rhymerl.histospec.engine.kernel import Drafts
from rhymerl.histospec.engine.requests import KEY_MIX, Counts, RequestTable, count_bin, row_key, take_keys
from rhymerl.histospec.goodput import AcceptanceCalibration, bucket_of
from rhymerl.histospec.index import PromptIndex
from rhymerl.histospec.offline.replay import replay_batch
from rhymerl.histospec.stats import POSITION_EDGE_ARRAY, SpecStats, tally_position, tally_row

# The drafting rules the mechanism tests were written against: long own drafts (7-token matches, factor
# 2, no probability cut-off) and the cross-prompt tree on. Tests of those mechanisms pin them.
TREE_RULES = dict(min_token_prob=0.0, max_spec_factor=2.0, max_match=7, recent_spec_factor=4.0, recent_responses=512)


def tree_rules(**settings) -> SpecConfig:
    """`SpecConfig(**settings)` over `TREE_RULES`."""
    return SpecConfig(**{**TREE_RULES, **settings})


def draft_arrays(drafter: BatchIndexDrafter, indexes: Sequence[PromptIndex], row_ids: Sequence[int],
                 nums: Sequence[int], budgets: Sequence[int], tokens: np.ndarray) -> Drafts:
    """Row r drafts from indexes[r] after tokens[row_ids[r], :nums[r]] (`draft_groups`, each distinct
    index once)."""
    seen: dict[int, int] = {}
    groups: list[PromptIndex] = []
    which = np.empty(len(indexes), np.int64)
    for r, ix in enumerate(indexes):
        which[r] = seen.setdefault(id(ix), len(groups))
        if which[r] == len(groups):
            groups.append(ix)
    return drafter.draft_groups(groups, which, row_ids, nums, budgets, tokens)


def propose(drafter: BatchIndexDrafter, indexes: Sequence[PromptIndex], row_ids: Sequence[int],
            nums: Sequence[int], budgets: Sequence[int], tokens: np.ndarray) -> list[Draft]:
    """`draft_arrays` as the Python drafter's `Draft`s (`HistoSpecDrafter.own` of each row)."""
    if not len(indexes):
        return []
    out = draft_arrays(drafter, indexes, row_ids, nums, budgets, tokens)
    return [Draft(tuple(d[:k]), n, s, tuple(p[:k])) if k else EMPTY
            for d, k, n, s, p in zip(out.tokens.tolist(), out.lengths.tolist(), out.match.tolist(),
                                     out.score.tolist(), out.probs.tolist())]


def replay_group(prompt: Sequence[int], responses: Sequence[Sequence[int]], config: SpecConfig,
                 index: PromptIndex | None = None, stats: SpecStats | None = None,
                 recent: RecentTree | None = None) -> SpecStats:
    """One prompt's group replayed in lockstep (`replay_batch` of one group); its counters."""
    return replay_batch([(prompt, responses, index)], config, stats, recent)


def record_calibration(cal: AcceptanceCalibration, probs: Sequence[Sequence[float]],
                       accepted: Sequence[int], positions: Sequence[int] | None = None) -> None:
    """Count verified drafts in `cal` as the engine's step does: draft i's estimates probs[i], of
    which the first accepted[i] tokens were accepted, after positions[i] response tokens (None: 0)."""
    buckets = bucket_of(positions if positions is not None else [0] * len(probs))
    for p, a, b in zip(probs, accepted, buckets.tolist()):
        for j, x in enumerate(p):
            count_bin(float(x), j < a, cal.drafted[b], cal.accepted[b])
    cal.counted(sum(len(p) for p in probs))


def counted(drafted: Sequence[int], accepted: Sequence[int], positions: Sequence[int],
            with_positions: bool = True) -> SpecStats:
    """New `SpecStats` with steps j (drafted[j] tokens, the first accepted[j] accepted, after
    positions[j] response tokens) counted as the engine counts a step's rows (`requests.Counts`)."""
    counts = Counts(int(max(drafted, default=0)))
    totals, hist, acc, steps, tokens = counts.arrays
    for d, a, p in zip(drafted, accepted, positions):
        tally_row(totals, hist, acc, int(d), int(a))
        tally_position(POSITION_EDGE_ARRAY, steps, tokens, int(p), int(a))
    stats = SpecStats()
    counts.flush(stats, with_positions)
    return stats


def row_keys(tokens: np.ndarray, rows: Sequence[int], ends: Sequence[int]) -> np.ndarray:
    """`requests.row_key` of each (row, end): the keys a `RequestTable` files requests under."""
    return np.array([row_key(tokens, int(r), int(e), KEY_MIX) for r, e in zip(rows, ends)], np.uint64)


def find(table: RequestTable, keys: np.ndarray) -> np.ndarray:
    """The slots `table` holds under `keys` (-1: none), each entry taken out once matched, as
    `step_pass.begin` finds a step's requests."""
    found = np.empty(len(keys), np.int64)
    left = take_keys(table.keys, table.slots, table.index, np.asarray(keys, np.uint64), found)
    table.keys, table.slots = table.keys[:left], table.slots[:left]
    return found
