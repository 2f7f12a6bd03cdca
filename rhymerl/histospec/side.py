"""The siblings' part of a prompt's index, in arrays a compiled step reads and grows (`SideIndex`;
its compiled queries: `rhymerl.histospec.side_search`).

A prompt's samples of the current step (its siblings) grow by a few tokens every engine step, so
they cannot live in the read-only suffix array of its history (`rhymerl.histospec.flat`). They live
here: the same n-gram occurrence table as `rhymerl.histospec.index.SuffixIndex` (every n-gram of
`min_match..max_match` tokens, keyed by the same 64-bit hash, listing where it ended as
`seq_id * STRIDE + position` codes in insertion order), answering the same questions with the same
answers, but stored as flat arrays instead of a dict of Python lists:

- the sequences: one int32 row per sibling (prompt tail + response), doubled when one outgrows it;
  a position's local code is position * rows + seq (rows: how many sequences the arrays hold, a
  power of two), so wider rows keep every code (the links are copied, the table untouched: when the
  codes were seq * width + position, widening rewrote all of them, 16-26 ms at 8K-token siblings,
  2026-12-05), and the siblings of a group, which advance in lockstep, write neighbouring links;
- the table: open addressing (linear probing, at most half full), each slot a (key, newest
  occurrence's local code) pair in one row, so a probe reads one cache line (key and head in two
  arrays read two: inserts took ~25% longer in a standalone trial);
- the links: for every position and n, the local code of the n-gram's occurrence before the one
  ending there (int32, -1: none), so a key's occurrences are a chain, newest first (its `limit` most
  recent are its first `limit` links). A position's links for all n sit side by side: one cache line
  written per new token;
- the pending ranges: (seq, first end, last end) of tokens appended whose n-grams are not filed yet
  (`pend`, in append order, `flush` files them in that order). The engine step appends its tokens
  and the helper thread files them behind the step (filing was ~0.5 of a ~2.5 ms step at 256
  requests, the table's cache misses mostly, 2026-12-06); its drafting kernel reads the pending ones
  where they lie (`rhymerl.histospec.side_search`), every query here files them first, and a new
  sequence's prefix waits among them, so the chains end as if each n-gram were filed when appended.

Why: at 256 requests per engine step the dict table cost ~25 us per request per step in Python (the
keys of the growing tails, the appends, the longest-match loop): more than the whole step may spend
drafting (issue 17). Here growing all of a prompt's siblings by a step is one compiled call, and the
batch drafter reads the siblings' continuations in its one drafting call (`rhymerl.histospec.kernel`).
Memory: 4 bytes of link per n-gram length (7 by default) and 4 of token per position of the rows,
plus the table (16 bytes a slot, 32-64 per distinct n-gram). `rhymerl bench spec-scale --spec engine`
at 256 requests x 8K-token contexts (16 prompts, rhyming siblings, ~1.8 distinct n-grams per token):
128 bytes per sibling token, 403 MB for 3.15M tokens (a link record of (code, link) per occurrence,
int64 each, took 261, 822 MB; it was also ~7% slower per step, 2026-12-05). The table holds a
slot's key as the int64 with the same bits as its uint64 hash; a free slot's head is -1.
`tests/rhymerl/histospec/test_histospec_side.py` checks it against `SuffixIndex`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rhymerl.histospec.index import STRIDE
from rhymerl.histospec.pages import small_pages
from rhymerl.histospec.side_arrays import (NKEYS, NOCC, NPEND, NPTOK, NSEQ, STATE, appending_many, copy_rows,
                                           copy_rows_of, pend, rehash, relayout, relayout_heads, table_full)
from rhymerl.histospec.side_arrays import flush as flush_pending
from rhymerl.histospec.side_search import longest, recent, tail_keys

# Sequences the arrays hold from the start: a GRPO group's samples join in their first steps, and each
# time they outgrow the rows every code is rewritten (position * rows + seq; 14 ms in the step that
# opened 16 prompts of 16 samples with 4 rows to start with, 2026-12-05). 16 x 64 positions: 32 KB.
ROWS = 16
PENDING = 2 * ROWS  # pending ranges room from the start: a step's rows of a prompt, its new sequences' prefixes
FILL_SLOTS = 1 << 17  # table slots `room_ahead` fills per call (2 MB: ~2 ms of page faults here)
SOON = 2  # `room_ahead` may make room this many steps' growth early (within its allowance)


class SideIndex:
    """Occurrences of every n-gram (min_match..max_match) in one prompt's growing sequences.

    Sequence ids count from 0 in insertion order (later = more recent); each sequence starts with
    `prefix` (the prompt's last tokens, at most max_match). Same answers as `SuffixIndex`.
    """

    def __init__(self, min_match: int = 1, max_match: int = 7, prefix: Sequence[int] = ()) -> None:
        if not 1 <= min_match <= max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got min_match={min_match}, "
                             f"max_match={max_match}")
        self.min_match, self.max_match = min_match, max_match
        self.prefix = np.asarray([int(t) for t in prefix][-max_match:], dtype=np.int32)
        self.state = np.zeros(STATE, dtype=np.int64)  # NSEQ, NOCC, NKEYS, NPEND, NPTOK
        self.pend = np.zeros((PENDING, 3), dtype=np.int64)  # (seq, first end, last end) not yet filed, in order
        self.tok = np.zeros((ROWS, 64), dtype=np.int32)
        self.lens = np.zeros(ROWS, dtype=np.int64)
        self.rewards = np.zeros(ROWS, dtype=np.float64)
        self.table = np.full((64, 2), -1, dtype=np.int64)  # (key bits, newest occurrence) per slot
        self.links = np.zeros((self.tok.size, max_match - min_match + 1), dtype=np.int32)  # per position and n
        self.generation = 0  # bumped whenever an array above is reallocated (`rhymerl.histospec.slots`)
        self._next: np.ndarray | None = None  # the next table, filled a chunk per `room_ahead`
        self._filled = 0  # its slots filled so far

    # ------------------------------------------------------------------ growing

    def add(self, tokens: Sequence[int] = (), reward: float = 0.0) -> int:
        """Start a new sequence (prefix + `tokens`) and return its id."""
        seq = int(self.state[NSEQ])
        if seq >= STRIDE:
            raise ValueError("index holds too many sequences; build a fresh one per step")
        self._room(seq + 1, len(self.prefix), len(self.prefix), ranges=1)
        self.state[NSEQ] = seq + 1
        self.rewards[seq] = float(reward)
        self.lens[seq] = len(self.prefix)
        self.tok[seq, :len(self.prefix)] = self.prefix
        pend(self.pend, self.state, seq, 1, len(self.prefix))  # n-grams inside the prefix itself, filed in turn
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
        """Append tokens[row_ids[j], starts[j]:ends[j]] to sequence seq_ids[j], for every j in order
        (distinct ids: the engine's rows of one prompt)."""
        seq_ids, starts, ends = (np.asarray(a, np.int64) for a in (seq_ids, starts, ends))
        if not len(seq_ids):
            return
        longest, total, ranges = (np.zeros(1, np.int64) for _ in range(3))
        if appending_many((self.lens,), (self.state,), np.zeros(len(seq_ids), np.int64), seq_ids, starts, ends,
                          longest, total, ranges) < 0:
            raise ValueError(f"unknown sequence id in {seq_ids.tolist()}; ids run 0..{self.state[NSEQ] - 1}")
        self._room(int(self.state[NSEQ]), int(longest[0]), int(total[0]), ranges=int(ranges[0]))
        copy_rows_of(self.tok, self.lens, self.pend, self.state, seq_ids, tokens, np.asarray(row_ids, np.int64),
                     starts, ends)
        self.flush()

    def flush(self) -> None:
        """File the n-grams of what was appended and not yet filed (`SideSlots.extend_rows` with
        `defer`, a new sequence's prefix), in the order appended. The queries below do this first;
        the engine's drafting kernel reads the pending ones where they lie instead. Never while the
        engine's helper thread files them (`StepGrowth.finish` first): a range filed twice links an
        occurrence to itself."""
        if self.state[NPEND]:
            flush_pending(self.tok, self.table, self.links, self.state, self.pend, self.min_match, self.max_match)

    def reserve(self, longest: int, total: int, ranges: int = 0) -> None:
        """Make room for appending `total` tokens in all in `ranges` pending ranges, the longest
        sequence then `longest` tokens long (`extend_rows` does this itself;
        `rhymerl.histospec.slots.SideSlots.extend_rows`, for many indexes in one compiled call, first)."""
        self._room(int(self.state[NSEQ]), int(longest), int(total), ranges=int(ranges))

    def set_reward(self, seq_id: int, reward: float) -> None:
        """Record the reward of a finished sibling so reward-weighted drafting can use it."""
        self.rewards[seq_id] = float(reward)

    def room_ahead(self, tokens: int, total: int, longest: int, allowance: int = 1 << 62) -> int:
        """Grow now what `tokens` more on the longest sequence (capped at `longest`, the longest a
        sequence can get) and `total` more in all would grow later inside `extend_rows`, so the
        engine's helper thread does it behind the step (`rhymerl.histospec.growth`); the bytes of
        the arrays it wrote. What the next step would need is done whatever it costs; what a step up
        to `SOON` steps later would need only while `allowance` (bytes) lasts, so a step's helper
        does not widen every prompt at once (a group's siblings, and a batch's prompts, grow in
        lockstep: widening 16 prompts' rows took ~13 ms, more than a forward pass, 2026-12-05).
        Wider rows are made at once (a copy of the rows and links, codes unchanged); a larger table
        from 3/8 full on, `FILL_SLOTS` slots a call (filling 64 MB took ~45 ms, page faults
        mostly), rehashed into when filled. A new sequence still grows the rows in its step (rare,
        and short then)."""
        nseq, cols = int(self.state[NSEQ]), self.tok.shape[1]
        held, spent = int(self.lens[:nseq].max(initial=0)), 0
        soon = max(held, min(held + SOON * tokens, longest))
        if min(held + tokens, longest) >= cols or (soon >= cols and allowance > 0):
            self._room(nseq, soon, 0, longest)  # the rows' width (the table is half full at most)
            spent += self.tok.nbytes + self.links.nbytes
        return spent + self._fill_ahead(total, allowance - spent)

    def _fill_ahead(self, total: int, allowance: int) -> int:
        """`room_ahead`'s table: the next one allocated once the table would be 3/8 full after
        `total` more tokens, filled a chunk per call while `allowance` lasts (all of it when the
        next step could need it) and swapped in when filled; the bytes written."""
        keys = self._keys_after(total)
        due = self._table_full(total)  # the next step would swap tables itself
        if self._next is None and (8 * keys > 3 * len(self.table) or due):
            self._next, self._filled = np.empty((max(2 * len(self.table), _pow2(2 * keys)), 2), np.int64), 0
        if self._next is None or not (due or allowance > 0):
            return 0
        end = len(self._next) if due else min(self._filled + FILL_SLOTS, len(self._next))
        fill = self._next[self._filled:end]
        fill[:] = -1
        spent, self._filled = fill.nbytes, end
        if end == len(self._next):
            spent += self.table.nbytes
            self._swap_table(self._next)
        return spent

    def _table_full(self, tokens: int) -> bool:
        """Whether the table would be more than half full after `tokens` more tokens, even if every
        n-gram they end were a new key (`side_arrays.table_full`)."""
        return bool(table_full(len(self.table), int(self.state[NKEYS]), tokens + int(self.state[NPTOK]),
                               self.max_match - self.min_match + 1))

    def _keys_after(self, tokens: int) -> int:
        """Keys in the table after `tokens` more tokens and the pending ones, if every n-gram they end
        were a new key."""
        return int(self.state[NKEYS]) + (tokens + int(self.state[NPTOK])) * (self.max_match - self.min_match + 1)

    def _swap_table(self, new: np.ndarray) -> None:
        """Move every key into `new` (all free) and use it."""
        self.generation += 1
        rehash(self.table, new)
        self.table, self._next = new, None

    def _room(self, seqs: int, length: int, new_tokens: int, longest: int = 1 << 40, ranges: int = 0) -> None:
        """Grow the arrays (by doubling) for `seqs` sequences, one of `length` tokens, and
        `new_tokens` more indexed tokens in `ranges` more pending ranges; rows no wider than a
        sequence of `longest` tokens needs (codes do not depend on the width: a 16,471-token limit
        gets rows of 16,472, not 32K)."""
        rows, cols = self.tok.shape
        if seqs > rows or length >= cols:  # a position may be `length` (a sequence's end): cols > length
            self._grow(max(rows, _pow2(seqs)), max(cols, min(_pow2(length + 1), longest + 1)))
        if self._table_full(new_tokens):  # in the step: the helper's table (`room_ahead`) was not ready
            self._swap_table(np.full((_pow2(2 * self._keys_after(new_tokens)), 2), -1, dtype=np.int64))
        if int(self.state[NPEND]) + ranges > len(self.pend):
            grown = np.zeros((_pow2(int(self.state[NPEND]) + ranges), 3), np.int64)
            grown[:len(self.pend)] = self.pend
            self.pend, self.generation = grown, self.generation + 1

    def _grow(self, rows: int, cols: int) -> None:
        """Reallocate the token rows as rows x cols and the links to match. Wider rows keep every
        local code (position * rows + seq): the links are copied as they are. More rows (a sibling
        beyond a power of two, mostly while sequences are short) rewrite the codes, in the links and
        the table's heads."""
        if rows * cols >= 2 ** 31:
            raise ValueError(f"siblings of {rows} sequences x {cols} tokens overflow the index's int32 positions; "
                             "keep fewer sequences per prompt index (spec.siblings off or a shorter max_model_len)")
        old_rows, old_cols = self.tok.shape
        self.generation += 1
        # Unwritten, not zeroed: nothing reads a row past its length or the links of a position not
        # yet filed (zeroing the 15 MB of 16 x 32K-token siblings' links took 2-12 ms, 2026-12-05).
        tok = small_pages(np.empty((rows, cols), dtype=np.int32))
        links = small_pages(np.empty((rows * cols, self.links.shape[1]), dtype=np.int32))
        copy_rows(self.tok, self.lens, int(self.state[NSEQ]), tok)  # the written part of each row
        if rows == old_rows:  # positions 0..the longest sequence's end, filed or not
            held = (int(self.lens.max(initial=0)) + 1) * rows
            links[:held] = self.links[:held]
        else:
            relayout(self.links, self.lens, int(self.state[NSEQ]), old_rows, links, rows)
            relayout_heads(self.table, old_rows, rows)
        self.tok, self.links = tok, links
        for name in ("lens", "rewards"):
            grown = np.zeros(rows, dtype=getattr(self, name).dtype)
            grown[:old_rows] = getattr(self, name)
            setattr(self, name, grown)

    # ------------------------------------------------------------------ querying

    def _keys(self, tail: Sequence[int]) -> tuple[np.ndarray, int]:
        q = np.asarray(tail[-self.max_match:], dtype=np.int64)[::-1].copy()
        keys = np.zeros(max(1, len(q)), dtype=np.uint64)
        tail_keys(q, len(q), keys)
        return keys, len(q)

    def longest(self, tail: Sequence[int]) -> int:
        """The longest n (min_match..max_match) such that the last n tokens of `tail` occurred with a
        token after them; 0 when none did."""
        self.flush()
        if not self.state[NOCC]:
            return 0
        keys, nq = self._keys(tail)
        return int(longest(self.lens, self.table, self.links, self.tok.shape[0], keys, nq, self.min_match,
                           self.min_match))

    def recent(self, tail: Sequence[int], n: int, limit: int) -> list[int]:
        """The `limit` most recent occurrence codes of the last n tokens of `tail`, oldest first
        (some may sit at a sequence's end)."""
        self.flush()
        if not self.state[NOCC] or n <= 0:
            return []
        keys, nq = self._keys(tail)
        if n > nq:
            raise ValueError(f"n={n} is longer than the tail ({nq} tokens of it are matched)")
        out = np.zeros(max(1, min(limit, int(self.state[NOCC]))), dtype=np.int64)
        count = recent(self.table, self.links, self.tok.shape[0], keys[n - 1], n - self.min_match, len(out), out, 0)
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
        """Occurrences (0: nothing to match), the pending ones filed first."""
        self.flush()
        return int(self.state[NOCC])

    @property
    def searchable(self) -> bool:
        """Whether anything is filed or pending (what the drafting kernel reads), filing nothing."""
        return bool(self.state[NOCC] or self.state[NPEND])

    @property
    def num_tokens(self) -> int:
        """Tokens held, prefixes included."""
        return int(self.lens[:self.state[NSEQ]].sum())

    @property
    def nbytes(self) -> int:
        """Bytes of its arrays."""
        return sum(a.nbytes for a in (self.tok, self.lens, self.rewards, self.table, self.links, self.pend))

    def __len__(self) -> int:
        return int(self.state[NSEQ])


def _pow2(n: int) -> int:
    """The smallest power of two >= max(n, 1)."""
    return 1 << max(0, int(n) - 1).bit_length()
