"""The arrays of many prompts' indexes as numba typed lists, indexed by slot (`FlatSlots`, `SideSlots`).

A compiled call cannot take a Python list of arrays, but it can take a typed list of them: the engine
step's one drafting call (`rhymerl.histospec.kernel.draft_rows`) reads each row's prompt's history
(`FlatIndex`) and siblings (`SideIndex`) through their slots. An index gets a slot the first time a
row reads it (its arrays are referenced, not copied); a `SideIndex` whose arrays were reallocated as
its siblings grew (`SideIndex.generation`) has its slot's entries replaced; `retain` frees the slots
of the indexes the caller dropped, for reuse. Engine thread only, but for `SideSlots.flush_all`,
which the engine's helper thread runs behind the step while the engine's thread reads no slot.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from numba import typed, types

from rhymerl.histospec.flat import PromptIndex
from rhymerl.histospec.search import SAMPLE
from rhymerl.histospec.side import ROWS, SideIndex
from rhymerl.histospec.side_arrays import appending_many, copy_many, crowded, flush_slots

_I32, _I64 = types.Array(types.int32, 1, "C"), types.Array(types.int64, 1, "C")
_U64, _F64 = types.Array(types.uint64, 1, "C"), types.Array(types.float64, 1, "C")
_I32_2D, _I64_2D = types.Array(types.int32, 2, "C"), types.Array(types.int64, 2, "C")


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
    """The arrays of attached `FlatIndex`es: texts, sas, keys, samples (every `search.SAMPLE`th
    key), starts, rewards (the history's). Every history is indexed `max_match` deep, the depth the
    drafting kernel matches to: it reads a run that deep as in position order (`FlatIndex`)."""

    def __init__(self, max_match: int) -> None:
        super().__init__((_I32, _I32, _U64, _U64, _I64, _F64))
        self.texts, self.sas, self.keys, self.samples, self.starts, self.rewards = self.lists
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
        """Free the slots of histories not among `indexes`' (their prompts were dropped)."""
        self._retain({id(ix.flat) for ix in indexes if ix.flat is not None})


class SideSlots(_Slots):
    """The arrays of `SideIndex`es (siblings): tok, lens, table, links, rewards, state, pend."""

    def __init__(self) -> None:
        super().__init__((_I32_2D, _I64, _I64_2D, _I32_2D, _F64, _I64, _I64_2D))
        self.tok, self.lens, self.table, self.links, self.rewards, self.state, self.pend = self.lists
        side = SideIndex(1, 2)  # compile (or load) the kernels now, not inside an engine step (~18 ms)
        for _ in range(ROWS + 1):  # more sequences than rows: the codes are rewritten
            side.add([1])
        side.extend(0, list(range(80)))  # wider rows (copied), a larger table (rehashed)
        side.room_ahead(64, 64, 1024)  # the next table, filled behind the step
        for dtype in (np.int32, np.int64):
            for defer in (True, False):
                self.extend_rows([side], np.zeros(1, np.int64), np.zeros(1, np.int64), np.array([[1, 2]], dtype),
                                 np.zeros(1, np.int64), np.zeros(1, np.int64), np.ones(1, np.int64), defer)
        self.flush_all(1, 2)
        self._retain(set())

    def slot(self, side: SideIndex) -> int:
        """The slot of `side`, its entries replaced if its arrays were reallocated since."""
        got = self._slot.get(id(side))
        if got is not None and got[1] == side.generation:
            return got[0]
        return self._put(side, (side.tok, side.lens, side.table, side.links, side.rewards, side.state, side.pend),
                         side.generation)

    def extend_rows(self, sides: Sequence[SideIndex], which: np.ndarray, seq_ids: np.ndarray, tokens: np.ndarray,
                    row_ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, defer: bool = False) -> None:
        """`SideIndex.extend_rows` for many indexes in one compiled call: row j appends
        tokens[row_ids[j], starts[j]:ends[j]] to sequence seq_ids[j] of sides[which[j]] (distinct
        sequences; each index's rows in order; one min_match..max_match for all). An engine step grows
        all its prompts' siblings so. With `defer`, the new n-grams are only noted (pending) until
        `flush_all` (the engine's helper thread, behind the step) files them; the drafting kernel and
        every `SideIndex` query answer meanwhile as if they were filed."""
        if not len(seq_ids):
            return
        at = np.fromiter((self.slot(side) for side in sides), np.int64, len(sides))
        longest, total, ranges = (np.zeros(len(self.tok), np.int64) for _ in range(3))
        rows_at, seq_ids = at[np.asarray(which, np.int64)], np.asarray(seq_ids, np.int64)
        starts, ends, row_ids = (np.asarray(a, np.int64) for a in (starts, ends, row_ids))
        ordered = appending_many(self.lens, self.state, rows_at, seq_ids, starts, ends, longest, total, ranges)
        if ordered < 0:
            raise ValueError(f"unknown sibling sequence id in {seq_ids.tolist()}")
        grow = np.zeros(len(sides), np.bool_)
        crowded(self.tok, self.table, self.state, self.pend, at, longest, total, ranges,
                sides[0].max_match - sides[0].min_match + 1, grow)
        for j in np.flatnonzero(grow).tolist():
            sides[j].reserve(longest[at[j]], total[at[j]], ranges[at[j]])
            self.slot(sides[j])  # its arrays, reallocated
        if not ordered:  # each index's rows together, in their order (an engine's rows mostly are)
            by = np.argsort(rows_at, kind="stable")
            rows_at, seq_ids, row_ids, starts, ends = rows_at[by], seq_ids[by], row_ids[by], starts[by], ends[by]
        copy_many(self.tok, self.lens, self.pend, self.state, rows_at, seq_ids, tokens, row_ids, starts, ends)
        if not defer:  # these indexes only: their slots are fresh, and only they took tokens or prefixes
            flush_slots(self.tok, self.table, self.links, self.state, self.pend, at, sides[0].min_match,
                        sides[0].max_match)

    def flush_all(self, min_match: int, max_match: int) -> None:
        """File every slot's pending n-grams (`SideIndex.flush`; releases the GIL: the engine's helper
        thread runs it behind the step, the engine's thread reading no slot meanwhile)."""
        for _, generation, side in list(self._slot.values()):
            if side.generation != generation:  # reallocated since its slot was set (its pending ranges too)
                self.slot(side)
        flush_slots(self.tok, self.table, self.links, self.state, self.pend, np.arange(len(self.state)), min_match,
                    max_match)

    def retain(self, indexes: Sequence[PromptIndex]) -> None:
        """Free the slots of siblings not among `indexes`' (their prompts were dropped)."""
        self._retain({id(ix.side) for ix in indexes})
