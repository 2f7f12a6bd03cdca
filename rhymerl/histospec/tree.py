"""The cross-prompt tree of HistoSpec: recent responses of every prompt (`RecentTree`), on Arctic
Inference's C++ suffix tree (the engine of vLLM's `suffix` method).

A request drafts from its prompt's own n-gram table (`rhymerl.histospec.index`: the prompt's earlier
epochs and its siblings) and from this tree, whichever draft scores higher (`HistoSpecDrafter`). The
tree holds the last `capacity` responses of all prompts, growing as they are generated, oldest evicted
first — what vLLM's stock per-engine cache holds at scale. It is what a prompt without history (epoch
0, a prompt never seen) drafts from besides its siblings, and it carries what all prompts share (the
task's answer format).

Why the library here and RhymeRL's table per prompt: on a default run's responses (replay, 2026-12-03)
the library's tree per prompt, holding exactly the table's history, drafted less well from epoch 1 on
than the table's longest-match, most-recent-first walk (4.51 vs 5.16 tokens per verification in epoch
1, both with this tree beside them), while the tree is the right structure for a large, churning set
of responses: C++, per-node counts, a draft's tokens carry probability estimates (the count share of
the chosen child), drafts of every match length are scored by the sum of those probabilities and
capped at `max_spec_factor` x the match length, and evicting a response is one call.

The library is imported lazily; without it `require_arctic_inference` names the fix (`make setup`).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Sequence

import numpy as np

from rhymerl.histospec.suffix import require_arctic_inference

# A response's tokens join the tree this many at a time (the engine and the replay alike): one library
# call per request per step cost ~3 us, as much as the rest of its drafting; the tree then lags each
# response by fewer than TREE_CHUNK tokens, which only drafts for other requests can miss (a request's
# own context comes from its row, not from the tree).
# Replay of a default run (2026-12-03), tokens per verification overall / epoch 0: chunk 1 5.228 / 2.504,
# 4 5.205 / 2.503, 8 5.183 / 2.482. Where drafts are accepted a request gains ~5 tokens a step anyway.
TREE_CHUNK = 4
_NO_FACTOR = 1e9  # max_spec_factor 0 means "no cap": the library wants a number


def _new_tree(depth: int) -> Any:
    require_arctic_inference()
    from arctic_inference.suffix_decoding._C import SuffixTree

    return SuffixTree(depth)


class RecentTree:
    """The last `capacity` responses of every prompt, growing as generated, oldest evicted first.

    `start()` opens a response (evicting the oldest beyond `capacity`) and returns its handle;
    `extend(handle, tokens)` appends to it while it is still held (a no-op once evicted).
    """

    def __init__(self, capacity: int, depth: int = 64) -> None:
        if capacity < 1 or depth < 2:
            raise ValueError(f"RecentTree needs capacity >= 1 and depth >= 2, got {capacity}, {depth}")
        self.capacity = capacity
        self.depth = depth
        self.tree = _new_tree(depth)
        self.held: deque[int] = deque()
        self.lengths: dict[int, int] = {}  # handle -> tokens, for responses still held
        self._next = 0

    def start(self, tokens: Sequence[int] = ()) -> int:
        """Open a response with its first `tokens`; its handle."""
        handle = self._next
        self._next = (self._next + 1) & 0x7FFFFFFF  # the library's ids are int32
        self.held.append(handle)
        self.lengths[handle] = 0
        while len(self.held) > self.capacity:
            old = self.held.popleft()
            del self.lengths[old]
            self.tree.remove(old)
        self.extend(handle, tokens)
        return handle

    def extend(self, handle: int, tokens: Sequence[int]) -> None:
        self.extend_array(handle, np.asarray(tokens, dtype=np.int32))

    def extend_array(self, handle: int, tokens: np.ndarray) -> None:
        """`extend` from an int32 array (a view of the engine's token row: no list per call)."""
        if handle in self.lengths and len(tokens):
            self.tree.extend_ndarray(handle, tokens)
            self.lengths[handle] += len(tokens)

    def speculate_rows(self, tokens: np.ndarray, rows: np.ndarray, ends: np.ndarray, budgets: np.ndarray,
                       max_spec_factor: float, min_token_prob: float, beat: np.ndarray
                       ) -> tuple[list[int], list[int], list[int], list[float]]:
        """`speculate(tokens[rows[j], :ends[j]], budgets[j], ...)` for every j (the engine step's rows
        that ask the tree: a row's context is its first ends[j] tokens), keeping the drafts that score
        above beat[j]: (their js, their lengths, their tokens one after another, their probabilities
        likewise). The winners' lists are joined for the caller's one write (a NumPy write of each
        row's lists cost ~2 us, a third of the library's call, 2026-12-06)."""
        speculate, factor = self.tree.speculate_ndarray, max_spec_factor or _NO_FACTOR
        won: list[int] = []
        sizes: list[int] = []
        flat: list[int] = []
        probs: list[float] = []
        for j, (i, n, budget, own) in enumerate(zip(rows.tolist(), ends.tolist(), budgets.tolist(), beat.tolist())):
            # its last `depth` tokens, a view of the row: int32 in vLLM, read in place (the binding
            # converts other integer types)
            context = tokens[i, max(0, n - self.depth):n]
            draft = speculate(context, budget, factor, 0.0, min_token_prob, False)
            if draft.score > own:
                drafted = draft.token_ids
                won.append(j)
                sizes.append(len(drafted))
                flat += drafted
                probs += draft.probs
        return won, sizes, flat, probs

    def speculate(self, context: Sequence[int], budget: int, max_spec_factor: float,
                  min_token_prob: float) -> tuple[tuple[int, ...], int, float, tuple[float, ...]]:
        """(tokens, match length, score, per-token probabilities) of the tree's best draft after
        `context` (its last `depth` tokens).

        The library tries every match length, drafts greedily along the most frequent child while the
        product of the children's count shares stays >= `min_token_prob`, at most `budget` tokens and
        `max_spec_factor` x the match length (0: no cap), and keeps the draft with the highest score
        (the sum of its tokens' probabilities).
        """
        context = [int(t) for t in context[-self.depth:]]
        if budget <= 0 or not context:
            return (), 0, 0.0, ()
        d = self.tree.speculate(context, budget, max_spec_factor or _NO_FACTOR, 0.0, min_token_prob, False)
        return tuple(d.token_ids), int(d.match_len), float(d.score), tuple(d.probs)

    def memory_bytes(self) -> int:
        """The library's estimate of the tree's memory."""
        return int(self.tree.estimate_memory())

    @property
    def num_tokens(self) -> int:
        """Tokens held (responses not yet evicted)."""
        return sum(self.lengths.values())

    def __len__(self) -> int:
        return len(self.held)
