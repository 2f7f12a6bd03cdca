"""The prompt's own drafts for a whole engine batch in one compiled call (`BatchIndexDrafter`).

`propose(indexes, row_ids, nums, budgets, tokens)` returns, for every row, exactly what
`HistoSpecDrafter(index)._from_index(context, budget)` returns for that row's context (same tokens,
match length and score): the history part runs in `rhymerl.histospec.kernel.draft_rows`, and a prompt
with siblings adds their continuations, gathered here from its `SuffixIndex`, to the same call. The
cross-prompt tree stays with the caller (`HistoSpecDrafter.against_recent`).

Each attached `FlatIndex` gets a slot in numba typed lists of its arrays the first time a row reads
it (no copy); `retain` frees the slots of indexes the caller dropped. Engine thread only.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numba import typed, types

from rhymerl.histospec import kernel
from rhymerl.histospec.drafter import EMPTY, MAX_CANDIDATES, PRIOR, Draft, SpecConfig
from rhymerl.histospec.flat import FlatIndex, PromptIndex
from rhymerl.histospec.index import STRIDE
from rhymerl.histospec.side import sibling_rows

_I32, _I64 = types.Array(types.int32, 1, "C"), types.Array(types.int64, 1, "C")
_U64, _F64 = types.Array(types.uint64, 1, "C"), types.Array(types.float64, 1, "C")


def runs(keys: np.ndarray) -> list[np.ndarray]:
    """The positions of `keys` grouped by key (ascending), each group in position order (np.split
    without its per-piece Python overhead: an engine step groups its rows by prompt this way)."""
    order = np.argsort(keys, kind="stable")
    bounds = [0, *(np.flatnonzero(np.diff(keys[order])) + 1).tolist(), len(order)]
    return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


class FlatSlots:
    """The arrays of attached `FlatIndex`es as typed lists the kernel indexes by slot."""

    def __init__(self) -> None:
        self.texts, self.sas = typed.List.empty_list(_I32), typed.List.empty_list(_I32)
        self.keys, self.starts = typed.List.empty_list(_U64), typed.List.empty_list(_I64)
        self.rewards = typed.List.empty_list(_F64)
        self._slot: dict[int, tuple[int, FlatIndex]] = {}  # id(flat) -> (slot, flat kept alive)
        self._free: list[int] = []

    def slot(self, index: PromptIndex) -> int:
        """The slot of `index`'s history (-1: not attached yet)."""
        flat = index.flat
        if flat is None:
            return -1
        got = self._slot.get(id(flat))
        if got is not None:
            return got[0]
        arrays = (np.ascontiguousarray(flat.text, np.int32), np.ascontiguousarray(flat.sa, np.int32),
                  np.ascontiguousarray(flat.key, np.uint64), np.ascontiguousarray(flat.starts, np.int64),
                  np.asarray(index.rewards[:index.base], dtype=np.float64))
        lists = (self.texts, self.sas, self.keys, self.starts, self.rewards)
        if self._free:
            k = self._free.pop()
            for lst, a in zip(lists, arrays):
                lst[k] = a
        else:
            k = len(self.texts)
            for lst, a in zip(lists, arrays):
                lst.append(a)
        self._slot[id(flat)] = (k, flat)
        return k

    def retain(self, indexes: Sequence[PromptIndex]) -> None:
        """Free the slots of histories not among `indexes`' (their prompts were dropped)."""
        live = {id(ix.flat) for ix in indexes if ix.flat is not None}
        for fid in [f for f in self._slot if f not in live]:
            k, _ = self._slot.pop(fid)
            self._free.append(k)
            for lst, dtype in ((self.texts, np.int32), (self.sas, np.int32), (self.keys, np.uint64),
                               (self.starts, np.int64), (self.rewards, np.float64)):
                lst[k] = np.zeros(0, dtype=dtype)

    def __len__(self) -> int:
        return len(self._slot)


class BatchIndexDrafter:
    """Drafts from the prompts' own indexes (history + siblings) for many rows per call."""

    def __init__(self, spec: SpecConfig, max_candidates: int = MAX_CANDIDATES) -> None:
        self.spec, self.limit = spec, max_candidates
        self.slots = FlatSlots()
        self._warm()

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
                     nums: Sequence[int], budgets: Sequence[int], tokens: np.ndarray) -> tuple[np.ndarray, ...]:
        """`draft_arrays` with row r drafting from indexes[which[r]] (distinct indexes: the engine's
        prompts, looked up once per prompt, not per row)."""
        count, spec = len(which), self.spec
        which = np.asarray(which, np.int64)
        slots = np.fromiter((self.slots.slot(ix) for ix in indexes), np.int64, len(indexes))[which]
        with_side = np.fromiter((ix.side.occurrences > 0 for ix in indexes), bool, len(indexes))
        row_ids, nums = np.asarray(row_ids, np.int64), np.asarray(nums, np.int64)
        budgets = np.asarray(budgets, np.int64)
        width = max(1, int(budgets.max(initial=0)))
        forced = np.full(count, -1, dtype=np.int64)
        flat_limits = np.zeros(count, dtype=np.int64)
        x_lo, x_hi = np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64)
        sib = np.flatnonzero(with_side[which])
        x_tok = np.empty((len(sib) * self.limit, width), dtype=np.int64)
        x_len = np.empty(len(sib) * self.limit, dtype=np.int64)
        x_code, x_rew = np.empty_like(x_len), np.empty(len(sib) * self.limit, dtype=np.float64)
        if len(sib):  # siblings: the longer of both parts' matches decides which part's occurrences count
            nf = self._history_match(slots[sib], row_ids[sib], nums[sib], tokens)
            fill = np.zeros(1, dtype=np.int64)
            for js in runs(which[sib]):  # one call per prompt
                ix = indexes[int(which[sib[js[0]]])]
                side = ix.side
                sibling_rows(side.tok, side.lens, side.hkey, side.hhead, side.ocode, side.oprev, side.rewards,
                             sib[js], nf[js], tokens, row_ids, nums, budgets, spec.min_match, spec.max_match,
                             self.limit, ix.base * STRIDE, spec.reward_weighted, forced, flat_limits, x_tok, x_len,
                             x_code, x_rew, x_lo, x_hi, fill)
        out = np.zeros((count, width), dtype=np.int64)
        out_len = np.zeros(count, dtype=np.int64)
        out_n = np.zeros(count, dtype=np.int64)
        out_score = np.zeros(count, dtype=np.float64)
        out_prob = np.zeros((count, width), dtype=np.float64)
        kernel.draft_rows(self.slots.texts, self.slots.sas, self.slots.keys, self.slots.starts,
                          self.slots.rewards, slots, tokens, row_ids, nums, budgets, forced, flat_limits,
                          x_tok, x_len, x_code, x_rew, x_lo, x_hi, self.limit, spec.min_match, spec.max_match,
                          float(spec.max_spec_factor), spec.reward_weighted, float(spec.min_token_prob),
                          PRIOR, out, out_len, out_n, out_score, out_prob)
        out_prob[np.arange(width)[None, :] >= out_len[:, None]] = 0.0
        return out, out_len, out_n, out_score, out_prob

    def _history_match(self, slots: np.ndarray, row_ids: np.ndarray, nums: np.ndarray,
                       tokens: np.ndarray) -> np.ndarray:
        """The history's match length per row (0: no history or no match)."""
        out = np.zeros(len(slots), dtype=np.int64)
        kernel.match_rows(self.slots.texts, self.slots.sas, self.slots.keys, slots, tokens, row_ids, nums,
                          self.spec.min_match, self.spec.max_match, out)
        return out

    def _warm(self) -> None:
        """Compile (or load from numba's cache) the kernels now, not inside an engine step."""
        index = PromptIndex.build(np.array([1, 2, 3, 1, 2, 4], np.int32), [3, 3], [1.0, 0.0],
                                  min_match=self.spec.min_match, max_match=self.spec.max_match)
        index.add([1, 2])
        saved, self.slots = self.slots, FlatSlots()
        try:
            for dtype in (np.int32, np.int64):
                self.propose([index, index], [0, 0], [2, 2], [2, 2], np.array([[1, 2]], dtype))
            self.slots.retain([])  # typed-list item assignment compiles too
            self.slots.slot(index)
        finally:
            self.slots = saved
