"""A prompt's index: its history as a reversed-context suffix array (`FlatIndex`, read-only) beside
its siblings as they grow (`rhymerl.histospec.siblings.SideIndex`), queried as one (`PromptIndex`).

`FlatIndex` sorts every continuation position g of the history by the tokens before it, read
backwards (D' = max(2, max_match) deep), ties in position order: the positions matching a context's
last n tokens form one contiguous run for every n <= D', listed most recent last.

Layout: `text` holds every sequence (prefix + response), each preceded by D `PAD`s (D: max_match
rounded up to a power of two, >= 2) and the whole followed by D more; a pad equals no token, so a
match never crosses a sequence start and a continuation ends at the next pad. Occurrence codes: a
history occurrence's is its position in `text` (< STRIDE; higher = more recent); a sibling's
(H + sibling id) * STRIDE + position, H the history's sequences.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Sequence

import numpy as np

from rhymerl.histospec.sibling_table import STRIDE
from rhymerl.histospec.siblings import SideIndex

PAD = -1  # before, between and after sequences in `text`: equals no token


class FlatIndex:
    """A prompt's history sequences (read-only), ids 0..len-1 in the order given (later = more recent)."""
    def __init__(self, text: np.ndarray, starts: np.ndarray, sa: np.ndarray, key: np.ndarray,
                 depth: int, min_match: int, max_match: int) -> None:
        self.text, self.starts, self.sa, self.key = text, starts, sa, key
        self.depth, self.min_match, self.max_match = depth, min_match, max_match
        self._text, self._sa, self._key = memoryview(text), memoryview(sa), memoryview(key)
        self._starts = starts.tolist()

    @classmethod
    def build(cls, tokens: np.ndarray, lengths: Sequence[int], prefix: Sequence[int] = (), *,
              min_match: int = 1, max_match: int = 7) -> "FlatIndex":
        """The index of flat responses (`lengths` each), each after `prefix`'s last max_match tokens."""
        depth = 1 << max(1, (max_match - 1).bit_length())
        prefix = np.asarray(prefix, dtype=np.int64)[len(prefix) - min(len(prefix), max_match):]
        lengths = np.asarray(lengths, dtype=np.int64)
        tokens = np.asarray(tokens)
        if len(tokens) != int(lengths.sum()) or (lengths < 0).any():
            shown = str(lengths.tolist()[:8])[:-1] + (", ...]" if len(lengths) > 8 else "]")
            raise ValueError(f"got {len(tokens)} tokens for lengths {shown} summing to {int(lengths.sum())}; "
                             "lengths must be >= 0 and sum to the tokens")
        n, plen = len(lengths), len(prefix)
        seq_lens = lengths + plen
        starts = depth * (np.arange(n) + 1) + np.concatenate(([0], np.cumsum(seq_lens)[:-1]))
        text = np.full(int(seq_lens.sum()) + depth * (n + 1), PAD, np.int32)
        if plen:
            text[starts[:, None] + np.arange(plen)] = prefix
        if len(tokens):
            dest = starts + plen
            text[np.repeat(dest - (np.cumsum(lengths) - lengths), lengths) + np.arange(len(tokens))] = tokens
        real = text != PAD
        cand = np.flatnonzero(real[1:] & real[:-1]) + 1  # a token before it and one to continue with
        r = np.zeros(len(text), dtype=np.int64)
        r[1:] = text[:-1] + 1  # r[g]: the reversed context of g, one token deep so far (pad: 0)
        m, deep = 1, max(2, max_match)
        while m < deep:  # context of g, m tokens deep = (context of g, context of g - step), m + step deep
            step = min(m, deep - m)  # the last round's windows overlap: sorted exactly max_match deep
            if int(r.max()) + 1 >= 1 << 31:
                r = np.unique(r, return_inverse=True)[1].reshape(-1).astype(np.int64)
            prev = np.zeros_like(r)
            prev[step:] = r[:-step]
            r = r * (int(r.max()) + 1) + prev
            m += step
        sa = cand[np.argsort(r[cand], kind="stable")].astype(np.int32)
        key = (text[sa - 1] + 1).astype(np.uint64) << np.uint64(32)
        key |= (text[np.maximum(sa - 2, 0)] + 1).astype(np.uint64)
        return cls(text, starts, sa, key, depth, min_match, max_match)

    def match_range(self, context: Sequence[int]) -> tuple[int, int, int]:
        """(n, lo, hi): the longest context tail (min_match..max_match) followed by a token before, at
        `sa[lo:hi]`; (0, 0, 0): none."""
        q = [int(t) for t in context[-self.max_match:]][::-1]  # q[j]: the token j + 1 back
        key = self._key
        if len(q) < self.min_match or not len(key):
            return 0, 0, 0
        k1 = (q[0] + 1) << 32
        if len(q) >= 2:
            k2 = k1 | (q[1] + 1)
            lo = bisect_left(key, k2)
            hi = bisect_left(key, k2 + 1, lo)
            if lo < hi:
                n, lo, hi = self._deeper(q, lo, hi)
                return (n, lo, hi) if n >= self.min_match else (0, 0, 0)
        lo = bisect_left(key, k1)
        hi = bisect_left(key, k1 + (1 << 32), lo)
        return (1, lo, hi) if lo < hi and self.min_match <= 1 else (0, 0, 0)

    def _deeper(self, q: list[int], lo: int, hi: int) -> tuple[int, int, int]:
        """Narrow the run [lo, hi) matching q[:2] to the longest prefix of q that still occurs."""
        sa, text, n = self._sa, self._text, 2
        while n < len(q):
            back, tok = n + 1, q[n]
            if hi - lo == 1:
                if text[sa[lo] - back] != tok:
                    break
                a, b = lo, hi
            else:
                def at(g: int) -> int:
                    return text[g - back]
                a = bisect_left(sa, tok, lo, hi, key=at)
                b = bisect_right(sa, tok, a, hi, key=at)
                if a == b:
                    break
            n, lo, hi = n + 1, a, b
        return n, lo, hi

    def recent_match(self, context: Sequence[int], limit: int) -> tuple[int, list[int]]:
        """(n, codes) of the `limit` most recent occurrences of the longest tail, oldest first."""
        n, lo, hi = self.match_range(context)
        if not n:
            return 0, []
        return n, sorted(self._sa[lo:hi].tolist())[-limit:]

    def seq_pos(self, code: int) -> tuple[int, int]:
        """(sequence id, position in it) of an occurrence code."""
        seq = bisect_right(self._starts, code) - 1
        return seq, code - self._starts[seq]

    def gather(self, codes: Sequence[int], budget: int) -> list[list[int]]:
        """The tokens after each code, at most `budget`, up to its sequence's end (may be empty)."""
        text, out = self._text, []
        for g in codes:
            cont = text[g:g + budget].tolist()
            if PAD in cont:
                cont = cont[:cont.index(PAD)]
            out.append(cont)
        return out

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def num_tokens(self) -> int:
        """Tokens held, prefixes included."""
        return int((self.text != PAD).sum())

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays beyond the tokens themselves (the positions and search keys)."""
        return self.sa.nbytes + self.key.nbytes + self.starts.nbytes


class PromptIndex:
    """A prompt's history (`FlatIndex`, attached when built, maybe by another thread; until then the
    siblings draft alone) beside its siblings (`SideIndex`): sequence ids 0..H-1, then H.."""
    def __init__(self, history_rewards: Sequence[float] = (), min_match: int = 1, max_match: int = 7,
                 prefix: Sequence[int] = (), flat: FlatIndex | None = None) -> None:
        self.side = SideIndex(min_match, max_match, prefix)
        self.min_match, self.max_match = min_match, max_match
        self.base = len(history_rewards)  # H: the history's sequences
        self.rewards: list[float] = [float(r) for r in history_rewards]  # per sequence id; read-only
        self.flat: FlatIndex | None = None
        if flat is not None:
            self.attach(flat)

    @classmethod
    def build(cls, tokens: np.ndarray, lengths: Sequence[int], rewards: Sequence[float] | None = None, *,
              min_match: int = 1, max_match: int = 7, prefix: Sequence[int] = ()) -> "PromptIndex":
        """An index over responses given flat (see `FlatIndex.build`), built now."""
        rewards = [0.0] * len(lengths) if rewards is None else list(rewards)
        if len(rewards) != len(lengths):
            raise ValueError(f"got {len(rewards)} rewards for {len(lengths)} responses; "
                             "pass one reward per response or none")
        flat = FlatIndex.build(tokens, lengths, prefix, min_match=min_match, max_match=max_match)
        return cls(rewards, min_match, max_match, prefix, flat)

    def attach(self, flat: FlatIndex) -> None:
        """Add the built history (its sequence count must be H)."""
        if len(flat) != self.base:
            raise ValueError(f"history index holds {len(flat)} sequences, expected {self.base}")
        self.flat = flat

    def add(self, tokens: Sequence[int] = (), reward: float = 0.0) -> int:
        """Start a sibling sequence (prefix + `tokens`); its id (>= H)."""
        self.rewards.append(float(reward))
        return self.base + self.side.add(tokens, reward)

    def extend(self, seq_id: int, tokens: Sequence[int]) -> None:
        """Append `tokens` to sibling `seq_id`."""
        if seq_id < self.base:
            raise ValueError(f"sequence {seq_id} is history (ids below {self.base} are read-only)")
        self.side.extend(seq_id - self.base, tokens)

    def recent_match(self, context: Sequence[int], limit: int) -> tuple[int, list[int]]:
        """(n, codes): the longest tail found in either part, and its `limit` most recent occurrences
        (the history's, then the siblings', which may sit at a sequence's end), oldest first; (0, [])."""
        tail = context[-self.max_match:]
        n_side = self.side.longest(tail) if self.side.occurrences and len(tail) else 0
        flat = self.flat
        n_flat, codes = flat.recent_match(tail, limit) if flat is not None else (0, [])
        n = max(n_side, n_flat)
        if not n:
            return 0, []
        if n_flat < n:
            codes = []
        shift = self.base * STRIDE
        codes = codes + [c + shift for c in self.side.recent(tail, n, limit)]
        return n, codes[-limit:]

    def match(self, context: Sequence[int]) -> tuple[int, list[int]]:
        """`recent_match` with every occurrence."""
        return self.recent_match(context, STRIDE)

    def seq_pos(self, code: int) -> tuple[int, int]:
        """(sequence id, position in it) of an occurrence code."""
        if code >= self.base * STRIDE:
            return divmod(code, STRIDE)
        return self.flat.seq_pos(code)

    def reward_of(self, code: int) -> float:
        """The reward of the sequence an occurrence code lies in."""
        return self.rewards[self.seq_pos(code)[0]]

    def gather(self, codes: Sequence[int], budget: int) -> list[list[int]]:
        """The tokens after each code, at most `budget`, up to its sequence's end (may be empty)."""
        split = self.base * STRIDE
        old = [c for c in codes if c < split]
        new = [c - split for c in codes if c >= split]
        out = self.flat.gather(old, budget) if old else []
        return out + (self.side.gather(new, budget) if new else [])

    @property
    def num_tokens(self) -> int:
        """Tokens held (the history's once attached), prefixes included."""
        return (self.flat.num_tokens if self.flat is not None else 0) + self.side.num_tokens

    def __len__(self) -> int:
        return self.base + len(self.side)
