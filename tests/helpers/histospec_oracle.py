"""The dict-based n-gram occurrence index (`SuffixIndex`): the tests' oracle for the prompt's index
(`rhymerl.histospec.index.PromptIndex`) and the siblings' (`rhymerl.histospec.siblings.SideIndex`).

One hash-map entry per distinct n-gram (min_match <= n <= max_match, keyed by the same 64-bit hash
as the siblings' table) lists where it ended, as seq_id * STRIDE + position codes in insertion
order. Slow and plain: every answer the production indexes give must equal this one's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from rhymerl.histospec.sibling_table import MUL as _MUL, SEED as _SEED, STRIDE

_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class Continuation:
    """One possible next token after a matched context, with its history statistics."""

    token: int
    count: int  # occurrences of (matched context + token)
    reward_sum: float  # sum of the rewards of the responses those occurrences come from
    latest: int  # most recent occurrence: highest code (later sequence, then later position)


def _tail_keys(tail: Sequence[int]) -> list[int]:
    """keys[n - 1]: the key of the last n tokens of `tail`, for n = 1..len(tail)."""
    keys, key = [], _SEED
    for t in reversed(tail):
        key = (key * _MUL + int(t) + 1) & _MASK
        keys.append(key)
    return keys


class SuffixIndex:
    """Occurrences of every n-gram (min_match <= n <= max_match) in one prompt's sequences.

    Sequence ids are assigned in insertion order; later ids count as more recent. Rewards of
    sequences still being generated (siblings) are 0 until `set_reward`.
    """

    def __init__(self, min_match: int = 3, max_match: int = 7, prefix: Sequence[int] = ()) -> None:
        if not 1 <= min_match <= max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got min_match={min_match}, "
                             f"max_match={max_match}")
        self.min_match = min_match
        self.max_match = max_match
        self.prefix: tuple[int, ...] = tuple(int(t) for t in prefix)[-max_match:]
        self.sequences: list[list[int]] = []  # prefix + response tokens; read-only for callers
        self.rewards: list[float] = []
        self.table: dict[int, list[int]] = {}  # n-gram key -> occurrence codes

    @classmethod
    def build(cls, responses: Iterable[Sequence[int]], rewards: Sequence[float] | None = None, *,
              min_match: int = 3, max_match: int = 7, prefix: Sequence[int] = ()) -> "SuffixIndex":
        """An index over `responses` (each a token-id sequence), oldest first."""
        responses = list(responses)
        if rewards is not None and len(rewards) != len(responses):
            raise ValueError(f"got {len(rewards)} rewards for {len(responses)} responses; "
                             "pass one reward per response or none")
        index = cls(min_match, max_match, prefix)
        if len(responses) >= STRIDE:
            raise ValueError("index holds too many sequences; build a fresh one per step")
        for i, tokens in enumerate(responses):
            index.sequences.append([*index.prefix, *(int(t) for t in tokens)])
            index.rewards.append(0.0 if rewards is None else float(rewards[i]))
            if len(index.sequences[-1]) >= STRIDE:
                raise ValueError(f"sequence {i} is longer than {STRIDE - 1} tokens")
        index._index_all()
        return index

    def _index_all(self) -> None:
        """Index every n-gram of every sequence at once (an empty table): keys and codes in numpy,
        grouped by a stable sort, so Python touches each distinct n-gram once, not each occurrence —
        a rhyming history repeats most of its n-grams. Same table as adding the sequences one by one."""
        lens = np.asarray([len(s) for s in self.sequences], dtype=np.int64)
        total = int(lens.sum())
        if total == 0:
            return
        tokens = np.fromiter((t for s in self.sequences for t in s), dtype=np.uint64, count=total) + np.uint64(1)
        starts = np.repeat(np.cumsum(lens) - lens, lens)
        pos = np.arange(total, dtype=np.int64) - starts  # each token's position in its sequence
        codes = np.repeat(np.arange(len(lens), dtype=np.int64) * STRIDE, lens) + pos + 1  # its n-grams' end
        keys = np.full(total, _SEED, dtype=np.uint64)  # [t]: key of the n-gram whose last token is t
        found_keys, found_codes = [], []
        for n in range(1, min(self.max_match, total) + 1):
            keys[n - 1:] = keys[n - 1:] * np.uint64(_MUL) + tokens[:total - n + 1]  # wraps mod 2**64
            if n >= self.min_match:
                inside = pos >= n - 1  # the n-gram lies within one sequence
                found_keys.append(keys[inside])
                found_codes.append(codes[inside])
        if not found_keys:  # every sequence shorter than min_match
            return
        keys, codes = np.concatenate(found_keys), np.concatenate(found_codes)
        order = np.argsort(keys, kind="stable")  # stable: codes stay in insertion order per key
        keys, codes = keys[order], codes[order].tolist()
        cuts = (np.flatnonzero(keys[1:] != keys[:-1]) + 1).tolist()
        table = self.table
        for key, lo, hi in zip(keys[[0, *cuts]].tolist(), [0, *cuts], [*cuts, len(codes)]):
            table[key] = codes[lo:hi]

    # ------------------------------------------------------------------ growing

    def add(self, tokens: Sequence[int] = (), reward: float = 0.0) -> int:
        """Start a new sequence (prefix + `tokens`) and return its id."""
        seq_id = len(self.sequences)
        if seq_id >= STRIDE:
            raise ValueError("index holds too many sequences; build a fresh one per step")
        self.sequences.append(list(self.prefix))
        self.rewards.append(float(reward))
        self._index_range(seq_id, 1)  # n-grams inside the prefix itself
        self.extend(seq_id, tokens)
        return seq_id

    def extend(self, seq_id: int, tokens: Sequence[int]) -> None:
        """Append `tokens` to sequence `seq_id` (a sibling that generated more tokens)."""
        if not 0 <= seq_id < len(self.sequences):
            raise ValueError(f"unknown sequence id {seq_id}; ids run 0..{len(self.sequences) - 1}")
        seq = self.sequences[seq_id]
        start = len(seq)
        seq.extend(int(t) for t in tokens)
        if len(seq) >= STRIDE:
            raise ValueError(f"sequence {seq_id} is longer than {STRIDE - 1} tokens")
        self._index_range(seq_id, start + 1)  # the end at `start` was indexed already

    def set_reward(self, seq_id: int, reward: float) -> None:
        """Record the reward of a finished sibling so reward-weighted drafting can use it."""
        self.rewards[seq_id] = float(reward)

    def _index_range(self, seq_id: int, first_end: int) -> None:
        """Insert every n-gram that ends just before positions first_end..len(seq)."""
        seq = self.sequences[seq_id]
        table = self.table
        size = len(seq)
        base = seq_id * STRIDE
        lo, hi = self.min_match, self.max_match
        if size - first_end < 128:  # a sibling's step or a short response: a plain loop has the least overhead
            for end in range(first_end, size + 1):
                code, key = base + end, _SEED
                for n in range(1, min(hi, end) + 1):
                    key = (key * _MUL + seq[end - n] + 1) & _MASK
                    if n >= lo:
                        occ = table.get(key)
                        if occ is None:
                            table[key] = [code]
                        else:
                            occ.append(code)
            return
        tokens = np.asarray(seq, dtype=np.uint64) + np.uint64(1)  # a whole response: keys in numpy
        keys = np.full(size + 1, _SEED, dtype=np.uint64)  # [end]: key of the n-gram ending at end
        for n in range(1, hi + 1):
            if n > size:
                break
            keys[n:] = keys[n:] * np.uint64(_MUL) + tokens[:size - n + 1]  # wraps mod 2**64
            start = max(first_end, n)
            if n < lo or start > size:
                continue
            for key, code in zip(keys[start:].tolist(), range(base + start, base + size + 1)):
                occ = table.get(key)
                if occ is None:
                    table[key] = [code]
                else:
                    occ.append(code)

    # ------------------------------------------------------------------ querying

    def match(self, context: Sequence[int]) -> tuple[int, list[int]]:
        """(n, occurrence codes) for the longest tail of `context` of length n in
        [min_match, max_match] that occurred before with a token after it; (0, []) when none did.

        Occurrences at the very end of a sequence are not enough: a growing sibling always
        matches its own end, and that predicts nothing. Codes are in insertion order, so the most
        recent occurrences come last; some may sit at a sequence end. The list is the index's
        own: do not modify it.
        """
        keys = _tail_keys(context[-self.max_match:])
        n = self.longest(keys)
        return (n, self.table[keys[n - 1]]) if n else (0, [])

    def longest(self, keys: Sequence[int]) -> int:
        """The longest n (min_match..len(keys)) whose tail key `keys[n - 1]` occurred with a token
        after it; 0 when none did. `keys` come from `_tail_keys`."""
        table, seqs = self.table, self.sequences
        for n in range(len(keys), self.min_match - 1, -1):
            occ = table.get(keys[n - 1])
            if occ is not None:
                for code in occ:
                    seq_id, pos = divmod(code, STRIDE)
                    if pos < len(seqs[seq_id]):
                        return n
        return 0

    def recent_match(self, context: Sequence[int], limit: int) -> tuple[int, list[int]]:
        """`match`, keeping only the `limit` most recent occurrences (a new list)."""
        n, codes = self.match(context)
        return n, codes[-limit:]

    def reward_of(self, code: int) -> float:
        """The reward of the sequence an occurrence code lies in."""
        return self.rewards[code // STRIDE]

    def gather(self, codes: Sequence[int], budget: int) -> list[list[int]]:
        """The tokens after each code, at most `budget`, up to its sequence's end (may be empty)."""
        seqs = self.sequences
        return [seqs[c // STRIDE][c % STRIDE:c % STRIDE + budget] for c in codes]

    def continuations(self, context: Sequence[int]) -> list[Continuation]:
        """Next tokens after the longest matched tail of `context`, best first by
        (count, latest). Occurrences at the end of a sequence (no next token yet) are skipped."""
        _, codes = self.match(context)
        stats: dict[int, list] = {}
        for code in codes:
            seq_id, pos = divmod(code, STRIDE)
            seq = self.sequences[seq_id]
            if pos < len(seq):
                st = stats.setdefault(seq[pos], [0, 0.0, -1])
                st[0] += 1
                st[1] += self.rewards[seq_id]
                st[2] = max(st[2], code)
        out = [Continuation(t, c, r, last) for t, (c, r, last) in stats.items()]
        out.sort(key=lambda c: (c.count, c.latest), reverse=True)
        return out

    @property
    def num_tokens(self) -> int:
        """Tokens held, prefixes included."""
        return sum(len(s) for s in self.sequences)

    def __len__(self) -> int:
        return len(self.sequences)
