"""The prompt's own drafts for a whole engine batch in one compiled call (`BatchIndexDrafter`).

`propose(indexes, row_ids, nums, budgets, tokens)` returns, for every row, exactly what
`HistoSpecDrafter(index)._from_index(context, budget)` returns for that row's context (same tokens,
match length and score): history and siblings in one call of `rhymerl.histospec.kernel.draft_rows`
for all rows, reading each prompt's arrays through its slots (`rhymerl.histospec.slots`; `retain`
frees the slots of indexes the caller dropped). The cross-prompt tree stays with the caller
(`HistoSpecDrafter.against_recent`; with a helper thread the engine asks it beside the kernel, which
then releases the GIL: `rhymerl.histospec.tree_asks`). Engine thread only.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from rhymerl.histospec import kernel
from rhymerl.histospec.drafter import EMPTY, MAX_CANDIDATES, PRIOR, Draft
from rhymerl.histospec.flat import PromptIndex
from rhymerl.histospec.index import STRIDE
from rhymerl.histospec.slots import FlatSlots, SideSlots
from rhymerl.histospec.spec_config import SpecConfig


class BatchIndexDrafter:
    """Drafts from the prompts' own indexes (history + siblings) for many rows per call."""

    def __init__(self, spec: SpecConfig, max_candidates: int = MAX_CANDIDATES,
                 sides: SideSlots | None = None, beside: bool = True) -> None:
        self.spec, self.limit = spec, max_candidates
        self.slots = FlatSlots(spec.max_match)
        self.sides = sides if sides is not None else SideSlots()  # the caller's, to share with its growth
        self._warm(beside)

    def propose(self, indexes: Sequence[PromptIndex], row_ids: Sequence[int], nums: Sequence[int],
                budgets: Sequence[int], tokens: np.ndarray) -> list[Draft]:
        """Per row r: the own draft of indexes[r] after tokens[row_ids[r], :nums[r]], <= budgets[r]."""
        drafts, ns, scores, probs = self.draft(indexes, row_ids, nums, budgets, tokens)
        return [Draft(tuple(d), n, s, tuple(p)) if d else EMPTY for d, n, s, p in zip(drafts, ns, scores, probs)]

    def draft(self, indexes: Sequence[PromptIndex], row_ids: Sequence[int], nums: Sequence[int],
              budgets: Sequence[int], tokens: np.ndarray
              ) -> tuple[list[list[int]], list[int], list[float], list[list[float]]]:
        """`propose`'s drafts as plain lists (no object per row): tokens (empty: no draft), match
        lengths, scores and the tokens' estimated probabilities."""
        if not len(indexes):
            return [], [], [], []
        out, out_len, out_n, out_score, out_prob = self.draft_arrays(indexes, row_ids, nums, budgets, tokens)
        sizes = out_len.tolist()
        drafts = [row[:size] for row, size in zip(out.tolist(), sizes)]
        probs = [row[:size] for row, size in zip(out_prob.tolist(), sizes)]
        return drafts, out_n.tolist(), out_score.tolist(), probs

    def draft_arrays(self, indexes: Sequence[PromptIndex], row_ids: Sequence[int], nums: Sequence[int],
                     budgets: Sequence[int], tokens: np.ndarray) -> tuple[np.ndarray, ...]:
        """`draft` as arrays, R rows x W (the largest budget) columns: tokens, lengths (0: no draft),
        match lengths, scores and the tokens' estimated probabilities (0 past a row's length)."""
        distinct: dict[int, int] = {}  # id(index) -> its position in `groups`
        groups: list[PromptIndex] = []
        which = np.empty(len(indexes), dtype=np.int64)
        for r, ix in enumerate(indexes):
            pos = distinct.get(id(ix))
            if pos is None:
                pos = distinct[id(ix)] = len(groups)
                groups.append(ix)
            which[r] = pos
        return self.draft_groups(groups, which, row_ids, nums, budgets, tokens)

    def draft_groups(self, indexes: Sequence[PromptIndex], which: np.ndarray, row_ids: Sequence[int],
                     nums: Sequence[int], budgets: Sequence[int], tokens: np.ndarray,
                     scores: np.ndarray | None = None, progress: np.ndarray | None = None,
                     started: Callable[[], object] | None = None) -> tuple[np.ndarray, ...]:
        """`draft_arrays` with row r drafting from indexes[which[r]] (distinct indexes: the engine's
        prompts, looked up once per prompt, not per row). `scores` (zeros, one per row), if given, is
        the scores' array; `progress` (int64, zeros), if given, counts the rows drafted so far in
        progress[0] (`publish`), for another thread to read their scores while the kernel drafts the
        rest; started(), if given, is called just before the kernel, which then releases the GIL
        (`kernel.draft_rows_beside`)."""
        count, spec = len(which), self.spec
        which = np.asarray(which, np.int64)
        slots = np.fromiter((self.slots.slot(ix) for ix in indexes), np.int64, len(indexes))[which]
        sides = np.fromiter((self.sides.slot(ix.side) if ix.side.searchable else -1 for ix in indexes), np.int64,
                            len(indexes))[which]
        shifts = np.fromiter((ix.base * STRIDE for ix in indexes), np.int64, len(indexes))[which]
        row_ids, nums = np.asarray(row_ids, np.int64), np.asarray(nums, np.int64)
        budgets = np.asarray(budgets, np.int64)
        width = max(1, int(budgets.max(initial=0)))
        out = np.zeros((count, width), dtype=np.int64)
        out_len = np.zeros(count, dtype=np.int64)
        out_n = np.zeros(count, dtype=np.int64)
        out_score = np.zeros(count, dtype=np.float64) if scores is None else scores
        out_prob = np.zeros((count, width), dtype=np.float64)
        sib, flat = self.sides, self.slots
        progress = np.zeros(1, np.int64) if progress is None else progress
        if started is not None:
            started()
        draft = kernel.draft_rows if started is None else kernel.draft_rows_beside  # the latter without the GIL
        draft(flat.texts, flat.sas, flat.keys, flat.samples, flat.starts, flat.rewards,
              slots, sib.tok, sib.lens, sib.table, sib.links, sib.rewards, sib.state, sib.pend, sides,
              shifts, tokens, row_ids, nums, budgets, self.limit,
              spec.min_match, spec.max_match, float(spec.max_spec_factor), spec.reward_weighted,
              float(spec.min_token_prob), PRIOR, out, out_len, out_n, out_score, out_prob, progress)
        return out, out_len, out_n, out_score, out_prob  # the kernel writes no probability past a row's length

    def retain(self, indexes: Sequence[PromptIndex]) -> None:
        """Free the slots of indexes not among `indexes` (their prompts were dropped)."""
        self.slots.retain(indexes)
        self.sides.retain(indexes)

    def _warm(self, beside: bool) -> None:
        """Compile (or load from numba's cache) the kernels now, not inside an engine step; the one
        that releases the GIL (`draft_groups` with `started`) only if `beside` (~3 s to compile)."""
        index = PromptIndex.build(np.array([1, 2, 3, 1, 2, 4], np.int32), [3, 3], [1.0, 0.0],
                                  min_match=self.spec.min_match, max_match=self.spec.max_match)
        index.add([1, 2])
        saved = self.slots, self.sides
        self.slots, self.sides = FlatSlots(self.spec.max_match), SideSlots()
        try:
            for dtype in (np.int32, np.int64):
                self.propose([index, index], [0, 0], [2, 2], [2, 2], np.array([[1, 2]], dtype))
                if beside:
                    self.draft_groups([index], np.zeros(2, np.int64), [0, 0], [2, 2], [2, 2],
                                      np.array([[1, 2]], dtype), started=lambda: None)
            self.retain([])  # typed-list item assignment compiles too
            self.slots.slot(index)
            self.sides.slot(index.side)
        finally:
            self.slots, self.sides = saved
