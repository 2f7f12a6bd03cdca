"""The cross-prompt tree (RecentTree) and how HistoSpec picks between it and the prompt's own index."""

import numpy as np
import pytest

from helpers.marks import needs_arctic
from rhymerl.histospec.drafter import HistoSpecDrafter, PRIOR, RecentTree, follow
from helpers.histospec_oracle import SuffixIndex
from rhymerl.histospec.bundle import HistoryBundle, PromptHistory
from rhymerl.histospec.offline.replay import RecordedResponse, replay
from helpers.histospec_calls import tree_rules
from rhymerl.histospec.engine.step_drafter import BatchDrafter


@needs_arctic
def test_recent_tree_drafts_from_held_responses_and_evicts_the_oldest():
    # FIFO: with room for 2, the third response evicts the first; extending an evicted one is a no-op.
    tree = RecentTree(capacity=2, depth=16)
    first = tree.start([1, 2, 3, 4, 5])
    tree.start([7, 8, 9])
    assert tree.speculate([1, 2], 8, 0.0, 0.0)[0] == (3, 4, 5)
    tree.start([6, 6])
    assert tree.speculate([1, 2], 8, 0.0, 0.0)[0] == ()
    tree.extend(first, [1, 2, 3])
    assert tree.speculate([1, 2], 8, 0.0, 0.0)[0] == ()
    assert (len(tree), tree.num_tokens) == (2, 5)


@needs_arctic
def test_recent_tree_caps_the_draft_at_factor_times_the_match():
    # max_spec_factor: the 2-token match [1,2] may draft 2 x 1.5 = 3 of the 5 tokens that follow
    # (the library matches at most all but the context's first token).
    tree = RecentTree(capacity=4, depth=16)
    tree.start([1, 2, 3, 4, 5, 6, 7])
    tokens, match, score, probs = tree.speculate([0, 1, 2], 8, 1.5, 0.0)
    assert (tokens, match, score, probs) == ((3, 4, 5), 2, 3.0, (1.0, 1.0, 1.0))


@needs_arctic
def test_a_prompt_without_history_drafts_from_the_cross_prompt_tree():
    # Epoch 0: the prompt's own index is empty; another prompt's response holds the shared format.
    recent = RecentTree(capacity=8, depth=16)
    recent.start([5, 9, 9, 1, 2, 3, 4])
    alone = HistoSpecDrafter(SuffixIndex(1, 7), max_spec_factor=2.0)
    assert alone.propose([7, 9, 1], 8).tokens == ()
    both = HistoSpecDrafter(SuffixIndex(1, 7), max_spec_factor=2.0, recent=recent, recent_spec_factor=2.0)
    assert both.propose([7, 9, 1], 8).tokens == (2, 3, 4)


@needs_arctic
def test_the_higher_scoring_draft_wins():
    # Score = expected accepted length. Own history: [1,2] -> 3 4 5 seen 6 times, each token estimated
    # at 6 / (6 + PRIOR); the recent tree: -> 8 8 once (the library estimates 1.0 per token, no prior).
    own = SuffixIndex.build([[1, 2, 3, 4, 5]] * 6, min_match=1, max_match=4)
    recent = RecentTree(capacity=8, depth=16)
    recent.start([1, 2, 8, 8])
    drafter = HistoSpecDrafter(own, max_spec_factor=2.0, recent=recent, recent_spec_factor=2.0)
    assert 3 * 6 / (6 + PRIOR) > 2.0
    assert drafter.propose([0, 1, 2], 8).tokens == (3, 4, 5)
    # ... and with the roles swapped the recent tree's draft is taken.
    weak = SuffixIndex.build([[1, 2, 8, 8, 8]], min_match=1, max_match=4)
    strong = RecentTree(capacity=8, depth=16)
    for _ in range(6):
        strong.start([1, 2, 3, 4, 5])
    drafter = HistoSpecDrafter(weak, max_spec_factor=2.0, recent=strong, recent_spec_factor=2.0)
    assert drafter.propose([0, 1, 2], 8).tokens == (3, 4, 5)


def test_the_longest_match_anchors_the_draft():
    # [3] alone was followed by 7 more often, but the longer tail [2,3] was followed by 4: 4 is drafted.
    index = SuffixIndex.build([[3, 7, 7], [3, 7, 7], [3, 7, 7], [1, 2, 3, 4, 5]], min_match=1, max_match=4)
    assert HistoSpecDrafter(index).propose([9, 2, 3], 8).tokens == (4, 5)
    assert HistoSpecDrafter(index).propose([9, 8, 3], 8).tokens == (7, 7)


def test_draft_tokens_carry_estimated_probabilities_that_sum_to_the_score():
    # 3 occurrences agree on 5 then split 2:1 -> token 5 at 3/(3+PRIOR), token 6 at that x 2/3.
    index = SuffixIndex.build([[1, 5, 6], [1, 5, 6], [1, 5, 9]], min_match=1, max_match=2)
    _, codes = index.match([1])
    tokens, probs = follow(index, codes, 8, False)
    p = 3 / (3 + PRIOR)
    assert tokens == [5, 6] and probs == pytest.approx([p, p * 2 / 3])
    draft = HistoSpecDrafter(index).propose([1], 8)
    assert draft.probs == pytest.approx((p, p * 2 / 3)) and draft.score == pytest.approx(p + p * 2 / 3)


@needs_arctic
def test_batch_drafter_feeds_and_drafts_from_the_recent_tree():
    # Engine path: prompt A's request generates 1..6; a request of prompt B (no history) whose
    # response reaches [2, 3] then drafts A's continuation from the cross-prompt tree.
    a, b = (50, 51), (60, 61)
    bundle = HistoryBundle.of((PromptHistory(a), PromptHistory(b)))
    spec = tree_rules(cost_aware=False, recent_spec_factor=2.0)
    batch = BatchDrafter(bundle, spec, k=8, max_model_len=64)
    rows = np.zeros((2, 64), dtype=np.int64)
    rows[0, :8] = [*a, 1, 2, 3, 4, 5, 6]
    batch.propose([[6]], np.array([8]), rows[:1])
    rows[1, :5] = [*b, 9, 2, 3]
    assert batch.propose([[3]], np.array([5]), rows[1:2]) == [[4, 5, 6]]


@needs_arctic
def test_replay_drafts_epoch_zero_from_an_earlier_step_of_another_prompt():
    # Step 0 holds prompt p; in step 1 prompt q (no history, no sibling yet) repeats p's tokens.
    shared = tuple(range(10, 30))
    records = [RecordedResponse("p", 0, shared, step=0), RecordedResponse("q", 0, (1,) + shared, step=1)]
    on = replay(records, tree_rules()).per_epoch[0]
    off = replay(records, tree_rules(recent_responses=0)).per_epoch[0]
    assert off.accepted == 0
    assert on.accepted > 10


@needs_arctic
def test_the_row_path_drafts_what_the_list_path_drafts():
    # Rule: the engine's path (responses grown from int32 arrays, drafts asked on views of int32 or
    # int64 token rows, contexts longer than the tree's depth) drafts what the list path drafts, after
    # the same tokens went in either way.
    rng = np.random.default_rng(3)
    a, b = RecentTree(capacity=8, depth=24), RecentTree(capacity=8, depth=24)
    base = rng.integers(0, 20, 300)
    for _ in range(5):
        resp = base.copy()
        hit = rng.random(300) < 0.1
        resp[hit] = rng.integers(0, 20, int(hit.sum()))
        ha, hb = a.start(resp[:10].tolist()), b.start(resp[:10].tolist())
        for lo in range(10, 300, 37):
            a.extend(ha, resp[lo:lo + 37].tolist())
            b.extend(hb, resp[lo:lo + 37].astype(np.int32))
    ends = np.arange(5, 300, 11)
    which = ends % 2  # row 1 holds tokens the tree never saw: no draft
    for dtype in (np.int32, np.int64):
        tokens = np.stack([base, base + 100]).astype(dtype)
        wants = [a.speculate(tokens[r, :e].tolist(), 12, 2.0, 0.1) for r, e in zip(which, ends)]
        gots = [b.speculate_row(tokens[r, :e], 12, 2.0, 0.1) for r, e in zip(which, ends)]
        assert any(not w[0] for w in wants) and any(w[0] for w in wants)
        assert [(tuple(g.token_ids), tuple(g.probs), g.score) for g in gots] == [(w[0], w[3], w[2]) for w in wants]


@needs_arctic
def test_a_confident_own_draft_does_not_ask_the_tree():
    # recent_gate: the tree is asked only while the own draft's score is below gate x budget; a tree
    # draft that would outscore it is then never seen (gate 0: never asked, gate 1: always).
    own = SuffixIndex.build([[1, 2, 3, 4, 5]] * 6, min_match=1, max_match=4)
    recent = RecentTree(capacity=8, depth=16)
    recent.start([1, 2, 8, 8, 8, 8, 8, 8])
    recent.start([1, 2, 8, 8, 8, 8, 8, 8])
    score = 3 * 6 / (6 + PRIOR)  # 2.25: the own draft's expected accepted length
    for gate, winner in ((1.0, (8, 8, 8, 8)), (score / 8 + 0.01, (8, 8, 8, 8)), (score / 8, (3, 4, 5)),
                         (0.0, (3, 4, 5))):
        drafter = HistoSpecDrafter(own, max_spec_factor=2.0, recent=recent, recent_spec_factor=2.0,
                                   recent_gate=gate)
        assert drafter.propose([0, 1, 2], 8).tokens == winner, gate  # the tree matches [1, 2]: 4 tokens, score 4
