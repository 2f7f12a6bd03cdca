"""Per-request drafting state of the engine's running requests in arrays (`RequestTable`), the
prompt a row starts with (`PromptTable`), and the counts a verified step adds (`StepLedger`).

vLLM's drafter interface gives rows, not request ids, and moves requests between rows. A request is
found again by its key: a uint64 hash of its length and last `KEY_TAIL` tokens at the step it was last
drafted for. Two requests with equal keys may swap states: that can cost draft quality, never
correctness. Engine thread only.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from numba import njit

from rhymerl.histospec.stats import POSITION_BUCKETS, SpecStats, Tally, tally_position, tally_row

KEY_TAIL = 16  # tokens of a request's tail in its key (with its length)
INT_FIELDS = ("budget", "n", "drafted", "prompt", "sib", "sib_n", "tree", "tree_n", "forecast", "plen", "step", "fails",
              "resume")
# the fields' rows in `RequestTable.fields`, for compiled passes (`step_pass`)
BUDGET, N, DRAFTED, PROMPT, SIB, SIB_N, TREE, TREE_N, FORECAST, PLEN, STEP, FAILS, RESUME = range(len(INT_FIELDS))
KEY_MIX = np.random.default_rng(0x5EED).integers(1, 2**63, KEY_TAIL + 1, dtype=np.uint64) | np.uint64(1)


@njit(cache=True)
def row_key(tokens, row, end, mix):
    """sum_t tokens[row, end - KEY_TAIL + t] * mix[t] + end * mix[KEY_TAIL] (mod 2**64)."""
    tail = mix.shape[0] - 1
    key = np.uint64(end) * mix[tail]
    for t in range(tail):
        key += np.uint64(tokens[row, max(end - tail + t, 0)]) * mix[t]
    return key


@njit(cache=True)
def take_keys(keys, slots, index, query, found):
    """`RequestTable.find`'s pass: found[j], the slot of the first untaken entry keyed query[j] (-1:
    none; equal keys pair in insertion order); the entries left, moved to the front and re-indexed."""
    taken = np.zeros(keys.shape[0], np.bool_)
    mask = index.shape[0] - 1
    for j in range(query.shape[0]):
        found[j] = -1
        h = _home(query[j], mask)
        while index[h] >= 0:
            i = index[h]
            if keys[i] == query[j] and not taken[i]:
                taken[i], found[j] = True, slots[i]
                break
            h = (h + 1) & mask
    left = 0
    for i in range(keys.shape[0]):
        if not taken[i]:
            keys[left], slots[left] = keys[i], slots[i]
            left += 1
    _index(keys[:left], index)
    return left


@njit(cache=True)
def _home(key, mask):
    """A key's first slot in the index: its top bits after one more multiply."""
    return np.int64((key * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)) & mask


@njit(cache=True)
def _index(keys, index):
    """index[h]: the position in `keys` filed at slot h (linear probing; -1: free; > 2x slots as keys)."""
    index[:] = -1
    mask = index.shape[0] - 1
    for i in range(keys.shape[0]):
        h = _home(keys[i], mask)
        while index[h] >= 0:
            h = (h + 1) & mask
        index[h] = i


@njit(cache=True)
def _keep(new_keys, new_slots, keys, slots, last_step, step, grace, out_keys, out_slots, dead, index):
    """`RequestTable.keep`'s pass: (kept, dead), the entries kept in out_* and the slots freed in `dead`."""
    n = new_keys.shape[0]
    out_keys[:n], out_slots[:n] = new_keys, new_slots
    kept, gone = n, 0
    for i in range(keys.shape[0]):
        if step - last_step[slots[i]] < grace:
            out_keys[kept], out_slots[kept] = keys[i], slots[i]
            kept += 1
        else:
            dead[gone] = slots[i]
            gone += 1
    _index(out_keys[:kept], index)
    return kept, gone


@njit(cache=True)
def back_off_row(fails, resume, s, accepted, step, cap):
    """From a 2nd fully rejected draft in a row, slot s skips drafting until `step` + min(2^(fails - 1), cap)."""
    fails[s] = fails[s] + 1 if accepted == 0 else 0
    resume[s] = step + min(1 << min(fails[s] - 1, 30), cap) if fails[s] >= 2 else 0


class _Field:
    """A `RequestTable` field: row `row` of its `fields` (a view: item assignment writes through)."""
    def __init__(self, row: int) -> None:
        self.row = row

    def __get__(self, table: "RequestTable | None", owner: type | None = None) -> "np.ndarray | _Field":
        return self if table is None else table.fields[self.row]


class RequestTable:
    """The drafting state of every request the engine ran lately, one slot each: `budget`; `n` /
    `drafted` / `probs` (length when last drafted for, that draft's length and estimates); `prompt`
    (bundle key, -1: unknown); `sib` / `tree` (-1: none) and `sib_n` / `tree_n` (tokens each holds);
    `forecast` / `plen`; `step` (last seen); `fails` / `resume`. Int fields are rows of `fields`."""
    (budget, n, drafted, prompt, sib, sib_n, tree, tree_n, forecast, plen, step, fails,
     resume) = (_Field(row) for row in range(len(INT_FIELDS)))

    def __init__(self, width: int, capacity: int = 64) -> None:
        self.width = width  # the longest draft (vLLM's num_speculative_tokens)
        self.fields = np.zeros((len(INT_FIELDS), capacity), dtype=np.int64)  # [field, slot]
        self.probs = np.zeros((capacity, width), dtype=np.float64)
        self.keys = np.zeros(0, dtype=np.uint64)
        self.slots = np.zeros(0, dtype=np.int64)
        self.index = np.full(4 * capacity, -1, dtype=np.int64)  # the keys' positions by hash (`_index`)
        self._free = list(range(capacity - 1, -1, -1))

    def alloc(self) -> int:
        """A free slot, its fields reset (the arrays double when full)."""
        if not self._free:
            size = self.fields.shape[1]
            self.fields = np.concatenate([self.fields, np.zeros_like(self.fields)], axis=1)
            self.probs = np.concatenate([self.probs, np.zeros((size, self.width))])
            self._free = list(range(2 * size - 1, size - 1, -1))
        slot = self._free.pop()
        self.fields[:, slot] = 0
        self.fields[[PROMPT, SIB, TREE], slot] = -1
        return slot

    def keep(self, keys: np.ndarray, slots: np.ndarray, step: int, grace: int) -> None:
        """Store this step's requests under their new keys; unseen entries stay `grace` steps, then are freed."""
        size = len(keys) + len(self.keys)
        out_keys, out_slots = np.empty(size, np.uint64), np.empty(size, np.int64)
        dead = np.empty(len(self.keys), np.int64)
        if 2 * size >= len(self.index):  # at most half full: probes stay short
            self.index = np.full(1 << (2 * size).bit_length(), -1, dtype=np.int64)
        kept, gone = _keep(np.asarray(keys, np.uint64), np.asarray(slots, np.int64), self.keys, self.slots, self.step,
                           step, grace, out_keys, out_slots, dead, self.index)
        self.keys, self.slots = out_keys[:kept], out_slots[:kept]
        if gone:
            self._free.extend(dead[:gone].tolist())

    def __len__(self) -> int:
        return len(self.slots)


def group(keys: np.ndarray, mark: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct, which), keys == distinct[which], first-seen order; mark: all -1 scratch (left so)."""
    keys = np.asarray(keys, np.int64)
    distinct, which = np.empty(len(keys), np.int64), np.empty(len(keys), np.int64)
    return distinct[:_group(keys, mark, distinct, which)], which


@njit(cache=True)
def _group(keys, mark, distinct, which):
    """`group`'s pass: distinct[:count] and which filled, mark restored; count."""
    count = 0
    for j in range(keys.shape[0]):
        k = keys[j]
        if mark[k] < 0:
            mark[k], distinct[count] = count, k
            count += 1
        which[j] = mark[k]
    for c in range(count):
        mark[distinct[c]] = -1
    return count


class PromptTable:
    """Which known prompt a token row starts with (longest known prompt first)."""
    def __init__(self, prompts: Sequence[Sequence[int]], dtype: Any = np.int32) -> None:
        self.dtype = np.dtype(dtype)
        self.by_len: dict[int, dict[bytes, int]] = {}
        for k, p in enumerate(prompts):
            self.by_len.setdefault(len(p), {})[np.asarray(p, dtype=self.dtype).tobytes()] = k
        self.lengths = sorted(self.by_len, reverse=True)

    def lookup(self, row: np.ndarray, n: int) -> int | None:
        """Index of the prompt that `row[:n]` starts with, if any; needs n > prompt length."""
        if row.dtype != self.dtype:
            row = row.astype(self.dtype)
        for length in self.lengths:
            if length < n:
                k = self.by_len[length].get(row[:length].tobytes())
                if k is not None:
                    return k
        return None


class Counts:
    """`SpecStats`' counters as arrays for compiled passes: totals (as `tally_row`), the two length
    histograms, the position buckets' steps and tokens."""
    def __init__(self, width: int) -> None:
        self.arrays = (np.zeros(5, np.int64), np.zeros(width + 1, np.int64), np.zeros(width + 1, np.int64),
                       np.zeros(POSITION_BUCKETS, np.int64), np.zeros(POSITION_BUCKETS, np.int64))

    def flush(self, stats: SpecStats, positions: bool) -> None:
        """Add the counts to `stats` (`positions`: the position buckets too) and zero them."""
        totals, hist, acc, pos_steps, pos_tokens = self.arrays
        if not totals[0]:
            return
        steps, tokens, drafts, drafted, accepted = totals.tolist()
        size = int(np.flatnonzero(hist)[-1]) + 1 if drafts else 0  # a Tally's lists: longest draft + 1
        stats.add(Tally(steps, tokens, drafts, drafted, accepted, hist[:size].tolist(), acc[:size].tolist(),
                        pos_steps.tolist(), pos_tokens.tolist()), positions)
        for a in self.arrays:
            a.fill(0)


class StepLedger:
    """The counts of the steps since the last `flush`, for the drafter's `stats` and its `lifetime`."""
    def __init__(self, width: int) -> None:
        self.step, self.lifetime = Counts(width), Counts(width)

    def flush(self, stats: SpecStats, lifetime: SpecStats) -> None:
        """Add the counts since the last flush to `stats` and (without positions) `lifetime`."""
        self.step.flush(stats, positions=True)
        self.lifetime.flush(lifetime, positions=False)


@njit(cache=True)
def account_row(fields, probs, s, size, step_counts, life_counts, edges, cal_drafted, cal_hits, step, backoff):
    """Count slot s's verified draft (`size` >= 1 tokens sampled) in both `Counts`, the calibration
    and the back-off; (drafted, accepted, tokens calibrated)."""
    d = fields[DRAFTED, s]
    a = min(size - 1, d)
    tally_row(step_counts[0], step_counts[1], step_counts[2], d, a)
    tally_row(life_counts[0], life_counts[1], life_counts[2], d, a)
    position = fields[N, s] - fields[PLEN, s]
    tally_position(edges, step_counts[3], step_counts[4], position, a)
    counted = min(d, probs.shape[1])
    bucket = np.searchsorted(edges, position, side="right")  # calibrated per response-position bucket
    for i in range(counted):
        count_bin(probs[s, i], i < a, cal_drafted[bucket], cal_hits[bucket])
    if backoff > 0 and d > 0:
        back_off_row(fields[FAILS], fields[RESUME], s, a, step, backoff)
    return d, a, counted


@njit(cache=True)
def count_bin(p, hit, drafted, hits):
    """Add one draft token of estimate p (accepted: `hit`) to its calibration bin."""
    bins = drafted.shape[0]
    b = min(max(int(p * bins), 0), bins - 1)
    drafted[b] += 1.0
    if hit:
        hits[b] += 1.0
