"""A prompt's history as flat numpy arrays: the read-only part of its index (`FlatIndex`), and
`PromptIndex`, which puts it beside a small dynamic n-gram table for the siblings as they grow
(`rhymerl.histospec.side.SideIndex`).

Why a reversed-context suffix array
-----------------------------------
The drafter asks: after the longest tail of this context (min_match..max_match tokens) that occurred
before, which positions continue it, most recent first? Sort every continuation position g of the
history by the tokens *before* it, read backwards (t[g-1], t[g-2], ..., t[g-M], M = max_match, at
least 2), ties in position order: the positions whose last n tokens equal the context's last n form
one contiguous run of that order for every n <= M, and the run for n + 1 lies inside the run for n.
A run M deep is in position order, so its most recent occurrences are its last entries: the drafting
kernel reads them there instead of selecting them from the whole run (with 64 history responses per
prompt a run holds ~65). One sorted array answers every match length, so the index costs per indexed
token 4 bytes of position (`sa`, int32) and 8 of search key (`key`: the two tokens before it packed
in a uint64, for `searchsorted`), 12 bytes beyond the tokens themselves (`text`, int32), against ~400
for one dict entry per n-gram. It is built by prefix doubling (ceil(log2 M) rounds of rank, combine,
sort: numpy, which releases the GIL while sorting, and two compiled loops that release it too: a
background thread builds it while the engine steps). It cannot grow, so siblings go to a `SideIndex`
beside it (`PromptIndex`); a sibling step touches only that.

Layout: `text` holds every sequence (prefix + response), each preceded by D `PAD`s (-1; D: M rounded
up to a power of two) and the whole followed by D more; a pad equals no token, so a match never
crosses a sequence start and a continuation read from `text` ends at the next pad.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Sequence

import numpy as np
from numba import njit

from rhymerl.histospec.index import STRIDE
from rhymerl.histospec.pages import huge_empty
from rhymerl.histospec.side import SideIndex

PAD = -1  # before, between and after sequences in `text`: equals no token


def _rank(r: np.ndarray) -> np.ndarray:
    """Dense ranks (0..distinct-1) of `r`, in the order of its values. (`np.unique`'s inverse held the
    GIL ~20-27 ms at 1M tokens, faulting in its fresh output: a step waited on the build that long.)"""
    order = np.argsort(r)  # numpy sorts without the GIL
    out = np.empty(len(r), np.int64)
    _dense_ranks(r, order, out)
    return out


@njit(cache=True, nogil=True)
def _dense_ranks(r, order, out):
    """out[order[j]] = the number of distinct values in r[order[:j]] below r[order[j]] (r[order] sorted)."""
    rank = 0
    for j in range(order.shape[0]):
        if j and r[order[j]] != r[order[j - 1]]:
            rank += 1
        out[order[j]] = rank


@njit(cache=True, nogil=True)
def _place(text, tokens, dest, lengths):
    """text[dest[i]:dest[i] + lengths[i]] = response i's tokens (given flat, one after another), without
    the GIL: `np.repeat` and a fancy scatter held it ~19 ms at 1M tokens, faulting in their output."""
    at = 0
    for i in range(lengths.shape[0]):
        d = dest[i]
        for t in range(lengths[i]):
            text[d + t] = tokens[at + t]
        at += lengths[i]


_warmed = False


def warm() -> None:
    """Compile (or load from numba's cache) the build's loops, once per process: a small history is
    built in the step (and a proposer makes a new drafter for each bundle, i.e. each step)."""
    global _warmed
    if not _warmed:
        FlatIndex.build(np.arange(4, dtype=np.int32), [2, 2], [7])
        FlatIndex.build(np.arange(4, dtype=np.int64), [2, 2], [7])
        _rank(np.zeros(2, np.int64))
        _warmed = True


class FlatIndex:
    """A prompt's history sequences (read-only): continuation positions sorted by their reversed
    context. Sequence ids are 0..len-1 in the order given (later = more recent), as in `SuffixIndex`.

    An occurrence's code here is its continuation's position in `text`: codes grow with the sequence
    id, then the position, so a higher code is a more recent occurrence (`seq_pos` gives the pair).
    Queries walk the arrays through zero-copy memoryviews with `bisect` (a few Python-int reads per
    level), which costs less than a numpy call per level for the short runs of a rhyming history.
    """

    def __init__(self, text: np.ndarray, starts: np.ndarray, sa: np.ndarray, key: np.ndarray,
                 depth: int, min_match: int, max_match: int) -> None:
        self.text, self.starts, self.sa, self.key = text, starts, sa, key
        self.depth, self.min_match, self.max_match = depth, min_match, max_match
        self._text, self._sa, self._key = memoryview(text), memoryview(sa), memoryview(key)
        self._starts = starts.tolist()

    @classmethod
    def build(cls, tokens: np.ndarray, lengths: Sequence[int], prefix: Sequence[int] = (), *,
              min_match: int = 1, max_match: int = 7) -> "FlatIndex":
        """The index of responses given flat (`tokens`, one after another, `lengths` each), each after
        `prefix`'s last max_match tokens. Tokens are ids >= 0 below 2**31 - 1."""
        depth = 1 << max(1, (max_match - 1).bit_length())  # D: max_match up to a power of two, >= 2
        prefix = np.asarray(prefix, dtype=np.int64)[len(prefix) - min(len(prefix), max_match):]
        lengths = np.asarray(lengths, dtype=np.int64)
        tokens = np.asarray(tokens)
        if tokens.dtype not in (np.int32, np.int64):  # the two `warm` compiles `_place` for
            tokens = tokens.astype(np.int64)
        if len(tokens) != int(lengths.sum()) or (lengths < 0).any():  # `_place` reads where lengths say
            shown = str(lengths.tolist()[:8])[:-1] + (", ...]" if len(lengths) > 8 else "]")
            raise ValueError(f"got {len(tokens)} tokens for lengths {shown} summing to {int(lengths.sum())}; "
                             "lengths must be >= 0 and sum to the tokens")
        n, plen = len(lengths), len(prefix)
        seq_lens = lengths + plen
        starts = depth * (np.arange(n) + 1) + np.concatenate(([0], np.cumsum(seq_lens)[:-1]))
        count = int(np.maximum(seq_lens - 1, 0).sum())  # positions with a token before and one at them
        # read at random by every engine step: on huge pages, written in place (`pages.huge_empty`)
        text, sa, key = huge_empty((int(seq_lens.sum()) + depth * (n + 1), np.int32), (count, np.int32),
                                   (count, np.uint64))
        text.fill(PAD)
        if plen:
            text[starts[:, None] + np.arange(plen)] = prefix
        if len(tokens):
            _place(text, tokens, starts + plen, lengths)
        real = text != PAD
        cand = np.flatnonzero(real[1:] & real[:-1]) + 1  # a token before it and one to continue with
        r = np.zeros(len(text), dtype=np.int64)
        r[1:] = text[:-1] + 1  # r[g]: the reversed context of g, one token deep so far (pad: 0)
        m, deep = 1, max(2, max_match)
        while m < deep:  # context of g, m tokens deep = (context of g, context of g - step), m + step deep
            step = min(m, deep - m)  # the last round's windows overlap: sorted exactly max_match deep
            if int(r.max()) + 1 >= 1 << 31:
                r = _rank(r)
            prev = np.zeros_like(r)
            prev[step:] = r[:-step]
            r = r * (int(r.max()) + 1) + prev
            m += step
        sa[:] = cand[np.argsort(r[cand], kind="stable")]
        before = (text[sa - 1] + 1).astype(np.uint64) << np.uint64(32)
        np.bitwise_or(before, (text[np.maximum(sa - 2, 0)] + 1).astype(np.uint64), out=key)
        return cls(text, starts, sa, key, depth, min_match, max_match)

    # ------------------------------------------------------------------ querying

    def match_range(self, context: Sequence[int]) -> tuple[int, int, int]:
        """(n, lo, hi): the longest tail of `context` of n tokens (min_match <= n <= max_match) that
        occurred with a token after it, its occurrences being `sa[lo:hi]`; (0, 0, 0) when none did."""
        q = [int(t) for t in context[-self.max_match:]][::-1]  # q[j]: the token j + 1 back
        key = self._key
        if len(q) < self.min_match or not len(key):
            return 0, 0, 0
        k1 = (q[0] + 1) << 32
        if len(q) >= 2:  # most contexts match 2+ tokens: look for the pair first (2 bisections, not 4)
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
        """Narrow the run [lo, hi) matching q[:2] to the longest prefix of q that still occurs: at
        each level the run is sorted by the next token back, so two bisections find its part."""
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
        """(n, codes) of the `limit` most recent occurrences of the longest matched tail, oldest
        first; (0, []) when none."""
        n, lo, hi = self.match_range(context)
        if not n:
            return 0, []
        if hi - lo <= 4 * limit:
            g = sorted(self._sa[lo:hi].tolist())
        else:  # a short, common tail: a long run
            g = np.partition(self.sa[lo:hi], hi - lo - limit)[hi - lo - limit:]
            g = sorted(g.tolist())
        return n, g[-limit:]

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
    """A prompt's index: its history (`FlatIndex`, attached when built, possibly by another thread)
    beside its siblings (a dynamic `SideIndex`), answering as one `SuffixIndex` over the history
    followed by the siblings would: sequence ids 0..H-1 are the history's, H.. the siblings'.

    Until `attach` the history is absent and drafts come from the siblings alone (the engine never
    waits for a build). Matching takes the longest tail found in either part; its occurrences are the
    history's (oldest first) then the siblings' (in the order their tokens arrived). Codes: a history
    occurrence's is its `FlatIndex` code (< STRIDE), a sibling's (H + id) * STRIDE + position, so a
    higher code is a more recent occurrence; `seq_pos` reads either.
    """

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

    # ------------------------------------------------------------------ growing (siblings)

    def add(self, tokens: Sequence[int] = (), reward: float = 0.0) -> int:
        """Start a sibling sequence (prefix + `tokens`); its id (>= H)."""
        self.rewards.append(float(reward))
        return self.base + self.side.add(tokens, reward)

    def extend(self, seq_id: int, tokens: Sequence[int]) -> None:
        """Append `tokens` to sibling `seq_id`."""
        if seq_id < self.base:
            raise ValueError(f"sequence {seq_id} is history (ids below {self.base} are read-only)")
        self.side.extend(seq_id - self.base, tokens)

    def set_reward(self, seq_id: int, reward: float) -> None:
        self.rewards[seq_id] = float(reward)
        if seq_id >= self.base:
            self.side.set_reward(seq_id - self.base, reward)

    # ------------------------------------------------------------------ querying

    def recent_match(self, context: Sequence[int], limit: int) -> tuple[int, list[int]]:
        """(n, codes): the longest tail of `context` (min_match..max_match tokens) that occurred with
        a token after it in either part, and the `limit` most recent of its occurrences, oldest first;
        (0, []) when none did. Siblings' occurrences may sit at a sequence's end."""
        tail = context[-self.max_match:]
        n_side = self.side.longest(tail) if self.side.occurrences and len(tail) else 0
        flat = self.flat
        n_flat, codes = flat.recent_match(tail, limit) if flat is not None else (0, [])
        n = max(n_side, n_flat)
        if not n:
            return 0, []
        if n_flat < n:
            codes = []
        side = self.side.recent(tail, n, limit)
        shift = self.base * STRIDE
        codes = codes + [c + shift for c in side]
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


class FlatBundle:
    """A `HistoryBundle` as flat arrays (`HistoryBundle.to_bytes`'s), no Python object per token:
    what an engine's drafter reads, the arrays of one prompt's history being views into it."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.prompt_lens = arrays["prompt_lens"].astype(np.int64)
        self.prompt_tokens = arrays["prompt_tokens"]
        self.num_responses = arrays["num_responses"].astype(np.int64)
        self.response_lens = arrays["response_lens"].astype(np.int64)
        self.response_tokens = arrays["response_tokens"]
        self.rewards = arrays["rewards"]
        self._p = np.concatenate(([0], np.cumsum(self.prompt_lens)))  # prompt k: tokens _p[k]:_p[k+1]
        self._r = np.concatenate(([0], np.cumsum(self.num_responses)))  # its responses: _r[k]:_r[k+1]
        self._t = np.concatenate(([0], np.cumsum(self.response_lens)))  # response i: tokens _t[i]:_t[i+1]

    @classmethod
    def from_bytes(cls, blob: bytes) -> "FlatBundle":
        """Read `HistoryBundle.to_bytes` output."""
        import io

        with np.load(io.BytesIO(blob)) as z:
            return cls({k: z[k] for k in z.files})

    @classmethod
    def of(cls, bundle) -> "FlatBundle":
        """The arrays of a `HistoryBundle` object."""
        return cls.from_bytes(bundle.to_bytes())

    def __len__(self) -> int:
        return len(self.prompt_lens)

    def prompt(self, k: int) -> np.ndarray:
        """Prompt k's token ids."""
        return self.prompt_tokens[self._p[k]:self._p[k + 1]]

    def history(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Prompt k's responses, oldest first: (tokens one after another, lengths, rewards)."""
        a, b = self._r[k], self._r[k + 1]
        return self.response_tokens[self._t[a]:self._t[b]], self.response_lens[a:b], self.rewards[a:b]
