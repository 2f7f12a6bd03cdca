"""The per-prompt history index: occurrences, longest match, counts, rewards, growth, the bundle."""

import random

import pytest

from helpers.histospec_oracle import SuffixIndex
from rhymerl.histospec.sibling_table import STRIDE


def test_counts_occurrences_of_each_continuation():
    # Counts: after [1,2,3] history continued with 4 twice and 5 once.
    ix = SuffixIndex.build([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 4]], min_match=2, max_match=3)
    conts = ix.continuations([9, 1, 2, 3])
    assert [(c.token, c.count) for c in conts] == [(4, 2), (5, 1)]


def test_longest_match_wins_within_bounds():
    # Longest match: [7,2,3] never occurred, but its 2-token tail [2,3] did (twice).
    ix = SuffixIndex.build([[1, 2, 3, 4], [8, 2, 3, 6]], min_match=2, max_match=3)
    n, codes = ix.match([7, 2, 3])
    assert n == 2
    assert [divmod(c, STRIDE) for c in codes] == [(0, 3), (1, 3)]  # (sequence, next position)
    # The 3-token tail is preferred when it occurred: only sequence 0 has [1,2,3].
    assert ix.match([1, 2, 3]) == (3, [3])


def test_no_match_below_min_match():
    # Minimum match: a 1-token tail never anchors a draft when min_match is 2.
    ix = SuffixIndex.build([[1, 2, 3]], min_match=2, max_match=3)
    assert ix.match([5, 3]) == (0, [])
    assert ix.match([3]) == (0, [])
    assert ix.continuations([5, 3]) == []


def test_max_match_caps_the_context_read():
    # Only the last max_match tokens are read: a mismatch further back does not matter.
    ix = SuffixIndex.build([[1, 2, 3, 4, 5]], min_match=2, max_match=3)
    assert ix.match([99, 98, 2, 3, 4])[0] == 3


def test_reward_sums_follow_the_responses():
    # Reward sums: continuation 4 comes from responses with rewards 1.0 and 0.5, 5 from 0.0.
    ix = SuffixIndex.build([[1, 2, 4], [1, 2, 5], [1, 2, 4]], rewards=[1.0, 0.0, 0.5],
                           min_match=2, max_match=2)
    by_tok = {c.token: c for c in ix.continuations([1, 2])}
    assert by_tok[4].reward_sum == pytest.approx(1.5)
    assert by_tok[5].reward_sum == 0.0
    ix.set_reward(1, 3.0)  # a sibling's reward arriving late counts from then on
    assert {c.token: c.reward_sum for c in ix.continuations([1, 2])}[5] == 3.0


def test_equal_counts_rank_the_most_recent_occurrence_first():
    # Tie-breaking: 4 and 5 occur once each; 5 comes from the later sequence.
    ix = SuffixIndex.build([[1, 2, 4], [1, 2, 5]], min_match=2, max_match=2)
    assert [c.token for c in ix.continuations([1, 2])] == [5, 4]
    # Within one sequence the later position is the more recent.
    ix = SuffixIndex.build([[1, 2, 4, 1, 2, 5]], min_match=2, max_match=2)
    assert [c.token for c in ix.continuations([1, 2])] == [5, 4]


def test_a_match_needs_a_token_after_it():
    # A sibling always matches its own end; the longest match must predict something.
    ix = SuffixIndex.build([[1, 2, 3, 4]], min_match=2, max_match=3)
    ix.add([9, 2, 3])  # [9,2,3] occurs only at this sequence's end; [2,3] also in sequence 0
    n, codes = ix.match([9, 2, 3])
    assert n == 2 and ix.continuations([9, 2, 3])[0].token == 4


def test_prefix_lets_the_first_response_tokens_match():
    # Prefix: the prompt's tail precedes each response, so the prompt end predicts token 1.
    ix = SuffixIndex.build([[10, 11], [10, 12]], min_match=2, max_match=3, prefix=[7, 8, 9, 5, 6])
    assert ix.prefix == (9, 5, 6)  # only max_match tokens of the prompt are kept
    assert [(c.token, c.count) for c in ix.continuations([9, 5, 6])] == [(10, 2)]


def test_growing_a_sibling_indexes_the_same_as_building_at_once():
    # Incremental growth: extending in chunks yields exactly the table of a one-shot build.
    rng = random.Random(0)
    seqs = [[rng.randrange(4) for _ in range(rng.randrange(1, 30))] for _ in range(5)]
    whole = SuffixIndex.build(seqs, min_match=2, max_match=4, prefix=[9, 9, 8])
    grown = SuffixIndex(2, 4, prefix=[9, 9, 8])
    ids = [grown.add() for _ in seqs]
    pos = [0] * len(seqs)
    while any(p < len(s) for p, s in zip(pos, seqs)):
        for k, s in enumerate(seqs):  # interleaved, a few tokens at a time, like siblings
            step = rng.randrange(1, 4)
            grown.extend(ids[k], s[pos[k]:pos[k] + step])
            pos[k] += step
    assert grown.sequences == whole.sequences
    assert {k: sorted(v) for k, v in grown.table.items()} == {k: sorted(v) for k, v in whole.table.items()}


def test_sibling_joins_and_is_matched():
    # Siblings: a sequence added after the build is found by later queries.
    ix = SuffixIndex.build([[1, 2, 3]], min_match=2, max_match=2)
    sib = ix.add([5, 6])
    assert ix.continuations([5, 6]) == []  # occurred, but nothing follows yet
    ix.extend(sib, [7])
    assert [(c.token, c.count, c.latest) for c in ix.continuations([5, 6])] == [(7, 1, sib * STRIDE + 2)]


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="min_match"):
        SuffixIndex(min_match=4, max_match=3)
    with pytest.raises(ValueError, match="one reward per response"):
        SuffixIndex.build([[1, 2]], rewards=[1.0, 2.0])
    with pytest.raises(ValueError, match="unknown sequence id 3"):
        SuffixIndex().extend(3, [1])


def test_prompt_history_index_uses_prompt_tail():
    ix = SuffixIndex.build([(4, 5)], [1.0], min_match=2, max_match=2, prefix=(1, 2, 3))
    assert ix.prefix == (2, 3)
    assert [c.token for c in ix.continuations([2, 3])] == [4]


@pytest.mark.parametrize("lo,hi", [(1, 7), (3, 5)])
def test_one_pass_build_equals_adding_long_and_short_sequences(lo, hi):
    # The numpy paths (a history in one pass; a long chunk appended) file exactly what the token loop
    # files, codes in insertion order per n-gram.
    rng = random.Random(1)
    seqs = [[rng.randrange(6) for _ in range(n)] for n in (300, 5, 0, 140, 1)]
    whole = SuffixIndex.build(seqs, min_match=lo, max_match=hi, prefix=[7, 8])
    one_by_one = SuffixIndex(lo, hi, prefix=[7, 8])
    for s in seqs:
        sid = one_by_one.add()
        for k in range(0, len(s), 7):
            one_by_one.extend(sid, s[k:k + 7])
    long_chunks = SuffixIndex(lo, hi, prefix=[7, 8])
    for s in seqs:
        long_chunks.add(s)
    assert whole.table == one_by_one.table == long_chunks.table
