"""Drafting from history: following continuations, branching rules, budgets, config and counters
(the vLLM adapter's batch logic: tests/rhymerl/vllm/test_histospec_proposer.py)."""

import random

import pytest

from rhymerl.errors import ConfigError
from rhymerl.histospec.drafter import (BudgetRule, HistoSpecDrafter, rule_of,
                                       NgramDrafter, PRIOR, budget_rule, histospec_drafter)
from helpers.histospec_oracle import SuffixIndex
from rhymerl.histospec.sibling_table import STRIDE
from rhymerl.config.spec import SpecConfig
from rhymerl.histospec.stats import SpecStats


def drafter(seqs, rewards=None, reward_weighted=False, lo=2, hi=3):
    return HistoSpecDrafter(SuffixIndex.build(seqs, rewards, min_match=lo, max_match=hi), reward_weighted)


def test_follows_the_history_and_branches_by_count():
    # Count rule: after [1,2,3,4] two responses continue 5,6 and one 9: take 5, then 6.
    d = drafter([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 9], [7, 1, 2, 3, 4, 5, 6, 8]])
    draft = d.propose([0, 2, 3], 10)
    assert draft.tokens == (4, 5, 6, 8) and draft.match_len == 2


def test_budget_caps_the_draft():
    d = drafter([[1, 2, 3, 4, 5, 6, 7]])
    assert d.propose([1, 2, 3], 2).tokens == (4, 5)
    assert d.propose([1, 2, 3], 0).tokens == ()


def test_no_draft_without_a_long_enough_match():
    # Minimum match: a 1-token match is not enough with min_match=2.
    assert drafter([[1, 2, 3]]).propose([9, 3], 4).tokens == ()


def test_equal_counts_go_to_the_most_recent_sequence():
    # Tie-breaking: one occurrence each; the later sequence (id 1) wins.
    assert drafter([[1, 2, 3, 7], [1, 2, 3, 8]]).propose([1, 2, 3], 1).tokens == (8,)


def test_reward_weighting_prefers_rewarded_branches():
    # Reward weighting: 5 occurs twice (rewards 0, 0), 9 once (reward 1): by count 5, by reward 9.
    seqs, rewards = [[1, 2, 5], [1, 2, 5], [1, 2, 9]], [0.0, 0.0, 1.0]
    assert drafter(seqs, rewards).propose([1, 2], 1).tokens == (5,)
    assert drafter(seqs, rewards, reward_weighted=True).propose([1, 2], 1).tokens == (9,)


def test_siblings_joining_the_index_produce_drafts():
    # Siblings: with no history, a sibling that is ahead supplies the draft as it grows.
    ix = SuffixIndex(2, 3, prefix=[100, 101])
    d = HistoSpecDrafter(ix)
    a, b = ix.add(), ix.add()
    ix.extend(a, [1, 2, 3, 4, 5])
    ix.extend(b, [1, 2])
    assert d.propose([100, 101, 1, 2], 8).tokens == (3, 4, 5)


def _greedy_reference(index, codes, budget, reward_weighted):
    """Token-by-token greedy walk (the rule, written the slow obvious way)."""
    cands = [divmod(c, STRIDE) for c in codes]
    out = []
    while len(out) < budget:
        groups: dict = {}
        for s, p in cands:
            seq = index.sequences[s]
            if p < len(seq):
                g = groups.setdefault(seq[p], [0, 0.0, (-1, -1)])
                g[0] += 1
                g[1] += index.rewards[s]
                g[2] = max(g[2], (s, p))  # most recent occurrence
        if not groups:
            break
        key = (lambda t: (groups[t][1], groups[t][0], groups[t][2])) if reward_weighted else \
            (lambda t: (groups[t][0], groups[t][2]))
        best = max(groups, key=key)
        out.append(best)
        cands = [(s, p + 1) for s, p in cands
                 if p < len(index.sequences[s]) and index.sequences[s][p] == best]
    return out


@pytest.mark.parametrize("reward_weighted", [False, True])
def test_sorted_walk_equals_token_by_token_greedy(reward_weighted):
    # The fast sorted-range walk makes exactly the greedy choices at every branch.
    rng = random.Random(1)
    for trial in range(300):
        base = [rng.randrange(3) for _ in range(40)]
        seqs = [[t if rng.random() > 0.15 else rng.randrange(3) for t in base][:rng.randrange(5, 40)]
                for _ in range(rng.randrange(1, 7))]
        rewards = [float(rng.randrange(3)) for _ in seqs]
        ix = SuffixIndex.build(seqs, rewards, min_match=2, max_match=4)
        ctx = [rng.randrange(3) for _ in range(4)]
        budget = rng.randrange(1, 20)
        _, codes = ix.match(ctx)
        got = HistoSpecDrafter(ix, reward_weighted, max_candidates=10**9).propose(ctx, budget).tokens
        assert list(got) == _greedy_reference(ix, codes, budget, reward_weighted), trial


def test_ngram_drafter_looks_up_the_context_itself():
    # Prompt lookup: the tail [1,2] occurred earlier, followed by 3, 4.
    assert NgramDrafter(2, 3).propose([1, 2, 3, 4, 1, 2], 2).tokens == (3, 4)
    assert NgramDrafter(2, 3).propose([1, 2, 3, 4], 2).tokens == ()


def _run_rule(rule, outcomes):
    """Budgets seen over a sequence of steps; True = the whole draft was accepted."""
    b, seen = rule.initial, []
    for full in outcomes:
        seen.append(b)
        b = rule.update(b, b, b if full else 0)
    return seen


def test_additive_rule_sequence():
    # Paper's rule: +2 on full acceptance, back to 2 on a rejection, capped.
    assert _run_rule(rule_of("additive", 32), [True, True, True, False, True]) == [2, 4, 6, 8, 2]
    assert _run_rule(BudgetRule("additive", cap=5, initial=2), [True, True, True]) == [2, 4, 5]
    assert rule_of("additive", 32).update(6, 0, 0) == 6  # a step without a draft changes nothing


def test_doubling_rule_sequence():
    # Public code's rule: double on full acceptance up to 16, halve on a rejection down to 2.
    outcomes = [True] * 4 + [False] * 4
    assert _run_rule(rule_of("doubling", 16), outcomes) == [2, 4, 8, 16, 16, 8, 4, 2]


def test_partial_acceptance_is_a_rejection():
    assert rule_of("additive", 32).update(8, 8, 7) == 2
    assert rule_of("doubling", 16).update(8, 8, 7) == 4


def test_default_budget_rule_is_fixed():
    # Measured (replay of a default run): with drafts capped by match length and scored, a fixed
    # budget of 16 reached a higher mean accepted length than doubling.
    assert budget_rule(SpecConfig()).kind == "fixed" and SpecConfig().max_budget == 16


def test_spec_config_budget_respects_max_budget():
    assert budget_rule(SpecConfig(budget_rule="additive", max_budget=8)).cap == 8
    assert budget_rule(SpecConfig(budget_rule="doubling", max_budget=32)).cap == 16
    assert budget_rule(SpecConfig(budget_rule="fixed", max_budget=5)).initial == 5


@pytest.mark.parametrize("kwargs, key", [
    ({"min_match": 0}, "spec.min_match"),
    ({"min_match": 5, "max_match": 4}, "spec.max_match"),
    ({"budget_rule": "linear"}, "spec.budget_rule"),
    ({"max_budget": 0}, "spec.max_budget"),
    ({"method": "eagle"}, "spec.method"),
    ({"history_epochs": -1}, "spec.history_epochs"),
])
def test_spec_config_errors_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        SpecConfig(**kwargs)


def test_stats_count_the_bonus_token_and_positions():
    # Two steps: draft 3 accept 2 (emits 3), draft 2 accept 0 (emits 1); one step without a draft.
    s = SpecStats()
    s.record(3, 2)
    s.record(2, 0)
    s.record(0, 0)
    assert (s.steps, s.tokens, s.drafted, s.accepted, s.drafts) == (3, 5, 5, 2, 2)
    assert s.mean_accepted_length == pytest.approx(5 / 3)
    assert s.mean_accepted_length_drafted == pytest.approx(1 + 2 / 2)
    assert s.acceptance_by_position() == [0.5, 0.5, 0.0]
    m = s.as_metrics()
    assert m["spec/acceptance_pos0"] == 0.5 and m["spec/tokens"] == 5.0
    with pytest.raises(ValueError, match="accepted=3"):
        s.record(2, 3)


def test_stats_merge_adds_counts():
    a, b = SpecStats(), SpecStats()
    a.record(1, 1)
    b.record(3, 3)
    a.merge(b)
    assert (a.steps, a.tokens, a.drafted_at, a.accepted_at) == (2, 6, [2, 1, 1], [2, 1, 1])


# ---------------------------------------------------------------- vLLM adapter batch logic


def test_min_token_prob_stops_before_an_unlikely_branch():
    # Probability stop: after [1,2] all 4 occurrences continue with 3, estimated 4 / (4 + PRIOR); then
    # 3 of 4 take 5 and 1 takes 9, so 5 is estimated at that x 0.75. A threshold just above either
    # estimate stops the draft before that token.
    seqs = [[1, 2, 3, 5, 6], [1, 2, 3, 5, 6], [1, 2, 3, 5, 6], [1, 2, 3, 9, 9]]
    index = SuffixIndex.build(seqs, None, min_match=2, max_match=3)
    p3 = 4 / (4 + PRIOR)
    p5 = p3 * 0.75
    assert HistoSpecDrafter(index, min_token_prob=p3 + 0.01).propose([1, 2], 8).tokens == ()
    assert HistoSpecDrafter(index, min_token_prob=p5 + 0.01).propose([1, 2], 8).tokens == (3,)
    assert HistoSpecDrafter(index, min_token_prob=p5 - 0.01).propose([1, 2], 8).tokens == (3, 5, 6)
    assert HistoSpecDrafter(index).propose([1, 2], 8).tokens == (3, 5, 6)
    assert histospec_drafter(SpecConfig(min_token_prob=p5 + 0.01), index).propose([1, 2], 8).tokens == (3,)
    with pytest.raises(ConfigError, match="spec.min_token_prob"):
        SpecConfig(min_token_prob=1.5)


def test_max_spec_factor_ties_the_draft_to_the_match():
    # Draft cap = factor x match length: the tail [2,3] matches 2 tokens, so factor 1 drafts 2 of the
    # 5 the history offers, 1.5 drafts 3, and 0 (off) all 5.
    index = SuffixIndex.build([[1, 2, 3, 4, 5, 6, 7, 8]], None, min_match=1, max_match=2)
    assert HistoSpecDrafter(index, max_spec_factor=1.0).propose([2, 3], 8).tokens == (4, 5)
    assert HistoSpecDrafter(index, max_spec_factor=1.5).propose([2, 3], 8).tokens == (4, 5, 6)
    assert histospec_drafter(SpecConfig(max_spec_factor=0.0), index).propose([2, 3], 8).tokens == (4, 5, 6, 7, 8)
    with pytest.raises(ConfigError, match="spec.max_spec_factor"):
        SpecConfig(max_spec_factor=-1.0)
