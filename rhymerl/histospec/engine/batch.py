"""Every row's own draft in one kernel call (`BatchIndexDrafter`), the slots through which the kernel
reads each prompt's arrays (`FlatSlots`, `SideSlots`: numba typed lists; an index gets a slot when a
row first reads it, a reallocated `SideIndex` has it replaced, `retain` frees dropped ones), and the
background indexing of prompts' histories (`HistoryBuilds`). Engine thread only, but for the builds.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Sequence

import numpy as np
import numba
from numba import typed, types

from rhymerl.histospec.drafter import MAX_CANDIDATES, PRIOR, indexed_history
from rhymerl.histospec.engine.kernel import Drafts, HistoryArrays, Params, Rows, SiblingArrays, draft_rows
from rhymerl.histospec.engine.cpu_tricks import SAMPLE
from rhymerl.histospec.index import FlatIndex, PromptIndex
from rhymerl.histospec.sibling_table import STRIDE, append_many, appending_many, crowded
from rhymerl.histospec.siblings import ROWS, SideIndex
from rhymerl.config.spec import SpecConfig
from rhymerl.histospec.stats import SpecStats

_I32, _I64 = types.Array(types.int32, 1, "C"), types.Array(types.int64, 1, "C")
_U64, _F64 = types.Array(types.uint64, 1, "C"), types.Array(types.float64, 1, "C")
_I32_2D, _I64_2D = types.Array(types.int32, 2, "C"), types.Array(types.int64, 2, "C")
INLINE_TOKENS = 4096  # history tokens a step may index itself; larger histories build in the background


class _Slots:
    """Typed lists of arrays, one entry per slot, each slot held for one object (keyed by its id)."""
    def __init__(self, kinds: Sequence[Any]) -> None:
        self.lists = tuple(typed.List.empty_list(kind) for kind in kinds)
        self._empty = tuple(np.zeros((0,) * kind.ndim, dtype=np.dtype(str(kind.dtype))) for kind in kinds)
        self._slot: dict[int, tuple[int, int, Any]] = {}  # id(obj) -> (slot, generation, obj kept alive)
        self._free: list[int] = []

    def _put(self, obj: Any, arrays: Sequence[np.ndarray], generation: int = 0) -> int:
        """The slot of `obj`, its entries set to `arrays` (a new slot, a freed one, or its own)."""
        got = self._slot.get(id(obj))
        if got is not None or self._free:
            k = got[0] if got is not None else self._free.pop()
            for lst, a in zip(self.lists, arrays):
                lst[k] = a
        else:
            k = len(self.lists[0])
            for lst, a in zip(self.lists, arrays):
                lst.append(a)
        self._slot[id(obj)] = (k, generation, obj)
        return k

    def _retain(self, live: set[int]) -> None:
        """Free the slots of objects whose ids are not in `live`."""
        for key in [key for key in self._slot if key not in live]:
            k = self._slot.pop(key)[0]
            self._free.append(k)
            for lst, empty in zip(self.lists, self._empty):
                lst[k] = empty

    def __len__(self) -> int:
        return len(self._slot)


class FlatSlots(_Slots):
    """The arrays of attached `FlatIndex`es (`kernel.HistoryArrays`), all indexed `max_match` deep."""
    def __init__(self, max_match: int) -> None:
        super().__init__((_I32, _I32, _U64, _U64, _I64, _F64))
        self.arrays = HistoryArrays(*self.lists)
        self.max_match = max_match

    def slot(self, index: PromptIndex) -> int:
        """The slot of `index`'s history (-1: not attached yet)."""
        flat = index.flat
        if flat is None:
            return -1
        got = self._slot.get(id(flat))
        if got is not None:
            return got[0]
        if flat.max_match != self.max_match:
            raise ValueError(f"a history indexed with max_match {flat.max_match} cannot be drafted with max_match "
                             f"{self.max_match}: build its FlatIndex with the drafter's spec.max_match")
        key = np.ascontiguousarray(flat.key, np.uint64)
        return self._put(flat, (np.ascontiguousarray(flat.text, np.int32), np.ascontiguousarray(flat.sa, np.int32),
                                key, key[::SAMPLE].copy(), np.ascontiguousarray(flat.starts, np.int64),
                                np.asarray(index.rewards[:index.base], dtype=np.float64)))

    def retain(self, indexes: Sequence[PromptIndex]) -> None:
        """Free the slots of histories not among `indexes`'."""
        self._retain({id(ix.flat) for ix in indexes if ix.flat is not None})


class SideSlots(_Slots):
    """The arrays of `SideIndex`es: `kernel.SiblingArrays`, and state."""
    def __init__(self) -> None:
        super().__init__((_I32_2D, _I64, _I64_2D, _I32_2D, _F64, _I64))
        self.arrays = SiblingArrays(*self.lists[:5])
        self.tok, self.lens, self.table, self.links, self.rewards, self.state = self.lists
        side = SideIndex(1, 2)  # compile (or load) the compiled growth now, not inside an engine step
        for _ in range(ROWS + 1):  # more sequences than rows: the codes are rewritten
            side.add([1])
        side.extend(0, list(range(80)))  # wider rows (copied), a larger table (rehashed)
        for dtype in (np.int32, np.int64):
            self.extend_rows([side], np.zeros(1, np.int64), np.zeros(1, np.int64), np.array([[1, 2]], dtype),
                             np.zeros(1, np.int64), np.zeros(1, np.int64), np.ones(1, np.int64))
        self._retain(set())

    def slot(self, side: SideIndex) -> int:
        """The slot of `side`, its entries replaced if its arrays were reallocated since."""
        got = self._slot.get(id(side))
        if got is not None and got[1] == side.generation:
            return got[0]
        return self._put(side, (side.tok, side.lens, side.table, side.links, side.rewards, side.state),
                         side.generation)

    def extend_rows(self, sides: Sequence[SideIndex], which: np.ndarray, seq_ids: np.ndarray, tokens: np.ndarray,
                    row_ids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        """`SideIndex.extend_rows` for many indexes (one min_match..max_match) in one compiled call:
        row j to seq_ids[j] (distinct) of sides[which[j]]."""
        if not len(seq_ids):
            return
        at = np.fromiter((self.slot(side) for side in sides), np.int64, len(sides))
        longest, total = (np.zeros(len(self.tok), np.int64) for _ in range(2))
        rows_at, seq_ids = at[np.asarray(which, np.int64)], np.asarray(seq_ids, np.int64)
        starts, ends, row_ids = (np.asarray(a, np.int64) for a in (starts, ends, row_ids))
        ordered = appending_many(self.lens, self.state, rows_at, seq_ids, starts, ends, longest, total)
        if ordered < 0:
            raise ValueError(f"unknown sibling sequence id in {seq_ids.tolist()}")
        lo, hi = sides[0].min_match, sides[0].max_match
        grow = np.zeros(len(sides), np.bool_)
        crowded(self.tok, self.table, self.state, at, longest, total, hi - lo + 1, grow)
        for j in np.flatnonzero(grow).tolist():
            sides[j].reserve(longest[at[j]], total[at[j]])
            self.slot(sides[j])  # its arrays, reallocated
        if not ordered:  # each index's rows together, in their order
            by = np.argsort(rows_at, kind="stable")
            rows_at, seq_ids, row_ids, starts, ends = rows_at[by], seq_ids[by], row_ids[by], starts[by], ends[by]
        append_many(self.tok, self.lens, self.table, self.links, self.state, rows_at, seq_ids, tokens, row_ids,
                    starts, ends, lo, hi)

    def retain(self, indexes: Sequence[PromptIndex]) -> None:
        """Free the slots of siblings not among `indexes`'."""
        self._retain({id(ix.side) for ix in indexes})


class BatchIndexDrafter:
    """Many rows' own drafts per kernel call: exactly `HistoSpecDrafter(index).own(context, budget)`."""
    def __init__(self, spec: SpecConfig, max_candidates: int = MAX_CANDIDATES, sides: SideSlots | None = None) -> None:
        self.spec, self.limit = spec, max_candidates
        self.params = Params(max_candidates, spec.min_match, spec.max_match, float(spec.max_spec_factor),
                             spec.reward_weighted, float(spec.min_token_prob), PRIOR)
        self.slots = FlatSlots(spec.max_match)
        self.sides = sides if sides is not None else SideSlots()  # the caller's, to share with its growth
        self._compiled: dict[Any, Any] = {}  # the kernel's compiled entry point by the token rows' type
        self._warm()

    def draft_groups(self, indexes: Sequence[PromptIndex], which: np.ndarray, row_ids: Sequence[int],
                     nums: Sequence[int], budgets: Sequence[int], tokens: np.ndarray) -> Drafts:
        """Row r drafts from indexes[which[r]] (distinct); R x W outputs, W the largest budget."""
        count, which = len(which), np.asarray(which, np.int64)
        slots = np.fromiter((self.slots.slot(ix) for ix in indexes), np.int64, len(indexes))[which]
        sides = np.fromiter((self.sides.slot(ix.side) if ix.side.occurrences else -1 for ix in indexes), np.int64,
                            len(indexes))[which]
        shifts = np.fromiter((ix.base * STRIDE for ix in indexes), np.int64, len(indexes))[which]
        budgets = np.asarray(budgets, np.int64)
        width = max(1, int(budgets.max(initial=0)))
        out = Drafts(np.zeros((count, width), np.int64), np.zeros(count, np.int64), np.zeros(count, np.int64),
                     np.zeros(count, np.float64), np.zeros((count, width), np.float64))
        rows = Rows(slots, sides, shifts, *(np.ascontiguousarray(a, np.int64) for a in (row_ids, nums, budgets)))
        args = (self.slots.arrays, self.sides.arrays, tokens, rows, self.params, out)
        call = self._compiled.get((tokens.dtype, tokens.flags.c_contiguous))
        if call is None:
            draft_rows(*args)
            self._compiled[tokens.dtype, tokens.flags.c_contiguous] = _entry_point(draft_rows, args)
        else:
            call(*args)
        return out

    def retain(self, indexes: Sequence[PromptIndex]) -> None:
        """Free the slots of indexes not among `indexes` (their prompts were dropped)."""
        self.slots.retain(indexes)
        self.sides.retain(indexes)

    def _warm(self) -> None:
        """Compile (or load from numba's cache) the kernel now, not inside an engine step."""
        index = PromptIndex.build(np.array([1, 2, 3, 1, 2, 4], np.int32), [3, 3], [1.0, 0.0],
                                  min_match=self.spec.min_match, max_match=self.spec.max_match)
        index.add([1, 2])
        saved = self.slots, self.sides
        self.slots, self.sides = FlatSlots(self.spec.max_match), SideSlots()
        try:
            for dtype in (np.int32, np.int64):
                self.draft_groups([index], np.zeros(2, np.int64), [0, 0], [2, 2], [2, 2], np.array([[1, 2]], dtype))
            self.retain([])  # typed-list item assignment compiles too
        finally:
            self.slots, self.sides = saved


def _entry_point(kernel: Any, args: tuple) -> Any:
    """The compiled function `kernel` runs for `args`' types, bypassing the dispatcher's slow lookup."""
    return kernel.overloads[tuple(numba.typeof(a) for a in args)].entry_point


class HistoryBuilds:
    """Histories indexed on their prompt's first request: in the step up to `INLINE_TOKENS` a step (all
    with `background=False`), else by a background thread; a build's error is raised at the next step."""
    def __init__(self, spec: SpecConfig, background: bool = True) -> None:
        self.spec, self.background = spec, background
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        self._built: list[tuple[int, float]] = []  # (tokens, seconds) of finished builds, to count
        self._lock = threading.Lock()
        self._inline_left = INLINE_TOKENS

    def new_step(self, stats: SpecStats) -> None:
        """Start a step: its allowance of history built in the step; the builds finished since counted."""
        self._inline_left = INLINE_TOKENS
        self.count(stats)

    def submit(self, index: PromptIndex, tokens: np.ndarray, lengths: np.ndarray, rewards: np.ndarray,
               prefix: np.ndarray) -> None:
        """Index a prompt's flat history after `prefix` and attach it to `index` (now if small)."""
        if not self.background or len(tokens) <= self._inline_left:
            self._inline_left -= len(tokens)
            self._build(index, tokens, lengths, rewards, prefix)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="histospec-index")
        self._pending.append(self._pool.submit(self._build, index, tokens, lengths, rewards, prefix))

    def _build(self, index: PromptIndex, tokens: np.ndarray, lengths: np.ndarray, rewards: np.ndarray,
               prefix: np.ndarray) -> None:
        t0 = time.perf_counter()
        tokens, lengths, _ = indexed_history(self.spec, prefix, tokens, lengths, rewards)
        flat = FlatIndex.build(tokens, lengths, prefix, min_match=self.spec.min_match, max_match=self.spec.max_match)
        index.attach(flat)
        with self._lock:
            self._built.append((flat.num_tokens, time.perf_counter() - t0))

    def count(self, stats: SpecStats) -> None:
        """Count finished builds in `stats`; re-raise a build's error here, in the engine's thread."""
        if self._pending:
            done = [f for f in self._pending if f.done()]
            self._pending = [f for f in self._pending if not f.done()]
            for f in done:
                f.result()
        if self._built:
            with self._lock:
                built, self._built = self._built, []
            for tokens, seconds in built:
                stats.index_tokens += tokens
                stats.index_seconds += seconds

    @property
    def building(self) -> int:
        """Histories being indexed in the background now."""
        return sum(not f.done() for f in self._pending)

    def wait(self, stats: SpecStats) -> None:
        """Block until every background build is attached, and count them in `stats`."""
        for f in list(self._pending):
            f.result()
        self.count(stats)
