"""The siblings' part of a prompt's index (`SideIndex`): this step's samples of the prompt, growing
every engine step (layout: `rhymerl.histospec.sibling_table`). It answers the longest context tail
that occurred with a token after it, and that tail's most recent occurrences. Sequence ids count
from 0 in insertion order; each sequence starts with `prefix` (the prompt's last tokens, <= max_match).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rhymerl.histospec.sibling_table import (NKEYS, NOCC, NSEQ, STATE, STRIDE, append_rows, appending_many,
                                             copy_rows, index_ends, longest, recent, rehash, relayout, table_full,
                                             tail_keys)

ROWS = 16  # sequences the arrays hold from the start: a GRPO group's samples


class SideIndex:
    """Occurrences of every n-gram (min_match..max_match) in one prompt's growing sequences."""
    def __init__(self, min_match: int = 1, max_match: int = 7, prefix: Sequence[int] = ()) -> None:
        if not 1 <= min_match <= max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got min_match={min_match}, "
                             f"max_match={max_match}")
        self.min_match, self.max_match = min_match, max_match
        self.prefix = np.asarray([int(t) for t in prefix][-max_match:], dtype=np.int32)
        self.state = np.zeros(STATE, dtype=np.int64)  # NSEQ, NOCC, NKEYS
        self.tok = np.zeros((ROWS, 64), dtype=np.int32)
        self.lens = np.zeros(ROWS, dtype=np.int64)
        self.rewards = np.zeros(ROWS, dtype=np.float64)
        self.table = np.full((64, 2), -1, dtype=np.int64)  # (key bits, newest occurrence) per slot
        self.links = np.zeros((self.tok.size, max_match - min_match + 1), dtype=np.int32)  # per position and n
        self.generation = 0  # bumped whenever an array above is reallocated (the engine's slots re-read them)

    def add(self, tokens: Sequence[int] = (), reward: float = 0.0) -> int:
        """Start a new sequence (prefix + `tokens`) and return its id."""
        seq, plen = int(self.state[NSEQ]), len(self.prefix)
        if seq >= STRIDE:
            raise ValueError("index holds too many sequences; build a fresh one per step")
        self.reserve(plen, plen, seqs=seq + 1)
        self.state[NSEQ] = seq + 1
        self.rewards[seq] = float(reward)
        self.lens[seq] = plen
        self.tok[seq, :plen] = self.prefix
        index_ends(self.tok, self.table, self.links, self.state, seq, 1, plen, self.min_match, self.max_match)
        if len(tokens):
            self.extend(seq, tokens)
        return seq

    def extend(self, seq_id: int, tokens: Sequence[int]) -> None:
        """Append `tokens` to sequence `seq_id` (a sibling that generated more tokens)."""
        row = np.asarray(tokens, dtype=np.int32).reshape(1, -1)
        self.extend_rows(np.array([seq_id]), row, np.zeros(1, np.int64), np.zeros(1, np.int64),
                         np.array([row.shape[1]]))

    def extend_rows(self, seq_ids: np.ndarray, tokens: np.ndarray, row_ids: np.ndarray, starts: np.ndarray,
                    ends: np.ndarray) -> None:
        """Append tokens[row_ids[j], starts[j]:ends[j]] to sequence seq_ids[j] (distinct), in order."""
        seq_ids, starts, ends = (np.asarray(a, np.int64) for a in (seq_ids, starts, ends))
        if not len(seq_ids):
            return
        longest_after, total = np.zeros(1, np.int64), np.zeros(1, np.int64)
        if appending_many((self.lens,), (self.state,), np.zeros(len(seq_ids), np.int64), seq_ids, starts, ends,
                          longest_after, total) < 0:
            raise ValueError(f"unknown sequence id in {seq_ids.tolist()}; ids run 0..{self.state[NSEQ] - 1}")
        self.reserve(int(longest_after[0]), int(total[0]))
        append_rows(self.tok, self.lens, self.table, self.links, self.state, seq_ids, tokens,
                    np.asarray(row_ids, np.int64), starts, ends, self.min_match, self.max_match)

    def reserve(self, length: int, new_tokens: int, seqs: int | None = None) -> None:
        """Grow the arrays (by doubling) for `seqs` sequences (default: those held), one of `length`
        tokens, and `new_tokens` more filed tokens."""
        seqs = int(self.state[NSEQ]) if seqs is None else seqs
        rows, cols = self.tok.shape
        if seqs > rows or length >= cols:  # a position may be `length` (a sequence's end): cols > length
            self._grow(max(rows, _pow2(seqs)), max(cols, _pow2(length + 1)))
        levels = self.max_match - self.min_match + 1
        if table_full(len(self.table), int(self.state[NKEYS]), new_tokens, levels):
            new = np.full((_pow2(2 * (int(self.state[NKEYS]) + new_tokens * levels)), 2), -1, dtype=np.int64)
            rehash(self.table, new)
            self.table, self.generation = new, self.generation + 1

    def _grow(self, rows: int, cols: int) -> None:
        """Reallocate the token rows as rows x cols and the links to match; more rows rewrite the codes."""
        if rows * cols >= 2 ** 31:
            raise ValueError(f"siblings of {rows} sequences x {cols} tokens overflow the index's int32 positions; "
                             "keep fewer sequences per prompt index (spec.siblings off or a shorter max_model_len)")
        old_rows = self.tok.shape[0]
        nseq = int(self.state[NSEQ])
        self.generation += 1
        tok = np.empty((rows, cols), dtype=np.int32)  # nothing reads past a row's length
        links = np.empty((rows * cols, self.links.shape[1]), dtype=np.int32)
        copy_rows(self.tok, self.lens, nseq, tok)
        if rows == old_rows:  # positions 0..the longest sequence's end keep their codes
            held = (int(self.lens.max(initial=0)) + 1) * rows
            links[:held] = self.links[:held]
        else:
            relayout(self.links, self.table, self.lens, nseq, old_rows, links, rows)
        self.tok, self.links = tok, links
        for name in ("lens", "rewards"):
            grown = np.zeros(rows, dtype=getattr(self, name).dtype)
            grown[:old_rows] = getattr(self, name)
            setattr(self, name, grown)

    def _keys(self, tail: Sequence[int]) -> tuple[np.ndarray, int]:
        q = np.asarray(tail[-self.max_match:], dtype=np.int64)[::-1].copy()
        keys = np.zeros(max(1, len(q)), dtype=np.uint64)
        tail_keys(q, len(q), keys)
        return keys, len(q)

    def longest(self, tail: Sequence[int]) -> int:
        """The longest n (min_match..max_match) whose tail of `tail` occurred with a token after; 0: none."""
        if not self.state[NOCC]:
            return 0
        keys, nq = self._keys(tail)
        return int(longest(self.lens, self.table, self.links, self.tok.shape[0], keys, nq, self.min_match,
                           self.min_match))

    def recent(self, tail: Sequence[int], n: int, limit: int) -> list[int]:
        """The `limit` most recent occurrence codes of `tail`'s last n tokens, oldest first."""
        if not self.state[NOCC] or n <= 0:
            return []
        keys, nq = self._keys(tail)
        if n > nq:
            raise ValueError(f"n={n} is longer than the tail ({nq} tokens of it are matched)")
        out = np.zeros(max(1, min(limit, int(self.state[NOCC]))), dtype=np.int64)
        count = recent(self.table, self.links, self.tok.shape[0], keys[n - 1], n - self.min_match, len(out), out)
        return out[:count].tolist()

    def gather(self, codes: Sequence[int], budget: int) -> list[list[int]]:
        """The tokens after each code, at most `budget`, up to its sequence's end (may be empty)."""
        out = []
        for c in codes:
            seq, pos = divmod(int(c), STRIDE)
            out.append(self.tok[seq, pos:min(pos + budget, int(self.lens[seq]))].tolist())
        return out

    def sequence(self, seq_id: int) -> list[int]:
        """Sequence `seq_id`'s tokens (prefix included)."""
        return self.tok[seq_id, :self.lens[seq_id]].tolist()

    @property
    def occurrences(self) -> int:
        """Occurrences filed (0: nothing to match)."""
        return int(self.state[NOCC])

    @property
    def num_tokens(self) -> int:
        """Tokens held, prefixes included."""
        return int(self.lens[:self.state[NSEQ]].sum())

    @property
    def nbytes(self) -> int:
        """Bytes of its arrays."""
        return sum(a.nbytes for a in (self.tok, self.lens, self.rewards, self.table, self.links))

    def __len__(self) -> int:
        return int(self.state[NSEQ])


def _pow2(n: int) -> int:
    """The smallest power of two >= max(n, 1)."""
    return 1 << max(0, int(n) - 1).bit_length()
