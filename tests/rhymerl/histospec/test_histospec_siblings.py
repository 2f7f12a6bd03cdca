"""rhymerl/histospec/siblings.py and sibling_table.py: the siblings' array table answers as the dict `SuffixIndex` does."""

import numpy as np
import pytest

from helpers.histospec_oracle import SuffixIndex, _tail_keys
from rhymerl.histospec.siblings import ROWS, SideIndex


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
    table, links = side.table.copy(), side.links.copy()
    side.reserve(200, 0)  # wider rows
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
    from rhymerl.histospec.engine.batch import SideSlots

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
    # Rule: sibling_table.crowded (SideSlots.extend_rows's test for all indexes at once) says "grow"
    # exactly when SideIndex.reserve reallocates: a sequence as long as the rows are wide, or a table
    # over half full if every new token filed a new key per n.
    from rhymerl.histospec.engine.batch import SideSlots
    from rhymerl.histospec.sibling_table import crowded

    slots = SideSlots()
    for longest, total in [(63, 1), (64, 1), (40, 1), (40, 20), (40, 60), (40, 30)]:
        side = SideIndex(1, 7)
        side.add(list(range(40)))  # rows 64 wide
        k, out = slots.slot(side), np.zeros(1, np.bool_)
        at = np.full(1, k, np.int64)
        longests, totals = (np.zeros(len(slots.tok), np.int64) for _ in range(2))
        longests[k], totals[k] = longest, total
        crowded(slots.tok, slots.table, slots.state, at, longests, totals, 7, out)
        before = side.generation
        side.reserve(longest, total)
        assert bool(out[0]) == (side.generation != before), (longest, total)


