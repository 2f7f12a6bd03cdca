"""Per-request drafting state of an engine's running requests, in arrays (`RequestTable`).

vLLM's drafter interface gives rows, not request ids, and moves requests between rows as others
finish. A request is found again by its key: its length and its last `KEY_TAIL` tokens at the step it
was last drafted for (next step, its first `num_tokens - len(sampled)` tokens are exactly those,
wherever its row now is), hashed to one uint64 per row in one compiled call (`row_keys`). Two
requests with the same length and tail may swap states: that can cost draft quality, never
correctness.

Why arrays: the state lived in a Python object per request, looked up and updated in a Python loop
over the batch (~4 us per request per step: 1 ms of an engine step at 256 requests, all of issue
17's drafting budget). Here one step's lookup is a sort-and-search over the step's keys
(`find`), its updates are array expressions over the rows' slots, and only a request seen for the
first time costs Python work.
"""

from __future__ import annotations

import numpy as np
from numba import njit

KEY_TAIL = 16  # tokens of a request's tail in its key (with its length)
_MIX = np.random.default_rng(0x5EED).integers(1, 2**63, KEY_TAIL + 1, dtype=np.uint64) | np.uint64(1)


def row_keys(tokens: np.ndarray, rows: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The keys of the requests in `rows` holding `ends` tokens: a uint64 hash of (length, last
    KEY_TAIL tokens; positions before 0 read token 0), for all rows in one compiled call."""
    rows, ends = np.asarray(rows, np.int64), np.asarray(ends, np.int64)
    out = np.zeros(len(rows), dtype=np.uint64)
    if len(rows):
        _keys(tokens, rows, ends, _MIX, out)
    return out


@njit(cache=True)
def _keys(tokens, rows, ends, mix, out):
    """out[j]: `_key` of row rows[j] at ends[j]."""
    for j in range(rows.shape[0]):
        out[j] = _key(tokens, rows[j], ends[j], mix)


@njit(cache=True)
def _key(tokens, row, end, mix):
    """sum_t tokens[row, end - KEY_TAIL + t] * mix[t] + end * mix[KEY_TAIL] (mod 2**64)."""
    tail = mix.shape[0] - 1
    key = np.uint64(end) * mix[tail]
    for t in range(tail):
        key += np.uint64(tokens[row, max(end - tail + t, 0)]) * mix[t]
    return key


@njit(cache=True)
def _find_rows(tokens, rows, before, ends, mix, keys, slots, found, kept):
    """`RequestTable.find_rows`' pass: found / kept filled, the stored entries not taken moved to the
    front of keys / slots; how many are left."""
    query = np.empty(rows.shape[0], np.uint64)
    for j in range(rows.shape[0]):
        query[j] = _key(tokens, rows[j], before[j], mix)
        kept[j] = _key(tokens, rows[j], ends[j], mix)
    return _take(keys, slots, query, found)


@njit(cache=True)
def _take(keys, slots, query, found):
    """`RequestTable.find`'s pass over the stored keys / slots (see `_find_rows`)."""
    at = np.full(query.shape[0], -1, np.int64)
    taken = np.zeros(keys.shape[0], np.bool_)
    if keys.shape[0]:
        _match(keys, query, at)
    for j in range(query.shape[0]):
        found[j] = slots[at[j]] if at[j] >= 0 else -1
        if at[j] >= 0:
            taken[at[j]] = True
    left = 0
    for i in range(keys.shape[0]):
        if not taken[i]:
            keys[left], slots[left] = keys[i], slots[i]
            left += 1
    return left


@njit(cache=True)
def _keep(new_keys, new_slots, keys, slots, last_step, step, grace, out_keys, out_slots, dead):
    """`RequestTable.keep`'s pass: the step's entries, then the stored ones seen within `grace` steps,
    into out_*; the others' slots into `dead`. (entries kept, slots dead)."""
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
    return kept, gone


def match_keys(stored: np.ndarray, query: np.ndarray) -> np.ndarray:
    """For each query key, a distinct position in `stored` holding an equal key (-1: none left);
    equal query keys take equal stored keys in order."""
    out = np.full(len(query), -1, dtype=np.int64)
    if len(stored) and len(query):
        _match(np.asarray(stored, np.uint64), np.asarray(query, np.uint64), out)
    return out


@njit(cache=True)
def _match(stored, query, out):
    """`match_keys` as one merge of both key lists, each sorted stably."""
    order = np.argsort(stored, kind="mergesort")
    qorder = np.argsort(query, kind="mergesort")
    i, size = 0, stored.shape[0]
    for j in range(qorder.shape[0]):
        key = query[qorder[j]]
        while i < size and stored[order[i]] < key:
            i += 1
        if i < size and stored[order[i]] == key:  # the next equal stored key not yet taken
            out[qorder[j]] = order[i]
            i += 1


@njit(cache=True)
def _back_off(fails, resume, slots, drafted, accepted, step, cap):
    """`RequestTable.back_off` in one pass over the rows (a dozen array expressions cost ~70 us)."""
    for j in range(slots.shape[0]):
        if drafted[j] > 0:
            _fail(fails, resume, slots[j], accepted[j], step, cap)


@njit(cache=True)
def _fail(fails, resume, s, accepted, step, cap):
    """Slot s's draft was verified with `accepted` tokens accepted: count a full rejection in a row
    (`fails`) and set the first step it may draft again (`resume`)."""
    fails[s] = fails[s] + 1 if accepted == 0 else 0
    resume[s] = step + min(1 << min(fails[s] - 1, 30), cap) if fails[s] >= 2 else 0


class RequestTable:
    """The drafting state of every request the engine ran lately, one slot per request.

    Fields (arrays indexed by slot): `budget` (its draft budget), `n` (its length when last drafted
    for), `drafted` (the length of that draft, 0: none), `probs` (that draft's estimated token
    probabilities, `Draft.probs`), `prompt` (its prompt's key in the bundle, -1: unknown prompt),
    `sib` / `sib_n` (its sequence in the prompt's index, -1: none, and how many of its row's tokens
    that sequence holds), `tree` / `tree_n` (its handle in the cross-prompt tree, -1: none, and how
    many of its row's tokens the tree holds), `forecast` / `plen`
    (its prompt's longest earlier response, 0: none, and the prompt's length), `step` (the last
    step that saw it), `fails` / `resume` (its fully rejected drafts in a row, and the first step
    it may draft again: `spec.fail_backoff`). `keys` / `slots`: the key each live slot was stored under.
    """

    INT_FIELDS = ("budget", "n", "drafted", "prompt", "sib", "sib_n", "tree", "tree_n", "forecast", "plen", "step",
                  "fails", "resume")

    def __init__(self, width: int, capacity: int = 64) -> None:
        self.width = width  # the longest draft (vLLM's num_speculative_tokens)
        for name in self.INT_FIELDS:
            setattr(self, name, np.zeros(capacity, dtype=np.int64))
        self.probs = np.zeros((capacity, width), dtype=np.float64)
        self.keys = np.zeros(0, dtype=np.uint64)
        self.slots = np.zeros(0, dtype=np.int64)
        self._free = list(range(capacity - 1, -1, -1))
        for dtype in (np.int32, np.int64):  # compile (or load) the kernels now, not inside a step
            row_keys(np.zeros((1, 1), dtype), np.zeros(1, np.int64), np.ones(1, np.int64))
        for dtype in (np.int32, np.int64):
            self.find_rows(np.zeros((1, 1), dtype), np.zeros(1, np.int64), np.zeros(1, np.int64), np.ones(1, np.int64))
        self.keep(np.ones(1, np.uint64), np.zeros(1, np.int64), 0, 1)
        self.find(np.ones(1, np.uint64))
        self.keep(np.zeros(0, np.uint64), np.zeros(0, np.int64), 0, 1)
        match_keys(np.ones(1, np.uint64), np.ones(1, np.uint64))
        self.back_off(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), 0, 1)

    def alloc(self) -> int:
        """A free slot, its fields reset (the arrays double when full)."""
        if not self._free:
            size = len(self.n)
            for name in self.INT_FIELDS:
                old = getattr(self, name)
                setattr(self, name, np.concatenate([old, np.zeros(size, dtype=np.int64)]))
            self.probs = np.concatenate([self.probs, np.zeros((size, self.width))])
            self._free = list(range(2 * size - 1, size - 1, -1))
        slot = self._free.pop()
        for name in self.INT_FIELDS:
            getattr(self, name)[slot] = 0
        self.prompt[slot] = self.sib[slot] = self.tree[slot] = -1
        return slot

    def find(self, keys: np.ndarray) -> np.ndarray:
        """The slots stored under `keys` (-1: not found), each stored entry matched at most once and
        then taken out of the table (`keep` stores the step's keys again)."""
        found = np.empty(len(keys), np.int64)
        left = _take(self.keys, self.slots, np.asarray(keys, np.uint64), found)
        self.keys, self.slots = self.keys[:left], self.slots[:left]
        return found

    def find_rows(self, tokens: np.ndarray, rows: np.ndarray, before: np.ndarray, ends: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
        """`find` of the requests in `rows` by their keys at `before` (`row_keys`), and their keys at
        `ends` (to `keep` them under), in one compiled call: an engine step needs both."""
        found, kept = np.empty(len(rows), np.int64), np.empty(len(rows), np.uint64)
        left = _find_rows(tokens, rows, before, ends, _MIX, self.keys, self.slots, found, kept)
        self.keys, self.slots = self.keys[:left], self.slots[:left]
        return found, kept

    def back_off(self, slots: np.ndarray, drafted: np.ndarray, accepted: np.ndarray, step: int, cap: int) -> None:
        """Count each drafting request's fully rejected drafts in a row (`fails`); from the second
        on, it skips drafting until step `step` + 2^(fails - 1), at most + `cap` (`resume`). Only
        what earlier steps' verifications decided is read, so the sampled distribution stays the
        target's (`spec.fail_backoff`)."""
        _back_off(self.fails, self.resume, np.asarray(slots, np.int64), np.asarray(drafted, np.int64),
                  np.asarray(accepted, np.int64), step, cap)

    def keep(self, keys: np.ndarray, slots: np.ndarray, step: int, grace: int) -> None:
        """Store this step's requests under their new keys; entries not seen this step stay for
        `grace` steps after they were last seen (a request vLLM paused), then their slots are freed."""
        size = len(keys) + len(self.keys)
        out_keys, out_slots, dead = np.empty(size, np.uint64), np.empty(size, np.int64), np.empty(len(self.keys), np.int64)
        kept, gone = _keep(np.asarray(keys, np.uint64), np.asarray(slots, np.int64), self.keys, self.slots, self.step,
                           step, grace, out_keys, out_slots, dead)
        self.keys, self.slots = out_keys[:kept], out_slots[:kept]
        if gone:
            self._free.extend(dead[:gone].tolist())

    def __len__(self) -> int:
        return len(self.slots)


def group(keys: np.ndarray, mark: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct, which) with keys == distinct[which], distinct in first-seen order (np.unique's
    answer but for the order: ~50 us a call at 256 rows, this ~3). keys: ints in 0..len(mark) - 1;
    mark: int64 scratch, -1 everywhere (left so)."""
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
