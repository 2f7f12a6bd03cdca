"""Growing the siblings and the cross-prompt tree with an engine step's new tokens (`StepGrowth`),
in the step or behind it.

Every engine step adds each running request's new tokens to its prompt's siblings (`SideIndex`, one
compiled call for all prompts) and, every `TREE_CHUNK` tokens, to the cross-prompt tree. At 256
requests with 8K-token contexts that is most of what the drafter costs a step (~1 ms of ~2 ms on
this project's CPU: occurrence inserts into tables of ~1M keys per prompt, the tree's suffix updates,
and the tables' doublings); none of it is needed until the next step drafts.

`behind=True` (`spec.grow_behind`) hands the step's growth to one helper thread when the step's
drafts are out, so it runs while the engine computes the next forward pass, and the next `propose`
waits for it (`new_step`) before it touches an index. What the helper reads is copied out of the
engine's token rows first: the engine reorders and overwrites those rows while the helper runs.
Drafts then see the siblings as of the step before: a sibling's last step of tokens is not yet in
its prompt's index when a request drafts (its own context is read from the engine's rows, always
current). Speculation stays lossless whatever is drafted; the effect on acceptance is measured by
`rhymerl bench spec` (the `siblings` arm). The compiled insert and rehash release the GIL; Arctic
Inference's tree update holds it (its binding does not release it), as it did in the step.

Catch-up allowances (a request that arrives with a long prefix, moved from another worker or
preempted, joins the siblings and the tree over several steps instead of stalling one) are counted
here too: `catch_up` shares the step's `SIDE_CATCH_UP` / `TREE_CATCH_UP` tokens. Engine thread only,
except the helper's own work.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Sequence

import numpy as np

from rhymerl.histospec.side import SideIndex
from rhymerl.histospec.slots import SideSlots
from rhymerl.histospec.tree import RecentTree

# Tokens a step adds to the siblings / the cross-prompt tree beyond its requests' new ones: a request
# that arrives with a long prefix (moved from another worker, or preempted and recomputed) catches up
# over steps instead of stalling one (256 requests of 8K tokens: 6 s in one step).
SIDE_CATCH_UP = 2048
TREE_CATCH_UP = 512


class StepGrowth:
    """One step's additions to the siblings (`siblings`) and the tree (`tree`), applied at once or,
    with `behind`, by the helper thread from `start` until the next `new_step` (or `finish`)."""

    def __init__(self, sides: SideSlots, recent: RecentTree | None, behind: bool) -> None:
        self.sides, self.recent, self.behind = sides, recent, behind
        self._pool: ThreadPoolExecutor | None = None
        self._running: Future | None = None
        self._due: list[Callable[[], None]] = []  # this step's work, not yet handed to the helper
        self.seconds = 0.0  # the helper's CPU seconds so far (read after `finish`)
        self.left = {"side": SIDE_CATCH_UP, "tree": TREE_CATCH_UP}  # this step's catch-up allowances
        self.lagging = 0  # tokens of this step's requests not yet in the siblings or the tree

    def new_step(self) -> None:
        """Wait for the previous step's growth (re-raising its error here), reset the allowances."""
        self.finish()
        self.left, self.lagging = {"side": SIDE_CATCH_UP, "tree": TREE_CATCH_UP}, 0

    def catch_up(self, due: np.ndarray, steady: np.ndarray, kind: str) -> np.ndarray:
        """Tokens each row adds this step to the siblings (kind "side") or the tree ("tree"): what it
        is due, up to what it would add had it never fallen behind (`steady`); the rows still behind
        share the step's allowance for `kind` beyond that, first rows first. The rest waits for
        later steps (counted in `lagging`)."""
        base = np.minimum(due, steady)
        behind = due - base
        if not behind.any():  # every step but a catch-up's: nothing to share
            return due
        left = self.left[kind]
        extra = np.clip(left - (np.cumsum(behind) - behind), 0, behind)
        self.left[kind] = left - int(extra.sum())
        self.lagging += int((behind - extra).sum())
        return base + extra

    def siblings(self, sides: Sequence[SideIndex], which: np.ndarray, seq_ids: np.ndarray, tokens: np.ndarray,
                 rows: np.ndarray, held: np.ndarray, upto: np.ndarray) -> None:
        """Append tokens[rows[j], held[j]:upto[j]] to sibling seq_ids[j] of sides[which[j]], for all j."""
        if not self.behind:
            self.sides.extend_rows(sides, which, seq_ids, tokens, rows, held, upto)
            return
        flat, starts, ends = _gather(tokens, rows, held, upto)
        zeros = np.zeros(len(rows), np.int64)
        self._due.append(lambda: self.sides.extend_rows(sides, which, seq_ids, flat, zeros, starts, ends))

    def tree(self, handles: np.ndarray, tokens: np.ndarray, rows: np.ndarray, held: np.ndarray,
             upto: np.ndarray) -> None:
        """Append tokens[rows[j], held[j]:upto[j]] to the tree's response handles[j], for all j."""
        parts = [(h, as_int32(tokens[r, a:b], copy=self.behind))
                 for h, r, a, b in zip(handles.tolist(), rows.tolist(), held.tolist(), upto.tolist())]
        extend = self.recent.extend_array

        def apply() -> None:
            for handle, part in parts:
                extend(handle, part)

        if self.behind:
            self._due.append(apply)
        else:
            apply()

    def start(self) -> None:
        """Hand this step's growth to the helper thread (with `behind`; otherwise it is done)."""
        if not self._due:
            return
        work, self._due = self._due, []
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="histospec-grow")
        self._running = self._pool.submit(self._run, work)

    def finish(self) -> None:
        """Block until the helper's growth is applied; re-raise its error in this thread."""
        running, self._running = self._running, None
        if running is not None:
            running.result()

    def _run(self, work: list[Callable[[], None]]) -> None:
        t0 = time.thread_time()
        for apply in work:
            apply()
        self.seconds += time.thread_time() - t0


def _gather(tokens: np.ndarray, rows: np.ndarray, held: np.ndarray,
            upto: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """tokens[rows[j], held[j]:upto[j]] for all j, copied into one (1, total) row, with each part's
    start and end in it: what the helper reads instead of the engine's rows."""
    counts = upto - held
    ends = np.cumsum(counts)
    starts = ends - counts
    cols = np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(starts - held, counts)
    return np.ascontiguousarray(tokens[np.repeat(rows, counts), cols]).reshape(1, -1), starts, ends


def as_int32(tokens: np.ndarray, copy: bool = False) -> np.ndarray:
    """`tokens` (a slice of one token row) as the int32 array the library takes: the row itself when
    the engine's rows are int32 (vLLM's are) and no copy is asked for, else a copy of the slice alone,
    never of all rows."""
    if tokens.dtype == np.int32:
        return tokens.copy() if copy else tokens
    return tokens.astype(np.int32)
