"""The flat history index (`FlatIndex`, `PromptIndex`) against the dict index it replaces, and the
flat bundle the engine reads."""

import numpy as np
import pytest

from rhymerl.histospec.drafter import HistoSpecDrafter
from helpers.histospec_oracle import SuffixIndex
from rhymerl.histospec.bundle import HistoryBundle, PromptHistory
from rhymerl.histospec.index import FlatIndex, PromptIndex
from rhymerl.histospec.sibling_table import STRIDE


def flat(seqs, lo=1, hi=7, prefix=()):
    return PromptIndex.build(np.asarray([t for s in seqs for t in s], dtype=np.int64), [len(s) for s in seqs],
                             min_match=lo, max_match=hi, prefix=prefix)


def canonical(index, codes):
    """Codes as (sequence, position) pairs, those with a token after them."""
    return sorted(index.seq_pos(c) for c, cont in zip(codes, index.gather(codes, 1)) if cont)


def test_longest_tail_and_its_continuations():
    # [1, 2, 3] occurs in sequences 0 and 2 (continued by 4) and 1 (by 5); 2-grams match nothing longer.
    ix = flat([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 4]], lo=2, hi=3)
    n, codes = ix.match([9, 1, 2, 3])
    assert n == 3 and canonical(ix, codes) == [(0, 3), (1, 3), (2, 3)]
    assert sorted(ix.gather(codes, 5)) == [[4], [4], [5]]


def test_a_match_never_crosses_a_sequence_start_and_ends_need_a_next_token():
    ix = flat([[1, 2], [3, 4]], lo=2, hi=2)
    assert ix.match([2, 3]) == (0, [])  # 2 | 3 spans two sequences
    assert ix.match([3, 4]) == (0, [])  # occurs, but at the end: nothing follows


def test_most_recent_occurrences_come_last_and_are_kept():
    # five copies of [7, 8, 9]: with limit 2 the two latest sequences (3, 4) remain, oldest first
    ix = flat([[7, 8, 9]] * 5, lo=2, hi=2)
    n, codes = ix.recent_match([7, 8], 2)
    assert n == 2 and [ix.seq_pos(c) for c in codes] == [(3, 2), (4, 2)]


def test_siblings_join_after_the_history_and_the_history_may_come_later():
    ix = PromptIndex([1.0], min_match=1, max_match=3)
    sib = ix.add([5, 6, 7])
    assert sib == 1 and canonical(ix, ix.match([5, 6])[1]) == [(1, 2)]  # siblings alone before attach
    ix.attach(FlatIndex.build(np.array([5, 6, 9]), [3], min_match=1, max_match=3))
    assert canonical(ix, ix.match([5, 6])[1]) == [(0, 2), (1, 2)]  # history first, then the sibling
    assert ix.reward_of(ix.match([5, 6])[1][0]) == 1.0
    with pytest.raises(ValueError):
        ix.extend(0, [1])  # the history is read-only


@pytest.mark.parametrize("seed", range(3))
def test_same_matches_as_the_dict_index_on_random_histories(seed):
    # Rule: PromptIndex answers as SuffixIndex over the same history + siblings (equal n, same occurrences
    # with a next token, same continuations), whatever min/max match, prefix and sibling growth.
    rng = np.random.default_rng(seed)
    for _ in range(100):
        vocab, lo = int(rng.integers(2, 6)), int(rng.integers(1, 4))
        hi = lo + int(rng.integers(0, 5))
        seqs = [rng.integers(0, vocab, int(rng.integers(0, 12))).tolist() for _ in range(int(rng.integers(1, 5)))]
        prefix = rng.integers(0, vocab, int(rng.integers(0, 4))).tolist()
        old = SuffixIndex.build(seqs, min_match=lo, max_match=hi, prefix=prefix)
        new = flat(seqs, lo, hi, prefix)
        so, sn = old.add(), new.add()
        for _ in range(4):
            ctx = prefix + rng.integers(0, vocab, int(rng.integers(0, 10))).tolist()
            n_old, c_old = old.match(ctx)
            n_new, c_new = new.match(ctx)
            assert n_new == n_old
            assert canonical(new, c_new) == sorted(divmod(c, STRIDE) for c, g in zip(c_old, old.gather(c_old, 1)) if g)
            assert sorted(g for g in new.gather(c_new, 5) if g) == sorted(g for g in old.gather(c_old, 5) if g)
            grow = rng.integers(0, vocab, 2).tolist()
            old.extend(so, grow)
            new.extend(sn, grow)


def test_drafts_equal_the_dict_index_drafts_on_a_rhyming_history():
    # Rule: the drafting walk (longest match, most recent 32, counts) is unchanged by the index's layout.
    rng = np.random.default_rng(1)
    base = rng.integers(0, 50, 300)
    seqs = []
    for _ in range(12):
        s = base.copy()
        hit = rng.random(len(s)) < 0.05
        s[hit] = rng.integers(0, 50, int(hit.sum()))
        seqs.append(s.tolist())
    old = HistoSpecDrafter(SuffixIndex.build(seqs, min_match=1, max_match=7), max_spec_factor=2.0)
    new = HistoSpecDrafter(flat(seqs), max_spec_factor=2.0)
    for pos in range(8, 300, 7):
        ctx = seqs[3][:pos]
        assert new.propose(ctx, 16) == old.propose(ctx, 16)


@pytest.mark.parametrize("max_match, vocab", [(2, 3), (3, 3), (5, 3), (7, 3), (8, 3), (11, 3), (7, 150_000),
                                              (11, 150_000)])
def test_positions_are_sorted_by_exactly_max_match_tokens_back_then_by_position(max_match, vocab):
    # Rule: sa orders positions by their max_match tokens before (read backwards, a pad before every
    # real token), ties by position: the drafting kernel reads a max_match-deep run's most recent
    # occurrences as its last entries. (Sorted one token deeper, as before, a run max_match deep
    # falls apart into runs by the next token back, each in position order but not the whole.)
    # A real vocabulary's contexts outgrow int64 after one doubling: they are re-ranked (`_rank`).
    rng = np.random.default_rng(max_match)
    tokens = rng.integers(0, vocab, 2000).astype(np.int32 if vocab > 3 else np.int64)
    ix = FlatIndex.build(tokens, [250] * 8, [1, 2], min_match=1, max_match=max_match)
    text, sa = ix.text.astype(np.int64), ix.sa.astype(np.int64)
    back = np.stack([text[sa - j] for j in range(1, max_match + 1)])  # row j - 1: j tokens back
    order = np.lexsort(np.vstack([sa[None], back[::-1]]))  # the last key is the primary one
    assert np.array_equal(order, np.arange(len(sa)))


def test_index_costs_twelve_bytes_per_token_beyond_the_tokens():
    ix = FlatIndex.build(np.arange(1000) % 97, [100] * 10, [1, 2, 3], min_match=1, max_match=7)
    assert ix.num_tokens == 1030
    assert ix.nbytes <= 12 * ix.num_tokens + 8 * len(ix)  # int32 position + uint64 key, per sequence a start


def test_flat_bundle_reads_a_bundle_without_per_token_objects():
    bundle = HistoryBundle.of((PromptHistory((5, 6), ((1, 2, 3), (4,)), (1.0, 0.5)), PromptHistory((7,))))
    fb = HistoryBundle.from_bytes(bundle.to_bytes())
    assert len(fb) == 2 and fb.prompt(0).tolist() == [5, 6] and fb.prompt(1).tolist() == [7]
    tokens, lengths, rewards = fb.history(0)
    assert (tokens.tolist(), lengths.tolist(), rewards.tolist()) == ([1, 2, 3, 4], [3, 1], [1.0, 0.5])
    assert fb.history(1)[1].tolist() == []


def test_lengths_that_do_not_cover_the_tokens_are_refused():
    # Rule: the compiled placement reads tokens where `lengths` say, so lengths that do not fit (a
    # negative one hiding behind the right sum too) are refused before it runs.
    for lengths in ([3, 2], [5, -3]):
        with pytest.raises(ValueError, match="lengths must be >= 0"):
            FlatIndex.build(np.arange(2), lengths)
