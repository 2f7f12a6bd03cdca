"""Indexing the histories of an engine's prompts for its drafter (`HistoryBuilds`).

A prompt's history (`FlatIndex`: its earlier responses, and with `spec.prompt_lookup` the prompt
itself) is indexed when its first request reaches the engine. A small one (at most `INLINE_TOKENS`
per step in all) is built in the step, where it costs less than a thread hand-off; a larger one by
one background thread (numpy releases the GIL while it sorts), attached to its `PromptIndex` when
ready, so a step never waits for a build: until then the prompt's requests draft from their
siblings. Errors of a background build are raised in the engine's thread, at its next step
(`count`). Engine thread only, except the builds themselves.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from rhymerl.histospec.flat import FlatIndex, PromptIndex, warm
from rhymerl.histospec.spec_config import SpecConfig
from rhymerl.histospec.stats import SpecStats

INLINE_TOKENS = 4096  # history tokens a step may index itself (~1 ms); larger ones build in the background


class HistoryBuilds:
    """The histories being indexed, in the step (small, or all with `background=False`) or by a
    background thread, and the counts of those built (`count`)."""

    def __init__(self, spec: SpecConfig, background: bool = True) -> None:
        self.spec, self.background = spec, background
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []  # futures of background builds
        self._built: list[tuple[int, float]] = []  # (tokens, seconds) of finished builds, to count
        self._lock = threading.Lock()
        self._inline_left = INLINE_TOKENS
        warm()  # its compiled loops: a small history is built in the step

    def new_step(self, stats: SpecStats) -> None:
        """Start a step: its allowance of history built in the step, and the builds finished since
        counted (`count`)."""
        self._inline_left = INLINE_TOKENS
        self.count(stats)

    def submit(self, index: PromptIndex, tokens: np.ndarray, lengths: np.ndarray, rewards: np.ndarray,
               prefix: np.ndarray) -> None:
        """Index a prompt's history (responses flat in `tokens`, `lengths` and `rewards` each, after
        the prompt `prefix`) and attach it to `index`: now if small, else in the background."""
        if not self.background or len(tokens) <= self._inline_left:
            self._inline_left -= len(tokens)
            self._build(index, tokens, lengths, rewards, prefix)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="histospec-index")
        self._pending.append(self._pool.submit(self._build, index, tokens, lengths, rewards, prefix))

    def _build(self, index: PromptIndex, tokens: np.ndarray, lengths: np.ndarray, rewards: np.ndarray,
               prefix: np.ndarray) -> None:
        """Build a history (`SpecConfig.indexed_history` of the prompt's: the concatenation too is
        off the step, ~0.75 ms at 256K tokens) and attach it to `index`."""
        t0 = time.perf_counter()
        tokens, lengths, _ = self.spec.indexed_history(prefix, tokens, lengths, rewards)
        flat = FlatIndex.build(tokens, lengths, prefix, min_match=self.spec.min_match,
                               max_match=self.spec.max_match)
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
