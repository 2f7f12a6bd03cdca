"""The compiled batch drafter (`BatchIndexDrafter`) against the Python drafter it replaces in the
engine step (`HistoSpecDrafter.own`, the oracle): same drafts, match lengths and scores."""

import numpy as np
import pytest

from rhymerl.histospec.engine.batch import BatchIndexDrafter, FlatSlots
from rhymerl.histospec.drafter import EMPTY, MAX_CANDIDATES, histospec_drafter
from rhymerl.histospec.index import FlatIndex, PromptIndex
from helpers.histospec_calls import tree_rules
from helpers.histospec_calls import draft_arrays, propose


def rhyming(rng, vocab, length, count, change):
    """`count` copies of one random sequence, each token replaced with probability `change`."""
    base = rng.integers(0, vocab, length)
    rows = np.repeat(base[None], count, axis=0)
    hit = rng.random(rows.shape) < change
    rows[hit] = rng.integers(0, vocab, int(hit.sum()))
    return rows


def random_case(rng):
    """A spec, prompt indexes (history attached or not, siblings or not) and a batch of rows."""
    vocab = int(rng.choice([3, 8, 1000]))
    lo = int(rng.integers(1, 4))
    spec = tree_rules(min_match=lo, max_match=lo + int(rng.integers(0, 6)),
                      max_spec_factor=float(rng.choice([0.0, 1.0, 2.0])),
                      min_token_prob=float(rng.choice([0.0, 0.0, 0.2])),
                      reward_weighted=bool(rng.integers(0, 2)), max_budget=16)
    indexes, rows, nums = [], [], []
    for _ in range(int(rng.integers(1, 4))):
        prompt = rng.integers(0, vocab, int(rng.integers(1, 6)))
        length, hist = int(rng.integers(4, 120)), int(rng.integers(0, 8))
        siblings = rng.random() < 0.5
        group = rhyming(rng, vocab, length, hist + 4, float(rng.choice([0.02, 0.1, 0.4])))
        rewards = rng.random(hist).round(1)  # ties in reward sums happen
        ix = PromptIndex(rewards, spec.min_match, spec.max_match, prompt)
        if hist and rng.random() < 0.8:
            ix.attach(FlatIndex.build(group[:hist].ravel(), [length] * hist, prompt,
                                      min_match=spec.min_match, max_match=spec.max_match))
        live = group[hist:]
        for j, resp in enumerate(live):
            at = int(rng.integers(1, length + 1))
            if siblings and rng.random() < 0.6:  # a sibling, grown to a random point
                ix.add(resp[:int(rng.integers(0, length + 1))].tolist(), round(float(rng.random()), 1))
            row = np.zeros(130, dtype=np.int64)
            row[:len(prompt)], row[len(prompt):len(prompt) + at] = prompt, resp[:at]
            indexes.append(ix)
            rows.append(row)
            nums.append(len(prompt) + at)
    return spec, indexes, np.stack(rows), nums


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("limit", [MAX_CANDIDATES, 3])
def test_batch_drafts_equal_the_python_drafter(seed, dtype, limit):
    # Rule: for every row, the compiled path returns exactly HistoSpecDrafter.own's Draft.
    # With 3 candidates most matched runs hold more than the kept occurrences (the kernel keeps a
    # run's most recent: the last entries of a max_match-deep run, selected from a shallower one).
    rng = np.random.default_rng(seed)
    for _ in range(25):
        spec, indexes, rows, nums = random_case(rng)
        mix = rng.permutation(len(nums))  # the prompts' rows interleaved: the kernel re-takes a slot's arrays
        indexes, rows, nums = [indexes[i] for i in mix], rows[mix].astype(dtype), [nums[i] for i in mix]
        budgets = rng.integers(1, 17, len(nums)).tolist()
        drafter = BatchIndexDrafter(spec, max_candidates=limit)
        got = propose(drafter, indexes, range(len(nums)), nums, budgets, rows)
        for ix, row, n, b, draft in zip(indexes, rows, nums, budgets, got):
            python = histospec_drafter(spec, ix)
            python.max_candidates = limit
            assert draft == python.own(row[:n].tolist(), b)
        _, lens, _, _, probs = draft_arrays(drafter, indexes, range(len(nums)), nums, budgets, rows)
        assert not probs[np.arange(probs.shape[1])[None, :] >= lens[:, None]].any()  # 0 past each length


def test_no_rows_and_rows_without_a_history_or_match():
    spec = tree_rules()
    bd = BatchIndexDrafter(spec)
    assert propose(bd, [], [], [], [], np.zeros((0, 4), np.int32)) == []
    ix = PromptIndex([0.0], 1, 7)  # history not attached yet, no siblings
    assert propose(bd, [ix], [0], [3], [4], np.array([[1, 2, 3]], np.int32)) == [EMPTY]


def test_slots_are_shared_per_history_and_freed_when_dropped():
    spec = tree_rules()
    a, b = (PromptIndex.build(np.array([1, 2, 3, 4]), [4], min_match=1, max_match=7) for _ in range(2))
    slots = FlatSlots(7)
    assert (slots.slot(a), slots.slot(a), slots.slot(b)) == (0, 0, 1)
    slots.retain([b])
    assert len(slots) == 1 and slots.slot(a) == 0  # a's slot was freed, then reused
    bd = BatchIndexDrafter(spec)
    assert propose(bd, [a], [0], [2], [4], np.array([[1, 2]], np.int32))[0].tokens == (3, 4)
    # a history indexed to another depth is refused: the kernel reads max_match-deep runs as in position order
    with pytest.raises(ValueError, match="max_match 5 cannot be drafted with max_match 7"):
        slots.slot(PromptIndex.build(np.array([1, 2, 3, 4]), [4], min_match=1, max_match=5))


def test_a_siblings_slot_follows_its_arrays_when_they_grow():
    # Rule: a slot references a SideIndex's arrays; when they are reallocated (the siblings grew),
    # the next look-up replaces its entries, so the compiled step never reads stale arrays.
    ix = PromptIndex.build(np.array([1, 2, 3, 4]), [4], min_match=1, max_match=7)
    seq = ix.add([5, 6, 7])
    bd = BatchIndexDrafter(tree_rules(min_match=2, max_spec_factor=0.0))
    row = np.array([[5, 6, 10, 11]], np.int32)
    assert propose(bd, [ix], [0], [2], [3], row)[0].tokens == (7,)  # after 5 6 the sibling has 7
    k = bd.sides.slot(ix.side)
    ix.extend(seq, list(range(10, 200)))  # outgrows the first arrays
    assert propose(bd, [ix], [0], [4], [3], row)[0].tokens == (12, 13, 14)  # 10 11 -> 12 13 14
    assert bd.sides.slot(ix.side) == k and np.array_equal(bd.sides.lists[0][k], ix.side.tok)
    bd.retain([])
    assert len(bd.sides) == 0 and len(bd.slots) == 0
