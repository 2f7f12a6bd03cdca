"""rhymerl/histospec/side.py: the siblings' array table answers as the dict `SuffixIndex` does."""

import numpy as np
import pytest

from rhymerl.histospec.index import STRIDE, SuffixIndex, _tail_keys
from rhymerl.histospec.side import NKEYS, NOCC, ROWS, SOON, SideIndex


def grow_both(rng, lo, hi, vocab):
    """The same random siblings (started, then grown a few tokens at a time) in a SideIndex and a
    SuffixIndex."""
    prefix = rng.integers(0, vocab, int(rng.integers(0, 9))).tolist()
    side, ref = SideIndex(lo, hi, prefix), SuffixIndex(lo, hi, prefix)
    base = rng.integers(0, vocab, 300)
    seqs = []
    for _ in range(int(rng.integers(1, 20))):
        if not seqs or rng.random() < 0.2:
            first = base[:int(rng.integers(0, 5))].tolist()
            assert side.add(first) == ref.add(first)
            seqs.append(len(first))
            continue
        ids = rng.choice(len(seqs), int(rng.integers(1, len(seqs) + 1)), replace=False)
        for s in ids.tolist():
            size = int(rng.integers(0, 40))
            chunk = base[seqs[s]:seqs[s] + size].copy()
            hit = rng.random(len(chunk)) < 0.1
            chunk[hit] = rng.integers(0, vocab, int(hit.sum()))
            seqs[s] += len(chunk)
            ref.extend(s, chunk.tolist())
            side.extend(s, chunk)
    return side, ref, base


@pytest.mark.parametrize("seed", range(6))
def test_side_index_answers_as_the_dict_index(seed):
    # Rule: same sequences, same longest match, same most recent occurrences (oldest first), same
    # continuations, for random tails (from the shared base, so most match) and random limits.
    rng = np.random.default_rng(seed)
    for _ in range(10):
        lo = int(rng.integers(1, 4))
        hi = lo + int(rng.integers(0, 6))
        vocab = int(rng.choice([2, 5, 50]))
        side, ref, base = grow_both(rng, lo, hi, vocab)
        assert len(side) == len(ref.sequences)
        assert [side.sequence(s) for s in range(len(side))] == ref.sequences
        assert side.num_tokens == sum(map(len, ref.sequences))
        for _ in range(30):
            at = int(rng.integers(1, 200))
            tail = base[max(0, at - int(rng.integers(1, 12))):at].tolist()
            if rng.random() < 0.3:
                tail[-1] = int(rng.integers(0, vocab))
            keys = _tail_keys(tail[-hi:])
            n = side.longest(tail)
            assert n == ref.longest(keys)
            for m in {n, len(keys), lo}:
                if lo <= m <= len(keys):
                    limit = int(rng.integers(1, 40))
                    codes = side.recent(tail, m, limit)
                    assert codes == ref.table.get(keys[m - 1], [])[-limit:]
                    assert side.gather(codes, 5) == ref.gather(codes, 5)


def test_growth_past_every_initial_capacity_keeps_answers():
    # Rule: the arrays double (sequences, length, occurrences, table) without losing an occurrence.
    rng = np.random.default_rng(7)
    side, ref = SideIndex(1, 7), SuffixIndex(1, 7)
    for _ in range(ROWS + 2):
        toks = rng.integers(0, 1000, 500).tolist()
        s = side.add(toks[:3])
        ref.add(toks[:3])
        side.extend(s, toks[3:])
        ref.extend(s, toks[3:])
    assert side.tok.shape[0] > ROWS and side.tok.shape[1] >= 500
    for seq in ref.sequences:
        for at in (7, 100, 499):
            tail = seq[:at]
            assert side.longest(tail) == ref.longest(_tail_keys(tail[-7:]))
            assert side.recent(tail, 7, 32) == ref.table.get(_tail_keys(tail[-7:])[6], [])[-32:]


def test_room_made_ahead_means_no_reallocation_in_the_step_and_the_same_answers():
    # Rule: after room_ahead(tokens, total, longest), appending up to `tokens` to each sequence and
    # `total` in all reallocates nothing (generation unchanged: the engine's step never grows the
    # arrays the helper grew); a larger table is filled over several calls and swapped in whole; the
    # rows never grow past `longest`; answers stay the dict index's throughout.
    rng = np.random.default_rng(5)
    side, ref = SideIndex(1, 7, [4]), SuffixIndex(1, 7, [4])
    base = rng.integers(0, 30, 5000)
    for _ in range(4):
        side.add(base[:3].tolist())
        ref.add(base[:3].tolist())
    held, swaps, calls = 3, 0, 0
    while held < 4000:
        before = side.generation
        wrote = side.room_ahead(64, 4 * 64, longest=4095)
        calls += 1
        swaps += side.generation != before
        assert wrote > 0 or side.generation == before
        before = side.generation
        for s in range(4):
            chunk = base[held:held + 50].copy()
            chunk[rng.random(50) < 0.1] = 7
            side.extend(s, chunk)
            ref.extend(s, chunk.tolist())
        held += 50
        assert side.generation == before
    assert side.tok.shape[1] == 4096 and swaps >= 3 and len(side.table) >= 2 * 4 * 7 * 1000
    for at in (10, 999, 3999):
        tail = ref.sequences[2][:at]
        assert side.longest(tail) == ref.longest(_tail_keys(tail[-7:]))
        assert side.recent(tail, 7, 32) == ref.table.get(_tail_keys(tail[-7:])[6], [])[-32:]


def test_wider_rows_keep_every_code_and_more_rows_keep_every_answer():
    # Rule: codes are position * rows + seq, so widening the rows (a sibling passing a power of two)
    # leaves the table as it was (only copied links, no code rewritten); more sequences than rows
    # (ROWS -> 2 ROWS) rewrite the codes, and answers stay the dict index's either way.
    rng = np.random.default_rng(2)
    side, ref = SideIndex(1, 7), SuffixIndex(1, 7)
    base = rng.integers(0, 10, 400)
    for _ in range(ROWS):
        side.add(base[:30].tolist())
        ref.add(base[:30].tolist())
    table, links, cols = side.table.copy(), side.links.copy(), side.tok.shape[1]
    assert 8 * side.state[NKEYS] < 3 * len(table)  # room_ahead(..., total=0) leaves this table alone
    assert side.room_ahead(100, 0, longest=1000, allowance=0)  # wider rows, for SOON steps (due: allowance or not)
    filed = (int(side.lens.max()) + 1) * ROWS  # the links of positions 0..the longest end (the rest unwritten)
    assert side.tok.shape == (ROWS, 256) and (side.table == table).all() and (side.links[:filed] == links[:filed]).all()
    side.extend(0, base[30:100])
    ref.extend(0, base[30:100].tolist())
    side.add(base[:200].tolist())  # one sequence more than the rows: twice the rows
    ref.add(base[:200].tolist())
    assert side.tok.shape[0] == 2 * ROWS
    for seq in (0, 1, ROWS - 1, ROWS):
        for at in (8, 29, 60, 99):
            tail = ref.sequences[seq][:at]
            if len(tail) < 8:
                continue
            assert side.longest(tail) == ref.longest(_tail_keys(tail[-7:]))
            assert side.recent(tail, 7, 32) == ref.table.get(_tail_keys(tail[-7:])[6], [])[-32:]


def test_bad_ids_and_settings_are_refused():
    with pytest.raises(ValueError, match="min_match"):
        SideIndex(0, 3)
    side = SideIndex(1, 3)
    side.add([1, 2])
    with pytest.raises(ValueError, match="unknown sequence id"):
        side.extend(1, [3])
    assert side.longest([9]) == 0 and side.recent([9], 1, 4) == []


def test_rows_too_large_for_int32_positions_are_refused_before_allocating():
    # Rule: positions are int32 (seq * cols + position); an index that would outgrow them says so
    # (and what to change) instead of wrapping around, and is left as it was.
    side = SideIndex(1, 3)
    side.add([1, 2, 3])
    with pytest.raises(ValueError, match="overflow the index's int32 positions"):
        side.reserve(2 ** 31, 1)
    assert side.sequence(0) == [1, 2, 3] and side.longest([1, 2]) == 2


def test_extending_from_token_rows_equals_extending_from_lists():
    # Rule: the engine's path (new tokens read from its token rows, one index) builds the
    # same table as appending each sibling's tokens.
    rng = np.random.default_rng(11)
    rows = rng.integers(0, 6, (5, 60)).astype(np.int32)
    a, b = SideIndex(1, 5, [1, 2]), SideIndex(1, 5, [1, 2])
    for r in range(5):
        a.add(rows[r, :3].tolist())
        b.add(rows[r, :3].tolist())
    at = np.full(5, 3)
    for _ in range(8):
        ids = rng.choice(5, int(rng.integers(1, 6)), replace=False)
        ends = at[ids] + rng.integers(0, 6, len(ids))
        a.extend_rows(ids, rows, ids, at[ids], ends)
        for s, e in zip(ids.tolist(), ends.tolist()):
            b.extend(s, rows[s, at[s]:e].tolist())
        at[ids] = ends
    assert [a.sequence(s) for s in range(5)] == [b.sequence(s) for s in range(5)]
    for n in range(1, 60, 3):
        tail = rows[n % 5, :n].tolist()
        assert a.longest(tail) == b.longest(tail)
        m = min(2, len(tail))
        assert a.recent(tail, m, 9) == b.recent(tail, m, 9)


def test_extending_many_indexes_in_one_call_equals_extending_each():
    # Rule: SideSlots.extend_rows (the engine step's one call for all prompts, rows of prompts
    # interleaved) builds the same tables as each index's own extend_rows.
    from rhymerl.histospec.slots import SideSlots

    rng = np.random.default_rng(12)
    rows = rng.integers(0, 6, (6, 200)).astype(np.int32)
    ours, theirs = [SideIndex(1, 5, [1, 2]) for _ in range(2)], [SideIndex(1, 5, [1, 2]) for _ in range(2)]
    for side in ours + theirs:
        for _ in range(3):
            side.add()
    slots, at = SideSlots(), np.zeros(6, np.int64)  # row r: sequence r % 3 of index r // 3
    for _ in range(10):
        grow = rng.choice(6, int(rng.integers(1, 7)), replace=False)  # in any order: indexes interleaved too
        ends = at[grow] + rng.integers(0, 40, len(grow))  # enough to reallocate the arrays
        slots.extend_rows(ours, grow // 3, grow % 3, rows, grow, at[grow], ends)
        for k in range(2):
            mine = grow // 3 == k
            theirs[k].extend_rows(grow[mine] % 3, rows, grow[mine], at[grow[mine]], ends[mine])
        at[grow] = ends
    for a, b in zip(ours, theirs):
        assert [a.sequence(s) for s in range(3)] == [b.sequence(s) for s in range(3)]
        for n in range(1, 200, 7):
            tail = rows[n % 6, :n].tolist()
            assert a.longest(tail) == b.longest(tail) and a.recent(tail, 1, 9) == b.recent(tail, 1, 9)
    with pytest.raises(ValueError, match="unknown sibling sequence"):
        slots.extend_rows(ours, np.zeros(1, np.int64), np.array([3]), rows, np.zeros(1, np.int64),
                          np.zeros(1, np.int64), np.ones(1, np.int64))


def test_the_one_call_room_test_answers_as_room_does():
    # Rule: side_arrays.crowded (SideSlots.extend_rows's test for all indexes at once) says "grow"
    # exactly when SideIndex.reserve reallocates: a sequence as long as the rows are wide, a table
    # over half full if every new or pending token filed a new key per n, or more pending ranges
    # than the index has room for.
    from rhymerl.histospec.side import PENDING
    from rhymerl.histospec.side_arrays import crowded
    from rhymerl.histospec.slots import SideSlots

    slots = SideSlots()
    cases = [(63, 1, 1, 0), (64, 1, 1, 0), (40, 1, 1, 0), (40, 20, 1, 0), (40, 60, 1, 0), (40, 1, PENDING, 0),
             (40, 1, PENDING + 1, 0), (40, 30, 1, 0), (40, 30, 1, 10)]  # the last: full for its pending keys
    for longest, total, ranges, pending in cases:
        side = SideIndex(1, 7)
        side.add(list(range(40)))  # rows 64 wide
        if pending:  # appended, not filed: their keys count as the new tokens' do
            slots.extend_rows([side], np.zeros(1, np.int64), np.zeros(1, np.int64), np.arange(pending)[None],
                              np.zeros(1, np.int64), np.zeros(1, np.int64), np.array([pending]), defer=True)
        k, out = slots.slot(side), np.zeros(1, np.bool_)
        at = np.full(1, k, np.int64)
        longests, totals, rangess = (np.zeros(len(slots.tok), np.int64) for _ in range(3))
        longests[k], totals[k], rangess[k] = longest, total, ranges
        crowded(slots.tok, slots.table, slots.state, slots.pend, at, longests, totals, rangess, 7, out)
        before = side.generation
        side.reserve(longest, total, ranges)
        assert bool(out[0]) == (side.generation != before), (longest, total, ranges, pending)


def test_room_due_next_step_is_always_made_room_for_later_steps_only_within_the_allowance():
    # Rule: room_ahead makes what `tokens` more would need next step whatever `allowance` says, and
    # room for up to SOON steps' growth early only while allowance > 0; it returns the bytes written.
    def side_of(length):
        side = SideIndex(1, 7)
        for _ in range(4):
            side.add(list(range(length)))
        return side

    assert SOON == 2
    side = side_of(40)  # rows 64 wide: 15 more fit, SOON x 15 do not
    assert side.room_ahead(15, 0, longest=1000, allowance=0) == 0 and side.tok.shape[1] == 64
    assert side.room_ahead(15, 0, longest=1000, allowance=1) >= side.links.nbytes and side.tok.shape[1] == 128
    side = side_of(40)
    assert side.room_ahead(60, 0, longest=1000, allowance=0) > 0  # due: 100 > 64
    assert side.tok.shape[1] == 256  # made for SOON steps at once: 40 + 2 x 60 tokens
    side = side_of(200)  # the table: 3/8 full after `total` more starts the next one, filled a chunk at a time
    table = side.table
    total = (7 * len(table) // 16 - int(side.state[NKEYS])) // 7  # keys then ~7/16 of the slots: not due
    assert side.room_ahead(0, total, longest=1000, allowance=0) == 0 and side.table is table
    assert side.room_ahead(0, total, longest=1000, allowance=1) > 0
    assert len(side.table) == 2 * len(table)  # under FILL_SLOTS: filled in one call and swapped in


@pytest.mark.parametrize("seed,lo", [(0, 1), (1, 1), (2, 2), (3, 2)])
def test_pending_ngrams_answer_as_filed(seed, lo):
    # Rule: the drafting kernel's siblings' search (`sibling_match`) over tokens appended but not yet
    # filed (`SideSlots.extend_rows(defer=True)`: read where they lie) answers exactly as after they
    # are filed: the same match length, the same `limit` most recent occurrences in the same order.
    # Tokens 5 and 6 occur only in what is pending, so some tails match only there; a small limit cuts
    # some answers inside the pending ones, others inside the filed ones.
    from rhymerl.histospec.side_search import pending_keys, sibling_match
    from rhymerl.histospec.slots import SideSlots

    rng = np.random.default_rng(seed)
    hi = 4
    side, slots = SideIndex(lo, hi, [7, 8]), SideSlots()
    for _ in range(3):
        side.add(rng.integers(0, 5, 30).tolist())
    rows = rng.integers(0, 7, (3, 12))
    firsts, lasts = np.zeros(3, np.int64), rng.integers(1, 13, 3)
    held = int(side.state[NOCC])
    slots.extend_rows([side], np.zeros(3, np.int64), np.arange(3), rows, np.arange(3), firsts, lasts, defer=True)
    side.add()  # a new sequence's prefix joins the pending ones too, filed after them
    assert side.searchable and side.state[NOCC] == held  # nothing filed yet

    def answers():
        pk, info = np.empty((64, hi - lo + 1), np.uint64), np.empty((64, 3), np.int64)
        npe = pending_keys(side.tok, side.lens, side.state, side.pend, lo, hi, pk, info)
        got, keys, codes = [], np.empty(hi, np.uint64), np.empty(3, np.int64)
        for seq in range(3):
            tokens = side.sequence(seq)
            for end in range(2, len(tokens) + 1):
                q = np.array(tokens[max(0, end - hi):end][::-1], np.int64)
                for n_flat in (0, 1, 2):
                    n, count = sibling_match(side.lens, side.table, side.links, side.tok.shape[0], q, len(q), n_flat,
                                             lo, 3, keys, codes, pk, info, npe)
                    got.append((n, codes[:count].tolist()))
        return got, npe

    pending, npe = answers()
    side.flush()
    filed, none = answers()
    assert npe == int(lasts.sum()) + 2 and none == 0 and pending == filed
    assert sum(1 for n, codes in filed if n and codes and max(codes) % STRIDE > 32) > 10  # pending ones answered
